"""Probe (issue 24): given turn 1's true finding, how often does Python_Coder (the frozen 135M executor,
or the arithmetic shortcut) get a fact-then-sum question right, for each kind of sub-goal a planner
might write at turn 2? 24 training questions, greedy. Run: python results/plan/probes/exec_probe.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import environment.tasks as T
from bookkeeping.models import load_model
from config import PRESETS, Config
from engine import HFEngine
from environment.scoring import score
from rollout import Trajectory, Turn, execute
from tools import Toolbox

m, tok = load_model()
eng = HFEngine(m, tok, max_batch=64)
ex = [e for e in T.load("planning", "train") if e["kind"] == "fact-then-sum"][:24]
tb = Toolbox(("Python_Coder", "Fact_Lookup"))
finds = tb.run([("Fact_Lookup", e["sub_goals"][0]) for e in ex])  # "birth year of X: 1852"
variants = {  # name: (sub-goal, context) from the example and the finding
    "the sum, hand-written ('23 + 1852')": (lambda e, f: e["sub_goals"][1], lambda e, f: ""),
    "the finding copied": (lambda e, f: f, lambda e, f: ""),
    "'Found ' and the finding (the trained planner's turn-2 form)": (lambda e, f: "Found " + f, lambda e, f: ""),
    "the same cut at 16 tokens (--planner-tokens 16)": (lambda e, f: tok.decode(tok("Found " + f)["input_ids"][:16]), lambda e, f: ""),
    "the bare value ('1852')": (lambda e, f: f.split(": ")[-1], lambda e, f: ""),
    "the question": (lambda e, f: e["query"], lambda e, f: ""),
    "the question, the finding as context": (lambda e, f: e["query"], lambda e, f: f),
}
cfg = Config(**PRESETS["cpu-plan"])  # its executor_tokens, as in training
for name, (sub_goal, context) in variants.items():
    # The rollout's own step 3 (rollout.execute) turns each turn-2 action into Python_Coder's command.
    trajs = [Trajectory(e["query"], turns=[Turn([], [], [], "", "Python_Coder", sub_goal(e, f), context(e, f), True, False)])
             for e, f in zip(ex, finds)]
    execute(trajs, eng, cfg)
    results = tb.run([("Python_Coder", tr.turns[-1].command) for tr in trajs])
    print(f"{name}: {sum(score(r.strip(), e) == 1 for r, e in zip(results, ex))} of {len(ex)} right")
