"""Probe (issue 24): the demo's rows with the generator shown another view of the memory. VIEW is one of
  steps           each step's sub-goal, command and result (modules.generator_prompt as it is)
  findings        each step as what its tool found (Memory.render(findings=True), the planner's view)
  results         each step's result alone
  findings-bare   the findings, without the restated last value
  findings-is     the findings, "The answer is the last step's result: ..." as the restatement
  no-command      each step's tool, sub-goal and result
  no-sub-goal     each step's tool, command and result
  tool-result     each step's tool and result
then evaluate.py's flags of the row (the demo's: 100 test questions, seed 0, --preset cpu-plan).

Run: python results/plan/probes/generator_views.py findings --oracle planner
     python results/plan/probes/generator_views.py steps --fixed-tool Python_Coder,Fact_Lookup"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import evaluate  # noqa: E402
import modules  # noqa: E402
from memory import Memory, cut_middle  # noqa: E402

VIEWS = ("steps", "findings", "results", "findings-bare", "findings-is", "no-command", "no-sub-goal", "tool-result")
if len(sys.argv) < 2 or sys.argv[1] not in VIEWS:
    sys.exit(__doc__)
view, flags = sys.argv[1], sys.argv[2:]
as_is = modules.generator_prompt
LINES = {  # a view of one step, for the views that are not Memory.render's own
    "results": lambda s: f"Step {s.index}: {s.result.strip()}",
    "no-command": lambda s: f"Step {s.index}: {s.tool} | Sub-goal: {s.sub_goal}\nResult: {cut_middle(s.result, 200)}",
    "no-sub-goal": lambda s: f"Step {s.index}: {s.tool} | Command: {cut_middle(s.command, 200)}\nResult: {cut_middle(s.result, 200)}",
    "tool-result": lambda s: f"Step {s.index}: {s.tool}\nResult: {cut_middle(s.result, 200)}",
}
RESTATED = "The last step's result answers the question: "  # modules.generator_prompt's line


class Viewed(Memory):
    """The same steps, rendered in the probe's view: modules.generator_prompt itself writes the rest."""

    def render(self, budget: int = 1200, result_floor: int = 80, findings: bool = False) -> str:
        if view in LINES:
            return "\n".join(map(LINES[view], self.steps)) or "(no steps yet)"
        return super().render(budget, result_floor, findings=findings or view != "steps")


def generator_prompt(query, memory, memory_chars=1200):
    chat = as_is(query, Viewed(memory.steps), memory_chars)
    user = chat[1]["content"]
    if view == "findings-bare":  # the restated line left out
        user = re.sub(re.escape(RESTATED) + r".*?\n\n(?=What is the answer)", "", user, flags=re.S)
    elif view == "findings-is":
        user = user.replace(RESTATED, "The answer is the last step's result: ")
    return [chat[0], {**chat[1], "content": user}]


modules.generator_prompt = generator_prompt  # rollout.py calls it through the module
out = f"runs/generator-views/{view}-" + "-".join(f.strip("-").replace(",", "-") for f in flags)
evaluate.main(["--data", "planning", "--n", "100", "--seed", "0", "--mode", "agent", "--preset", "cpu-plan",
               "--batch-size", "50", "--out", out, *flags])
