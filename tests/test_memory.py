"""Memory rendering, truncation and how a trajectory's memory is saved.  Run: python -m pytest -q tests/test_memory.py"""

import json

from bookkeeping.report import trajectory_json
from memory import Memory, cut_middle
from rollout import Trajectory


def test_cut_middle_keeps_head_and_tail_and_says_what_was_cut():
    text = "HEAD" + "x" * 1000 + "TAIL"
    out = cut_middle(text, 100)
    assert len(out) <= 100
    assert out.startswith("HEAD") and out.endswith("TAIL")
    assert "chars cut" in out
    assert cut_middle("short", 100) == "short"


def test_render_fits_the_budget_and_cuts_the_oldest_result_first():
    m = Memory()
    m.add("Local_Search", "find the founder", "founder of X", "OLD" + "a" * 3000)
    m.add("Python_Coder", "compute", "print(2)", "NEW" + "b" * 300)
    text = m.render(budget=900)
    assert len(text) <= 900
    # The newest result survives whole; the oldest is the one cut.
    assert "NEW" + "b" * 300 in text
    assert "chars cut" in text.split("Step 2")[0]


def test_render_drops_old_steps_when_results_alone_cannot_fit():
    m = Memory()
    for i in range(30):
        m.add("Python_Coder", f"goal {i}", f"print({i})", "r" * 500)
    text = m.render(budget=600)
    assert len(text) <= 600
    assert "omitted" in text and "Step 30" in text


def test_findings_render_one_line_a_step_ending_with_what_the_tool_found():
    # The planner's view: what each step found, its result last on the line, without the sub-goal and
    # command that a small planner would otherwise copy into its next sub-goal.
    m = Memory()
    m.add("Fact_Lookup", "founding year of Zhervym Motors", "founding year of Zhervym Motors | What is 57 plus ...",
          "founding year of Zhervym Motors: 1856")
    m.add("Python_Coder", "57 + 1856", "print(57 + 1856)", "1913")
    assert m.render(findings=True) == ("Step 1: Fact_Lookup found: founding year of Zhervym Motors: 1856\n"
                                       "Step 2: Python_Coder found: 1913")
    long = Memory()
    for i in range(30):
        long.add("Python_Coder", f"goal {i}", f"print({i})", "r" * 500)
    text = long.render(budget=600, findings=True)
    assert len(text) <= 600 and "omitted" in text and "Step 30" in text and "goal" not in text
    assert Memory().render(findings=True) == "(no steps yet)"


def test_empty_memory_renders_a_placeholder():
    assert Memory().render() == "(no steps yet)"


def test_a_saved_trajectory_holds_every_step_of_its_memory():
    tr = Trajectory("What is 1?")
    tr.memory.add("Python_Coder", "g", "print(1)", "1")
    tr.memory.steps[-1].verdict = "STOP"
    saved = json.loads(json.dumps(trajectory_json(tr)))  # what results.jsonl holds
    assert saved["memory"] == [{"index": 1, "tool": "Python_Coder", "sub_goal": "g", "command": "print(1)", "result": "1",
                                "verdict": "STOP"}]


def test_a_new_memory_is_fresh():
    a, b = Memory(), Memory()
    a.add("Python_Coder", "g", "c", "r")
    assert b.steps == []
