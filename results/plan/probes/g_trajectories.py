"""One multi-step test question's G trajectories, sampled as in training (the preset's rollout, the
planner at its temperature, the frozen modules greedy), with the untrained planner and with a trained
checkpoint: what the turns wrote and what each step found.

Run: python results/plan/probes/g_trajectories.py runs/plan/checkpoints/step-000030 [test question id]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import speedups
import environment.tasks as T
from bookkeeping.models import load_model
from config import PRESETS, Config
from evaluate import resolve_checkpoint
from environment import scoring
from rollout import rollout
from tools import Toolbox

checkpoint = sys.argv[1]
qid = sys.argv[2] if len(sys.argv) > 2 else "two-hop-test-250"
cfg = Config(**PRESETS["cpu-plan"])
example = next((e for e in T.load("planning", "test") if e["id"] == qid), None)
if example is None:
    sys.exit(f"no test question with id {qid!r} in the planning suite")
frozen = speedups.FastEngine(*load_model(), max_batch=64)
toolbox = Toolbox(cfg.tool_names(), llm=frozen)
print(f"{example['query']}   (gold {example['answer']}; right plan {' then '.join(example['tools'])})")
for name, source in (("untrained", None), ("trained", checkpoint)):
    planner = frozen if source is None else speedups.FastEngine(*load_model(str(resolve_checkpoint(source)[0])), max_batch=64)
    torch.manual_seed(0)
    trajs = rollout([example["query"]] * cfg.group_size, planner, frozen, toolbox, cfg, examples=[example] * cfg.group_size)
    rewards = [scoring.score(tr.final_output, example) for tr in trajs]
    print(f"\n{name}: {int(sum(rewards))} of {len(trajs)} right")
    for tr, r in zip(trajs, rewards):
        steps = "  |  ".join(f"{t.tool} {t.sub_goal[:44]!r} -> {t.result.strip()[:44]!r}" if t.result else t.tool
                             for t in tr.turns)
        print(f"  {'right' if r else 'wrong'}  {steps}  =>  {tr.answer[:30]!r}")
