"""The untrained planner's tool token, read without sampling: per kind of question, the logit of each
tool's first token after "Tool Name:" minus Fact_Lookup's, at turn 1 and at turn 2 (after a step of
Fact_Lookup with the question as its sub-goal), with the tools in both orders, before and after
--calibrate-tools' offsets (bookkeeping/tool_choice.tool_offsets). A gap that follows the list's order
and not the kind is position; what calibration leaves is the question's own pull.

Run: python results/plan/probes/position.py [questions a kind, default 12]"""
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import modules
import environment.tasks as T
from bookkeeping.models import load_model
from bookkeeping.tool_choice import choice_logits, tool_offsets
from config import PRESETS, Config
from engine import HFEngine
from memory import Memory
from rollout import tool_choice_tokens
from tools import Toolbox

n = int(sys.argv[1]) if len(sys.argv) > 1 else 12
cfg = Config(**PRESETS["cpu-plan"])
engine = HFEngine(*load_model())
engine.model.eval()
by_kind = defaultdict(list)
for e in T.load("planning", "test"):
    by_kind[e["kind"]].append(e)
lookup = Toolbox(("Fact_Lookup",))
for order in (("Fact_Lookup", "Python_Coder", "Done"), ("Python_Coder", "Fact_Lookup", "Done")):
    choices = tool_choice_tokens(engine.tokenizer, order)
    offsets = tool_offsets(engine, order, choices, cfg)
    print(f"order {', '.join(order)}; logit minus Fact_Lookup's, mean over {n} test questions a kind: raw / calibrated")
    for kind, examples in by_kind.items():
        cells = []
        for t in (1, 2):
            offered = [(c, name) for c, name in zip(choices, order) if t > 1 or name != "Done"]
            raw = []
            for e in examples[:n]:
                memory = Memory()
                if t == 2:
                    command = e["query"] + " | " + e["query"]
                    memory.add("Fact_Lookup", e["query"], command, lookup.run([("Fact_Lookup", command)])[0])
                chat = modules.planner_prompt(e["query"], "", order, memory, cfg.memory_chars)
                raw.append(choice_logits(engine, chat, modules.PLANNER_PREFIX, [c for c, _ in offered]))
            z = torch.tensor(raw).mean(0)
            cal = z + torch.tensor([offsets[t][c] for c, _ in offered])
            fl = [name for _, name in offered].index("Fact_Lookup")
            cells.append(f"turn {t}: " + ", ".join(f"{name} {float(z[i] - z[fl]):+.1f} / {float(cal[i] - cal[fl]):+.1f}"
                                                   for i, (_, name) in enumerate(offered) if name != "Fact_Lookup"))
        print(f"  {kind:14s} " + "   ".join(cells))
