"""Every command of the README's code blocks runs, shortened, so that none breaks unseen; and each
says how long it takes.

The commands run as the README writes them, in the README's order, in one scratch folder that links
to the repository's files, as if it were the repository (the evaluation of runs/cpu's checkpoint
needs the training run that makes it, and nothing is written into the repository), each with the changes of
its rule in RULES: the tiny random-weight model for the embedded one, 2 questions for 50, one or two
training steps for twenty. A command that no rule knows fails the test: add a rule, or the reason it
cannot run here, when you add a command to the README. The scripts with a main(argv) run in this
process (conftest.run_main: the same main, without a new interpreter's imports); the modules run
with -m start a process each, as written.

Run: python -m pytest -q tests/test_readme.py
"""

import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, run_main

README = (ROOT / "README.md").read_text(encoding="utf-8")
# The README's "to train alone" command: the --checkpoint and --resume commands build on its run.
TRAIN_ALONE = "python train.py --preset cpu --out runs/cpu"
# What every rollout-sized command gets on top: one turn and a few tokens a module on the tiny model.
SMALL = ["--max-turns", "1", "--analysis-tokens", "0", "--planner-tokens", "6", "--executor-tokens", "6",
         "--verifier-tokens", "3", "--generator-tokens", "3"]
DURATION = re.compile(r"\b\d+(\.\d+)?(-\d+(\.\d+)?)?\s?(ms|s|min|minutes?|h|hours?)\b|not yet timed")


def readme_commands(text: str = README) -> list[tuple[str, str]]:
    """(command, comment) of every line of the README's ```bash blocks; continued lines are joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command, _, comment = line.partition(" # ")
            if command.strip():
                commands.append((" ".join(command.split()), comment.strip()))
    return commands


def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with `flag value` in place of the flag's value, or appended when argv lacks it."""
    if flag in argv:
        i = argv.index(flag)
        return argv[:i + 1] + [value] + argv[i + 2:]
    return argv + [flag, value]


def last_checkpoint(argv: list[str], cwd) -> list[str]:
    """--checkpoint RUN/checkpoints/step-N of the README -> the last step the shortened run has."""
    i = argv.index("--checkpoint")
    steps = sorted((cwd / argv[i + 1]).parent.glob("step-*"))
    assert steps, f"{argv[i + 1]}: the run the README makes first has no checkpoint"
    return argv[:i + 1] + [str(steps[-1].relative_to(cwd))] + argv[i + 2:]


def shorten(argv: list[str], tiny: str, cwd) -> list[str] | str:
    """The command as the test runs it, or why it does not run here. argv[0] is the script or -m."""
    script, has = argv[0], set(argv)
    if script == "setup.sh":
        return "installs from the package index: CI runs it (.ci/run)"
    if argv[:3] == ["-m", "pytest", "-q"]:
        return "the suite itself"
    if script == "scripts/gpu_check.sh":
        return "tests/test_gpu_paths.py runs it, and its --cpu mode"
    if "--frozen-engine" in has or argv[:2] == ["serve", "Qwen/Qwen2.5-7B-Instruct"]:
        return "needs a serving engine on a GPU"
    if script == "launch" and "--dry-run" not in has:
        return "needs GPUs and a model from the hub (tests/test_gpu_paths.py runs the same launch on the CPU)"
    if script == "bench.py":
        return "tests/test_bench.py runs it on the tiny model"
    if argv == ["demo.py"]:
        return "tests/test_demo.py runs it on the tiny model"
    if "--checkpoint" in has and "gpu-24gb" in " ".join(argv):
        return "evaluates the GPU run above"
    if script == "train.py" and "--dry-run" in has:
        return argv  # loads nothing: runs as written
    if script == "train.py" and "--resume" in has:
        return set_flag(argv, "--steps", "2")  # one more step than the run it resumes
    if script == "train.py":
        return argv + ["--model", tiny, "--steps", "1", "--checkpoint-every", "1", *SMALL]
    if script == "ask.py":
        return argv + ["--model", tiny, *SMALL]
    if script == "evaluate.py" and "--compare" in has:
        return argv
    if script == "evaluate.py":
        argv = set_flag(argv, "--n", "2")
        argv = last_checkpoint(argv, cwd) if "--checkpoint" in has else argv + ["--model", tiny]
        return argv + SMALL
    if script == "demo.py":
        return argv + ["--model", tiny, "--n", "3", "--steps", "1"]
    if argv[:2] in (["-m", "environment.sandbox"], ["-m", "environment.search"], ["-m", "environment.facts"],
                    ["-m", "environment.tasks"]):
        return argv  # no model: runs as written
    raise AssertionError(f"README command {' '.join(argv)!r} has no rule in tests/test_readme.py: add one")


def split(command: str) -> tuple[dict, list[list[str]]]:
    """('VAR=value' environment, [argv after the program, ...]) of a README line ('a && b' is two)."""
    env, runs = {}, []
    for part in command.split(" && "):
        words = shlex.split(part)
        while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        program, argv = words[0], words[1:]
        assert program in ("python", "bash", "accelerate", "vllm"), f"README runs {program!r}: add it to the test"
        runs.append(argv)
    return env, runs


def test_every_readme_command_says_how_long_it_takes():
    commands = readme_commands()
    assert len(commands) >= 15, commands  # the blocks were found
    missing = [c for c, comment in commands if not DURATION.search(comment)]
    assert not missing, f"README commands without a duration in their comment: {missing}"


def test_every_readme_command_runs_shortened(tiny_model_dir, tmp_path):
    assert TRAIN_ALONE in README, "the README's training command moved: update TRAIN_ALONE"
    for entry in ROOT.iterdir():  # the repository's files, its runs/ and tests/ left out
        if not entry.name.startswith(".") and entry.name not in ("runs", "tests"):
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "snippet.py").write_text("print(6 * 7)\n")  # `python -m environment.sandbox snippet.py`
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran, skipped = [], []
    for command in [TRAIN_ALONE] + [c for c, _ in readme_commands()]:
        extra, runs = split(command)
        for argv in runs:
            todo = shorten(argv, str(tiny_model_dir), tmp_path)
            if isinstance(todo, str):
                skipped.append((" ".join(argv), todo))
                continue
            if todo[0].endswith(".py"):
                res = run_main(todo[0], *todo[1:], cwd=tmp_path, env=extra)
            else:
                res = subprocess.run([sys.executable, *todo], cwd=tmp_path, env={**env, **extra}, capture_output=True,
                                     text=True, timeout=300)
            assert res.returncode == 0, f"README: {command}\nran: {' '.join(todo)}\n{res.stderr[-3000:]}"
            ran.append(" ".join(todo))
    assert len(ran) >= 12, (ran, skipped)  # the CPU commands ran, not only the skipped ones
