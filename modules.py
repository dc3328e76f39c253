"""The four AgentFlow modules: their prompts, and tolerant parsers for what a model writes back.

    planner   (trainable)  query analysis once, then per turn the next action a_t = (tool, sub-goal, context)
    executor  (frozen)     turns the action into a tool command (a program, a query, an instruction)
    verifier  (frozen)     reads the memory and says STOP (enough to answer) or CONTINUE
    generator (frozen)     reads the memory and writes the final answer

Every call is one fresh prompt (a system line and one user message) rebuilt from the query and the
memory; no chat history grows. Prompts are short because the embedded model has 135M parameters and
a 2k context: each states its output format in one line and shows it.

Every parser here takes any string and never raises; when the model's text does not fit the format,
a documented fallback applies:

    parser           fallback when the text does not fit
    parse_action     tool: the "Tool Name:" field matched case/space/underscore-insensitively, or the one
                     tool the field names among other words ("Python_Coder to compute it"). A field that
                     names several tools chose none ("<one of Python_Coder, Fact_Lookup>", the prompt's
                     own line copied, must not read as its first tool); nor does a field that names no
                     tool. Only with no field at all: the last known tool mentioned anywhere in the
                     text. Else tool "" and valid False: a failed step ("Error: no valid tool").
                     Sub-goal missing: the question. Context missing: "".
    parse_command    code tools: the last ```python fenced block, else the text after "Command:", else
                     the whole text if it compiles as Python; else "" (empty command -> error step).
                     text tools: the last "Command:" value, else the first non-empty line; else "".
    parse_verdict    the last "Conclusion: STOP|CONTINUE", else the last whole word STOP or CONTINUE
                     (whole words: "stopping" is not a verdict, unlike the official fallback); else
                     CONTINUE, so an undecided verifier costs a turn, bounded by max turns.
    parse_answer     scoring.extract_answer: the last <answer>..</answer>, else \\boxed{..}, else an
                     "Answer:" line, else the whole text.

Simplifications vs. the official prompts:
- The action's fields are asked in the order Tool Name, Sub-Goal, Context (official: Context, Sub-Goal,
  Tool Name, after a Justification). A 135M model loses the format quickly, so the decision that
  matters comes first and survives a response cut at max_new_tokens.
- No Justification field and no few-shot demonstrations (a 135M model copies them verbatim).
- The executor's context is what the earlier steps found when the planner writes none (the cpu-plan
  action is a tool and a sub-goal; officially the planner writes the facts a step needs there).
- Every reply starts with a forced prefix ("Tool Name:", "```python\nprint(", "Command:", "Conclusion:",
  "Answer:"). The official system relies on a 7B model following the format; a 135M model does not
  without this help. The direct baseline gets the same "Answer:" prefix, so the comparison is fair.

Test: python -m pytest -q tests/test_modules.py
"""

import re
from dataclasses import dataclass

from memory import Memory
from environment.scoring import extract_answer
from tools import TOOLS, is_error, render_for_executor, render_for_planner

# ---------------------------------------------------------------------------------------------
# Prompts. Each builder returns a chat: [system message, user message]. The reply of each module is
# forced to start with a prefix that pins its format; the model writes only what follows, and the
# parser reads prefix + completion. For the planner the prefix is part of the prompt s_t, so the
# trained tokens a_t begin with the tool name: the decision that matters.

PLANNER_PREFIX = "Tool Name:"
SUB_GOAL_PREFIX = "\nSub-Goal:"  # forced after a first-token tool choice (rollout.plan_chosen)
VERIFIER_PREFIX = "Conclusion:"
ANSWER_PREFIX = "Answer:"  # generator and the direct baseline alike


def executor_prefix(tool: str) -> str:
    # "print(" makes the program a printed expression: with it the 135M executor computes about half
    # of the arithmetic test questions right; asked for "a program" it writes def print_result(num)
    # boilerplate that prints the wrong thing.
    return "```python\nprint(" if TOOLS[tool].kind == "code" else "Command:"


# Stop strings end a reply once its format is complete, instead of letting a small model ramble on
# until max_new_tokens: the action is three lines (a blank line ends it), a command, verdict or
# answer is one line, and a program ends at its closing fence.
PLANNER_STOP = ("\n\n",)
LINE_STOP = ("\n",)


def executor_stop(tool: str) -> tuple:
    return ("```", "\n") if TOOLS[tool].kind == "code" else LINE_STOP  # a program is one line


def chat(system: str, user: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def analysis_prompt(query: str, tools) -> list[dict]:
    """Planner, once per query: what is asked and which tools could help (not trained)."""
    return chat(
        "You plan how to answer questions with tools.",
        f"Question: {query}\n\nTools:\n{render_for_planner(tools)}\n\n"
        "In one or two sentences: what does the question ask, and which tool fits it best?",
    )


def planner_prompt(query: str, analysis: str, tools, memory: Memory, memory_chars: int = 1200) -> list[dict]:
    """Planner, every turn: the next action a_t given (q, analysis, tools, M_t). The trained call.

    What is the same for many prompts comes first (the tool list, the format line), then the question,
    then what each earlier step found (Memory.render's findings: a result, not an earlier sub-goal, is the
    text nearest to the sub-goal the planner writes, and what it copies forward); the shared prefix is
    computed once in the rollout's prefill and in the update."""
    return chat(
        "You choose the tool for the next step of an agent that answers questions.",
        f"Tools:\n{render_for_planner(tools)}\n\n"
        "Reply in exactly this format:\n"
        "Tool Name: <one of " + ", ".join(tools) + ">\nSub-Goal: <what this step must find or compute>\n"
        "Context: <facts from earlier steps that it needs>\n\n"
        f"Question: {query}\n" + (f"Analysis: {analysis.strip()}\n" if analysis.strip() else "")
        + f"\nSteps so far:\n{memory.render(memory_chars, findings=True)}",
    )


def executor_prompt(query: str, tool: str, sub_goal: str, context: str) -> list[dict]:
    """Executor: the command for the chosen tool, from the question, the context (what earlier steps
    found: rollout.execute), the sub-goal and the tool card.

    The context sits between the question and the sub-goal: so placed, the 135M executor given a
    fact-then-sum question, the year an earlier step found ("Known: founding year of X: 1852") and the
    question copied as the sub-goal prints the sum for 20 of 40 training questions; after the sub-goal,
    11; first of all, 10 (results/plan/probes/executor_context.py). The sub-goal first gave 28, but
    turned word problems without a context into prose (calculations 29 -> 25 of 30)."""
    code = TOOLS[tool].kind == "code"
    return chat(
        "You write Python code." if code else "You write the input of a tool.",
        f"Question: {query}\n" + (f"Known: {context}\n" if context else "") + f"Sub-Goal: {sub_goal}\n"
        + f"{render_for_executor(tool)}\n"
        + ("Write one line of Python that prints the answer." if code else "Write the input."),
    )


def findings(memory: Memory) -> list[str]:
    """What the steps so far found: their results, failed steps ("Error: ...") passed over."""
    return [s.result.strip() for s in memory.steps if not is_error(s.result)]


def verifier_prompt(query: str, analysis: str, memory: Memory, memory_chars: int = 1200) -> list[dict]:
    """Verifier: is the memory enough to answer the question?"""
    return chat(
        "You check whether an agent has found enough to answer a question.",
        f"Question: {query}\n\nSteps so far:\n{memory.render(memory_chars)}\n\n"
        "Do the results above contain the answer? Reply with one line:\n"
        "Conclusion: STOP (the answer is there) or Conclusion: CONTINUE (more steps are needed)",
    )


def generator_prompt(query: str, memory: Memory, memory_chars: int = 1200) -> list[dict]:
    """Generator ("direct" variant): the final answer from the memory.

    Question first, then the steps, then the request: the results sit between the question and the
    request, where a small model answers from them rather than copying the question's expression, and
    the G trajectories of a question share a longer prompt prefix. No placeholder such as "<final
    answer>" in the format line: a small model copies it verbatim (results/route/history.md).

    The last step's value is restated before the request: with two labelled facts in memory (a
    two-hop question's bridge and its answer) the 135M generator otherwise copies either one. A failed
    step (an "Error: ..." result) is passed over: after a right result and a failed call, the value to
    restate is the right result's, not the error message, which the generator would copy.
    """
    found = findings(memory)
    last = found[-1].split(": ", 1)[-1].strip() if found else ""
    return chat(
        "You answer questions from the results of tools.",
        f"Question: {query}\n\nSteps so far:\n{memory.render(memory_chars)}\n\n"
        + (f"The last step's result answers the question: {last}\n\n" if last else "")
        + "What is the answer to the question? Reply with the answer only.",
    )


# ---------------------------------------------------------------------------------------------
# Parsers. Each accepts any string and never raises.

# Markdown a small model sprinkles over field labels: **Tool Name:**, ### Sub-Goal, `Python_Coder`.
# A single "*" is left alone: it is multiplication in a sub-goal such as "compute 4821 * 37".
_MARKDOWN = re.compile(r"\*\*+|(?<!\w)__+|__+(?!\w)|`+|^[ \t]*[#>]+", flags=re.M)


def _clean(text) -> str:
    """Strip markdown emphasis so that '**Tool Name:** `Python_Coder`' reads 'Tool Name: Python_Coder'."""
    return _MARKDOWN.sub("", text) if isinstance(text, str) else ""


def _field(text: str, labels: str) -> str | None:
    """The value of the LAST line that starts with one of `labels` (a regex alternation), or None."""
    matches = re.findall(rf"^[ \t\-*\d.)]*(?:{labels})[ \t]*[:=\-][ \t]*(.*)$", text, flags=re.I | re.M)
    return matches[-1].strip() if matches else None


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower())


def match_tool(name: str, tools) -> str:
    """A tool name written loosely ('python coder', 'PYTHON_CODER.') -> the canonical name, or ''."""
    key = _key(re.sub(r"[^\w\s\-]", "", name or ""))
    for t in tools:
        if key == _key(t):
            return t
    return ""


@dataclass
class Action:
    """The parsed planner output a_t."""

    tool: str  # a canonical tool name, or "" when none could be read
    sub_goal: str  # what this step must achieve
    context: str  # facts from earlier steps that the executor needs
    valid: bool  # False when the tool could not be determined (an invalid action)


def parse_action(text, query: str, tools) -> Action:
    """Read (tool, sub-goal, context) from the planner's text; see the fallback table above."""
    text = _clean(text)
    named = _field(text, r"tool[ _\-]*name|tool")
    if named is not None:  # the field decides: one tool, exactly or among other words; else none
        tool = match_tool(named, tools)
        if not tool:
            mentioned = [t for t in tools if _key(t) in _key(named)]
            tool = mentioned[0] if len(mentioned) == 1 else ""
    else:  # no field at all: the last tool mentioned anywhere in the text
        spots = [(m.start(), t) for t in tools for m in re.finditer(re.escape(t), text, flags=re.I)]
        tool = max(spots)[1] if spots else ""
    sub_goal = _field(text, r"sub[ _\-]*goal|goal") or query
    context = _field(text, r"context") or ""
    return Action(tool, sub_goal[:500], context[:500], bool(tool))


_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", flags=re.S | re.I)


def parse_command(text, tool: str) -> str:
    """The tool command from the executor's text; '' when there is none (see the fallback table)."""
    if not isinstance(text, str):
        return ""
    if TOOLS.get(tool) and TOOLS[tool].kind == "code":
        blocks = [b.strip() for b in _FENCE.findall(text) if b.strip()]
        if blocks:
            return blocks[-1]
        after = _field(text, r"command")
        for candidate in ([after] if after else []) + [text.strip()]:
            if candidate and _compiles(candidate):
                return candidate
        return ""
    value = _field(_clean(text), r"command|query|search[ _]*query")
    if value is None:
        value = next((ln.strip() for ln in _clean(text).splitlines() if ln.strip()), "")
    return value.strip().strip("\"'").strip()[:300]


_ARITHMETIC = re.compile(r"^[\d\s.()]*\d[\d\s.()]*(?:[-+*/]+[\d\s.()]*\d[\d\s.()]*)+$")  # numbers and operators
_RUN = re.compile(r"[\d\s.,()+\-*/]+")  # a stretch of digits, operators, brackets, points, commas and spaces


def arithmetic_in(text) -> str:
    """The one arithmetic expression on numbers in a sub-goal ("57 + 1856" in "Finds 57 + 1856"), which
    Python_Coder runs as print(<expression>) without an executor (the 135M executor garbles a third of
    them); "" for none, several, or one cut off ("2419 * 31 - 448 *": the executor reads it with the question)."""
    if not isinstance(text, str):
        return ""
    found = [run.strip() for run in _RUN.findall(text)]
    found = [run for run in found if _ARITHMETIC.match(run) and _compiles(run)]
    return found[0] if len(found) == 1 else ""


def _compiles(code: str) -> bool:
    try:
        compile(code, "<executor>", "exec")
        return True
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        return False


def parse_verdict(text) -> str:
    """'STOP' or 'CONTINUE' from the verifier's text; CONTINUE when undecided (see the table above)."""
    text = _clean(text)
    found = re.findall(r"conclusion\W{0,3}(stop|continue)\b", text, flags=re.I)
    if not found:
        found = re.findall(r"\b(stop|continue)\b", text, flags=re.I)
    return found[-1].upper() if found else "CONTINUE"


def parse_answer(text) -> str:
    """The final answer from the generator's text (the same extraction the reward uses)."""
    return extract_answer(text if isinstance(text, str) else "")
