"""Probe (issue 24): where one rollout step of the cpu-plan preset spends its time. The first training
question of each kind in the preset's --kinds, G each, the untrained planner, rolled out twice; the
seconds of each batched phase (Trajectory.seconds). Run: python results/plan/probes/phases.py"""
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import environment.tasks as T  # noqa: E402
import speedups  # noqa: E402
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
torch.manual_seed(0)
for _ in range(2):
    t0 = time.perf_counter()
    trajs = rollout([e["query"] for e in examples], engine, engine, toolbox, cfg, examples=examples)
    phases = collections.defaultdict(float)
    for tr in trajs:  # every trajectory of a batched call carries the call's whole time
        for phase, seconds in tr.seconds.items():
            phases[phase] = max(phases[phase], seconds)
    print(f"{len(trajs)} trajectories in {time.perf_counter() - t0:.1f} s:",
          ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in phases.items()))
