"""Probe (issue 24): is one rollout the same when run twice from the same seed? 12 training questions
(3 of each kind), G 6, the cpu-plan preset, the untrained planner; each rollout's planner texts, commands,
results and answers hashed, and all of them written to OUT as JSON. Run in two processes to compare
across them. Run: python results/plan/probes/determinism.py OUT.json"""
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch, speedups, environment.tasks as T
from bookkeeping.models import load_model
from config import Config, PRESETS
from tools import Toolbox
from rollout import rollout
cfg = Config(**PRESETS['cpu-plan'])
m, tok = load_model()
eng = speedups.FastEngine(m, tok, max_batch=64)
tb = Toolbox(cfg.tool_names(), llm=eng)
allx = T.load('planning', 'train')
ex = []
for kind in ('calculation', 'fact', 'fact-then-sum', 'two-hop'):
    ex += [e for e in allx if e['kind'] == kind][:3]
out = []
for rep in range(2):
    torch.manual_seed(0)
    trajs = rollout([e['query'] for e in ex for _ in range(6)], eng, eng, tb, cfg, examples=[e for e in ex for _ in range(6)])
    rec = [[(t.planner_text, t.command, t.result) for t in tr.turns] + [tr.answer] for tr in trajs]
    out.append(rec)
    print(rep, hashlib.md5(json.dumps(rec).encode()).hexdigest(), flush=True)
json.dump(out, open(sys.argv[1], 'w'))
