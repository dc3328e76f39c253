"""Probe (issue 24): fact-then-sum's turn 2, Python_Coder given turn 1's true finding as the executor's
context and the question copied as the sub-goal (cut at 15 tokens, as the trained planner's copies
are): how often does the frozen executor print the right sum, for each place of the context in its
prompt? 40 training questions, greedy. The first form is modules.executor_prompt before d90d749 (the
context, when a planner wrote one, after the sub-goal); the second is the code's since.
Run: python results/plan/probes/executor_context.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import environment.tasks as T  # noqa: E402
import modules  # noqa: E402
import speedups  # noqa: E402
from bookkeeping.models import load_model  # noqa: E402
from environment.scoring import score  # noqa: E402
from tools import Toolbox, render_for_executor  # noqa: E402

model, tok = load_model()
engine = speedups.FastEngine(model, tok, max_batch=64)
examples = [e for e in T.load("planning", "train") if e["kind"] == "fact-then-sum"][:40]
toolbox = Toolbox(("Python_Coder", "Fact_Lookup"))
found = toolbox.run([("Fact_Lookup", e["sub_goals"][0]) for e in examples])  # "founding year of X: 1852"
card, ask = render_for_executor("Python_Coder"), "Write one line of Python that prints the answer."
FORMS = {  # (question, sub-goal, finding) -> the user message
    "question, sub-goal, 'Context:' (before d90d749)": lambda q, s, f: f"Question: {q}\nSub-Goal: {s}\nContext: {f}\n{card}\n{ask}",
    "question, 'Known:', sub-goal (the code)": lambda q, s, f: f"Question: {q}\nKnown: {f}\nSub-Goal: {s}\n{card}\n{ask}",
    "sub-goal, 'Known:', question": lambda q, s, f: f"Sub-Goal: {s}\nKnown: {f}\nQuestion: {q}\n{card}\n{ask}",
    "'Known:', question, sub-goal": lambda q, s, f: f"Known: {f}\nQuestion: {q}\nSub-Goal: {s}\n{card}\n{ask}",
    "question, sub-goal, card, 'Known:'": lambda q, s, f: f"Question: {q}\nSub-Goal: {s}\n{card}\nKnown: {f}\n{ask}",
}
prefix, stop = modules.executor_prefix("Python_Coder"), modules.executor_stop("Python_Coder")
cut = [tok.decode(tok(" " + e["query"], add_special_tokens=False).input_ids[:15]).strip() for e in examples]
for name, form in FORMS.items():
    chats = [modules.chat("You write Python code.", form(e["query"], s, f)) for e, s, f in zip(examples, cut, found)]
    commands = [modules.parse_command(prefix + g.text, "Python_Coder")
                for g in engine.generate(chats, max_new_tokens=24, temperature=0.0, prefix=prefix, stop=stop)]
    results = toolbox.run([("Python_Coder", c) for c in commands])
    right = sum(score(r.strip(), e) == 1 for r, e in zip(results, examples))
    print(f"{name}: {right} of {len(examples)} (e.g. {commands[0]!r})", flush=True)
