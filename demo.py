"""The CPU demo: Flow-GRPO teaches the embedded agent's planner which tool to call for which question.

On N test questions of the planning suite (environment/planning.py: calculations, facts, and
two-step questions that need a fact and then a calculation on it), the same questions for every row:

    1. base model alone     evaluate.py --mode direct    no tools
    2. AgentFlow            evaluate.py --mode agent     the untrained planner
    3. fixed plans          evaluate.py --fixed-tool T   no planner: tool T every turn, the question as
                                                         sub-goal, for every offline tool T
                                                         (the planner chooses between the first two)
    4. oracle router        evaluate.py --oracle         no planner: each question's right tools in order,
                                                         the question as sub-goal (the ceiling of routing)
    5. Flow-GRPO            train.py --preset cpu-demo   the planner trained in the live loop
    6. AgentFlow + Flow-GRPO  evaluate.py --checkpoint   the trained planner
    7. the table: accuracy with Wilson 95% intervals per kind of question and for all, and the trained
       agent minus each row, paired on the same questions with a 95% interval (evaluate.py --compare);
       the learning curve: training reward, test accuracy during training, and the baselines as lines

Every step is one of the project's own commands, printed before it runs, so each row of the table can
be reproduced alone. Rows 3 and 4 do not fit in the 30 minutes with the rest (the demo takes 17 min
without them): `python demo.py --baselines only` runs them (about 6 minutes) into the same folder, and
`python demo.py` then shows them.

Run:   python demo.py --baselines only     (rows 3 and 4, the fixed plans and the oracle router)
       python demo.py                      (writes runs/demo/: results.md, results.json, learning_curve.png)
       python demo.py --n 20 --steps 4     (a quick look)
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from evaluate import compare  # noqa: E402
from config import PRESETS  # noqa: E402

BASE, UNTRAINED, FIXED = "base model alone", "AgentFlow, untrained planner", "AgentFlow, fixed plan: "
ORACLE, TRAINED = "AgentFlow, oracle router", "AgentFlow + Flow-GRPO"
FIXED_TOOLS = ("Python_Coder", "Fact_Lookup", "Local_Search")  # the planning suite's offline tools


def run(cmd, seconds: dict, name: str):
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds[name] = time.perf_counter() - t0
    print(f"  ({seconds[name]:.0f} s)", flush=True)


def plot(metrics_path: Path, accuracy: dict, final_step: int, path: Path):
    """Training reward per step (and its running mean), test accuracy during training, and each
    baseline's accuracy on all the demo's questions as a horizontal line."""
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    steps = [m["step"] for m in lines if "reward_mean" in m]
    reward = [m["reward_mean"] for m in lines if "reward_mean" in m]
    window = max(1, len(reward) // 8)
    smooth = [sum(reward[max(0, i - window + 1): i + 1]) / len(reward[max(0, i - window + 1): i + 1]) for i in range(len(reward))]
    tests = [(m["step"], m["test_accuracy"]) for m in lines if "test_accuracy" in m]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, reward, color="tab:blue", alpha=0.3, label="training reward (batch mean)")
    ax.plot(steps, smooth, color="tab:blue", label=f"training reward (running mean of {window})")
    if tests:
        ax.plot(*zip(*tests), "o--", color="tab:orange", label="test accuracy during training (eval_n questions)")
    fixed = {k: v for k, v in accuracy.items() if k.startswith(FIXED)}
    styles = {BASE: ("black", ":"), UNTRAINED: ("tab:red", ":"), ORACLE: ("tab:green", "--"), TRAINED: ("tab:purple", "-")}
    if fixed:
        best = max(fixed, key=fixed.get)
        styles[best] = ("tab:gray", "-.")
    for name, (color, style) in styles.items():
        if name in accuracy:
            ax.axhline(accuracy[name], color=color, linestyle=style, linewidth=1.2,
                       label=f"{name}: {100 * accuracy[name]:.0f}% of all demo questions" + (" (best fixed plan)" if name in fixed else ""))
    ax.set_xlabel("training step")
    ax.set_ylabel("reward / accuracy")
    ax.set_xlim(0, max(final_step, 1))
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Flow-GRPO on SmolLM2-135M-Instruct, 2 CPU cores: the planning suite")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    preset = PRESETS["cpu-demo"]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--n", type=int, default=100, help="test questions of the demo's suite, the same for every row")
    p.add_argument("--data", default=preset["data"], help="the suite (default: the preset's, planning)")
    p.add_argument("--steps", type=int, default=preset["steps"], help="training steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=preset["model"], help="the model of every row (default: the embedded one)")
    p.add_argument("--baselines", choices=("skip", "only", "all"), default="skip",
                   help="the fixed plans (one per tool) and the oracle router: skip them (the table still shows "
                        "those already in --out), run only them (about 6 min), or run them too (over 30 min)")
    args = p.parse_args(argv)
    out = Path(args.out)
    py = sys.executable
    # The agent is evaluated with the rollout sizes it is trained with (evaluate.py --preset), planner greedy.
    agent = ["--mode", "agent", "--preset", "cpu-demo", "--batch-size", "50"]
    common = [py, "evaluate.py", "--data", args.data, "--n", str(args.n), "--seed", str(args.seed)]
    model = ["--model", args.model]
    seconds, rows = {}, []  # rows: (name in the plot, output folder)

    def evaluate(name, folder, extra):
        run(common + extra + ["--label", name, "--out", str(out / folder)], seconds, name)
        rows.append((name, out / folder))

    t0 = time.perf_counter()
    if args.baselines != "only":
        evaluate(BASE, "eval-direct", model + ["--mode", "direct", "--preset", "cpu-demo", "--batch-size", "50"])
        evaluate(UNTRAINED, "eval-untrained", model + agent)
    # Every offline tool of the suite as a fixed plan, Local_Search too (the planner is offered the two
    # that pay); the oracle with the same three.
    every = ["--tools", ",".join(FIXED_TOOLS)]
    baselines = [(FIXED + tool, f"eval-fixed-{tool}", every + ["--fixed-tool", tool]) for tool in FIXED_TOOLS]
    baselines.append((ORACLE, "eval-oracle", every + ["--oracle"]))
    for name, folder, extra in baselines:
        if args.baselines != "skip":
            evaluate(name, folder, model + agent + extra)
        elif (out / folder / "summary.json").is_file():  # run before with --baselines only, same questions
            print(f"(the table takes {name} from {out / folder})", flush=True)
            rows.append((name, out / folder))
    if args.baselines == "only":
        print(f"baselines in {out} in {(time.perf_counter() - t0) / 60:.1f} min; now `python demo.py` shows them")
        return
    if (out / "train").exists():  # train.py refuses to start a new run over an old one; the demo owns this folder
        print(f"removing the previous demo's training run, {out / 'train'}", flush=True)
        shutil.rmtree(out / "train")
    run([py, "train.py", "--preset", "cpu-demo", "--data", args.data, "--steps", str(args.steps), "--seed", str(args.seed),
         "--out", str(out / "train"), "--model", args.model, "--checkpoint-every", str(args.steps),
         "--eval-n", str(min(args.n, preset["eval_n"]))], seconds, "training")
    final = out / "train" / "checkpoints" / f"step-{args.steps:06d}"
    evaluate(TRAINED, "eval-trained", agent + ["--checkpoint", str(final)])

    # The trained agent is the last folder: --compare's last column is it minus each row, paired.
    markdown, entries = compare([folder for _, folder in rows])
    (out / "results.md").write_text(markdown + "\n")
    (out / "results.json").write_text(json.dumps(entries, indent=2) + "\n")
    accuracy = {name: json.loads((folder / "summary.json").read_text())["accuracy"] for name, folder in rows}
    plot(out / "train" / "metrics.jsonl", accuracy, args.steps, out / "learning_curve.png")
    minutes = (time.perf_counter() - t0) / 60
    timing = ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items())
    (out / "timing.json").write_text(json.dumps({"minutes": minutes, "seconds": seconds}, indent=2) + "\n")
    print(f"\nwrote {out / 'results.md'}, {out / 'results.json'}, {out / 'learning_curve.png'} in {minutes:.1f} min "
          f"({timing})\n")
    print(markdown)


if __name__ == "__main__":
    main()
