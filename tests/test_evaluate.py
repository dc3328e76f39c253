"""evaluate.py: Wilson intervals, scoring and records on a scripted engine, the HTML viewer's escaping,
the command line end to end on a tiny random-weight model (both modes, a user file, a checkpoint),
--compare, and the one-line errors for bad input.

Run: python -m pytest -q tests/test_evaluate.py
"""

import html
import json
import math
import shutil
import subprocess
import sys

import pytest

import baselines
import evaluate
from environment import tasks
import modules
from engine import Generation
from rollout import RolloutConfig, rollout
from tools import Toolbox

from conftest import ROOT, run_main

# Small budgets keep a command line run to a few seconds with the tiny model.
FAST = ["--max-turns", "1", "--analysis-tokens", "8", "--planner-tokens", "16", "--executor-tokens", "16",
        "--verifier-tokens", "4", "--generator-tokens", "8"]


def run_cli(*args):
    """evaluate.py's command line in this process (conftest.run_main)."""
    return run_main("evaluate.py", *args)


# ---------------------------------------------------------------------------------------------
# Wilson interval


def test_wilson_matches_published_values():
    # Reference values of the 95% Wilson score interval (z = 1.96).
    assert wilson_rounded(0, 10) == (0.0, 0.2775)
    assert wilson_rounded(5, 10) == (0.2366, 0.7634)
    assert wilson_rounded(10, 10) == (0.7225, 1.0)
    assert wilson_rounded(0, 3) == (0.0, 0.5615)


def wilson_rounded(k, n):
    low, high = evaluate.wilson(k, n)
    return round(low, 4), round(high, 4)


@pytest.mark.parametrize("k,n", [(1, 10), (3, 7), (50, 100), (99, 100), (1, 1000)])
def test_wilson_bounds_solve_the_score_test_equation(k, n):
    # The Wilson bounds are the two p where the score test is exactly at z: n (k/n - p)^2 = z^2 p (1 - p).
    z, phat = 1.96, k / n
    low, high = evaluate.wilson(k, n, z)
    assert 0 <= low < phat < high <= 1
    for p in (low, high):
        assert math.isclose(n * (phat - p) ** 2, z * z * p * (1 - p), rel_tol=1e-9)


def test_wilson_with_no_questions_is_the_whole_range_and_bad_counts_raise():
    assert evaluate.wilson(0, 0) == (0.0, 1.0)
    for k, n in [(4, 3), (-1, 3)]:
        with pytest.raises(ValueError, match="0 <= k <= n"):
            evaluate.wilson(k, n)


# ---------------------------------------------------------------------------------------------
# Scoring and records on a scripted engine (exact control over what the modules say)


class ScriptedEngine:
    """Plays every module by its system prompt; the generator is right only for the 4821 * 37 question."""

    def __init__(self, judge_says="false"):
        self.judge_says = judge_says

    def generate(self, chats, max_new_tokens=64, temperature=0.0, prefix="", stop=()):
        out = []
        for chat in chats:
            system, user = chat[0]["content"], chat[-1]["content"]
            if "the next step of an agent" in system:
                text = "Tool Name: Python_Coder\nSub-Goal: compute it\nContext: none"
            elif "plan how" in system:
                text = "It asks for a calculation."
            elif prefix in (modules.executor_prefix("Python_Coder"), modules.executor_prefix("Local_Search")):
                text = "```python\nprint(6 * 7)\n```"
            elif "check whether" in system:
                text = "Conclusion: STOP"
            elif "strict grader" in system:
                text = f"analysis: looks fine. true_false: {self.judge_says}"
            else:  # generator (agent) or the model alone (direct)
                text = "Answer: 178377" if "4821 * 37" in user else "Answer: 1"
            assert text.startswith(prefix)  # a real engine writes only what follows the forced prefix
            out.append(Generation(text[len(prefix):]))
        return out


@pytest.fixture
def two_examples(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text('{"question": "What is 4821 * 37?", "answer": 178377, "suite": "calc"}\n'
                    '{"question": "Who founded Quorvex Dynamics?", "answer": "Lormaev Deinem", "suite": "facts"}\n')
    return tasks.load(path)


@pytest.mark.parametrize("mode", ["agent", "direct"])
def test_evaluate_examples_scores_each_question_and_reports_it_as_it_goes(two_examples, mode):
    eng, seen = ScriptedEngine(), []
    cfg = RolloutConfig(max_turns=2, temperature=0.0)
    records = evaluate.evaluate_examples(two_examples, eng, eng, cfg, mode, Toolbox(cfg.tools, llm=eng),
                                         batch_size=1, on_result=seen.append, progress=False)
    assert seen == records and [r["id"] for r in records] == [e["id"] for e in two_examples]
    assert [r["score"] for r in records] == [1.0, 0.0] and [r["correct"] for r in records] == [True, False]
    assert [r["prediction"] for r in records] == ["178377", "1"]
    assert records[0]["gold"] == 178377 and records[1]["suite"] == "facts"
    json.dumps(records)  # every record is JSON-ready
    s = evaluate.summarize(records, label="x", mode=mode)
    assert s["accuracy"] == 0.5 and s["n"] == 2 and s["ci95"] == list(evaluate.wilson(1, 2))
    assert s["suites"] == {"calc": {"accuracy": 1.0, "ci95": [*evaluate.wilson(1, 1)], "n": 1, "correct": 1.0},
                           "facts": {"accuracy": 0.0, "ci95": [*evaluate.wilson(0, 1)], "n": 1, "correct": 0.0}}
    if mode == "agent":  # one Python_Coder turn each, then the verifier says STOP
        assert [r["turns"] for r in records] == [1, 1] and records[0]["trajectory"]["turns"][0]["result"].strip() == "42"
        assert s["tool_calls"] == {"Python_Coder": 2} and s["tool_errors"] == {"Python_Coder": 0}
        assert s["avg_turns"] == 1.0 and s["stop_reasons"] == {"verifier": 2}
    else:
        assert [r["turns"] for r in records] == [0, 0] and s["tool_calls"] == {} and s["stop_reasons"] == {"direct": 2}


def test_judge_engine_replaces_the_rule_based_score(two_examples):
    cfg = RolloutConfig(max_turns=1)
    records = evaluate.evaluate_examples(two_examples, ScriptedEngine(), None, cfg, "direct", None, batch_size=2,
                                         judge_engine=ScriptedEngine(judge_says="true"), progress=False)
    assert [r["score"] for r in records] == [1.0, 1.0]  # the (lenient) judge overrules the rule's 0 on the wrong one


def test_html_escapes_model_text_and_offers_a_wrong_only_filter(tmp_path):
    evil = "<script>alert(1)</script>"
    turn = {"planner_text": evil, "tool": "Python_Coder", "sub_goal": evil, "context": "", "valid_action": True,
            "command": evil, "result": evil, "verdict": "STOP"}
    records = [
        {"id": "q1", "suite": "s", "query": f"Q {evil}", "gold": ["a<b", "c"], "prediction": evil, "score": 0.0,
         "correct": False, "stop_reason": "verifier", "trajectory": {"analysis": evil, "final_output": evil, "turns": [turn]}},
        {"id": "q2", "suite": "s", "query": "fine & dandy", "gold": 1, "prediction": "1", "score": 1.0,
         "correct": True, "stop_reason": "direct", "trajectory": {"analysis": "", "final_output": "Answer: 1", "turns": []}},
    ]
    path = tmp_path / "t.html"
    evaluate.write_html(records, path)
    page = path.read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # only the page's own filter script
    assert "fine &amp; dandy" in page and "a&lt;b OR c" in page
    assert page.count('<details class="wrong">') == 1 and page.count('<details class="right">') == 1
    assert 'id=only-wrong' in page and "http" not in page  # self-contained: no external resources


# ---------------------------------------------------------------------------------------------
# The command line on the tiny model


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """evaluate.py in both modes on 3 arithmetic questions; {mode: (output folder, process)}."""
    base = tmp_path_factory.mktemp("eval")
    out = {}
    for mode in ("agent", "direct"):
        proc = run_cli("--data", "arithmetic", "--n", 3, "--mode", mode, "--model", tiny_model_dir,
                       "--out", base / mode, "--batch-size", 2, *FAST)
        out[mode] = (base / mode, proc)
    return out


@pytest.mark.parametrize("mode", ["agent", "direct"])
def test_cli_writes_summary_results_and_viewer(runs, mode):
    folder, proc = runs[mode]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "config: " in proc.stdout and "accuracy" in proc.stdout
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["n"] == 3 and summary["mode"] == mode and summary["data"] == "arithmetic"
    low, high = summary["ci95"]
    assert 0 <= low <= summary["accuracy"] <= high <= 1
    assert summary["suites"]["arithmetic"]["n"] == 3 and summary["label"]
    for key in ("avg_turns", "tool_calls", "tool_errors", "invalid_action_rate", "empty_command_rate",
                "seconds_per_question", "total_seconds"):
        assert key in summary
    lines = (folder / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 3
    expected_turns = 1 if mode == "agent" else 0  # --max-turns 1; direct mode has no tool turns
    assert all(len(r["trajectory"]["turns"]) == expected_turns for r in records)
    page = (folder / "trajectories.html").read_text()
    for r in records:
        assert html.escape(r["query"]) in page


def test_fixed_plan_calls_the_tool_every_turn_with_the_question_as_sub_goal(tiny_model_dir, tmp_path):
    """--fixed-tool: the baseline of a planner that learned only which tool to call."""
    proc = run_cli("--data", "arithmetic", "--n", 2, "--fixed-tool", "Python_Coder", "--model", tiny_model_dir,
                   "--out", tmp_path / "fixed", *FAST)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    assert summary["label"].endswith("fixed plan: Python_Coder")
    records = [json.loads(line) for line in (tmp_path / "fixed" / "results.jsonl").read_text().splitlines()]
    turns = [(r["query"], t) for r in records for t in r["trajectory"]["turns"]]
    assert len(records) == 2 and turns
    assert all(t["tool"] == "Python_Coder" and t["sub_goal"] == q and t["valid_action"] for q, t in turns)


@pytest.mark.parametrize("plan", ["Fact_Lookup,Python_Coder", ("Fact_Lookup", "Python_Coder")])
def test_a_fixed_plan_calls_its_tools_in_order_then_done_or_else_the_last_tool_again(plan):
    """baselines.FixedPlan (--fixed-tool A,B): A on turn 1, B on turn 2, the question as every sub-goal;
    then Done when the tool list offers it (the trajectory ends: stop_reason "planner"), else B again."""
    eng = ScriptedEngine()
    q = "What is 57 plus the year in which Noullysk Foundry was founded?"
    for tools, expected, stop in (("Python_Coder,Fact_Lookup,Done", ["Fact_Lookup", "Python_Coder", "Done"], "planner"),
                                  ("Python_Coder,Fact_Lookup", ["Fact_Lookup", "Python_Coder", "Python_Coder"], "max_turns")):
        cfg = RolloutConfig(max_turns=3, temperature=0.0, analysis_tokens=0, verify=False, tools=tools)
        [tr] = rollout([q], baselines.FixedPlan(plan, offered=cfg.tool_names()), eng, Toolbox(cfg.tool_names(), llm=eng), cfg)
        assert [t.tool for t in tr.turns] == expected and tr.stop_reason == stop
        assert all(t.sub_goal == q and t.valid_action for t in tr.turns)
        assert tr.turns[0].result == "founding year of Noullysk Foundry: 1856" and tr.turns[1].result.strip() == "42"


def test_compare_prints_a_markdown_table_and_writes_json(runs, tmp_path):
    dirs = [runs[m][0] for m in ("direct", "agent")]
    labels = [json.loads((d / "summary.json").read_text())["label"] for d in dirs]
    proc = run_cli("--compare", *dirs, "--json", tmp_path / "table.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| system | arithmetic | all |" in proc.stdout
    for label in labels:
        assert f"| {label} | " in proc.stdout
    entries = json.loads((tmp_path / "table.json").read_text())
    assert {(e["system"], e["suite"]) for e in entries} == {(l, s) for l in labels for s in ("arithmetic", "all")}
    assert all(e["n"] == 3 and e["ci95_low"] <= e["accuracy"] <= e["ci95_high"] for e in entries)


def test_a_user_jsonl_file_works_as_data(tiny_model_dir, tmp_path):
    data = tmp_path / "mine.jsonl"
    rows = [{"question": "What is 2 + 2?", "answer": 4}, {"question": "Is <b> & bold?", "answer": "yes"},
            {"question": "Capital of France?", "answer": ["Paris", "paris"]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_cli("--data", data, "--n", 3, "--mode", "direct", "--model", tiny_model_dir, "--out", tmp_path / "o", *FAST)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["n"] == 3 and list(summary["suites"]) == ["mine"]
    page = (tmp_path / "o" / "trajectories.html").read_text()
    assert "Is &lt;b&gt; &amp; bold?" in page and "Is <b>" not in page


def make_checkpoint(tiny_model_dir, tmp_path):
    step = tmp_path / "run1" / "checkpoints" / "step-000010"
    shutil.copytree(tiny_model_dir, step / "planner")
    (step / "state.json").write_text(json.dumps({"step": 10, "config": {"model": str(tiny_model_dir)}}))
    return step


def test_checkpoint_planner_and_frozen_model_come_from_the_step_folder(tiny_model_dir, tmp_path):
    step = make_checkpoint(tiny_model_dir, tmp_path)
    # Both the step folder and its planner/ subfolder are accepted, and state.json names the base model.
    assert evaluate.resolve_checkpoint(str(step)) == (step / "planner", str(tiny_model_dir))
    assert evaluate.resolve_checkpoint(str(step / "planner")) == (step / "planner", str(tiny_model_dir))
    proc = run_cli("--data", "arithmetic", "--n", 3, "--checkpoint", step, "--out", tmp_path / "o", *FAST)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["label"] == "AgentFlow (run1/step-000010)" and summary["frozen_model"] == str(tiny_model_dir)
    assert summary["checkpoint"] == str(step) and summary["n"] == 3


# ---------------------------------------------------------------------------------------------
# Sizes for the machine: the cpu preset's on a CPU, the paper's a flag away


def test_on_a_cpu_the_rollout_sizes_are_the_cpu_presets_and_the_papers_are_a_flag_away(tmp_path):
    from config import PRESETS
    from bookkeeping.cli import CPU_SIZES

    assert CPU_SIZES == {k: PRESETS["cpu"][k] for k in CPU_SIZES}  # one set of CPU sizes, trained and evaluated
    base = ["--data", "arithmetic", "--out", str(tmp_path / "o"), "--device", "cpu"]
    cfg, args = evaluate.parse_args(base)
    assert {k: getattr(cfg, k) for k in CPU_SIZES} == CPU_SIZES and args.sizes_source.startswith("cpu")
    paper, args = evaluate.parse_args(base + ["--sizes", "paper"])
    assert paper.max_turns == 10 and paper.analysis_tokens == evaluate.EvalConfig.analysis_tokens
    assert args.sizes_source.startswith("paper")
    # A size flag wins over the machine's sizes; a preset replaces them.
    assert evaluate.parse_args(base + ["--max-turns", "5"])[0].max_turns == 5
    demo, args = evaluate.parse_args(base + ["--preset", "cpu-route"])
    assert demo.max_turns == PRESETS["cpu-route"]["max_turns"] and args.sizes_source == "--preset cpu-route"


def test_the_run_says_which_sizes_it_used(runs):
    folder, proc = runs["agent"]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["sizes"] in proc.stdout and "sizes (" in proc.stdout and "--sizes cpu|paper" in proc.stdout


# ---------------------------------------------------------------------------------------------
# Bad input: one clear line, non-zero exit


def error_of(argv) -> str:
    """evaluate.py's command line in this process, which must fail: its error message (argparse's or the
    SystemExit's), as it would be on stderr."""
    proc = run_cli(*argv)
    assert proc.returncode != 0
    return proc.stderr


def test_bad_inputs_exit_with_a_message_that_says_what_to_change(tiny_model_dir, tmp_path):
    # --data and --out are valid unless the case is about them, so each case fails for its own reason only.
    out = ["--data", "arithmetic", "--out", tmp_path / "o"]
    assert "is not a suite" in error_of([*out, "--data", "no_such_suite"])
    assert "--n must be >= 1" in error_of([*out, "--n", 0])
    assert "not both" in error_of(["--model", tiny_model_dir, "--checkpoint", tmp_path, *out])
    assert "--out DIR is required" in error_of(["--data", "arithmetic", "--n", 1])
    assert "unknown tool" in error_of(["--tools", "Python_Coder,Hammer", *out])
    assert "--fixed-tool takes tools of --tools" in error_of([*out, "--fixed-tool", "Hammer"])
    assert "--fixed-tool takes tools of --tools" in error_of([*out, "--fixed-tool", "Python_Coder,Hammer"])
    assert "--fixed-tool takes tools of --tools" in error_of([*out, "--fixed-tool", ","])
    assert "--fixed-tool takes tools of --tools" in error_of([*out, "--fixed-tool", "Python_Coder", "--mode", "direct"])
    assert "--oracle must be router or planner" in error_of([*out, "--oracle", "sometimes"])
    assert "--oracle replaces the planner" in error_of([*out, "--oracle", "router", "--fixed-tool", "Python_Coder"])
    assert "ask for n <=" in error_of([*out, "--n", 10**6])
    assert "--json needs --compare" in error_of(["--json", tmp_path / "t.json"])
    assert "summary.json not found" in error_of(["--compare", tmp_path])
    # Checkpoints: each missing piece is named.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "incomplete: no config.json" in error_of(["--checkpoint", empty, *out])
    (empty / "planner").mkdir()
    shutil.copy(tiny_model_dir / "config.json", empty / "planner")
    assert "no weights" in error_of(["--checkpoint", empty, *out])
    shutil.copy(tiny_model_dir / "model.safetensors", empty / "planner")
    assert "no tokenizer files" in error_of(["--checkpoint", empty, *out])
    assert "no such folder" in error_of(["--checkpoint", tmp_path / "nope", *out])
    assert not (tmp_path / "o").exists()  # nothing was written for a refused run


def test_missing_data_file_is_one_line_on_stderr_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "evaluate.py", "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "missing.jsonl" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
