"""bench.py end to end on the tiny random-weight model: it runs and writes every figure as a number.

No timing is asserted (the figures are machine-dependent); the test pins that the benchmark runs the
rollout, the replay, the update and the baselines, and reports each required figure as a finite number.

Run: python -m pytest -q tests/test_bench.py
"""

import json
import math
import subprocess
import sys

from conftest import ROOT, run_main

REQUIRED = ("rollout_vs_generate", "rollout_batched_speedup", "update_vs_plain", "pad_fraction", "peak_rss_gb",
            "matmul_gflops", "update_gflops", "model_copies", "rollout_tok_s", "replay_tok_s", "one_by_one_s",
            "batched_s", "update_tok_s", "plain_tok_s", "update_s", "plain_s", "rollout_fast_prefill_speedup",
            "search_vs_generate", "search_query_s", "generate_call_s")
TINY = ["--group-size", "3", "--max-turns", "1", "--analysis-tokens", "0", "--planner-tokens", "6",
        "--executor-tokens", "6", "--verifier-tokens", "3", "--generator-tokens", "3", "--data", "arithmetic",
        "--threads", "1"]


def run_bench(args):
    return subprocess.run([sys.executable, "bench.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_bench_writes_every_figure_as_a_finite_number(tiny_model_dir, tmp_path):
    out = tmp_path / "sub" / "bench.json"
    proc = run_bench(["--model", str(tiny_model_dir), *TINY, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in REQUIRED:
        assert isinstance(result[key], (int, float)) and math.isfinite(result[key]), (key, result[key])
    assert 0.0 <= result["pad_fraction"] <= 1.0
    assert result["model_copies"] == 2  # the policy and its frozen copy, each counted once
    assert result["rollout_tokens"] > 0 and result["update_tokens"] > 0 and result["generate_calls"] >= 2
    assert result["sizes"]["group_size"] == 3 and result["sizes"]["max_turns"] == 1
    assert set(result["met"]) == set(result["targets"])
    assert result["update_frozen_bottom_speedup"] is None  # every layer trains: nothing frozen to measure
    # The table names every figure with its value and whether it met the target.
    for key in ("rollout_vs_generate", "rollout_batched_speedup", "update_vs_plain", "pad_fraction",
                "search_vs_generate", "peak_rss_gb", "matmul_gflops", "update_gflops"):
        assert key in proc.stdout
    assert "met?" in proc.stdout


def test_bench_measures_the_frozen_bottom_where_layers_are_frozen(tiny_model_dir, tmp_path):
    """--train-layers 1 on the 2-layer tiny model: the update runs the frozen layer once (what train.py
    chooses) and the figure compares it with the update that runs every layer on every pass."""
    out = tmp_path / "bench.json"
    proc = run_bench(["--model", str(tiny_model_dir), *TINY, "--train-layers", "1", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["sizes"]["train_layers"] == 1
    assert result["update_frozen_bottom_speedup"] > 0 and math.isfinite(result["update_frozen_bottom_speedup"])
    assert "update_frozen_bottom_speedup" in proc.stdout


def test_bench_rejects_a_group_of_one_before_loading_anything(tmp_path):
    proc = run_main("bench.py", "--group-size", "1", "--out", tmp_path / "b.json")
    assert proc.returncode == 2
    assert "--group-size 1: must be >= 2" in proc.stderr
    assert not (tmp_path / "b.json").exists()
