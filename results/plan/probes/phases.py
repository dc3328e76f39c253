"""Probe (issue 24): where one rollout step of the cpu-plan preset spends its time. The first training
question of each kind in the preset's --kinds, G each, the untrained planner, rolled out twice; the
seconds of each batched phase (Trajectory.seconds), and of each `generate` call: its rows, the prompt
tokens the prefix tree computes (speedups/prefill.py), the seconds of its prefill and in all.
Run: python results/plan/probes/phases.py   (OMP_NUM_THREADS=1 for the demo's one thread a process)"""
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import environment.tasks as T  # noqa: E402
import speedups  # noqa: E402
from speedups import generate, prefill  # noqa: E402
from bookkeeping.models import load_model  # noqa: E402
from config import PRESETS, Config  # noqa: E402
from rollout import rollout  # noqa: E402
from tools import Toolbox  # noqa: E402

cfg = Config(**PRESETS["cpu-plan"])
model, tokenizer = load_model()
engine = speedups.FastEngine(model, tokenizer, max_batch=cfg.max_batch)
toolbox = Toolbox(cfg.tool_names(), llm=engine)
train = T.load("planning", "train")
picked = []
for kind in cfg.kind_names():  # a kind listed twice gets its next question
    picked.append(next(e for e in train if e["kind"] == kind and e not in picked))
examples = [e for e in picked for _ in range(cfg.group_size)]
calls = []  # per generate call: rows, prompt tokens computed, prefill seconds, seconds in all


def timed_prefill(model, prompts, pad, room, plain=prefill.prefill):
    t0 = time.perf_counter()
    out = plain(model, prompts, pad, room)
    seconds = time.perf_counter() - t0  # the tree is built again below, outside the time
    nodes, _ = prefill.prefix_tree(prompts)
    calls.append([len(prompts), sum(n.end - n.start for n in nodes), seconds, 0.0])
    return out


def timed_call(self, prompts, *args, plain=generate.FastEngine.generate_ids, **kwargs):
    t0 = time.perf_counter()
    out = plain(self, prompts, *args, **kwargs)
    calls[-1][3] = time.perf_counter() - t0
    return out


generate.prefill, generate.FastEngine.generate_ids = timed_prefill, timed_call
torch.manual_seed(0)
for _ in range(2):
    calls.clear()
    t0 = time.perf_counter()
    trajs = rollout([e["query"] for e in examples], engine, engine, toolbox, cfg, examples=examples)
    phases = collections.defaultdict(float)
    for tr in trajs:  # every trajectory of a batched call carries the call's whole time
        for phase, seconds in tr.seconds.items():
            phases[phase] = max(phases[phase], seconds)
    print(f"{len(trajs)} trajectories in {time.perf_counter() - t0:.1f} s:",
          ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in phases.items()))
    for rows, tokens, prefill_s, total_s in calls:
        print(f"  a call of {rows} rows: {tokens} prompt tokens computed, prefill {prefill_s:.1f} s, {total_s:.1f} s in all")
