"""The scripts' command lines, off the reading path: one flag per config field (`arg`), the settings of how
a script runs its engines (EngineSettings), the rollout sizes that fit the machine (--sizes), and the
--sandbox switch. train.py, evaluate.py and ask.py build on these.

Test:  python -m pytest -q tests/test_cli.py tests/test_evaluate.py
"""

import argparse
from dataclasses import dataclass, field, fields

from environment import sandbox


def arg(default, help: str):
    """A config field with its one-line help: add_arguments makes it a flag."""
    return field(default=default, metadata={"help": help})


@dataclass
class EngineSettings:
    """How a script runs the engines and tools, not what a rollout does: rollout.RolloutConfig extends it,
    and with it config.Config and evaluate.EvalConfig, so train.py, evaluate.py and ask.py share these flags."""

    max_batch: int = arg(16, "rows per batched generate call of an engine; more prompts are split into chunks")
    frozen_dtype: str = arg("auto", "weights of the frozen modules' engine (executor, verifier, generator, Base_Generator): "
                                    "auto = the frozen model's own (train.py: bf16 under Accelerate's bf16, else fp32; "
                                    "evaluate.py: --dtype's), fp32 or bf16 (a second copy, in that dtype; the planner, the "
                                    "KL reference and the layers below --train-layers keep theirs), bf16-if-native "
                                    "(bf16 on a GPU or a CPU with bf16 instructions, avx512_bf16 or amx_bf16; else auto)")
    sandbox: str = arg("", "Python_Coder's isolation: auto (namespaces where the kernel allows, else one line says "
                           "so), strict (refuse to run without), off (a plain subprocess); '' = $AGENTFLOW_SANDBOX, else auto")
    speedups: bool = arg(None, "the speed-ups of speedups/ (tested equal to the plain path): unset = on where they apply "
                               "(one process, a plain KV cache, the tested transformers), else off with one line saying "
                               "why; --speedups / --no-speedups force them")


def add_arguments(parser: argparse.ArgumentParser, cls, **defaults) -> None:
    """One flag per field of the dataclass `cls`, its help from the field. The parsed values stay None
    unless given, so a caller can tell the command line from a preset or the class's default; `defaults`
    are the caller's own defaults where they differ from the class's (shown in --help, applied by it)."""
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = defaults.get(f.name, f.default)
        help = f"{f.metadata.get('help', '')} (default: {default!r})".replace("%", "%%")  # argparse %-formats help
        if f.type in (bool, "bool"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            parser.add_argument(flag, type=type(f.default), default=None, help=help)


# Sizes that fit a CPU: the `cpu` training preset's (config.py; a test keeps the two equal), so a
# checkpoint of that preset is evaluated with the sizes it was trained with. On a CPU every generated
# token costs milliseconds, and RolloutConfig's defaults (and evaluate.EvalConfig's 10 turns, the
# paper's evaluation) cost the embedded 135M model about 5x as much a question, most of it on a query
# analysis and verifier verdicts it cannot use. ask.py and evaluate.py run with these on a CPU
# (--sizes auto) unless a --preset or a size flag says otherwise; --sizes paper keeps the defaults.
CPU_SIZES = dict(max_turns=2, analysis_tokens=0, planner_tokens=24, executor_tokens=40, verifier_tokens=6,
                 generator_tokens=16, memory_chars=600)
SIZES = ("auto", "cpu", "paper")  # the choices of --sizes


def machine_sizes(choice: str, device: str) -> tuple[str, dict]:
    """(name, fields) of the rollout sizes for --sizes `choice` on `device`: CPU_SIZES for 'cpu', or
    for 'auto' on a CPU; no fields (the config class's defaults, the paper's) for 'paper' or a GPU.
    Example: machine_sizes("auto", "cpu") == ("cpu", CPU_SIZES); machine_sizes("auto", "cuda")[1] == {}."""
    if choice not in SIZES:
        raise ValueError(f"--sizes must be one of {', '.join(SIZES)}, got {choice!r}")
    if choice == "cpu" or (choice == "auto" and not str(device).startswith("cuda")):
        return "cpu", dict(CPU_SIZES)
    return "paper", {}


def describe_sizes(cfg, source: str) -> str:
    """The one line a script prints to say which rollout sizes it runs with, where they came from, and
    how to choose others."""
    return (f"sizes ({source}): max_turns {cfg.max_turns}, verify {'on' if cfg.verify else 'off'}, tokens: analysis "
            f"{cfg.analysis_tokens} planner {cfg.planner_tokens} executor {cfg.executor_tokens} verifier "
            f"{cfg.verifier_tokens} generator {cfg.generator_tokens}, memory {cfg.memory_chars} chars "
            "(--sizes cpu|paper, or a size flag, to change)")


def set_sandbox(mode: str) -> None:
    """Apply --sandbox before any work: a bad value, or strict where isolation is unavailable, stops here."""
    try:
        sandbox.set_mode(mode or None)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"--sandbox {mode}: {e}") from None
