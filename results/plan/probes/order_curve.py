"""The run built to show the broadcast (results/plan/history.md, first section): sum-then-fact, whose
right plan starts with Python_Coder, trained on 4 of every 6 questions for 24 steps, the broadcast
beside last-turn credit. Per step, of the kind's 24 trajectories: the share paid and the share that
started with Python_Coder; with the greedy accuracy on its 20 test questions as points. Run from the
repository root: python results/plan/probes/order_curve.py"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plan = Path(__file__).resolve().parents[1]
KIND = "sum-then-fact"
runs = {"broadcast (Flow-GRPO)": ("broadcast", "tab:blue"), "last turn only (--credit last)": ("credit-last", "tab:orange")}

fig, (paid, first) = plt.subplots(1, 2, figsize=(11, 4))
for label, (name, color) in runs.items():
    rows = [json.loads(line) for line in (plan / f"metrics-0938973-order-{name}.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    plans = [r["plans_by_kind"][KIND] for r in rows]
    n = [sum(p.values()) for p in plans]
    paid.plot(steps, [r["reward_by_kind"][KIND] for r in rows], color=color, label=f"{label}, sampled in training")
    first.plot(steps, [sum(v for k, v in p.items() if k.startswith("Python_Coder")) / m for p, m in zip(plans, n)],
               color=color, label=label)
    greedy = {0: 0.0}  # the untrained planner: Fact_Lookup first on all 20 (history.md)
    for step in (12, 24):
        summary = plan / f"eval-0938973-order-step{step}-greedy-{name}.summary.json"
        greedy[step] = json.loads(summary.read_text())["accuracy"]
    paid.plot(list(greedy), list(greedy.values()), "o--", color=color, label=f"{label}, greedy on 20 test questions")
paid.set(xlabel="step", ylabel="share right", title=f"{KIND}: right answers", ylim=(-0.03, 1))
first.set(xlabel="step", ylabel="share", title=f"{KIND}: trajectories that start with Python_Coder", ylim=(0, 1))
paid.legend(fontsize=7)
first.legend(fontsize=7)
fig.tight_layout()
out = plan / "curve-order-broadcast-vs-last.png"
fig.savefig(out, dpi=110)
print("wrote", out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out, file=sys.stderr)
