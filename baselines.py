"""Planners that are rules, not models: the baselines of every results table (evaluate.py
--fixed-tool, --oracle). Each answers a planner prompt with an action text, as a model would, and
reads what it needs (which question, which turn) from the prompt itself; it has no tokenizer, so
rollout.py parses its text as free text.

    FixedPlan("Fact_Lookup,Python_Coder")   these tools in order, the question as sub-goal, then Done
    OraclePlan(examples, "router")          each question's right first tool, then Done
    OraclePlan(examples, "planner")         each question's right plan with hand-written sub-goals

Test: python -m pytest -q tests/test_evaluate.py tests/test_planning.py
"""

import re

from engine import Generation
from tools import is_stop


def fixed_plan(text: str) -> list[str]:
    """The tools of --fixed-tool "A,B" in order (" A,B" as one action would name no tool)."""
    return [t.strip() for t in text.split(",") if t.strip()]


class FixedPlan:
    """A planner that is a rule, not a model: a fixed sequence of tools, one a turn, with the question as
    the sub-goal; once the sequence is done it stops (Done, when the tool list offers it) or calls the
    last tool again.

    The baseline that tells what training added beyond "follow one plan for every question": its
    action text is just the tool name, so modules.parse_action gives the executor the question itself
    as the sub-goal and no context of its own (rollout.execute then gives it what earlier steps found),
    the same action a trained planner that learned only the tools would take. It reads which turn a
    prompt is for from the prompt's "Step k:" lines.
    """

    tokens_generated = 0  # no model: nothing generated, nothing trained

    def __init__(self, tools, offered=()):
        self.tools = fixed_plan(tools) if isinstance(tools, str) else list(tools)
        self.stop = next((t for t in offered if is_stop(t)), "")

    def generate(self, chats, **kwargs) -> list[Generation]:
        return [Generation(" " + _next(self.tools, _steps_done(chat), self.stop)) for chat in chats]


class OraclePlan:
    """An oracle: a planner that knows each question's right plan (its example's "tools", in order, and
    "sub_goals"), then stops (Done, when offered).

    kind "router": the right FIRST tool with the question as the sub-goal, one turn: the ceiling of
    routing alone, what a planner reaches that picks the right tool but writes nothing of its own.
    kind "planner": every step of the right plan with its hand-written sub-goal ("founder of X", then
    "birth city of <the founder>", written from the example's known intermediate result): the ceiling
    of the frozen modules and tools, what a planner that also writes the right sub-goals reaches.
    It reads which question and which turn a prompt is for from the prompt itself (its "Question: ..."
    line and the "Step k:" lines of the memory).
    """

    tokens_generated = 0

    def __init__(self, examples, kind: str = "router", offered=()):
        if kind not in ("router", "planner"):
            raise ValueError(f"oracle kind must be router or planner, got {kind!r}")
        self.kind = kind
        self.by_query = {ex["query"]: ex for ex in examples}
        self.stop = next((t for t in offered if is_stop(t)), "")

    def generate(self, chats, **kwargs) -> list[Generation]:
        out = []
        for chat in chats:
            text = chat[-1]["content"]
            ex = next((e for q, e in self.by_query.items() if re.search(f"^Question: {re.escape(q)}$", text, flags=re.M)), None)
            tools = (ex["tools"] if ex else ["(no oracle tool)"])[: 1 if self.kind == "router" else None]
            done = _steps_done(chat)
            action = _next(tools, done, self.stop)
            if self.kind == "planner" and ex and done < len(tools):
                action += f"\nSub-Goal: {ex['sub_goals'][done]}"
            out.append(Generation(" " + action))
        return out


def _steps_done(chat) -> int:
    """How many steps the memory of a planner prompt holds (its "Step k:" lines)."""
    return max([int(k) for k in re.findall(r"^Step (\d+):", chat[-1]["content"], flags=re.M)], default=0)


def _next(tools, done: int, stop: str) -> str:
    """The tool of turn done + 1 of a fixed sequence: the next one, else stop (or the last again)."""
    return tools[done] if done < len(tools) else (stop or tools[-1])
