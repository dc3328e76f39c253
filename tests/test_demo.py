"""demo.py end to end on the tiny model with tiny sizes: every row of the table (the fixed sequences,
both oracles, the --credit last ablation), the table as markdown and JSON, the learning curve as a
PNG and the training speed.  Run: python -m pytest -q tests/test_demo.py
"""

import json

import demo
from conftest import run_main
from environment import planning, tasks


def test_fixed_plans_are_every_sequence_of_the_tools_up_to_max_turns_without_done():
    P, F = "Python_Coder", "Fact_Lookup"
    assert demo.fixed_plans([P, F, "Done"], 2) == [(P,), (F,), (P, P), (P, F), (F, P), (F, F)]
    assert demo.fixed_plans([P, F], 1) == [(P,), (F,)]  # cpu-route: one turn, the single tools


def test_the_learning_curve_takes_its_ends_from_the_untrained_and_trained_rows_on_the_training_runs_questions(tmp_path):
    """train.py --no-eval-ends logs the steps between; step 0 and the last step are the untrained and the
    trained rows' scores on the training run's eval questions only (of the demo's more), and an end whose
    evaluation is missing, or lacks one of those questions, is left out rather than guessed."""
    questions = [{"id": "a"}, {"id": "b"}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in [
        {"step": 1, "reward_mean": 0.1}, {"step": 2, "reward_mean": 0.2, "test_accuracy": 0.5}, {"step": 3, "reward_mean": 0.3}]))
    for folder, scores in (("untrained", {"a": 0, "b": 0, "c": 1}), ("trained", {"a": 1, "b": 1, "c": 0})):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "results.jsonl").write_text("\n".join(json.dumps({"id": k, "score": v}) for k, v in scores.items()))
    curve = demo.learning_curve(tmp_path / "metrics.jsonl", tmp_path / "untrained", tmp_path / "trained", questions)
    assert curve == [(0, 0.0), (2, 0.5), (3, 1.0)]
    assert demo.learning_curve(tmp_path / "metrics.jsonl", tmp_path / "missing", tmp_path / "trained",
                               questions + [{"id": "d"}]) == [(2, 0.5)]


def test_demo_writes_the_table_the_learning_curve_and_the_trajectories_before_and_after(tiny_model_dir, tmp_path):
    """The default, cpu-plan (two turns, Done): every row runs, its six fixed sequences, both oracles and
    the last-turn-credit ablation beside the trained agent; and the G trajectories of a multi-step
    question of each kind, untrained and trained."""
    out = tmp_path / "demo"
    res = run_main("demo.py", "--model", tiny_model_dir, "--n", "5", "--steps", "1", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    entries = json.loads((out / "results.json").read_text())
    fixed = {demo.FIXED + " then ".join(plan) for plan in demo.fixed_plans(["Python_Coder", "Fact_Lookup"], 2)}
    assert "AgentFlow, fixed plan: Fact_Lookup then Python_Coder" in fixed and len(fixed) == 6
    assert {e["system"] for e in entries} == {demo.BASE, demo.UNTRAINED, *fixed, demo.ROUTER, demo.ORACLE, demo.LAST,
                                              demo.TRAINED}
    for e in entries:
        assert {"system", "suite", "accuracy", "ci95_low", "ci95_high", "n"} <= e.keys()
        assert 0 <= e["ci95_low"] <= e["accuracy"] <= e["ci95_high"] <= 1
        # Every row but the trained one carries "trained minus this row", paired on the same questions.
        if e["system"] != demo.TRAINED:
            d = e["minus_last"]
            assert d["system"] == demo.TRAINED and d["n"] == e["n"]
            assert -1 <= d["ci95_low"] <= d["difference"] <= d["ci95_high"] <= 1
    assert {e["suite"] for e in entries} == {"calculation", "fact", "fact-then-sum", "two-hop", "sum-then-fact", "all"}
    # The oracle planner follows each question's plan within the two turns: a step and Done, or two steps.
    plan = {e["query"]: (e["tools"] + ["Done"])[:2] for e in tasks.load("planning", n=5)}
    records = [json.loads(line) for line in (out / "eval-oracle-planner" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 5 and all([t["tool"] for t in r["trajectory"]["turns"]] == plan[r["query"]] for r in records)
    # The ablation trained with --credit last, the trained agent with the broadcast.
    assert json.loads((out / "train-last" / "config.json").read_text())["credit"] == "last"
    assert json.loads((out / "train" / "config.json").read_text())["credit"] == "broadcast"
    markdown = (out / "results.md").read_text()
    assert f"{demo.TRAINED} minus this row" in markdown and "trajectories a minute" in markdown
    timing = json.loads((out / "timing.json").read_text())
    assert set(timing["trajectories_per_minute"]) == {"last-turn credit", "broadcast"}
    assert all(v > 0 for v in timing["trajectories_per_minute"].values())
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Both runs' curves hold step 0 and the last step, from the untrained and the trained rows.
    curves = json.loads((out / "learning_curve.json").read_text())
    assert [step for step, _ in curves["broadcast"]] == [step for step, _ in curves["last-turn credit"]] == [0, 1]
    assert "greedy test accuracy during training" in markdown
    # One multi-step question of each kind among the demo's, its G trajectories before and after training.
    text = (out / "trajectories.txt").read_text()
    kinds = {e["kind"] for e in tasks.load("planning", n=5)} & set(planning.MULTI_STEP)
    group = json.loads((out / "train" / "config.json").read_text())["group_size"]
    assert kinds and text.count("  untrained: ") == text.count("  trained: ") == len(kinds)
    assert len([line for line in text.splitlines() if line.startswith(("    right  ", "    wrong  "))]) == 2 * group * len(kinds)
