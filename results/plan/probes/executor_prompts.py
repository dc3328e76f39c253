"""Probe (issue 24): can a reworded executor prompt let Python_Coder make the sum from what a turn-2
sub-goal carries? exec_probe's 24 fact-then-sum training questions with turn 1's true finding, for the
sub-goals "Found " + finding, the finding, the bare value and the hand-written sum; and 24 training
calculations that are word problems (no arithmetic in the question: they go to the executor), with the
question as sub-goal. Greedy. Run: python results/plan/probes/executor_prompts.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import environment.tasks as T  # noqa: E402
import modules  # noqa: E402
from bookkeeping.models import load_model  # noqa: E402
from config import PRESETS, Config  # noqa: E402
from engine import HFEngine  # noqa: E402
from environment.scoring import score  # noqa: E402
from rollout import Trajectory, Turn, execute  # noqa: E402
from tools import Toolbox, render_for_executor  # noqa: E402

as_is = modules.executor_prompt
ASK = "Write one line of Python that prints the answer."
PROMPTS = {  # name: (query, tool, sub_goal, context) -> chat
    "the code's prompt": as_is,
    "the sub-goal after the tool's card": lambda q, tool, sg, c: modules.chat(
        "You write Python code.", f"Question: {q}\n{render_for_executor(tool)}\nSub-Goal: {sg}\n{ASK}"),
    "asking for the numbers of the question and the sub-goal": lambda q, tool, sg, c: modules.chat(
        "You write Python code.", f"Question: {q}\nSub-Goal: {sg}\n{render_for_executor(tool)}\n"
        "Write one line of Python that prints the answer, with the numbers of the question and of the sub-goal."),
    "the sub-goal labelled 'Known:'": lambda q, tool, sg, c: modules.chat(
        "You write Python code.", f"Question: {q}\nKnown: {sg}\n{render_for_executor(tool)}\n{ASK}"),
}
SUB_GOALS = {"'Found ' + finding": lambda e, f: "Found " + f, "the finding": lambda e, f: f,
             "the bare value": lambda e, f: f.split(": ")[-1], "the hand-written sum": lambda e, f: e["sub_goals"][1]}

m, tok = load_model()
eng = HFEngine(m, tok, max_batch=64)
train = T.load("planning", "train")
sums = [e for e in train if e["kind"] == "fact-then-sum"][:24]
words = [e for e in train if e["kind"] == "calculation" and not modules.arithmetic_in(e["query"])][:24]
tb = Toolbox(("Python_Coder", "Fact_Lookup"))
finds = tb.run([("Fact_Lookup", e["sub_goals"][0]) for e in sums])  # "founding year of X: 1852"
cfg = Config(**PRESETS["cpu-plan"])


def right(examples, sub_goals) -> int:
    trajs = [Trajectory(e["query"], turns=[Turn([], [], [], "", "Python_Coder", sg, "", True, False)])
             for e, sg in zip(examples, sub_goals)]
    execute(trajs, eng, cfg)  # the rollout's own step 3, with the patched prompt
    results = tb.run([("Python_Coder", tr.turns[-1].command) for tr in trajs])
    return sum(score(r.strip(), e) == 1 for r, e in zip(results, examples))


for name, prompt in PROMPTS.items():
    modules.executor_prompt = prompt
    fts = ", ".join(f"{sg} {right(sums, [make(e, f) for e, f in zip(sums, finds)])}" for sg, make in SUB_GOALS.items())
    print(f"{name}: fact-then-sum of {len(sums)}: {fts}; word problems {right(words, [e['query'] for e in words])} of {len(words)}")
