"""The paper-scale recipe: Accelerate config files parse, the dry run prints the config and a memory
estimate without downloading anything, and the estimate counts parameters right.

Run: python -m pytest -q tests/test_scaling.py
"""

import os
import subprocess
import sys

import pytest
from accelerate.commands.config.config_args import ClusterConfig

from scaleout import sizing
from conftest import ROOT, make_tiny_model


@pytest.mark.parametrize("name, kind, procs", [
    ("accelerate_1gpu", "NO", 1), ("accelerate_8gpu_ddp", "MULTI_GPU", 8), ("accelerate_8gpu_fsdp", "FSDP", 8),
])
def test_accelerate_config_files_parse(name, kind, procs):
    cfg = ClusterConfig.from_yaml_file(str(ROOT / "configs" / f"{name}.yaml"))
    assert cfg.distributed_type.value == kind and cfg.num_processes == procs and cfg.mixed_precision == "bf16"


def test_paper_dry_run_prints_config_and_memory_estimate_offline():
    # accelerate launch exports the precision it was given; the dry run estimates for that precision.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "ACCELERATE_MIXED_PRECISION": "bf16"}
    res = subprocess.run([sys.executable, "train.py", "--preset", "paper", "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    for expected in ['"model": "Qwen/Qwen2.5-7B-Instruct"', '"group_size": 8', '"questions_per_step": 32', '"lr": 1e-06',
                     '"clip_high": 0.3', '"kl_coef": 0.001', "mixed precision: bf16", '"gradient_checkpointing": true',
                     "7.62 B parameters", "8 GPU(s), FSDP-sharded", "total (the larger)"]:
        assert expected in out, expected


def test_the_estimate_counts_parameters_like_the_model_does(tokenizer, tmp_path):
    model = make_tiny_model(len(tokenizer))
    model.save_pretrained(tmp_path)
    counted = sizing.parameter_count(sizing.architecture(str(tmp_path)))
    actual = sum(p.numel() for p in model.parameters())
    assert abs(counted - actual) / actual < 0.01
    assert abs(sizing.parameter_count(sizing.architecture("Qwen/Qwen2.5-7B-Instruct")) - 7.62e9) < 0.01e9


def test_sharding_divides_the_training_states_and_an_unknown_model_says_what_to_pass():
    one = sizing.estimate("Qwen/Qwen2.5-7B-Instruct", gpus=1)
    eight = sizing.estimate("Qwen/Qwen2.5-7B-Instruct", gpus=8, sharded=True)
    assert eight["adamw_states"] == pytest.approx(one["adamw_states"] / 8)
    assert eight["total"] < 80 < one["total"]  # 7B fits 8 x 80 GB only when sharded
    with pytest.raises(ValueError, match="local model folder"):
        sizing.architecture("someone/unknown-model")
