"""The GPU launch paths, proven on CPU replicas: what `accelerate launch train.py` runs on one GPU and on
eight, run here with tiny random-weight models.

- one process with --gradient-checkpointing (and --speedups, where the shared-prompt update broke):
  training steps, a resume and evaluation;
- the training step under FSDP (FULL_SHARD) on two gloo CPU processes whose trajectories differ in
  turns and lengths, through rollout, recomputed old log-probs, update and evaluation
  (tests/fsdp_driver.py: torch's FSDP, since Accelerate will not set FSDP up without a GPU);
- the launcher's precision (`--mixed_precision bf16`, a config file's `mixed_precision`) takes
  effect and every metrics line says which precision ran;
- evaluate.py's device and dtype defaults; metrics reduced over processes;
- scripts/gpu_check.sh in its --cpu mode, so the GPU check cannot rot unseen.

Every multi-process run has a timeout (and the FSDP driver a 60 s collective timeout): a hang fails.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_gpu_paths.py
"""

import json
import os
import subprocess
import sys
import types

import pytest
import torch
from safetensors.torch import load_file

import evaluate
import train
from bookkeeping.metrics import step_metrics
from conftest import ROOT

TINY = ["--data", "arithmetic", "--group-size", "2", "--questions-per-step", "2", "--mini-batch-questions", "1",
        "--max-turns", "2", "--analysis-tokens", "0", "--planner-tokens", "6", "--executor-tokens", "6",
        "--verifier-tokens", "3", "--generator-tokens", "3", "--lr", "1e-3", "--sample-every", "0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# ---- one process ------------------------------------------------------------------------------

def test_one_process_gradient_checkpointing_with_speedups_trains_resumes_and_evaluates(tiny_model_dir, tmp_path):
    # The shared-prompt update needs a KV cache, which gradient checkpointing switches off: it must
    # step aside (train.share_prompts) instead of failing at the first update.
    run = tmp_path / "ckpt"
    cfg, _ = train.parse_args(TINY + ["--model", str(tiny_model_dir), "--out", str(run), "--steps", "2",
                                      "--gradient-checkpointing", "--speedups", "--checkpoint-every", "1",
                                      "--eval-every", "1", "--eval-n", "2"])
    train.train(cfg)
    cfg, given = train.parse_args(["--resume", str(run), "--steps", "3"])
    train.train(cfg, given=given)
    lines = metrics(run)
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    assert all("test_accuracy" in m for m in lines) and all(m["optimizer_steps"] >= 1 for m in lines[1:])
    # The arithmetic suite names each question's kind: the test accuracy per kind, beside the overall one.
    by_kind = [m["test_accuracy_by_kind"] for m in lines]
    assert all(b and all(0 <= a <= 1 for a in b.values()) for b in by_kind)
    assert all(min(b.values()) <= m["test_accuracy"] <= max(b.values()) for b, m in zip(by_kind, lines))
    saved = json.loads((run / "config.json").read_text())
    assert saved["gradient_checkpointing"] and saved["speedups"]
    start, end = load_file(str(tiny_model_dir / "model.safetensors")), train_params(run, 3)
    assert any(not torch.equal(start[k], end[k]) for k in end if k in start)


def train_params(run, step):
    return load_file(str(run / "checkpoints" / f"step-{step:06d}" / "planner" / "model.safetensors"))


# ---- FSDP on two CPU processes ------------------------------------------------------------------

def fsdp_driver(args, env=(), port=29541):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "tests/fsdp_driver.py", *args]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**ENV, **dict(env)})
    assert res.returncode == 0, res.stderr[-4000:]


def test_fsdp_step_on_two_processes_with_different_trajectories_keeps_identical_parameters(tiny_model_dir, tmp_path):
    # The paper preset's FSDP settings (recomputed old log-probs, gradient checkpointing, evaluation).
    out = tmp_path / "fsdp"
    fsdp_driver([*TINY, "--model", str(tiny_model_dir), "--out", str(out), "--steps", "2", "--questions-per-step", "2",
                 "--mini-batch-questions", "2", "--micro-batch-rows", "2", "--old-logprobs", "recompute",
                 "--gradient-checkpointing", "--eval-every", "1", "--eval-n", "3", "--checkpoint-every", "1"])
    # The ranks really differed: turns per trajectory and response lengths (so rows, micro-batches
    # and decode steps) are not the same on the two processes.
    r0, r1 = (json.loads((out / f"driver-rank{r}.json").read_text()) for r in (0, 1))
    assert [s["turns"] for s in r0] != [s["turns"] for s in r1]
    assert max(max(s["response_lengths"]) for s in r1) > max(max(s["response_lengths"]) for s in r0)
    assert sum(len(s["response_lengths"]) for s in r1) > sum(len(s["response_lengths"]) for s in r0)
    # Identical whole weights on both ranks, changed by training, saved whole in the checkpoint.
    assert (out / "params-rank0.sha256").read_text() == (out / "params-rank1.sha256").read_text()
    start, end = load_file(str(tiny_model_dir / "model.safetensors")), train_params(out, 2)
    assert start.keys() <= end.keys() | {"lm_head.weight"}
    assert all(end[k].shape == start[k].shape for k in end if k in start)
    assert any(not torch.equal(start[k], end[k]) for k in end if k in start)
    lines = metrics(out)
    assert [m["step"] for m in lines] == [0, 1, 2] and all("test_accuracy" in m for m in lines)
    assert all("test_accuracy_by_kind" in m for m in lines)  # the same per-kind counts reduced on both ranks
    assert lines[-1]["processes"] == 2 and lines[-1]["distributed_type"] == "FSDP"
    # A resume under FSDP: the whole weights from the checkpoint, one more step, still identical.
    digest = (out / "params-rank0.sha256").read_text()
    fsdp_driver(["--resume", str(out), "--steps", "3"])
    assert [m["step"] for m in metrics(out)] == [0, 1, 2, 3]
    assert (out / "params-rank0.sha256").read_text() == (out / "params-rank1.sha256").read_text() != digest


def test_fsdp_in_bf16_keeps_the_rotary_buffers_fp32_and_every_rank_loads_the_frozen_copy_whole(tiny_model_dir, tmp_path):
    """configs/accelerate_8gpu_fsdp.yaml's settings: Accelerate's bf16 MixedPrecision policy (buffer_dtype
    bf16) and fsdp_cpu_ram_efficient_loading, with transformers 5.17's loading off rank 0 (zeros)."""
    from transformers import AutoModelForCausalLM

    from fsdp_driver import rotary_buffers, state_digest

    out = tmp_path / "fsdp-bf16"
    launcher = {"ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_USE_FSDP": "true",
                "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}
    fsdp_driver([*TINY, "--model", str(tiny_model_dir), "--out", str(out), "--steps", "1", "--questions-per-step", "2",
                 "--mini-batch-questions", "2", "--micro-batch-rows", "2", "--old-logprobs", "recompute"],
                env=launcher, port=29543)
    assert metrics(out)[-1]["mixed_precision"] == "bf16"
    ranks = [json.loads((out / f"loads-rank{r}.json").read_text()) for r in (0, 1)]
    # After a step under FSDP, the policy's rotary frequencies are still the fp32 ones it was built
    # with (bf16 would be off by up to 0.4%), on both ranks.
    built = [list(b) for b in rotary_buffers(AutoModelForCausalLM.from_pretrained(tiny_model_dir)).values()]
    for rank in ranks:
        assert list(rank["policy_buffers"].values()) == built  # [dtype, values] per buffer
    # The frozen copy (the second model loaded) holds the checkpoint on rank 1 too, not zeros.
    frozen = state_digest(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16))
    assert [rank["loads"][1]["digest"] for rank in ranks] == [frozen, frozen]


# ---- the launcher's precision -------------------------------------------------------------------

def _launch(launcher, run, tiny_model_dir):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_machines", "1", "--dynamo_backend", "no",
           *launcher, "train.py", *TINY, "--model", str(tiny_model_dir), "--out", str(run), "--steps", "1"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_the_launchers_mixed_precision_takes_effect_and_every_metrics_line_says_which(tiny_model_dir, tmp_path):
    # A config file's mixed_precision (configs/accelerate_1gpu.yaml) is checked the same way by the
    # gpu_check --cpu test below (its bf16 runs launch with that file and read metrics.jsonl).
    res = _launch(["--num_processes", "1", "--mixed_precision", "bf16"], tmp_path / "run", tiny_model_dir)
    assert '"mixed_precision": "bf16"' in res.stderr  # the launcher line printed at start
    [line] = metrics(tmp_path / "run")
    assert line["mixed_precision"] == "bf16" and line["device"] == "cpu" and line["processes"] == 1


# ---- evaluate.py's device and dtype, metrics over processes -------------------------------------

def test_evaluate_runs_on_the_gpu_in_bf16_by_default_and_says_what_to_pass_without_one(monkeypatch):
    cfg = types.SimpleNamespace(device="auto", dtype="auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert evaluate.device_and_dtype(cfg) == ("cpu", torch.float32)
    assert evaluate.device_and_dtype(types.SimpleNamespace(device="cpu", dtype="bf16")) == ("cpu", torch.bfloat16)
    with pytest.raises(SystemExit, match="pass --device cpu"):
        evaluate.device_and_dtype(types.SimpleNamespace(device="cuda", dtype="auto"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert evaluate.device_and_dtype(cfg) == ("cuda", torch.bfloat16)
    assert evaluate.device_and_dtype(types.SimpleNamespace(device="auto", dtype="fp32")) == ("cuda", torch.float32)


class TwoRanks:
    """An accelerator whose reduce adds a second rank's vector, recorded from a first call."""

    device = "cpu"

    def __init__(self, other=None):
        self.other, self.seen = other, None

    def reduce(self, tensor, reduction="sum"):
        self.seen = tensor.clone()
        return tensor + self.other if self.other is not None else tensor


def test_update_figures_in_the_metrics_are_means_over_every_processes_micro_batches():
    from rollout import Trajectory

    def upd(kl, entropy, micro, loss):
        return {"kl": kl, "entropy": entropy, "clip_frac_low": 0.0, "clip_frac_high": 0.1 * micro, "ratio_mean": micro,
                "pg_loss": -kl, "loss": loss, "grad_norm": 1.0, "skipped_updates": 0, "optimizer_steps": 1,
                "tokens": 10, "micro": micro}

    trajs = [Trajectory(query="q") for _ in range(2)]
    rewards = torch.tensor([1.0, 0.0])
    rank1 = TwoRanks()
    step_metrics(1, trajs, rewards, [0, 0], 2, upd(0.9, 3.0, 1, 0.5), 1.0, 1.0, rank1, ())
    m = step_metrics(1, trajs, rewards, [0, 0], 2, upd(0.2, 1.0, 2, 0.25), 1.0, 1.0, TwoRanks(rank1.seen), ())
    # Rank 0 alone would say kl 0.1 and entropy 0.5; over both ranks' three micro-batches:
    assert m["kl"] == pytest.approx((0.2 + 0.9) / 3) and m["entropy"] == pytest.approx(4.0 / 3)
    assert m["pg_loss"] == pytest.approx(-1.1 / 3) and m["loss"] == pytest.approx(0.75)
    assert m["clip_frac_high"] == pytest.approx(0.3 / 3) and m["reward_mean"] == 0.5


# ---- the GPU check script -----------------------------------------------------------------------

def test_gpu_check_refuses_without_cuda_and_says_how_to_run_its_cpu_mode():
    """Its CPU mode (8 checks, about 80 s) runs in .ci/run, under the pinned transformers and 5.17."""
    res = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**ENV, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 2 and "sees no CUDA GPU" in res.stderr and "--cpu" in res.stderr
