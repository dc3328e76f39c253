"""Probe (issue 24): given turn 1's true finding, how often does Python_Coder (the frozen 135M executor,
or the arithmetic shortcut) get a fact-then-sum question right, for each kind of sub-goal a planner
might write at turn 2? 24 training questions, greedy. Run: python results/plan/probes/exec_probe.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import modules
import environment.tasks as T
from bookkeeping.models import load_model
from engine import HFEngine
from environment.scoring import score
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
prefix, stop = modules.executor_prefix("Python_Coder"), modules.executor_stop("Python_Coder")
for name, (sub_goal, context) in variants.items():
    subs = [sub_goal(e, f) for e, f in zip(ex, finds)]
    chats = [modules.executor_prompt(e["query"], "Python_Coder", s, context(e, f)) for e, s, f in zip(ex, subs, finds)]
    gens = eng.generate(chats, max_new_tokens=24, temperature=0.0, prefix=prefix, stop=stop)
    cmds = [f"print({modules.arithmetic_in(s)})" if modules.arithmetic_in(s) else modules.parse_command(prefix + g.text, "Python_Coder")
            for s, g in zip(subs, gens)]
    results = tb.run([("Python_Coder", c) for c in cmds])
    print(f"{name}: {sum(score(r.strip(), e) == 1 for r, e in zip(results, ex))} of {len(ex)} right")
