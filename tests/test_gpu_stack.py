"""What a GPU machine's software stack changes, pinned on CPU: a model's own generation_config, an
older transformers (5.17), a python3-only machine without every package, and autocast's memory.

- temperature 0 is greedy on the plain engine even when the model's generation_config asks to sample
  (Qwen2.5-*-Instruct's does: do_sample True, temperature 0.7, top_p 0.8, top_k 20);
- the speed-ups hand the KV cache to the model under the installed transformers' own name
  (`cache` in 5.24, `past_key_values` in 5.17; a model with 5.17's interface stands in for 5.17 here,
  and CI runs scripts/gpu_check.sh --cpu under a real 5.17 as well: .ci/run);
- scripts/gpu_check.sh finds python3 where there is no `python`, and gpu_check.py names a missing
  package in one line;
- the memory estimate counts what bf16 autocast adds, and --dry-run says which precision it assumed.
The FSDP items (bf16 buffers, the frozen copy on every rank) run in tests/test_gpu_paths.py.

Run: python -m pytest -q tests/test_gpu_stack.py
"""

import os
import shutil
import subprocess
import sys
import types

import pytest
import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

import train
from conftest import ROOT, run_main
from engine import HFEngine, encode_chat
from scaleout import sizing
from speedups import prefill, shared_prompt
from test_engine import group_chats
from test_update import _rows

# Qwen2.5-*-Instruct's generation_config.json
QWEN_INSTRUCT = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
INSTALLED = prefill.CACHE  # this transformers' name for the KV cache, before a test patches it
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def tiny_qwen2(vocab_size: int):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return Qwen2ForCausalLM(config).eval()


# ---- 1. temperature 0 ---------------------------------------------------------------------------

def test_temperature_zero_is_greedy_on_the_plain_engine_when_the_models_generation_config_samples(tokenizer):
    model = tiny_qwen2(len(tokenizer))
    chat = [{"role": "user", "content": "What is 12 + 30?"}]
    # Greedy by hand: the argmax of every next-token distribution.
    ids = torch.tensor([encode_chat(tokenizer, chat)])
    with torch.no_grad():
        for _ in range(12):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    argmax = ids[0, -12:].tolist()
    model.generation_config = GenerationConfig(**QWEN_INSTRUCT)
    for seed in range(4):
        torch.manual_seed(seed)
        got = HFEngine(model, tokenizer).generate([chat], max_new_tokens=12, temperature=0.0)[0]
        assert got.response_ids == argmax[:len(got.response_ids)] and len(got.response_ids) > 0, seed


# ---- 4. the KV cache's keyword ------------------------------------------------------------------

class OldCacheNames(torch.nn.Module):
    """transformers 5.17's interface over this version's model: the KV cache goes in as past_key_values
    and comes back as out.past_key_values, and there is no out.cache. 5.17 would take a `cache=`
    keyword silently and run without the cache; here it is an error."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.config = model.config

    @property
    def device(self):
        return self.inner.device

    def get_decoder(self):  # the decoder alone (speedups/shared_prompt.py runs it), under 5.17's names too
        return OldCacheNames(self.inner.get_decoder())

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, past_key_values=None, **kwargs):
        assert "cache" not in kwargs, "cache= is not a keyword of transformers 5.17"
        out = self.inner(**{INSTALLED: past_key_values}, **kwargs)
        fields = {name: getattr(out, name) for name in ("logits", "last_hidden_state") if hasattr(out, name)}
        return types.SimpleNamespace(**fields, past_key_values=getattr(out, INSTALLED))


def test_the_speedups_pass_and_read_the_kv_cache_under_transformers_5_17s_name(tokenizer, monkeypatch):
    model = tiny_qwen2(len(tokenizer))
    prompts = [encode_chat(tokenizer, c) for c in group_chats()]
    pad = tokenizer.eos_token_id  # what HFEngine pads with when the tokenizer names no pad token
    turns = shared_prompt.group_by_prefix(_rows(), 8)[0][0]  # rows that share a prompt prefix
    batch = train.collate(turns, 0, "cpu")
    small = tiny_qwen2(1000)  # _rows() draws token ids below 1000
    want_prefill = prefill.prefill(model, prompts, pad, room=4)
    with torch.no_grad():
        want_logits = shared_prompt.forward(small, batch)
    for module in (prefill, shared_prompt):  # what the installed 5.17 would make it
        monkeypatch.setattr(module, "CACHE", "past_key_values")
    got_prefill = prefill.prefill(OldCacheNames(model), prompts, pad, room=4)
    with torch.no_grad():
        got_logits = shared_prompt.forward(OldCacheNames(small).eval(), batch)
    assert torch.equal(got_prefill[0], want_prefill[0]) and torch.equal(got_prefill[1], want_prefill[1])
    for a, b in zip(got_prefill[2].layers, want_prefill[2].layers):
        assert torch.allclose(a.keys, b.keys) and torch.allclose(a.values, b.values)
    assert torch.allclose(got_logits, want_logits, atol=1e-5)


# ---- 5. scripts/gpu_check.sh on a bare machine --------------------------------------------------

def test_gpu_check_finds_python3_where_there_is_no_python(tmp_path):
    bin_dir = tmp_path / "bin"  # PATH holds python3 and the shell's tools, no `python`
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    for tool in ("bash", "dirname", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for env in ({"PATH": str(bin_dir)}, {"PATH": str(bin_dir), "PYTHON": "python3"}):
        res = subprocess.run([str(bin_dir / "bash"), "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, env={**ENV, **env, "CUDA_VISIBLE_DEVICES": ""})
        assert res.returncode == 2 and "sees no CUDA GPU" in res.stderr, res.stderr[-1000:]


def test_gpu_check_names_missing_packages_in_one_line_instead_of_a_traceback():
    # accelerate and requests made unimportable, as on a machine with only torch and transformers
    code = ("import sys, runpy; sys.modules['accelerate'] = sys.modules['requests'] = None; "
            "sys.argv = ['scripts/gpu_check.py', '--cpu']; runpy.run_path('scripts/gpu_check.py', run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    [line] = res.stderr.strip().splitlines()
    assert "accelerate, requests not installed" in line and "pip install accelerate==1.15.0 'requests>=2.31'" in line


# ---- 6. memory under autocast -------------------------------------------------------------------

def test_the_estimate_under_autocast_adds_fp32_residuals_bf16_weight_copies_and_fp32_logit_copies():
    model = "Qwen/Qwen2.5-0.5B-Instruct"
    p = sizing.parameter_count(sizing.architecture(model))
    bf16 = sizing.estimate(model, bf16=True, checkpointing=False)
    fp32 = sizing.estimate(model, bf16=False, checkpointing=False)
    assert bf16["autocast_weights"] == pytest.approx(p * 2 / sizing.GIB) and fp32["autocast_weights"] == 0  # 0.9 GiB
    assert bf16["logits"] == pytest.approx(2 * fp32["logits"])  # the bf16 logits AND their fp32 copy
    assert bf16["activations"] == pytest.approx(fp32["activations"] / 2 * 1.25)  # not pure bf16: +25%
    checkpointed = sizing.estimate(model, bf16=True, checkpointing=True)["activations"]
    assert checkpointed == pytest.approx(sizing.estimate(model, bf16=False, checkpointing=True)["activations"])
    sharded = sizing.estimate(model, gpus=8, sharded=True, bf16=True)  # FSDP gathers bf16 weights itself
    assert sharded["autocast_weights"] == 0


def test_dry_run_without_the_launcher_says_it_assumed_fp32():
    res = run_main("train.py", "--preset", "gpu-24gb", "--dry-run", env={"ACCELERATE_MIXED_PRECISION": None})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "mixed precision: fp32 assumed (no launcher" in res.stdout
    assert "ACCELERATE_MIXED_PRECISION=bf16" in res.stdout
    assert "replicated (DDP or one device), fp32:" in res.stdout
