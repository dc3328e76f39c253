"""The update computes a prompt PREFIX shared by several rows once.

Rows of an update often begin with the same tokens: the G rows of a question's first turn have the
very same prompt s_1; rows that differ only near the end of the prompt (a tool list shown in another
order in its last line, a later turn's memory after the same question) share everything before it;
and every planner prompt starts with the same system line and tool list. In a left-padded micro-batch
those tokens are computed once per row. Here the longest prefix common to a chunk of rows runs once,
its KV cache is expanded (a view, no copy) to the rows, and each row's own tokens (the rest of its
prompt, then its response) run on top of it. The gradient still flows into the prefix's computation
through the cache and adds up over the rows: the loss, its gradient and every log-prob equal the
left-padded layout's up to float rounding (tests/test_update.py).

    row b:   [ shared prefix (P) | own prompt tail (S_b) | response (n_b) | right padding ]
    loss mask:        -                     0                  1                 0

train.py's micro_batches(turns, size, share_prompts=True) hands rows here; they come back as the same
batch dict that train.collate makes, except that the response-side tensors are laid out as above (row
b's response at its own offset, `batch["start"][b]`, which train.row_values reads).
It cannot apply, and train.py keeps the plain rows, where:
- several processes train (DDP and FSDP need one forward per backward; this makes two);
- gradient checkpointing is on (transformers then turns the KV cache off, and there is none to share).

Test: python -m pytest -q tests/test_update.py
"""

import torch

from flow_grpo import first_token_fields
from speedups.prefill import common_prefix

# A chunk shares its prefix only when the prefix is at least this many tokens: below that, the second
# forward call and the right padding of the rows' tails cost more than the tokens saved.
MIN_SHARED = 32


def group_by_prefix(turns, size: int):
    """(shared chunks, the rest). Rows sorted by prompt (rows with long common prefixes sit next to each
    other) are cut greedily into chunks of at most `size`. A row joins the chunk when that saves
    tokens: the p' prefix tokens it then does not compute must outweigh what the chunk's n rows
    compute again when the shared prefix shrinks from p to p' (n (p - p')). So the G rows of one
    prompt stay together, and so do rows that differ only near the end; a row that shares less than
    MIN_SHARED tokens with its neighbours goes to the plain rest."""
    order = sorted(turns, key=lambda t: tuple(t.prompt_ids))
    chunks, chunk, prefix = [], [], 0
    for t in order:
        if chunk:
            p = min(prefix, common_prefix(chunk[0].prompt_ids, t.prompt_ids))
            if len(chunk) < size and p >= MIN_SHARED and p >= len(chunk) * (prefix - p):
                chunk.append(t)
                prefix = p
                continue
            chunks.append(chunk)
        chunk, prefix = [t], len(t.prompt_ids)
    if chunk:
        chunks.append(chunk)
    shared = [c for c in chunks if len(c) > 1]
    rest = [c[0] for c in chunks if len(c) == 1]
    return shared, rest


def collate(turns, device) -> dict:
    """Rows that share a prefix: the prefix once; each row's prompt tail and response after it, right-padded.

    The tails are the model's input (`tail`, (B, T)). The loss-side tensors (targets, mask, old_logp,
    ref_logp, (B, R)) start at the first tail position that any row's response occupies (`lo`), so that
    no logit is computed for a tail position that only predicts prompt tokens; row b's response is at
    [start_b, start_b + n_b) of them."""
    P = len(turns[0].prompt_ids)
    for t in turns[1:]:
        P = min(P, common_prefix(turns[0].prompt_ids, t.prompt_ids))
    tails = [t.prompt_ids[P:] + t.response_ids for t in turns]
    B, T = len(turns), max(len(x) for x in tails)
    lo = min(len(t.prompt_ids) - P for t in turns)
    tail = torch.zeros((B, T), dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    mask, old, ref = torch.zeros((B, T - lo)), torch.zeros((B, T - lo)), torch.zeros((B, T - lo))
    start = []
    for b, (t, ids) in enumerate(zip(turns, tails)):
        s, n = len(t.prompt_ids) - P - lo, len(t.response_ids)
        tail[b, :len(ids)] = torch.tensor(ids)
        attention[b, :len(ids)] = 1
        mask[b, s:s + n] = 1
        old[b, s:s + n] = torch.tensor(t.logprobs)
        if t.ref_logp is not None:
            ref[b, s:s + n] = torch.tensor(t.ref_logp)
        start.append(s)
    batch = dict(prompt=torch.tensor([turns[0].prompt_ids[:P]]), tail=tail, tail_attention=attention,
                 targets=tail[:, lo:], mask=mask, old_logp=old, ref_logp=ref, start=torch.tensor(start),
                 advantages=torch.tensor([t.advantage for t in turns], dtype=torch.float32),  # (B,)
                 turns=torch.tensor([float(t.traj_turns) for t in turns]), shared=True,
                 **first_token_fields([t.first_choices for t in turns], start))  # (1, P), (B, T) x2, (B, R) x4, (B,) x3
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def response_logits(model, batch):
    """(B, R, V) logits predicting batch["targets"] for B rows after ONE shared prefix: the prefix
    pass, then the tails on its cache, the language-model head (a 49k vocabulary) only where needed."""
    B, T = batch["tail"].shape
    R = batch["targets"].shape[1]
    P = batch["prompt"].shape[1]
    first = model(input_ids=batch["prompt"], use_cache=True, logits_to_keep=1)  # the last prefix logit predicts tail token 0
    cache = first.cache
    for layer in cache.layers:  # (1, heads, P, d) -> (B, heads, P, d), a view: no copy, gradients add up
        layer.keys = layer.keys.expand(B, -1, -1, -1)
        layer.values = layer.values.expand(B, -1, -1, -1)
    device = batch["tail"].device
    attention = torch.cat([torch.ones((B, P), dtype=torch.long, device=device), batch["tail_attention"]], dim=1)
    positions = (P + torch.arange(T, device=device)).expand(B, T)
    # targets = tail[:, T - R:] and tail position j predicts tail token j + 1: keep positions T - R - 1 ..
    # T - 2. When T == R some row's response starts right after the prefix, and the prefix pass's last
    # logit predicts its first token.
    rest = model(input_ids=batch["tail"], attention_mask=attention, position_ids=positions, cache=cache,
                 use_cache=False, logits_to_keep=min(R + 1, T))
    logits = rest.logits[:, :-1]
    return torch.cat([first.logits[:, -1:].expand(B, -1, -1), logits], dim=1) if R == T else logits


def tokens_computed(batch) -> int:
    """Real tokens a forward over this batch computes: the prefix once, then every row's own tokens."""
    return batch["prompt"].shape[1] + int(batch["tail_attention"].sum())
