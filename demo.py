"""The CPU demo: Flow-GRPO trains the embedded agent's planner in its own loop, on 2 CPU cores.

Two presets (config.py): cpu-plan (the default), two turns whose actions are a tool and a sub-goal each,
Done to stop, so that a sub-goal must carry one step's result into the next tool call; cpu-route, one
turn whose action is the tool alone (it learns to route: README). Under cpu-plan the tool is drawn
calibrated (--calibrate-tools, bookkeeping/tool_choice.py).

On N test questions of the planning suite (environment/planning.py: calculations and facts, one step
each, and three multi-step kinds, fact-then-sum, two-hop and sum-then-fact, whose step 2 needs what
step 1 found; sum-then-fact's step 1 is Python_Coder), the same questions for every row:

    1. base model alone      evaluate.py --mode direct       no tools
    2. AgentFlow             evaluate.py --mode agent        the untrained planner
    3. fixed plans           evaluate.py --fixed-tool A,B    no planner: every fixed sequence of the
                                                             planner's tools up to max_turns, the
                                                             question as sub-goal, then Done
    4. oracle router         evaluate.py --oracle router     the right first tool, one turn
    5. oracle planner        evaluate.py --oracle planner    the right tools AND hand-written sub-goals:
                                                             the ceiling of the frozen modules and tools
    6. Flow-GRPO             train.py --preset PRESET        the planner trained in the live loop
    7. last-turn credit      train.py ... --credit last      the same run, the advantage given only to
                                                             each trajectory's last turn (the ablation;
                                                             with more than one turn only)
    8. the trained agents    evaluate.py --checkpoint        rows 6 and 7 evaluated
    9. the table: accuracy with Wilson 95% intervals per kind and for all, and the trained agent minus
       each row, paired on the same questions (evaluate.py --compare); the learning curve of both runs
       (the greedy test accuracy during training on the runs' eval_n questions: step 0 and the last
       step are rows 2 and 8 on those questions, which train.py --no-eval-ends leaves to them);
       the training speed in trajectories a minute; and, with more than one turn, one multi-step question
       of each kind with its G trajectories sampled as in training, untrained and trained
       (trajectories.txt: what each turn's sub-goal carried into the next tool call)

Every step is one of the project's own commands, printed before it runs, so each row of the table can
be reproduced alone. They run as jobs on two processes side by side (--workers), each with half the
threads, the longest first (each training run with its evaluation, then the baselines); each job's
output goes to OUT/logs/. `--baselines skip` takes rows 1-5 from an earlier run in the same folder;
`--ablation skip` leaves row 7 out.

Run:   python demo.py                      (writes runs/demo/: results.md, results.json, learning_curve.png,
                                            learning_curve.json, trajectories.txt, timing.json)
       python demo.py --n 20 --steps 4     (a quick look)
       python demo.py --preset cpu-route   (the one-turn routing demo)
"""

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import evaluate  # noqa: E402
import train  # noqa: E402
from environment import tasks  # noqa: E402
from evaluate import compare  # noqa: E402
from config import PRESETS  # noqa: E402

BASE, UNTRAINED, FIXED = "base model alone", "AgentFlow, untrained planner", "AgentFlow, fixed plan: "
ROUTER, ORACLE = "AgentFlow, oracle router (one turn)", "AgentFlow, oracle planner (hand-written sub-goals)"
LAST, TRAINED = "AgentFlow + Flow-GRPO, last-turn credit", "AgentFlow + Flow-GRPO"


def fixed_plans(tools, max_turns: int) -> list[tuple]:
    """Every sequence of the planner's tools (Done left out) of 1 .. max_turns steps."""
    steps = [t for t in tools if t != "Done"]
    return [plan for n in range(1, max_turns + 1) for plan in itertools.product(steps, repeat=n)]


MAINS = {"evaluate.py": evaluate.main, "train.py": train.main}


def run_job(job) -> dict:
    """Run a job's commands one after another, each its script's main() in this process: the same code
    path as the command (each main seeds torch itself), without importing torch and transformers again
    per row. `job` = ([(name, command)], log): with a log file (a worker of the pool), each command's
    line goes to the demo's output and what the command prints to the log. Returns {name: seconds}."""
    commands, log = job
    seconds = {}
    with open(log, "w") if log else contextlib.nullcontext() as f:
        for name, cmd in commands:
            print("$ python " + " ".join(cmd) + (f"   (its output: {log})" if log else ""), flush=True)
            t0 = time.perf_counter()
            if f:
                saved = os.dup(1), os.dup(2)
                os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)  # file descriptors: tqdm and C-level output too
            try:
                MAINS[cmd[0]](cmd[1:])
            finally:
                if f:
                    sys.stdout.flush(), sys.stderr.flush()
                    os.dup2(saved[0], 1), os.dup2(saved[1], 2)
                    os.close(saved[0]), os.close(saved[1])
            seconds[name] = time.perf_counter() - t0
            print(f"  ({seconds[name]:.0f} s: {name})", flush=True)
    return seconds


def run_jobs(jobs, workers: int) -> dict:
    """Run the jobs, in this process (one worker) or on a pool of `workers` processes that split this
    process's threads between them, longest job first (the list's order). On 2 CPU cores a decode step
    of one row-batch leaves the second core mostly idle, so two processes of one thread each get more
    done: at 3b1d7b0 the demo took 45.7 min so, against 50.9 one after another
    (results/plan/history.md). Returns {name: seconds} over every job."""
    seconds = {}
    if workers <= 1:
        for commands, _ in jobs:
            seconds |= run_job((commands, None))
        return seconds
    threads = max(1, torch.get_num_threads() // workers)
    print(f"{len(jobs)} jobs on {workers} processes of {threads} thread(s) each, side by side", flush=True)
    with multiprocessing.get_context("spawn").Pool(workers, torch.set_num_threads, (threads,)) as pool:
        for done in pool.imap_unordered(run_job, jobs):
            seconds |= done
    return seconds


def learning_curve(metrics_path: Path, untrained: Path, trained: Path, questions) -> list[tuple[int, float]]:
    """A training run's greedy test accuracy on its eval_n `questions`, [(step, accuracy)]: the steps in
    between from train.py's metrics, step 0 and the last step from the evaluations of the untrained and
    the trained planner (rows 2 and 8) on those questions, among the demo's. Both are the greedy rollout
    that train.py would run there, so the demo runs it once (train.py --no-eval-ends; in the two demos
    before this one the two gave the same accuracy). An end is left out where its evaluation is missing
    or lacks one of the questions."""
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    middle = [(m["step"], m["test_accuracy"]) for m in lines if "test_accuracy" in m]
    ends = []
    for step, folder in ((0, untrained), (max((m["step"] for m in lines), default=0), trained)):
        if (folder / "results.jsonl").is_file():
            score = {r["id"]: r["score"] for r in map(json.loads, (folder / "results.jsonl").read_text().splitlines())}
            if all(q["id"] in score for q in questions):
                ends.append((step, sum(score[q["id"]] for q in questions) / len(questions)))
    return sorted(dict(middle + ends).items())


def plot(runs: dict, accuracy: dict, final_step: int, path: Path):
    """Per training run (broadcast credit, last-turn credit), {name: (metrics.jsonl, learning_curve, eval_n)}:
    the training reward per step and the test accuracy during training; each baseline's accuracy on all
    the demo's questions as a line."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for (name, (metrics_path, tests, n)), color in zip(runs.items(), ("tab:blue", "tab:orange")):
        lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
        steps = [m["step"] for m in lines if "reward_mean" in m]
        ax.plot(steps, [m["reward_mean"] for m in lines if "reward_mean" in m], color=color, alpha=0.35,
                label=f"{name}: training reward (batch mean)")
        if tests:
            ax.plot(*zip(*tests), "o--", color=color, label=f"{name}: test accuracy during training ({n} questions, greedy)")
    fixed = {k: v for k, v in accuracy.items() if k.startswith(FIXED)}
    styles = {BASE: ("black", ":"), UNTRAINED: ("tab:red", ":"), ROUTER: ("tab:green", "-."), ORACLE: ("tab:green", "--")}
    if fixed:
        styles[max(fixed, key=fixed.get)] = ("tab:gray", "-.")
    for name, (color, style) in styles.items():
        if name in accuracy:
            ax.axhline(accuracy[name], color=color, linestyle=style, linewidth=1.2,
                       label=f"{name}: {100 * accuracy[name]:.0f}%" + (" (best fixed plan)" if name in fixed else ""))
    ax.set_xlabel("training step")
    ax.set_ylabel("reward / accuracy")
    ax.set_xlim(0, max(final_step, 1))
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Flow-GRPO on SmolLM2-135M-Instruct, 2 CPU cores: the planning suite")
    ax.legend(fontsize=6.5, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def trajectories_per_minute(metrics_path: Path) -> float:
    """Training trajectories rolled out and trained on per minute of rollout + update time."""
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    steps = [m for m in lines if "reward_mean" in m]
    seconds = sum(m.get("rollout_s", 0) + m.get("update_s", 0) for m in steps)
    return 60 * sum(m.get("trajectories", 0) for m in steps) / seconds if seconds else 0.0


def before_and_after(data: str, n: int, seed: int, preset: str, model: str, checkpoint: Path, path: Path):
    """The first multi-step question of each kind among the demo's, its G trajectories sampled as in
    training (the preset's rollout: the planner at its temperatures, the frozen modules greedy), with the
    untrained planner and with the trained one; written to `path` as text, one line a trajectory: each
    turn's tool, the sub-goal it wrote, and what the tool found with it."""
    import speedups
    from bookkeeping.models import frozen_modules_model, load_model
    from config import Config
    from environment import planning, scoring, tasks
    from rollout import rollout
    from tools import Toolbox

    cfg = Config(**{**PRESETS[preset], "model": model})
    examples = tasks.load(data, n=n, seed=seed)
    picks = [next(e for e in examples if e.get("kind") == k) for k in planning.MULTI_STEP
             if any(e.get("kind") == k for e in examples)]
    initial, tokenizer = load_model(model)
    on, _ = speedups.choose(None, initial)
    untrained = speedups.engine(initial, tokenizer, on, cfg.max_batch)
    trained = speedups.engine(*load_model(str(evaluate.resolve_checkpoint(str(checkpoint))[0])), on, cfg.max_batch)
    frozen = speedups.engine(frozen_modules_model(model, initial, cfg.frozen_dtype), tokenizer, on, cfg.max_batch)
    toolbox = Toolbox(cfg.tool_names(), llm=frozen)
    lines = []
    for ex in picks:
        lines.append(f"{ex['query']}   (gold {ex['answer']}; right plan: "
                     + " then ".join(f"{tool} {goal!r}" for tool, goal in zip(ex["tools"], ex["sub_goals"])) + ")")
        for name, planner in (("untrained", untrained), ("trained", trained)):
            torch.manual_seed(seed)
            trajs = rollout([ex["query"]] * cfg.group_size, planner, frozen, toolbox, cfg, examples=[ex] * cfg.group_size)
            rewards = [scoring.score(tr.final_output, ex) for tr in trajs]
            lines.append(f"  {name}: {int(sum(rewards))} of {len(trajs)} right")
            for tr, r in zip(trajs, rewards):
                steps = "  |  ".join(f"{t.tool} {t.sub_goal[:44]!r} -> {t.result.strip()[:44]!r}" if t.command else t.tool
                                     for t in tr.turns)
                lines.append(f"    {'right' if r else 'wrong'}  {steps}  =>  {tr.answer[:30]!r}")
        lines.append("")
    path.write_text("\n".join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=("cpu-plan", "cpu-route"), default="cpu-plan",
                   help="cpu-plan: two turns, a tool and a sub-goal each, Done to stop (the multi-step planner); "
                        "cpu-route: one turn, the tool as the action")
    p.add_argument("--out", default="", help="output folder (default: runs/demo, or runs/demo-cpu-route)")
    p.add_argument("--n", type=int, default=100, help="test questions of the demo's suite, the same for every row")
    p.add_argument("--data", help="the suite (default: the preset's, planning)")
    p.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="the model of every row (default: the preset's, the embedded one)")
    p.add_argument("--baselines", choices=("all", "skip", "only"), default="all",
                   help="rows 1-5 (the base model, the untrained planner, the fixed plans and the two oracles): run "
                        "them (all), take them from an earlier run in --out (skip), or run only them (only)")
    p.add_argument("--ablation", choices=("auto", "run", "skip"), default="auto",
                   help="the same training run with --credit last (the advantage on each trajectory's last turn "
                        "only); auto = run it when the preset has more than one turn")
    p.add_argument("--workers", type=int, default=2,
                   help="processes that run the demo's commands side by side, splitting the threads (1 = one after "
                        "another in this process, on every thread)")
    pre, _ = p.parse_known_args(argv)
    preset = PRESETS[pre.preset]
    p.set_defaults(data=preset["data"], steps=preset["steps"], model=preset["model"])
    args = p.parse_args(argv)
    out = Path(args.out or ("runs/demo" if args.preset == "cpu-plan" else f"runs/demo-{args.preset}"))
    ablation = args.ablation == "run" or (args.ablation == "auto" and preset["max_turns"] > 1)
    # The agent is evaluated with the rollout sizes it is trained with (evaluate.py --preset), planner greedy.
    agent = ["--mode", "agent", "--preset", args.preset, "--batch-size", "50"]
    common = ["evaluate.py", "--data", args.data, "--n", str(args.n), "--seed", str(args.seed)]
    model = ["--model", args.model]
    logs = out / "logs"  # with several workers: each job's output
    eval_n = min(args.n, preset["eval_n"])  # the training runs' test questions, all among the demo's n
    rows = []  # (name in the plot, output folder), in the table's order: the trained agent last

    def evaluation(name, folder, extra):
        rows.append((name, out / folder))
        return name, common + extra + ["--label", name, "--out", str(out / folder)]

    t0 = time.perf_counter()
    baselines = [(BASE, "eval-direct", ["--mode", "direct", "--preset", args.preset, "--batch-size", "50"]),
                 (UNTRAINED, "eval-untrained", agent)]
    baselines += [(FIXED + " then ".join(plan), "eval-fixed-" + "-".join(plan), agent + ["--fixed-tool", ",".join(plan)])
                  for plan in fixed_plans(preset["tools"].split(","), preset["max_turns"])]
    baselines += [(ROUTER, "eval-oracle-router", agent + ["--oracle", "router"]),
                  (ORACLE, "eval-oracle-planner", agent + ["--oracle", "planner"])]
    jobs = []  # ([(name, command)], log), longest first: each training run and its evaluation, then each baseline
    for name, folder, extra in baselines:
        if args.baselines != "skip":
            jobs.append(([evaluation(name, folder, model + extra)], logs / f"{folder}.txt"))
        elif (out / folder / "summary.json").is_file():  # run before in this folder, on the same questions
            print(f"(the table takes {name} from {out / folder})", flush=True)
            rows.append((name, out / folder))
    runs = {}
    if args.baselines != "only":
        runs = {"broadcast": (TRAINED, "train", [])}
        if ablation:
            runs = {"last-turn credit": (LAST, "train-last", ["--credit", "last"]), **runs}  # the trained agent stays last
    for name, folder, extra in runs.values():  # each put first: the broadcast run, the longest job, leads
        if (out / folder).exists():  # train.py refuses to start a new run over an old one; the demo owns this folder
            print(f"removing the previous demo's training run, {out / folder}", flush=True)
            shutil.rmtree(out / folder)
        training = ["train.py", "--preset", args.preset, "--data", args.data, "--steps", str(args.steps),
                    "--seed", str(args.seed), "--out", str(out / folder), "--model", args.model,
                    "--checkpoint-every", str(args.steps), "--eval-n", str(eval_n), "--no-eval-ends", *extra]
        final = out / folder / "checkpoints" / f"step-{args.steps:06d}"
        jobs.insert(0, ([(f"training ({name})", training), evaluation(name, "eval-" + folder, agent + ["--checkpoint", str(final)])],
                        logs / f"{folder}.txt"))
    rows.sort(key=lambda row: {LAST: 1, TRAINED: 2}.get(row[0], 0))  # stable: the baselines keep their order
    logs.mkdir(parents=True, exist_ok=True)
    seconds = run_jobs(jobs, min(args.workers, len(jobs)))
    if args.baselines == "only":
        print(f"baselines in {out} in {(time.perf_counter() - t0) / 60:.1f} min; now `python demo.py` shows them")
        return

    # The trained agent is the last folder: --compare's last column is it minus each row, paired.
    markdown, entries = compare([folder for _, folder in rows])
    speed = {name: trajectories_per_minute(out / folder / "metrics.jsonl") for name, (_, folder, _) in runs.items()}
    markdown += "\n\ntraining: " + ", ".join(f"{name} {v:.1f} trajectories a minute" for name, v in speed.items())
    questions = tasks.load(args.data, split="test", n=eval_n, seed=args.seed)  # train.py's (scaleout/launch.py)
    curves = {name: learning_curve(out / folder / "metrics.jsonl", out / "eval-untrained", out / f"eval-{folder}", questions)
              for name, (_, folder, _) in runs.items()}
    markdown += f"\n\ngreedy test accuracy during training ({eval_n} of the questions), (step, accuracy): " + "; ".join(
        f"{name} " + ", ".join(f"({step}, {acc:.3f})" for step, acc in curve) for name, curve in curves.items())
    (out / "results.md").write_text(markdown + "\n")
    (out / "results.json").write_text(json.dumps(entries, indent=2) + "\n")
    (out / "learning_curve.json").write_text(json.dumps({"questions": eval_n, **curves}, indent=2) + "\n")
    accuracy = {name: json.loads((folder / "summary.json").read_text())["accuracy"] for name, folder in rows}
    plot({name: (out / folder / "metrics.jsonl", curves[name], eval_n) for name, (_, folder, _) in runs.items()},
         accuracy, args.steps, out / "learning_curve.png")
    if preset["max_turns"] > 1:  # what the trained sub-goals carry from one step into the next
        t1 = time.perf_counter()
        before_and_after(args.data, args.n, args.seed, args.preset, args.model,
                         out / "train" / "checkpoints" / f"step-{args.steps:06d}", out / "trajectories.txt")
        seconds["trajectories before and after"] = time.perf_counter() - t1
    minutes = (time.perf_counter() - t0) / 60
    timing = ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items())
    (out / "timing.json").write_text(json.dumps({"minutes": minutes, "workers": args.workers, "seconds": seconds,
                                                 "trajectories_per_minute": speed}, indent=2) + "\n")
    print(f"\nwrote {out / 'results.md'}, {out / 'results.json'}, {out / 'learning_curve.png'} in {minutes:.1f} min "
          f"({timing})\n")
    print(markdown)


if __name__ == "__main__":
    main()
