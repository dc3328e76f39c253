"""Nothing the model writes or the world sends crashes training or loses work.

kill -9 in the middle of training then --resume; a non-finite loss skipped instead of applied; tools
that hang or raise in the middle of a rollout; bad data files, bad models and incomplete checkpoints
rejected up front with one line that says what to change.
Run: python -m pytest -q tests/test_robustness.py
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest
import torch
from accelerate import Accelerator

from bookkeeping import checkpoint
import tools
from conftest import ROOT, make_tiny_model, run_main
from bookkeeping.metrics import rollout_stats
from rollout import RolloutConfig, rollout
from test_rollout import ScriptedEngine
from test_train import TINY
from test_update import turn
from train import update


def _train_cmd(*args):
    return [sys.executable, "train.py", *TINY, *args]


# ---- training durability ----------------------------------------------------------------------

def test_kill_9_mid_training_then_resume_loses_and_repeats_no_step(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(_train_cmd("--model", str(tiny_model_dir), "--out", str(run), "--steps", "50",
                                       "--checkpoint-every", "1"),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.2)
    time.sleep(0.7)  # somewhere inside a later step: rollout, update or a checkpoint write
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(metrics.read_text().splitlines())
    assert 2 <= killed_at < 50, "the run should have been killed in the middle"
    # Every checkpoint folder that exists is complete: none is ever half written.
    for p in (run / "checkpoints").glob("step-*"):
        assert checkpoint.is_complete(p), p
    target = killed_at + 2
    res = subprocess.run([sys.executable, "train.py", "--resume", str(run), "--steps", str(target)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = metrics.read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]  # every line is valid JSON
    assert steps == list(range(1, target + 1))
    assert not list((run / "checkpoints").glob(".tmp-*"))
    assert checkpoint.is_complete(run / "checkpoints" / f"step-{target:06d}")


def test_a_non_finite_loss_skips_the_update_and_leaves_the_weights_alone(tokenizer):
    model = make_tiny_model(len(tokenizer)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = types.SimpleNamespace(epochs=1, agg="token-mean", micro_batch_rows=4, temperature=1.0, clip_low=0.2,
                                clip_high=0.3, clip_c=0.0, kl_kind="low_var_kl", kl_coef=0.001, grad_clip=1.0, tool_temperature=0.0)
    good = turn([1, 2, 3], [4, 5], [-1.0, -2.0], 1.0, 1, [-1.0, -2.0])
    bad = turn([1, 2, 3], [6, 7], [float("nan"), -2.0], -1.0, 1, [-1.0, -2.0])  # a NaN from anywhere upstream
    with pytest.warns(UserWarning, match="update skipped"):
        stats = update(cfg, Accelerator(cpu=True), model, optimizer, [[good, bad]], tokenizer.pad_token_id)
    assert stats["skipped_updates"] == 1 and stats["optimizer_steps"] == 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # The same rows without the NaN do update the weights.
    bad.logprobs = [-1.5, -2.0]
    stats = update(cfg, Accelerator(cpu=True), model, optimizer, [[good, bad]], tokenizer.pad_token_id)
    assert stats["optimizer_steps"] == 1
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


# ---- tools that fail in the middle of a rollout -----------------------------------------------

def test_a_hanging_or_raising_tool_becomes_an_error_result_and_the_rollout_goes_on(monkeypatch):
    # The hanging tool returns only when the test releases it (or after 60 s): a rollout that waited
    # for it would find it returned. No clock is read, so a loaded machine cannot fail the test.
    release, returned = threading.Event(), []

    def hang(code, timeout=10.0):
        release.wait(60)
        returned.append(True)

    def explode():
        raise RuntimeError("index file vanished")

    monkeypatch.setattr(tools.sandbox, "run_python", hang)
    monkeypatch.setattr(tools, "local_search", explode)
    eng = ScriptedEngine(["CONTINUE"] * 10)
    cfg = RolloutConfig(max_turns=2)
    box = tools.Toolbox(cfg.tools, llm=eng, python_timeout=0.5, tool_timeout=0.5)
    try:
        trajs = rollout(["q0", "q1"], eng, eng, box, cfg)
        assert returned == [], "the rollout waited for the hanging tool instead of timing it out"
    finally:
        release.set()
    for tr in trajs:
        assert len(tr.turns) == 2 and tr.answer == "178377"
        assert all("did not answer within" in t.result for t in tr.turns)
    assert rollout_stats(trajs)["tool_errors"]["Python_Coder"] == 4
    results = box.run([("Local_Search", "founder of X"), ("Python_Coder", "print(1)")])
    assert results[0] == "Error: Local_Search failed: RuntimeError: index file vanished"


# ---- bad input ----------------------------------------------------------------------------------

def _last_line(res):
    return res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""


def test_a_bad_data_file_stops_train_with_file_and_line_or_is_skipped_and_counted(tiny_model_dir, tmp_path):
    data = tmp_path / "qs.jsonl"
    data.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n{"question": "broken\n'
                    '{"question": "", "answer": "1"}\n{"question": "What is 3 * 3?", "answer": 9}\n')
    res = subprocess.run(_train_cmd("--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "a"),
                                    "--steps", "1"), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert f"{data}:2:" in _last_line(res) and "--skip-bad-rows" in _last_line(res)
    res = run_main("train.py", *TINY, "--model", tiny_model_dir, "--data", data, "--out", tmp_path / "b", "--steps", "1",
                   "--skip-bad-rows")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "skipped 2 bad rows" in res.stderr


def test_a_missing_model_or_one_without_chat_template_fails_in_one_line(tiny_model_dir, tmp_path):
    res = subprocess.run(_train_cmd("--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "a"), "--steps", "1"),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "cannot load model" in _last_line(res) and "--model" in _last_line(res)
    plain = tmp_path / "plain"
    import shutil
    shutil.copytree(tiny_model_dir, plain)
    for name in ("chat_template.jinja",):
        (plain / name).unlink(missing_ok=True)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    res = subprocess.run(_train_cmd("--model", str(plain), "--out", str(tmp_path / "b"), "--steps", "1"),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "no chat template" in _last_line(res)


def test_an_incomplete_checkpoint_is_refused_with_what_is_missing(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    res = run_main("train.py", *TINY, "--model", tiny_model_dir, "--out", run, "--steps", "1", "--checkpoint-every", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    step = run / "checkpoints" / "step-000001"
    (step / "optimizer.pt").unlink()
    res = subprocess.run([sys.executable, "train.py", "--resume", str(step)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "incomplete" in _last_line(res) and "optimizer.pt" in _last_line(res)
    # From the run folder, no complete checkpoint is left: also one clear line.
    res = subprocess.run([sys.executable, "train.py", "--resume", str(run)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "no complete checkpoint" in _last_line(res)
