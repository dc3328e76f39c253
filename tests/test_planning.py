"""The planning suite (the CPU demo's): its five kinds and splits, that each example's right plan
(tools and hand-written sub-goals) answers it, the oracle router and the oracle planner, and the
paired difference that --compare reports. Fact_Lookup itself: tests/test_facts.py.
Run: python -m pytest -q tests/test_planning.py
"""

import itertools
import json
import re
from collections import Counter

import pytest

import baselines
import evaluate
import modules
from bookkeeping.report import paired_difference
from engine import Generation
from environment import facts, scoring, tasks
from environment.game24 import _evaluate, _tokenize
from bookkeeping.report import format_trajectory
from rollout import RolloutConfig, rollout
from tools import TOOLS, Toolbox

from conftest import run_main
from test_evaluate import error_of, run_cli

FAST = ["--max-turns", "2", "--analysis-tokens", "0", "--planner-tokens", "8", "--executor-tokens", "8",
        "--verifier-tokens", "4", "--generator-tokens", "8"]


# ---------------------------------------------------------------------------------------------
# The suite


def test_planning_splits_are_disjoint_deterministic_and_prefix_stable():
    train, test = tasks.load("planning", split="train"), tasks.load("planning", split="test")
    assert len(train) > 800 and len(test) > 150  # every kind as many as sum-then-fact's 216 questions
    assert not {e["query"] for e in train} & {e["query"] for e in test}
    assert len({e["id"] for e in train + test}) == len(train) + len(test)
    a, b = tasks.load("planning", n=100, seed=0), tasks.load("planning", n=100, seed=0)
    assert [e["query"] for e in a] == [e["query"] for e in b]
    assert [e["query"] for e in tasks.load("planning", n=100, seed=1)] != [e["query"] for e in a]
    # Equal shares, so 60 of 100 are multi-step, and every example names its right plan: the tools in
    # order and a sub-goal for each step.
    assert Counter(e["suite"] for e in a) == {"calculation": 20, "fact": 20, "fact-then-sum": 20, "two-hop": 20,
                                              "sum-then-fact": 20}
    assert all(e["tools"] == {"calculation": ["Python_Coder"], "fact": ["Fact_Lookup"],
                              "fact-then-sum": ["Fact_Lookup", "Python_Coder"],
                              "two-hop": ["Fact_Lookup", "Fact_Lookup"],
                              "sum-then-fact": ["Python_Coder", "Fact_Lookup"]}[e["suite"]] for e in train + test)
    assert all(e["kind"] == e["suite"] and len(e["sub_goals"]) == len(e["tools"]) for e in train + test)
    assert all(set(e["tools"]) <= set(TOOLS) for e in a)
    assert "two-step" not in {e["kind"] for e in train + test}  # the old kind is gone


def test_each_kind_has_hand_written_sub_goals_in_fact_lookups_words():
    """The worked examples of planning.py's docstring: a fact then a sum, a two-hop question, and a sum
    then a fact (Pequisk, the one city founded in 1566)."""
    by_query = {e["query"]: e for e in tasks.load("planning", split="train") + tasks.load("planning", split="test")}
    founded = next(e for q, e in by_query.items() if q.endswith("plus the year in which Noullysk Foundry was founded?"))
    k = founded["addend"]
    assert founded["sub_goals"] == ["founding year of Noullysk Foundry", f"{k} + 1856"]
    assert founded["answer"] == k + 1856 and founded["intermediate"] == "1856"
    hop = by_query["In which city was the founder of Noullysk Foundry born?"]
    assert hop["sub_goals"] == ["founder of Noullysk Foundry", "birth city of Brukras Veirtha"]
    assert hop["intermediate"] == "Brukras Veirtha" and hop["answer"] == "Fulyrn"
    fact = next(e for e in by_query.values() if e["kind"] == "fact")
    assert len(fact["sub_goals"]) == 1 and any(w in fact["query"] for w in fact["sub_goals"][0].split(" of ")[-1:])
    year = next(e for e in by_query.values() if e["kind"] == "sum-then-fact" and e["intermediate"] == "1566")
    [k] = [int(x) for x in re.findall(r"\+ (\d+)", year["query"])]
    assert year["sub_goals"] == [f"{1566 - k} + {k}", "population of the city founded in 1566"]
    assert year["answer"] == 1334000  # Pequisk's
    calc = next(e for e in by_query.values() if e["kind"] == "calculation")
    assert calc["sub_goals"] == [calc["query"]]  # the question is the program's own sub-goal


def test_the_other_suites_keep_their_questions_and_shares():
    mixed = tasks.load("mixed", n=100)
    assert Counter(e["suite"] for e in mixed) == {"arithmetic": 34, "game24": 33, "lookup": 33}
    for suite in ("arithmetic", "game24", "lookup"):
        assert len(tasks.load(suite, n=5)) == 5


def _value_of(expression: str):
    return _evaluate(_tokenize(expression))[0]


def test_the_right_plan_answers_every_question():
    """Every question's right plan reaches its answer: each Fact_Lookup step, sent as rollout.py sends it
    ("sub-goal | question"), names the step's value (the gold, or the intermediate value that step 2
    needs); a fact-then-sum's second sub-goal is the sum that equals the gold; the calculation in each
    question equals its answer. A multi-step question alone gets only its first hop."""
    for e in tasks.load("planning", split="test") + tasks.load("planning", split="train", n=500):
        step = [f"{g} | {e['query']}" for g in e["sub_goals"]]
        if e["suite"] == "fact":
            assert facts.lookup(e["query"]).endswith(f": {e['answer']}"), e["query"]
            assert facts.lookup(step[0]).endswith(f": {e['answer']}"), e["query"]
        elif e["suite"] == "fact-then-sum":
            for command in (e["query"], step[0]):
                result = facts.lookup(command)
                assert result.endswith(f": {e['intermediate']}"), (command, result)
            number = int(str(e["intermediate"]).replace(",", ""))
            assert _value_of(e["sub_goals"][1]) == e["answer"] == number + e["addend"] and str(e["addend"]) in e["query"]
            assert modules.arithmetic_in(e["sub_goals"][1]) == e["sub_goals"][1]  # rollout.py runs it without an executor
        elif e["suite"] == "two-hop":
            assert facts.lookup(step[0]).endswith(f": {e['intermediate']}"), e["sub_goals"]
            assert facts.lookup(step[1]).endswith(f": {e['answer']}"), e["sub_goals"]
            assert e["intermediate"] in e["sub_goals"][1] and e["intermediate"] not in e["query"]
            assert not facts.lookup(e["query"]).endswith(f": {e['answer']}")  # one hop only: step 2 is needed
        elif e["suite"] == "sum-then-fact":
            assert _value_of(e["sub_goals"][0]) == int(e["intermediate"])  # step 1: the sum, run as written
            assert modules.arithmetic_in(e["query"]) == e["sub_goals"][0]
            assert e["intermediate"] in e["sub_goals"][1] and e["intermediate"] not in e["query"]
            for carried in (step[1], f"{e['intermediate']} | {e['query']}"):  # the year carried, named or bare
                assert facts.lookup(carried).endswith(f": {e['answer']:,}"), carried
            assert not facts.lookup(e["query"]).endswith(f": {e['answer']:,}")  # no arithmetic: step 1 is needed
        else:
            m = re.fullmatch(r"What is (.*)\?", e["query"])
            numbers = [int(x) for x in re.findall(r"\d+", e["query"])]
            value = _value_of(m.group(1)) if m else numbers[0] * numbers[1]  # the word problems are products
            assert value == e["answer"], e["query"]


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
# The oracles


class Frozen:
    """Executor, verifier and generator from a script (Fact_Lookup needs no executor: rollout.py builds
    its command). The executor prints the expression of a "What is ...?" sub-goal; the generator answers
    with the value that generator_prompt restates from the last step. `calls` counts each module."""

    def __init__(self):
        self.calls = Counter()

    def generate(self, chats, max_new_tokens=64, temperature=0.0, prefix="", stop=()):
        out = []
        for chat in chats:
            system, user = chat[0]["content"], chat[-1]["content"]
            if "write Python" in system:
                self.calls["executor"] += 1
                asked = re.search(r"^Sub-Goal: What is (.*)\?$", user, flags=re.M)
                text = f"{asked.group(1) if asked else '1 + 1'})\n```"  # after the forced "```python\nprint("
            elif "input of a tool" in system:
                self.calls["executor"] += 1
                text = " " + re.search(r"^Sub-Goal: (.*)$", user, flags=re.M).group(1)
            elif "check whether" in system:
                self.calls["verifier"] += 1
                text = " CONTINUE"
            else:
                self.calls["generator"] += 1
                restated = re.search(r"^The last step's result answers the question: (.*)$", user, flags=re.M)
                text = " " + (restated.group(1) if restated else "2")
            out.append(Generation(text))
        return out


def _questions(per_kind: int):
    """A few test questions of each kind (the calculations of the "What is ...?" form)."""
    examples = tasks.load("planning", n=100)
    pick = lambda kind: [e for e in examples if e["suite"] == kind and (kind != "calculation" or e["query"].startswith("What is"))]
    return [e for kind in ("calculation", "fact", "fact-then-sum", "two-hop") for e in pick(kind)[:per_kind]]


def test_oracle_router_calls_the_right_first_tool_with_the_question_as_sub_goal_then_done():
    examples = _questions(1)
    frozen = Frozen()
    for tools, expected in (("Python_Coder,Fact_Lookup,Done", lambda e: [e["tools"][0], "Done"]),
                            ("Python_Coder,Fact_Lookup", lambda e: [e["tools"][0]] * 3)):  # no Done: the tool again
        cfg = RolloutConfig(max_turns=3, temperature=0.0, analysis_tokens=0, verify=False, tools=tools)
        plan = baselines.OraclePlan(examples, "router", offered=cfg.tool_names())
        trajs = rollout([e["query"] for e in examples], plan, frozen, Toolbox(cfg.tool_names(), llm=frozen), cfg,
                        examples=examples)
        for e, tr in zip(examples, trajs):
            assert [t.tool for t in tr.turns] == expected(e)
            assert all(t.sub_goal == e["query"] and t.context == "" for t in tr.turns)
            assert tr.stop_reason == ("planner" if "Done" in tools else "max_turns")
    with pytest.raises(ValueError, match="router or planner"):
        baselines.OraclePlan(examples, "oracle")


def test_oracle_planner_sends_its_hand_written_sub_goals_to_the_tools_and_answers_right():
    """Every right tool with its sub-goal, then Done: Fact_Lookup reads the sub-goal first (step 2 of a
    two-hop question looks up the bridge), a fact-then-sum's sum runs without an executor call, and the
    generator (scripted to answer the restated last result) is right on every question."""
    examples = _questions(2)
    cfg = RolloutConfig(max_turns=3, temperature=0.0, analysis_tokens=0, verify=False, tools="Python_Coder,Fact_Lookup,Done")
    frozen = Frozen()
    trajs = rollout([e["query"] for e in examples], baselines.OraclePlan(examples, "planner", offered=cfg.tool_names()),
                    frozen, Toolbox(cfg.tool_names(), llm=frozen), cfg, examples=examples)
    for e, tr in zip(examples, trajs):
        assert [t.tool for t in tr.turns] == e["tools"] + ["Done"] and tr.stop_reason == "planner"
        assert [t.sub_goal for t in tr.turns[:-1]] == e["sub_goals"]
        assert len(tr.memory.steps) == len(e["tools"])  # Done adds nothing to the memory
        for t, goal in zip(tr.turns, e["sub_goals"]):
            if t.tool == "Fact_Lookup":
                # The sub-goal, the question, then what the earlier steps found (read for a year only).
                found = "; ".join(s.result.strip() for s in tr.memory.steps[:tr.turns.index(t)])
                assert t.command == f"{goal} | {e['query']}" + (f" || {found}" if found else "")
                assert not t.result.startswith("Error")
        if e["suite"] == "two-hop":
            assert tr.turns[0].result.endswith(": " + e["intermediate"]) and tr.turns[1].result.endswith(f": {e['answer']}")
        if e["suite"] == "fact-then-sum":
            assert tr.turns[1].command == f"print({e['sub_goals'][1]})"
        assert scoring.score(tr.final_output, e) == 1.0, (e["query"], format_trajectory(tr))
    # Executor calls only for the calculations whose sub-goal, the question, holds no arithmetic expression
    # (the word problems); "What is 4821 * 37?" runs as print(4821 * 37).
    word_problems = sum(e["suite"] == "calculation" and not modules.arithmetic_in(e["query"]) for e in examples)
    assert frozen.calls["executor"] == word_problems


def test_the_oracles_and_fixed_plans_are_labelled_by_what_they_are():
    cfg, _ = evaluate.parse_args(["--data", "planning", "--out", "x", "--oracle", "planner", "--device", "cpu"])
    assert evaluate.default_label(cfg, "m").endswith("oracle planner")
    cfg, _ = evaluate.parse_args(["--data", "planning", "--out", "x", "--oracle", "router", "--device", "cpu"])
    assert evaluate.default_label(cfg, "m").endswith("oracle router")
    cfg, _ = evaluate.parse_args(["--data", "planning", "--out", "x", "--fixed-tool", "Fact_Lookup,Python_Coder",
                                  "--tools", "Python_Coder,Fact_Lookup,Done", "--device", "cpu"])
    assert evaluate.default_label(cfg, "m").endswith("fixed plan: Fact_Lookup,Python_Coder")


def test_cli_oracle_and_compare_report_the_paired_difference(tiny_model_dir, tmp_path):
    common = ["--data", "planning", "--n", 5, "--model", tiny_model_dir, "--tools", "Python_Coder,Fact_Lookup,Done", *FAST]
    oracle = run_cli(*common, "--oracle", "planner", "--out", tmp_path / "oracle")
    assert oracle.returncode == 0, oracle.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "oracle" / "results.jsonl").read_text().splitlines()]
    examples = tasks.load("planning", n=5)
    # --max-turns 2: a one-step plan and its Done, or the two steps of a multi-step plan.
    assert [[t["tool"] for t in r["trajectory"]["turns"]] for r in records] == [(e["tools"] + ["Done"])[:2] for e in examples]
    assert [r["trajectory"]["turns"][0]["sub_goal"] for r in records] == [e["sub_goals"][0] for e in examples]
    assert json.loads((tmp_path / "oracle" / "summary.json").read_text())["label"].endswith("oracle planner")
    # A fixed sequence: Fact_Lookup then Python_Coder for every question, the question as sub-goal.
    fixed = run_cli(*common, "--fixed-tool", "Fact_Lookup,Python_Coder", "--label", "lookup always", "--out", tmp_path / "fixed")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "fixed" / "results.jsonl").read_text().splitlines()]
    assert all([t["tool"] for t in r["trajectory"]["turns"]] == ["Fact_Lookup", "Python_Coder"] for r in records)
    assert all(t["sub_goal"] == r["query"] for r in records for t in r["trajectory"]["turns"])
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


def test_oracle_needs_the_plan_fields_and_a_kind(tiny_model_dir, tmp_path):
    # In process: each refusal comes before any model is loaded (parser.error exits 2 with the message on
    # stderr; the missing fields, after the questions are read, exit with the message itself).
    def refusal(*args):
        return error_of([*args, "--model", tiny_model_dir, "--out", tmp_path / "o"])

    assert "--oracle router needs 'tools' fields" in refusal("--data", "arithmetic", "--n", 2, "--oracle", "router", *FAST)
    assert "--oracle planner needs 'tools' and 'sub_goals' fields" in refusal("--data", "arithmetic", "--n", 2,
                                                                              "--oracle", "planner", *FAST)
    assert "--oracle replaces the planner" in refusal("--data", "planning", "--n", 2, "--oracle", "router", "--mode", "direct")
    assert "--oracle must be router or planner" in refusal("--data", "planning", "--n", 2, "--oracle", "always")
    assert not (tmp_path / "o").exists()


def test_without_the_verifier_every_trajectory_runs_max_turns_and_fact_lookup_needs_no_executor():
    examples = [e for e in tasks.load("planning", n=10) if e["suite"] == "fact"][:2]
    calls = []

    class Counting(Frozen):
        def generate(self, chats, **kwargs):
            calls.extend(chat[0]["content"] for chat in chats)
            return super().generate(chats, **kwargs)

    cfg = RolloutConfig(max_turns=2, temperature=0.0, analysis_tokens=0, verify=False, tools="Fact_Lookup,Python_Coder")
    frozen = Counting()
    trajs = rollout([e["query"] for e in examples], baselines.FixedPlan("Fact_Lookup"), frozen,
                    Toolbox(cfg.tool_names(), llm=frozen), cfg, examples=examples)
    assert [len(tr.turns) for tr in trajs] == [2, 2] and {tr.stop_reason for tr in trajs} == {"max_turns"}
    assert not any("check whether" in s or "input of a tool" in s for s in calls)  # only the generator ran
    assert [t.command for t in trajs[0].turns] == [examples[0]["query"], f"{examples[0]['query']} || {trajs[0].turns[0].result}"]


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
    res = run_main("bookkeeping/tool_choice.py", "--model", tiny_model_dir, "--n", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Fact_Lookup first" in res.stdout and "routing margin Python_Coder" in res.stdout
    bad = run_main("bookkeeping/tool_choice.py", "--tools", "Python_Coder,Nope", "--n", "1")
    assert bad.returncode == 2 and "Nope" in bad.stderr
