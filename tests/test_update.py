"""The update's two layouts give the same numbers: rows that share a prompt (computed once, its KV cache
shared: speedups/shared_prompt.py) and left-padded rows (the plain path in train.py).

Run: python -m pytest -q tests/test_update.py
"""

import copy
import types

import torch
from accelerate import Accelerator

import train
from conftest import make_tiny_model
from flow_grpo import token_logprobs
from rollout import Turn


def turn(prompt, response, old, advantage, traj_turns, ref):
    return Turn(prompt, response, old, "", "Python_Coder", "", "", True, False, advantage=advantage,
                traj_turns=traj_turns, ref_logp=ref)


def _rows():
    torch.manual_seed(0)
    prompt = torch.randint(3, 900, (40,)).tolist()
    rows = []
    for i, n in enumerate([5, 3, 7, 1]):  # one question's group at turn 1: the same prompt
        resp = torch.randint(3, 900, (n,)).tolist()
        rows.append(turn(prompt, resp, [-2.0] * n, [1.5, -0.5, -0.5, -0.5][i], 1, [-2.1] * n))
    for n, p in [(4, 30), (2, 52)]:  # later turns: prompts of their own
        ids = torch.randint(3, 900, (p + n,)).tolist()
        rows.append(turn(ids[:p], ids[p:], [-1.0] * n, 0.7, 2, [-1.1] * n))
    return rows


def test_shared_prompt_logprobs_equal_left_padded_logprobs():
    model = make_tiny_model(1000).eval()
    rows = _rows()
    for chunk, shared in train.micro_batches(rows, 8, share_prompts=True):
        for layout in (shared, False):
            logits, batch, _ = train.forward(model, chunk, layout, 0, "cpu")
            lp = token_logprobs(logits, batch["targets"], 0.7)
            values = [train.row_values(lp, b, len(t.response_ids), layout) for b, t in enumerate(chunk)]
            if layout:
                shared_values = values
            elif shared:
                for a, b in zip(shared_values, values):
                    assert torch.allclose(a, b, atol=1e-5)
    assert any(s for _, s in train.micro_batches(rows, 8, share_prompts=True))


def test_an_update_with_shared_prompts_matches_one_without():
    cfg = types.SimpleNamespace(epochs=1, agg="token-mean", micro_batch_rows=3, temperature=0.7, clip_low=0.2,
                                clip_high=0.3, clip_c=0.0, kl_kind="low_var_kl", kl_coef=0.001, grad_clip=1.0)
    a = make_tiny_model(1000).train()
    b = copy.deepcopy(a)
    # Plain SGD, so that a parameter difference is exactly a gradient difference (Adam's first step is
    # about lr * sign(g), which amplifies float noise on near-zero gradients).
    opt_a = torch.optim.SGD(a.parameters(), lr=1.0)
    opt_b = torch.optim.SGD(b.parameters(), lr=1.0)
    stats_a = train.update(cfg, Accelerator(cpu=True), a, opt_a, [_rows()], 0, share_prompts=True)
    stats_b = train.update(cfg, Accelerator(cpu=True), b, opt_b, [_rows()], 0, share_prompts=False)
    assert stats_a["optimizer_steps"] == stats_b["optimizer_steps"] == 1
    assert abs(stats_a["loss"] - stats_b["loss"]) < 1e-6
    assert stats_a["tokens"] < stats_b["tokens"]  # the shared prompt is computed once, not four times
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name
