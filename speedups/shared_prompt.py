"""The update computes a prompt shared by several rows once (the G rows of a question's first turn).

At the first turn the G rows of a question have the very same prompt s_1 (a few hundred tokens) and
differ only in their ~20 response tokens, so most of a left-padded micro-batch is the same prompt
computed G times. Here the prompt runs once, its KV cache is expanded (a view, no copy) to the G
responses, and the responses run on top of it. The gradient still flows into the prompt's computation
through the cache, and adds up over the G rows: the loss, its gradient and every log-prob equal the
left-padded layout's up to float rounding (tests/test_update.py). On the CPU preset that cuts the
tokens an update computes several-fold.

train.py's micro_batches(turns, size, shared=True) hands rows here; they come back as the same
batch dict that train.collate makes, except that the response-side tensors are LEFT-aligned (row b's
tokens are positions [0, R_b)), which `row_values` undoes. It cannot apply, and train.py keeps the
plain rows, where:
- several processes train (DDP and FSDP need one forward per backward; this makes two);
- gradient checkpointing is on (transformers then turns the KV cache off, and there is none to share).

Test: python -m pytest -q tests/test_update.py
"""

import torch


def group_by_prompt(turns, size: int):
    """(shared chunks, the rest): rows with the same prompt go together, at most `size` a chunk."""
    groups = {}
    for t in turns:
        groups.setdefault(tuple(t.prompt_ids), []).append(t)
    shared = [g[i:i + size] for g in groups.values() if len(g) > 1 for i in range(0, len(g), size)]
    rest = [g[0] for g in groups.values() if len(g) == 1]
    return shared, rest


def collate(turns, device) -> dict:
    """Rows that share one prompt: the prompt once, the responses right-padded after it."""
    B, R = len(turns), max(len(t.response_ids) for t in turns)
    targets = torch.zeros((B, R), dtype=torch.long)
    mask, old, ref = torch.zeros((B, R)), torch.zeros((B, R)), torch.zeros((B, R))
    for b, t in enumerate(turns):
        n = len(t.response_ids)
        targets[b, :n] = torch.tensor(t.response_ids)
        mask[b, :n] = 1
        old[b, :n] = torch.tensor(t.logprobs)
        if t.ref_logp is not None:
            ref[b, :n] = torch.tensor(t.ref_logp)
    batch = dict(prompt=torch.tensor([turns[0].prompt_ids]), targets=targets, mask=mask, old_logp=old, ref_logp=ref,
                 advantages=torch.tensor([t.advantage for t in turns], dtype=torch.float32),  # (B,)
                 turns=torch.tensor([float(t.traj_turns) for t in turns]), shared=True)  # (1, P), (B, R) x4, (B,) x2
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def response_logits(model, batch):
    """(B, R, V) logits for B responses after ONE shared prompt: prompt pass, then response pass on its cache."""
    B, R = batch["targets"].shape
    P = batch["prompt"].shape[1]
    first = model(input_ids=batch["prompt"], use_cache=True, logits_to_keep=1)  # the last prompt logit predicts token 0
    cache = first.cache
    for layer in cache.layers:  # (1, heads, P, d) -> (B, heads, P, d), a view: no copy, gradients add up
        layer.keys = layer.keys.expand(B, -1, -1, -1)
        layer.values = layer.values.expand(B, -1, -1, -1)
    device = batch["mask"].device
    attention = torch.cat([torch.ones((B, P), dtype=torch.long, device=device), batch["mask"].long()], dim=1)
    positions = (P + torch.arange(R, device=device)).expand(B, R)
    rest = model(input_ids=batch["targets"], attention_mask=attention, position_ids=positions, cache=cache, use_cache=False)
    return torch.cat([first.logits[:, -1:].expand(B, -1, -1), rest.logits[:, :-1]], dim=1)


def tokens_computed(batch) -> int:
    """Real tokens a forward over this batch computes: the prompt once, then every response token."""
    return batch["prompt"].shape[1] + int(batch["mask"].sum())
