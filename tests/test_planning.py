"""The planning suite (the CPU demo's): its splits, that the right tool answers every question,
Fact_Lookup's tolerant reading of commands, the oracle router, and the paired difference that
--compare reports.  Run: python -m pytest -q tests/test_planning.py
"""

import itertools
import json
import random
import re
import subprocess
import sys
from collections import Counter

import pytest

import evaluate
import modules
from bookkeeping.report import paired_difference
from engine import Generation
from environment import facts, tasks
from environment.game24 import _evaluate, _tokenize
from rollout import RolloutConfig, rollout
from tools import TOOLS, Toolbox

from conftest import ROOT

FAST = ["--max-turns", "2", "--analysis-tokens", "0", "--planner-tokens", "8", "--executor-tokens", "8",
        "--verifier-tokens", "4", "--generator-tokens", "8"]


def run_cli(*args):
    return subprocess.run([sys.executable, "evaluate.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------------------------
# The suite


def test_planning_splits_are_disjoint_deterministic_and_prefix_stable():
    train, test = tasks.load("planning", split="train"), tasks.load("planning", split="test")
    assert len(train) > 1000 and len(test) > 200
    assert not {e["query"] for e in train} & {e["query"] for e in test}
    assert len({e["id"] for e in train + test}) == len(train) + len(test)
    a, b = tasks.load("planning", n=100, seed=0), tasks.load("planning", n=100, seed=0)
    assert [e["query"] for e in a] == [e["query"] for e in b]
    assert [e["query"] for e in tasks.load("planning", n=100, seed=1)] != [e["query"] for e in a]
    # 2 : 2 : 1, and every example names the tools an oracle would call.
    assert Counter(e["suite"] for e in a) == {"calculation": 40, "fact": 40, "two-step": 20}
    assert all(e["tools"] == {"calculation": ["Python_Coder"], "fact": ["Fact_Lookup"],
                              "two-step": ["Fact_Lookup", "Python_Coder"]}[e["suite"]] for e in train + test)
    assert all(set(e["tools"]) <= set(TOOLS) for e in a)


def test_the_other_suites_keep_their_questions_and_shares():
    mixed = tasks.load("mixed", n=100)
    assert Counter(e["suite"] for e in mixed) == {"arithmetic": 34, "game24": 33, "lookup": 33}
    for suite in ("arithmetic", "game24", "lookup"):
        assert len(tasks.load(suite, n=5)) == 5


def _value_of(expression: str):
    return _evaluate(_tokenize(expression))[0]


def test_the_right_tool_answers_every_question():
    """Every question's oracle tool result holds its answer: Fact_Lookup's line names the gold (or the
    two-step question's intermediate value), and the calculation in each question equals its answer."""
    for e in tasks.load("planning", split="test") + tasks.load("planning", split="train", n=500):
        if e["suite"] == "fact":
            assert facts.lookup(e["query"]).endswith(f": {e['answer']}"), e["query"]
        elif e["suite"] == "two-step":
            result = facts.lookup(e["query"])
            assert result.endswith(f": {e['intermediate']}"), (e["query"], result)
            number = int(str(e["intermediate"]).replace(",", ""))
            assert _value_of(f"{e['addend']} + {number}") == e["answer"] and str(e["addend"]) in e["query"]
        else:
            m = re.fullmatch(r"What is (.*)\?", e["query"])
            numbers = [int(x) for x in re.findall(r"\d+", e["query"])]
            value = _value_of(m.group(1)) if m else numbers[0] * numbers[1]  # the word problems are products
            assert value == e["answer"], e["query"]


# ---------------------------------------------------------------------------------------------
# Fact_Lookup


def test_fact_lookup_reads_loose_commands():
    assert facts.lookup("founder of Noullysk Foundry") == "founder of Noullysk Foundry: Brukras Veirtha"
    assert facts.lookup("**Who founded NOULLYSK foundry??**") == "founder of Noullysk Foundry: Brukras Veirtha"
    assert facts.lookup("Noullysk Foundry founding year") == "founding year of Noullysk Foundry: 1856"
    assert facts.lookup("birth city of Veirtha") == "birth city of Brukras Veirtha: Fulyrn"
    # No attribute named: every fact of the entity, on one line.
    assert facts.lookup("Brukras Veirtha") == "Brukras Veirtha: birth city Fulyrn; birth year 1822; profession shipwright"
    # One hop only: a chain gives a fact of the entity named, never of the bridge.
    assert facts.lookup("In which city was the founder of Noullysk Foundry born?").startswith("founder of Noullysk Foundry")


@pytest.mark.parametrize("command", ["", "   ", None, 42, "x" * 100_000, "What is 2 + 2?", "Zhervym\x00\n\t",
                                     "ünïcödé ℵ 🚀", "((((", "founder of", "Noullysk " * 5000, b"bytes"])
def test_fact_lookup_never_raises(command):
    result = facts.lookup(command)
    assert isinstance(result, str) and len(result) < 400


def test_fact_lookup_fuzz_never_raises():
    rng = random.Random(0)
    words = ["founder", "year", "city", "Noullysk", "Veirtha", "born", "population", "Fulyrn", "?", "of", "the", "\n"]
    for _ in range(300):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        assert isinstance(facts.lookup(text), str)


def test_the_toolbox_runs_fact_lookup_and_parses_its_command():
    result = Toolbox(("Fact_Lookup",)).run([("Fact_Lookup", "founder of Noullysk Foundry"), ("Fact_Lookup", "")])
    assert result == ["founder of Noullysk Foundry: Brukras Veirtha", "Error: the executor produced no command"]
    assert modules.parse_command("Command: Who founded Noullysk Foundry?", "Fact_Lookup") == "Who founded Noullysk Foundry?"


# ---------------------------------------------------------------------------------------------
# The paired difference


def test_paired_difference_matches_the_enumerated_bootstrap():
    """Worked example: a = [1, 1, 1, 0], b = [0, 0, 1, 1]; every one of the 4^4 resamples, counted."""
    a, b = [1, 1, 1, 0], [0, 0, 1, 1]
    d = [x - y for x, y in zip(a, b)]
    means = sorted(sum(d[i] for i in idx) / 4 for idx in itertools.product(range(4), repeat=4))
    cdf = lambda v: sum(m <= v for m in means) / len(means)
    support = sorted(set(means))
    low = next(v for v in support if cdf(v) >= 0.025)
    high = next(v for v in support if cdf(v) >= 0.975)
    r = paired_difference(a, b)
    assert (r["difference"], r["ci95_low"], r["ci95_high"], r["n"], r["wins"], r["losses"]) == (0.25, low, high, 4, 2, 1)
    assert (low, high) == (-0.5, 1.0)


def test_paired_difference_edges():
    assert paired_difference([1, 0, 1], [1, 0, 1])[("ci95_low")] == 0.0 == paired_difference([1, 0, 1], [1, 0, 1])["ci95_high"]
    r = paired_difference([1] * 20, [0] * 20)
    assert (r["difference"], r["ci95_low"], r["ci95_high"]) == (1.0, 1.0, 1.0)
    r = paired_difference([1] * 30 + [0] * 70, [0] * 100)  # 30 wins in 100: about 0.30 -/+ 0.09
    assert r["ci95_low"] == pytest.approx(0.21, abs=0.011) and r["ci95_high"] == pytest.approx(0.39, abs=0.011)
    with pytest.raises(ValueError):
        paired_difference([1, 0], [1])
    assert paired_difference([], [])["n"] == 0


# ---------------------------------------------------------------------------------------------
# The oracle router


class Frozen:
    """Executor, verifier and generator from a script (Fact_Lookup needs no executor: rollout.py builds its command)."""

    def generate(self, chats, max_new_tokens=64, temperature=0.0, prefix="", stop=()):
        out = []
        for chat in chats:
            system, user = chat[0]["content"], chat[-1]["content"]
            if "write Python" in system:
                text = "print(1 + 1)\n```"
            elif "input of a tool" in system:
                text = " " + re.search(r"^Sub-Goal: (.*)$", user, flags=re.M).group(1)
            elif "check whether" in system:
                text = " CONTINUE"
            else:
                text = " 2"
            out.append(Generation(text))
        return out


def test_oracle_plan_calls_each_questions_tools_in_order_with_the_question_as_sub_goal():
    examples = [e for e in tasks.load("planning", n=20) if e["suite"] in ("two-step", "fact")][:4]
    cfg = RolloutConfig(max_turns=3, temperature=0.0, analysis_tokens=0, tools="Python_Coder,Fact_Lookup,Local_Search")
    frozen = Frozen()
    trajs = rollout([e["query"] for e in examples], evaluate.OraclePlan(examples), frozen,
                    Toolbox(cfg.tool_names(), llm=frozen), cfg, examples=examples)
    for e, tr in zip(examples, trajs):
        expected = e["tools"] + [e["tools"][-1]] * (3 - len(e["tools"]))  # the last tool again on later turns
        assert [t.tool for t in tr.turns] == expected
        assert all(t.sub_goal == e["query"] and t.context == "" for t in tr.turns)
        assert tr.turns[0].result == facts.lookup(e["query"])


def test_cli_oracle_and_compare_report_the_paired_difference(tiny_model_dir, tmp_path):
    common = ["--data", "planning", "--n", 5, "--model", tiny_model_dir, "--tools", "Python_Coder,Fact_Lookup", *FAST]
    oracle = run_cli(*common, "--oracle", "--out", tmp_path / "oracle")
    assert oracle.returncode == 0, oracle.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "oracle" / "results.jsonl").read_text().splitlines()]
    assert all(r["trajectory"]["turns"][0]["tool"] == tasks.load("planning", n=5)[i]["tools"][0] for i, r in enumerate(records))
    assert json.loads((tmp_path / "oracle" / "summary.json").read_text())["label"].endswith("oracle router")
    fixed = run_cli(*common, "--fixed-tool", "Fact_Lookup", "--label", "lookup always", "--out", tmp_path / "fixed")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    proc = run_cli("--compare", tmp_path / "fixed", tmp_path / "oracle", "--json", tmp_path / "t.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    label = json.loads((tmp_path / "oracle" / "summary.json").read_text())["label"]
    assert f"| {label} minus this row |" in proc.stdout.splitlines()[0]
    entries = json.loads((tmp_path / "t.json").read_text())
    by = {(e["system"], e["suite"]): e for e in entries}
    paired = by[("lookup always", "all")]["minus_last"]
    scores = {d: [json.loads(line)["score"] for line in (tmp_path / d / "results.jsonl").read_text().splitlines()]
              for d in ("oracle", "fixed")}
    assert paired == {"system": label, **paired_difference(scores["oracle"], scores["fixed"])}
    assert "minus_last" not in by[(label, "all")]  # the last system is not compared with itself
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| lookup always |"))
    assert row.rstrip(" |").endswith(f"n={paired['n']}")


def test_oracle_needs_a_tools_field(tiny_model_dir, tmp_path):
    proc = run_cli("--data", "arithmetic", "--n", 2, "--model", tiny_model_dir, "--oracle", "--out", tmp_path / "o", *FAST)
    assert proc.returncode != 0 and "--oracle needs a 'tools' field" in proc.stderr
    proc = run_cli("--data", "planning", "--n", 2, "--model", tiny_model_dir, "--oracle", "--mode", "direct", "--out", tmp_path / "o")
    assert proc.returncode != 0 and "--oracle replaces the planner" in proc.stderr


def test_without_the_verifier_every_trajectory_runs_max_turns_and_fact_lookup_needs_no_executor():
    examples = [e for e in tasks.load("planning", n=10) if e["suite"] == "fact"][:2]
    calls = []

    class Counting(Frozen):
        def generate(self, chats, **kwargs):
            calls.extend(chat[0]["content"] for chat in chats)
            return super().generate(chats, **kwargs)

    cfg = RolloutConfig(max_turns=2, temperature=0.0, analysis_tokens=0, verify=False, tools="Fact_Lookup,Python_Coder")
    frozen = Counting()
    trajs = rollout([e["query"] for e in examples], evaluate.FixedPlan("Fact_Lookup"), frozen,
                    Toolbox(cfg.tool_names(), llm=frozen), cfg, examples=examples)
    assert [len(tr.turns) for tr in trajs] == [2, 2] and {tr.stop_reason for tr in trajs} == {"max_turns"}
    assert not any("check whether" in s or "input of a tool" in s for s in calls)  # only the generator ran
    assert all(t.command == e["query"] for e, tr in zip(examples, trajs) for t in tr.turns)


class Planner:
    """A planner from a script: Fact_Lookup with a fixed sub-goal."""

    tokens_generated = 0

    def __init__(self, sub_goal):
        self.sub_goal = sub_goal

    def generate(self, chats, **kwargs):
        return [Generation(f" Fact_Lookup\nSub-Goal: {self.sub_goal}", [], [], []) for _ in chats]


def test_fact_lookup_reads_the_sub_goal_then_the_question():
    [e] = [e for e in tasks.load("planning", n=20) if e["suite"] == "fact"][:1]
    cfg = RolloutConfig(max_turns=1, temperature=0.0, analysis_tokens=0, verify=False, tools="Fact_Lookup,Python_Coder")
    frozen = Frozen()
    box = Toolbox(cfg.tool_names(), llm=frozen)
    # A sub-goal that names no entity: the question still names it (an executor would have seen both).
    [tr] = rollout([e["query"]], Planner("Find a fact about a person"), frozen, box, cfg, examples=[e])
    assert tr.turns[0].command == f"Find a fact about a person | {e['query']}"
    assert tr.turns[0].result == facts.lookup(e["query"]) and not tr.turns[0].result.startswith("Error")
    # A sub-goal that names another fact of the entity asks for that fact: what to ask still matters.
    q = "Who founded Noullysk Foundry?"
    [tr] = rollout([q], Planner("founding year of Noullysk Foundry"), frozen, box, cfg)
    assert tr.turns[0].result == "founding year of Noullysk Foundry: 1856"
    [tr] = rollout([q], Planner(q), frozen, box, cfg)  # the question as sub-goal: the command is the question
    assert tr.turns[0].command == q and tr.turns[0].result == "founder of Noullysk Foundry: Brukras Veirtha"


def test_tool_choice_reads_the_planner_probabilities_and_the_routing_margin(tokenizer):
    """bookkeeping.tool_choice: P(tool) per kind and order equals a plain one-row forward of the planner
    prompt + tool name; the routing margin is 0 for a planner that follows the list, 1 for the oracle."""
    import torch
    from bookkeeping import tool_choice
    from conftest import make_tiny_model
    from engine import encode_chat
    from memory import Memory
    tok = tokenizer
    model = make_tiny_model(len(tok))
    tools = ("Python_Coder", "Fact_Lookup")
    got = tool_choice.tool_probabilities(model, tok, "What is 3 * 4?", tools)
    for t, p in zip(tools, got):
        prompt = encode_chat(tok, modules.planner_prompt("What is 3 * 4?", "", tools, Memory()), modules.PLANNER_PREFIX)
        name = tok(" " + t, add_special_tokens=False).input_ids
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([prompt + name])).logits[0, len(prompt) - 1:-1], -1)
        assert abs(p - float(logp[torch.arange(len(name)), torch.tensor(name)].sum().exp())) < 1e-5
    exs = [{"query": "q1", "kind": "calculation", "tools": ["Python_Coder"]}, {"query": "q2", "kind": "fact", "tools": ["Fact_Lookup"]}]
    by_position = {"calculation": {"Python_Coder": [0.9, 0.1], "Fact_Lookup": [0.1, 0.9]},
                   "fact": {"Python_Coder": [0.9, 0.1], "Fact_Lookup": [0.1, 0.9]}}
    oracle = {"calculation": {"Python_Coder": [1.0, 0.0], "Fact_Lookup": [1.0, 0.0]},
              "fact": {"Python_Coder": [0.0, 1.0], "Fact_Lookup": [0.0, 1.0]}}
    assert tool_choice.routing_margins(by_position, exs, tools) == {"Python_Coder": 0.0, "Fact_Lookup": 0.0}
    assert tool_choice.routing_margins(oracle, exs, tools) == {"Python_Coder": 1.0, "Fact_Lookup": 1.0}
    tab = tool_choice.table(model, tok, [dict(e, query="What is 3 * 4?") for e in exs], tools)
    assert set(tab) == {"calculation", "fact"} and all(set(v) == set(tools) for v in tab.values())


def test_tool_choice_command_prints_a_table_and_margins(tiny_model_dir):
    res = subprocess.run([sys.executable, "-m", "bookkeeping.tool_choice", "--model", str(tiny_model_dir), "--n", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Fact_Lookup first" in res.stdout and "routing margin Python_Coder" in res.stdout
    bad = subprocess.run([sys.executable, "-m", "bookkeeping.tool_choice", "--tools", "Python_Coder,Nope", "--n", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Nope" in bad.stderr
