"""The run built to show the broadcast (results/plan/history.md, fifth section): sum-then-fact, whose
right plan starts with Python_Coder, trained on 4 of every 6 questions for 24 steps, the broadcast
beside last-turn credit. Per step, of the kind's 24 trajectories: the share paid and the share that
started with Python_Coder; with the greedy accuracy on its 20 test questions as points. With an
argument, the runs at that learning rate (--lr 2e-4, 12 steps; history.md, third section). Run from
the repository root: python results/plan/probes/order_curve.py [lr2e-4]"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plan = Path(__file__).resolve().parents[1]
KIND = "sum-then-fact"
LR = sys.argv[1] + "-" if len(sys.argv) > 1 else ""  # "lr2e-4-": that run's files; "": the lr 5e-5 runs
runs = {"broadcast (Flow-GRPO)": ("broadcast", "tab:blue"), "last turn only (--credit last)": ("credit-last", "tab:orange")}

fig, (paid, first) = plt.subplots(1, 2, figsize=(11, 4))
for label, (name, color) in runs.items():
    rows = [json.loads(line) for line in (plan / f"metrics-0938973-order-{LR}{name}.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    plans = [r["plans_by_kind"][KIND] for r in rows]
    n = [sum(p.values()) for p in plans]
    paid.plot(steps, [r["reward_by_kind"][KIND] for r in rows], color=color, label=f"{label}, sampled in training")
    first.plot(steps, [sum(v for k, v in p.items() if k.startswith("Python_Coder")) / m for p, m in zip(plans, n)],
               color=color, label=label)
    summaries = {0: "untrained-greedy", **{step: f"{LR}step{step}-greedy-{name}" for step in steps if step % 6 == 0}}
    greedy = {step: json.loads((plan / f"eval-0938973-order-{s}.summary.json").read_text())["accuracy"]
              for step, s in summaries.items()}
    paid.plot(list(greedy), list(greedy.values()), "o--", color=color, label=f"{label}, greedy on 20 test questions")
paid.set(xlabel="step", ylabel="share right", title=f"{KIND}: right answers" + (f" ({LR[:-1]})" if LR else ""), ylim=(-0.03, 1))
first.set(xlabel="step", ylabel="share", title=f"{KIND}: trajectories that start with Python_Coder", ylim=(0, 1))
paid.legend(fontsize=7)
first.legend(fontsize=7)
fig.tight_layout()
out = plan / f"curve-order-{LR}broadcast-vs-last.png"
fig.savefig(out, dpi=110)
print("wrote", out, file=sys.stderr)
