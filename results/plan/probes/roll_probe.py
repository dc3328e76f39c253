"""Probe (issue 24): untrained rollouts of the cpu-plan preset on training questions of each kind (G of
each): how many succeed, and which tool sequences they took. Run: python results/plan/probes/roll_probe.py
"{'tools': 'Fact_Lookup,Python_Coder,Done'}" 8   (preset overrides, questions a kind)"""
import ast
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import speedups, environment.tasks as T
from environment import scoring
from bookkeeping.models import load_model
from config import Config, PRESETS
from tools import Toolbox
from rollout import rollout
kw = dict(PRESETS['cpu-plan']); kw.update(ast.literal_eval(sys.argv[1]) if len(sys.argv) > 1 else {})
nq = int(sys.argv[2]) if len(sys.argv) > 2 else 8
cfg = Config(**{k: v for k, v in kw.items()})
m, tok = load_model()
eng = speedups.FastEngine(m, tok, max_batch=64)
tb = Toolbox(cfg.tool_names(), llm=eng)
torch.manual_seed(0)
allx = T.load('planning', 'train')
for kind in ('two-hop', 'fact-then-sum', 'fact', 'calculation'):
    ex = [e for e in allx if e['kind'] == kind][:nq]
    G = cfg.group_size
    trajs = rollout([e['query'] for e in ex for _ in range(G)], eng, eng, tb, cfg, examples=[e for e in ex for _ in range(G)])
    seqs = collections.Counter(); wins = collections.Counter()
    for tr in trajs:
        s = '-'.join(t.tool for t in tr.turns); r = scoring.score(tr.final_output, tr.example)
        seqs[s] += 1; wins[s] += r; tr.reward = r
    groups = sum(any(trajs[i * G + j].reward for j in range(G)) for i in range(len(ex)))
    print(kind, 'success', sum(wins.values()), '/', len(trajs), 'groups with a success', groups, '/', len(ex))
    print('   ', {s: (seqs[s], int(wins[s])) for s in seqs})
    right = [tr for tr in trajs if '-'.join(t.tool for t in tr.turns) == '-'.join(tr.example['tools'])]
    for tr in right[:4]:
        print('    ', [t.sub_goal[:50] for t in tr.turns], '->', tr.answer[:30], tr.reward)
