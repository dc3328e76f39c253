"""One Flow-GRPO update from a rollout batch: training rows, log-probs, loss, accumulation, step.

Every planner turn of every trajectory becomes one training row: the prompt s_t and the sampled
action a_t, with the loss mask on a_t only (the tool output lives in the NEXT turn's prompt, so no
other masking is needed) and the advantage A_i of its trajectory (the reward broadcast). Rows are
left-padded, so every response sits at the end of its row and the language-model head only runs on
the last R positions (`logits_to_keep`), not on the whole prompt: on a 49k vocabulary that is most of
the memory of a forward pass. Rows whose prompts are identical (the G samples of a question at the
first turn) share one prompt pass and its KV cache: on the CPU preset that cuts the tokens an update
computes several-fold (collate_shared).

    for each epoch, for each mini-batch (one optimiser step):
        for each micro-batch of rows sorted by length:          # gradient accumulation
            logp      = log pi_theta(a_t | s_t)                  (B, R)
            pg_loss   = clipped surrogate vs. pi_old            flow_grpo.policy_loss
            kl_loss   = beta * k3(pi_theta || pi_ref)           flow_grpo.kl_penalty + agg_loss
            backward((pg_loss + kl_loss) * world)               no gradient all-reduce until the last
        clip_grad_norm(1.0); AdamW step (skipped, and counted, when non-finite)

Accumulation uses Accelerate's `no_sync` + `backward` rather than `accelerator.accumulate`: the
number of micro-batches varies from one mini-batch to the next (trajectories have different turn
counts), and each micro-batch loss is already normalised by the whole mini-batch's token count (or
trajectory count for "flow"), summed over processes. DDP averages gradients over the W processes, so
each process multiplies its loss by W and the result is exactly the full-batch loss.

Test: python -m pytest -q tests/test_train.py
"""

import contextlib
import math
import warnings
from dataclasses import dataclass

import torch

from flow_grpo import agg_loss, entropy_from_logits, kl_penalty, policy_loss, token_logprobs
from speedups.prefill import left_pad


# ---------------------------------------------------------------------------------------------
# Training rows: one per planner turn. Left-padded, so every row's response sits at the end and the
# language-model head only has to run on the last R positions (logits_to_keep), not on the prompt.


@dataclass
class Row:
    ids: list  # prompt s_t + response a_t token ids, (P + R,)
    n_resp: int  # R = |a_t|, the number of loss-masked tokens at the end of ids
    old_logp: list  # log pi_old of each response token, (R,)
    advantage: float  # A_i of the row's trajectory (the broadcast)
    turns: int  # T_i, the number of planner turns of the row's trajectory ("flow" aggregation)
    mini: int  # which mini-batch (optimiser step) the row belongs to
    ref_logp: list | None = None  # log pi_ref of each response token, (R,)


def collate(rows, pad_id: int, device) -> dict:
    """Left-pad rows into tensors. The loss mask is built from recorded lengths, never from token ids."""
    ids, attn = left_pad([r.ids for r in rows], pad_id)  # (B, L)
    B, L, R = len(rows), ids.shape[1], max(r.n_resp for r in rows)
    mask = torch.zeros((B, R))
    old = torch.zeros((B, R))
    ref = torch.zeros((B, R))
    for b, r in enumerate(rows):
        mask[b, R - r.n_resp:] = 1
        old[b, R - r.n_resp:] = torch.tensor(r.old_logp)
        if r.ref_logp is not None:
            ref[b, R - r.n_resp:] = torch.tensor(r.ref_logp)
    batch = dict(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                 targets=ids[:, L - R:], mask=mask, old_logp=old, ref_logp=ref,  # (B, L) x3, (B, R) x4
                 advantages=torch.tensor([r.advantage for r in rows], dtype=torch.float32),  # (B,)
                 turns=torch.tensor([float(r.turns) for r in rows]))  # (B,)
    return {k: v.to(device) for k, v in batch.items()}


def response_logits(model, batch):
    """Logits that predict each of the last R tokens: (B, R, V). Position p predicts token p + 1."""
    R = batch["targets"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], logits_to_keep=R + 1, use_cache=False)
    return out.logits[:, :-1]


def collate_shared(rows, device) -> dict:
    """Rows that share one prompt: the prompt once, the responses right-padded after it.

    At the first turn the G rows of a question have the very same prompt s_1 (a few hundred tokens)
    and differ only in their ~20 response tokens, so most of a left-padded batch is the same prompt
    computed G times. Here it is computed once and its KV cache is shared by the G responses; the
    gradient still flows into the prompt's computation through the cache (tested against `collate`).
    Response-side tensors are left-aligned: row b's tokens are positions [0, n_resp).
    """
    prompt = rows[0].ids[: len(rows[0].ids) - rows[0].n_resp]
    B, R = len(rows), max(r.n_resp for r in rows)
    targets = torch.zeros((B, R), dtype=torch.long)
    mask, old, ref = torch.zeros((B, R)), torch.zeros((B, R)), torch.zeros((B, R))
    for b, r in enumerate(rows):
        targets[b, : r.n_resp] = torch.tensor(r.ids[len(prompt):])
        mask[b, : r.n_resp] = 1
        old[b, : r.n_resp] = torch.tensor(r.old_logp)
        if r.ref_logp is not None:
            ref[b, : r.n_resp] = torch.tensor(r.ref_logp)
    batch = dict(prompt=torch.tensor([prompt]), targets=targets, mask=mask, old_logp=old, ref_logp=ref,  # (1, P), (B, R) x4
                 advantages=torch.tensor([r.advantage for r in rows], dtype=torch.float32),  # (B,)
                 turns=torch.tensor([float(r.turns) for r in rows]))  # (B,)
    return {k: v.to(device) for k, v in batch.items()}


def shared_response_logits(model, batch):
    """(B, R, V) logits for B responses after ONE shared prompt: prompt pass, then response pass on its cache."""
    B, R = batch["targets"].shape
    P = batch["prompt"].shape[1]
    first = model(input_ids=batch["prompt"], use_cache=True, logits_to_keep=1)  # the last prompt logit predicts token 0
    cache = first.cache
    for layer in cache.layers:  # (1, heads, P, d) -> (B, heads, P, d), a view: no copy, gradients add up
        layer.keys = layer.keys.expand(B, -1, -1, -1)
        layer.values = layer.values.expand(B, -1, -1, -1)
    attention = torch.cat([torch.ones((B, P), dtype=torch.long, device=batch["mask"].device), batch["mask"].long()], dim=1)
    positions = (P + torch.arange(R, device=batch["mask"].device)).expand(B, R)
    rest = model(input_ids=batch["targets"], attention_mask=attention, position_ids=positions,
                 cache=cache, use_cache=False)
    return torch.cat([first.logits[:, -1:].expand(B, -1, -1), rest.logits[:, :-1]], dim=1)


def units(rows, size, share_prompts: bool):
    """Micro-batches as (rows, shared) pairs. With share_prompts, rows with the same prompt go together
    and their prompt is computed once; the other rows are sorted by length and left-padded."""
    if not share_prompts:
        return [(chunk, False) for chunk in micro_batches(rows, size)]
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r.ids[: len(r.ids) - r.n_resp]), []).append(r)
    shared = [g[i:i + size] for g in groups.values() if len(g) > 1 for i in range(0, len(g), size)]
    single = [g[0] for g in groups.values() if len(g) == 1]
    return [(chunk, True) for chunk in shared] + [(chunk, False) for chunk in micro_batches(single, size)]


def forward(model, chunk, shared, pad_id, device):
    """(logits (B, R, V), batch, real tokens computed) for one micro-batch of either layout."""
    if shared:
        batch = collate_shared(chunk, device)
        tokens = batch["prompt"].shape[1] + int(batch["mask"].sum())
        return shared_response_logits(model, batch), batch, tokens
    batch = collate(chunk, pad_id, device)
    return response_logits(model, batch), batch, int(batch["attention_mask"].sum())


def row_slice(logp, b, n, shared):
    """Row b's n response values: left-aligned in the shared layout, right-aligned when left-padded."""
    return logp[b, :n] if shared else logp[b, logp.shape[1] - n:]


@torch.no_grad()
def fill_logprobs(model, rows, attr, pad_id, device, temperature, micro):
    """Store log pi(a_t) of a no-grad model (reference, or pi_old when recomputed) on every row."""
    for chunk, shared in units(rows, micro, share_prompts=True):
        logits, batch, _ = forward(model, chunk, shared, pad_id, device)
        logp = token_logprobs(logits, batch["targets"], temperature).float().cpu()
        for b, r in enumerate(chunk):
            setattr(r, attr, row_slice(logp, b, r.n_resp, shared).tolist())


def micro_batches(rows, size):
    """Rows sorted by length, then cut into micro-batches: little padding per forward pass."""
    rows = sorted(rows, key=lambda r: len(r.ids))
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def make_rows(trajs, advantages, group_of, questions_per_mini) -> list[Row]:
    rows = []
    for tr, adv, g in zip(trajs, advantages.tolist(), group_of):
        for t in tr.turns:
            if t.response_ids:  # a zero-length response has no token to train
                rows.append(Row(t.prompt_ids + t.response_ids, len(t.response_ids), t.logprobs, adv,
                                len(tr.turns), g // questions_per_mini))
    return rows


# ---------------------------------------------------------------------------------------------
# The update: clipped surrogate + KL, micro-batches accumulated, one optimiser step per mini-batch.


def update(cfg, accelerator, policy, optimizer, rows, n_mini, pad_id) -> dict:
    stats = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0,
             "ratio_mean": 0.0, "grad_norm": 0.0, "skipped_updates": 0, "optimizer_steps": 0, "tokens": 0}
    n_micro_total = 0
    for epoch in range(cfg.epochs):
        for mini in range(n_mini):
            mine = [r for r in rows if r.mini == mini]
            if not mine and accelerator.num_processes == 1:
                continue  # nothing to train in this mini-batch (e.g. every group filtered out): no step
            # The loss of a mini-batch is normalised over ALL processes' rows, so that DDP's gradient
            # average (divide by the world size) gives exactly the full-batch token-mean / flow value.
            local = sum(r.n_resp for r in mine) if cfg.agg == "token-mean" else sum(1.0 / r.turns for r in mine)
            normaliser = accelerator.reduce(torch.tensor(float(local), device=accelerator.device), "sum").item()
            # Shared prompts need two forward calls before one backward, which DDP does not allow, so
            # they are a single-process optimisation (the CPU case); several processes left-pad every row.
            chunks = units(mine, cfg.micro_batch_rows, share_prompts=accelerator.num_processes == 1)
            loss_sum = 0.0
            for i, (chunk, shared) in enumerate(chunks):
                # Accumulate: no gradient all-reduce until the last micro-batch of this mini-batch.
                sync = i == len(chunks) - 1
                with contextlib.nullcontext() if sync else accelerator.no_sync(policy), accelerator.autocast():
                    logits, batch, tokens = forward(policy, chunk, shared, pad_id, accelerator.device)  # (B, R, V)
                    logp = token_logprobs(logits, batch["targets"], cfg.temperature)  # (B, R)
                    pg_loss, pg = policy_loss(logp, batch["old_logp"], batch["advantages"], batch["mask"],
                                              clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.clip_c or None,
                                              agg=cfg.agg, turn_counts=batch["turns"], normaliser=normaliser)
                    per_token_kl = kl_penalty(logp, batch["ref_logp"], cfg.kl_kind)  # (B, R)
                    kl_loss = agg_loss(per_token_kl, batch["mask"], agg=cfg.agg, turn_counts=batch["turns"], normaliser=normaliser)
                    loss = pg_loss + cfg.kl_coef * kl_loss  # = -J for these rows
                    accelerator.backward(loss * accelerator.num_processes)
                loss_sum += loss.item()
                with torch.no_grad():
                    m = batch["mask"].bool()
                    stats["entropy"] += entropy_from_logits(logits[m][None], cfg.temperature).mean().item() if m.any() else 0.0
                    stats["kl"] += (per_token_kl[m].mean().item() if m.any() else 0.0)
                for k in ("clip_frac_low", "clip_frac_high", "ratio_mean"):
                    stats[k] += float(pg[k])
                stats["pg_loss"] += pg_loss.item()
                stats["tokens"] += tokens
                n_micro_total += 1
            # One optimiser step per mini-batch; a non-finite gradient is skipped, never applied.
            grad_norm = accelerator.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            grad_norm = float(grad_norm) if grad_norm is not None else 0.0
            if math.isfinite(grad_norm) and math.isfinite(loss_sum):
                optimizer.step()
                stats["optimizer_steps"] += 1
            else:
                warnings.warn(f"non-finite loss ({loss_sum}) or gradient norm ({grad_norm}): update skipped")
                stats["skipped_updates"] += 1
            optimizer.zero_grad(set_to_none=True)
            stats["loss"] += loss_sum
            stats["grad_norm"] = max(stats["grad_norm"], grad_norm) if math.isfinite(grad_norm) else stats["grad_norm"]
    for k in ("entropy", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "pg_loss"):
        stats[k] /= max(n_micro_total, 1)
    stats["loss"] /= max(cfg.epochs * n_mini, 1)
    return stats
