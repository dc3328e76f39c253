"""The module parsers on good, bad, empty, oversized and adversarial text, and the prompts.

Every parser must never raise and must map each failure to its documented fallback (see modules.py).
Run: python -m pytest -q tests/test_modules.py
"""

import random
import string

import pytest

import evaluate
import modules
from engine import encode_chat
from memory import Memory
from modules import parse_action, parse_answer, parse_command, parse_verdict

TOOLS = ("Python_Coder", "Local_Search", "Base_Generator")
Q = "What is 4821 * 37?"


# ---- planner action -------------------------------------------------------------------------

@pytest.mark.parametrize("text, tool", [
    ("Tool Name: Python_Coder\nSub-Goal: multiply\nContext: none", "Python_Coder"),
    ("tool name: python coder\nsub-goal: multiply", "Python_Coder"),
    ("**Tool Name:** `Local_Search`\n**Sub-Goal:** find it", "Local_Search"),
    ("### Tool_Name: LOCAL_SEARCH.", "Local_Search"),
    ("Sub-Goal: compute it\nContext: x\nTool Name: Python_Coder", "Python_Coder"),  # wrong order
    ("Tool Name: Python_Coder to compute the product", "Python_Coder"),  # extra words
    ("I think we should use Local_Search, then Python_Coder.", "Python_Coder"),  # no field: last mention
    ("Tool Name: Base_Generator\nTool Name: Local_Search", "Local_Search"),  # last field wins
])
def test_parse_action_reads_the_tool_tolerantly(text, tool):
    a = parse_action(text, Q, TOOLS)
    assert a.tool == tool and a.valid


@pytest.mark.parametrize("text", ["", "Tool Name: Calculator\nSub-Goal: x", "blah blah", None, "Tool Name:",
                                  # a field that names several tools chose none (the prompt's own line copied)
                                  "Tool Name: <one of Python_Coder, Local_Search, Base_Generator>",
                                  "Tool Name: Local_Search, Python_Coder, Context: find it",
                                  # the field decides: a tool named only in the sub-goal is not a choice
                                  "Tool Name: 4821 * 37\nSub-Goal: use Python_Coder"])
def test_parse_action_without_a_known_tool_is_invalid_and_falls_back_to_the_question(text):
    a = parse_action(text, Q, TOOLS)
    assert a.tool == "" and not a.valid
    if not text or "Sub-Goal" not in text:
        assert a.sub_goal == Q


def test_parse_action_reads_sub_goal_and_context():
    a = parse_action("Tool Name: Python_Coder\nSub-Goal: multiply 4821 by 37\nContext: none yet", Q, TOOLS)
    assert a.sub_goal == "multiply 4821 by 37" and a.context == "none yet"


def test_parse_action_only_knows_the_tools_it_is_given():
    assert parse_action("Tool Name: Wikipedia_Search", Q, TOOLS).valid is False
    assert parse_action("Tool Name: Wikipedia_Search", Q, TOOLS + ("Wikipedia_Search",)).tool == "Wikipedia_Search"


# ---- executor command -----------------------------------------------------------------------

def test_parse_command_takes_the_last_python_block():
    text = "Here:\n```python\nprint(1)\n```\nbetter:\n```python\nprint(4821 * 37)\n```\nDone."
    assert parse_command(text, "Python_Coder") == "print(4821 * 37)"


def test_parse_command_accepts_an_unclosed_block_and_bare_code():
    assert parse_command("```python\nprint(2 + 2)", "Python_Coder") == "print(2 + 2)"
    assert parse_command("print(6 * 7)", "Python_Coder") == "print(6 * 7)"
    assert parse_command("Command: print(6 * 7)", "Python_Coder") == "print(6 * 7)"


def test_parse_command_gives_empty_for_prose_instead_of_code():
    assert parse_command("The answer is easy to compute by hand, just multiply.", "Python_Coder") == ""
    assert parse_command("", "Python_Coder") == ""


def test_parse_command_for_text_tools():
    assert parse_command("Command: founder of Quorvex Dynamics", "Local_Search") == "founder of Quorvex Dynamics"
    assert parse_command('**Command:** "Tellamar population"', "Local_Search") == "Tellamar population"
    assert parse_command("Tellamar population\nmore lines", "Local_Search") == "Tellamar population"
    assert parse_command("   \n  ", "Local_Search") == ""


# ---- verifier verdict -----------------------------------------------------------------------

@pytest.mark.parametrize("text, verdict", [
    ("Conclusion: STOP", "STOP"),
    ("conclusion: continue", "CONTINUE"),
    ("**Conclusion:** **STOP**", "STOP"),
    ("Conclusion: CONTINUE ... actually Conclusion: STOP", "STOP"),
    ("We should stop here.", "STOP"),
    ("Stopping is premature.", "CONTINUE"),  # 'stopping' is not a verdict (the official fallback says STOP)
    ("unstoppable", "CONTINUE"),
    ("", "CONTINUE"),
    (None, "CONTINUE"),
])
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) == verdict


# ---- fuzz: no parser ever raises ------------------------------------------------------------

def _random_texts():
    rng = random.Random(0)
    alphabet = string.printable + "ÄéßΩ漢字🙂\u200b\x00*`#_|:-"
    texts = ["", " ", "\n" * 50, "x" * 100_000, "Tool Name: " * 5000, "```python\n" * 1000, "```" * 3001]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400))) for _ in range(300)]
    parts = ["Tool Name: Python_Coder", "Sub-Goal: s", "Context: c", "Conclusion: STOP", "<answer>7</answer>",
             "\\boxed{8}", "Answer: 9", "```python\nprint(1)\n```", "**", "\u00e9\u00e9"]
    texts += ["\n".join(rng.sample(parts, rng.randint(1, len(parts)))) for _ in range(200)]
    return texts


def test_no_parser_raises_on_random_empty_huge_or_unicode_text():
    for text in _random_texts():
        a = parse_action(text, Q, TOOLS)
        assert a.tool in TOOLS + ("",) and a.valid == bool(a.tool)
        for tool in TOOLS:
            assert isinstance(parse_command(text, tool), str)
        assert parse_verdict(text) in ("STOP", "CONTINUE")
        assert isinstance(parse_answer(text), str)


def test_parse_answer_takes_the_last_candidate():
    assert parse_answer("<answer>1</answer> no wait <answer>2</answer>") == "2"
    assert parse_answer("Answer: 178377") == "178377"


@pytest.mark.parametrize("text, expression", [
    ("57 + 1856", "57 + 1856"), ("4821 * 37", "4821 * 37"), (" 12 / 4 ", "12 / 4"), ("(3 + 4) * 2", "(3 + 4) * 2"),
    ("1856+57", "1856+57"), ("What is 4821 * 37?", "4821 * 37"), ("Finds 21 + 1961", "21 + 1961"),
    ("[fact of 23 + 1852]", "23 + 1852"),
    ("57", ""), ("57 +", ""), ("(57 + 1856", ""), ("2419 * 31 - 448 *", ""),  # no operator, or no whole program
    ("1,856 + 57", ""), ("add 57 to 1856", ""), ("12 + 3 then 4 * 5", ""),  # a comma in it, none, or several
    ("A shop sells 46 boxes of 22 pencils each.", ""), ("__import__('os').system('ls')", ""), ("57 + x", ""),
    ("", ""), (None, ""),
])
def test_arithmetic_in_finds_the_one_whole_expression_on_numbers(text, expression):
    """A Python_Coder sub-goal that holds one arithmetic expression is run as print(<expression>) without an
    executor; anything else goes to the executor."""
    assert modules.arithmetic_in(text) == expression


# ---- prompts --------------------------------------------------------------------------------

def test_prompts_are_short_fresh_chats_that_state_their_format(tokenizer):
    mem = Memory()
    mem.add("Python_Coder", "multiply", "print(4821 * 37)", "178377")
    chats = [
        modules.analysis_prompt(Q, TOOLS),
        modules.planner_prompt(Q, "It asks for a product.", TOOLS, mem),
        modules.executor_prompt(Q, "Python_Coder", "multiply", ""),
        modules.executor_prompt(Q, "Local_Search", "find", ""),
        modules.verifier_prompt(Q, "", mem),
        modules.generator_prompt(Q, mem),
        evaluate.direct_prompt(Q),
    ]
    for c in chats:
        assert [m["role"] for m in c] == ["system", "user"]
        n = len(encode_chat(tokenizer, c))
        assert n < 600, "prompts must fit a 135M model with a 2k context"
    assert "Tool Name:" in chats[1][1]["content"] and "178377" in chats[1][1]["content"]
    assert "Conclusion: STOP" in chats[4][1]["content"]
    assert "answer only" in chats[5][1]["content"] and "<" not in chats[5][1]["content"]


def test_the_generator_prompt_restates_the_last_steps_value():
    """With two labelled facts in memory (a two-hop question's bridge and its answer) the generator is
    told which one answers: the last step's value, after its label's ": "."""
    mem = Memory()
    q = "In which city was the founder of Noullysk Foundry born?"
    assert "last step" not in modules.generator_prompt(q, mem)[1]["content"]  # nothing to restate yet
    mem.add("Fact_Lookup", "founder of Noullysk Foundry", "founder of Noullysk Foundry", "founder of Noullysk Foundry: Brukras Veirtha")
    mem.add("Fact_Lookup", "birth city of Brukras Veirtha", "birth city of Brukras Veirtha", "birth city of Brukras Veirtha: Fulyrn")
    user = modules.generator_prompt(q, mem)[1]["content"]
    assert "The last step's result answers the question: Fulyrn\n" in user
    assert user.index("Steps so far:") < user.index("The last step's result") < user.index("Reply with the answer only.")
    mem.add("Python_Coder", "57 + 1856", "print(57 + 1856)", "1913\n")  # a result without a label
    assert "The last step's result answers the question: 1913\n" in modules.generator_prompt(q, mem)[1]["content"]
    mem.add("Fact_Lookup", "1913", "1913", "Error: Fact_Lookup found no person, city, company or invention")
    user = modules.generator_prompt(q, mem)[1]["content"]  # a failed last step: the last value found
    assert "The last step's result answers the question: 1913\n" in user and "found no person" in user
    only_errors = Memory()
    only_errors.add("Python_Coder", "x", "print(x)", "Error: NameError: name 'x' is not defined")
    assert "last step" not in modules.generator_prompt(q, only_errors)[1]["content"]
