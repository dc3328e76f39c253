"""The CPU demo: Flow-GRPO makes the embedded agent's planner better, on the machine in front of you.

    1. base model alone   evaluate.py --mode direct   on N test questions of the mixed suite
    2. AgentFlow          evaluate.py --mode agent    the untrained planner, same questions
    3. fixed plan         evaluate.py --fixed-tool    no planner: Python_Coder every turn, the question
                                                      as sub-goal (what learning one tool choice is worth)
    4. Flow-GRPO          train.py --preset cpu-demo  the planner trained in the live loop
    5. AgentFlow + Flow-GRPO  evaluate.py --checkpoint  the trained planner, same questions
    6. the table (accuracy with Wilson 95% intervals, per suite) as markdown and JSON, and the learning
       curve (training reward per step, test accuracy at the start, along the way and at the end) as PNG

Every step is one of the project's own commands, printed before it runs, so each row of the table can
be reproduced alone. Same seeds and the same test questions for all four rows.

Run:   python demo.py                      (writes runs/demo/: results.md, results.json, learning_curve.png)
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
from train import PRESETS  # noqa: E402


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


def plot(metrics_path: Path, untrained: float, trained: float, final_step: int, path: Path, fixed: float | None = None):
    """Reward per training step (and its running mean), test accuracy as points, the fixed plan as a line."""
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    steps = [m["step"] for m in lines if "reward_mean" in m]
    reward = [m["reward_mean"] for m in lines if "reward_mean" in m]
    window = max(1, len(reward) // 8)
    smooth = [sum(reward[max(0, i - window + 1): i + 1]) / len(reward[max(0, i - window + 1): i + 1]) for i in range(len(reward))]
    tests = [(m["step"], m["test_accuracy"]) for m in lines if "test_accuracy" in m]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, reward, color="tab:blue", alpha=0.3, label="training reward (batch mean)")
    ax.plot(steps, smooth, color="tab:blue", label=f"training reward (running mean of {window})")
    if tests:
        ax.plot(*zip(*tests), "o--", color="tab:orange", label="test accuracy during training (eval_n questions)")
    ax.plot([0, final_step], [untrained, trained], "s", color="tab:red", markersize=8,
            label="test accuracy, all demo questions (untrained, trained)")
    if fixed is not None:
        ax.axhline(fixed, color="tab:gray", linestyle=":", label="test accuracy, all demo questions, fixed plan: Python_Coder")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Flow-GRPO on SmolLM2-135M-Instruct, 2 CPU cores")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--n", type=int, default=100, help="test questions of the mixed suite, the same for every row")
    p.add_argument("--steps", type=int, default=PRESETS["cpu-demo"]["steps"], help="training steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=PRESETS["cpu-demo"]["model"], help="the model of every row (default: the embedded one)")
    args = p.parse_args(argv)
    out = Path(args.out)
    preset = PRESETS["cpu-demo"]
    py = sys.executable
    # The agent is evaluated with the rollout sizes it is trained with (evaluate.py --preset), planner greedy.
    agent = ["--mode", "agent", "--preset", "cpu-demo", "--batch-size", "25"]
    common = [py, "evaluate.py", "--data", "mixed", "--n", str(args.n), "--seed", str(args.seed)]
    model = ["--model", args.model]
    t0 = time.perf_counter()
    run(common + model + ["--mode", "direct", "--preset", "cpu-demo", "--batch-size", "25",
                  "--label", "base model alone", "--out", str(out / "eval-direct")])
    run(common + model + agent + ["--label", "AgentFlow, untrained planner", "--out", str(out / "eval-untrained")])
    run(common + model + agent + ["--fixed-tool", "Python_Coder", "--label", "AgentFlow, fixed plan: Python_Coder",
                                  "--out", str(out / "eval-fixed")])
    if (out / "train").exists():  # train.py refuses to start a new run over an old one; the demo owns this folder
        print(f"removing the previous demo's training run, {out / 'train'}", flush=True)
        shutil.rmtree(out / "train")
    run([py, "train.py", "--preset", "cpu-demo", "--steps", str(args.steps), "--seed", str(args.seed), "--out", str(out / "train"),
         "--model", args.model, "--checkpoint-every", str(args.steps), "--eval-n", str(min(args.n, preset["eval_n"]))])
    final = out / "train" / "checkpoints" / f"step-{args.steps:06d}"
    run(common + agent + ["--checkpoint", str(final), "--label", "AgentFlow + Flow-GRPO", "--out", str(out / "eval-trained")])

    dirs = [out / "eval-direct", out / "eval-untrained", out / "eval-fixed", out / "eval-trained"]
    markdown, entries = compare(dirs)
    (out / "results.md").write_text(markdown + "\n")
    (out / "results.json").write_text(json.dumps(entries, indent=2) + "\n")
    acc = {d.name: json.loads((d / "summary.json").read_text())["accuracy"] for d in dirs}
    plot(out / "train" / "metrics.jsonl", acc["eval-untrained"], acc["eval-trained"], args.steps, out / "learning_curve.png",
         fixed=acc["eval-fixed"])
    print(f"\nwrote {out / 'results.md'}, {out / 'results.json'}, {out / 'learning_curve.png'} "
          f"in {(time.perf_counter() - t0) / 60:.1f} min\n")
    print(markdown)


if __name__ == "__main__":
    main()
