"""The update computes a prompt PREFIX shared by several rows once: train.py's micro_batches and
forward, as drop-ins with the same contract.

Rows of an update often begin with the same tokens: the G rows of a question's first turn have the
very same prompt s_1; rows that differ only near the end of the prompt (a later turn's memory after
the same question) share everything before it; and every planner prompt starts with the same system
line and tool list. In a left-padded micro-batch those tokens are computed once per row. Here
`micro_batches` puts rows with a long common prefix together, and `forward` runs that prefix once,
expands its KV cache (a view, no copy) to the rows, and runs each row's own tokens (the rest of its
prompt, then its response) on top of it:

    row b:   [ shared prefix (P) | own prompt tail | response (n_b) | right padding ]     (B, P + T)

It takes train.collate's left-padded batch and returns the logits in that batch's layout, (B, R, V),
so everything after it (the log-probs, the loss, the masks) is the plain path's. The gradient still
flows into the prefix's computation through the cache and adds up over the rows: the loss, its
gradient and every log-prob equal the plain forward's up to float rounding (tests/test_update.py).
It runs the plain forward instead where nothing is worth sharing (under MIN_SHARED tokens) and under
gradient checkpointing in training (transformers then turns the KV cache off); train.py uses it with
one process only (DDP and FSDP need one forward per backward; this makes two).

Test: python -m pytest -q tests/test_update.py
"""

import torch

from speedups.prefill import CACHE, common_prefix

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


def micro_batches(turns, size: int) -> list[list]:
    """train.micro_batches' contract: the chunks that share a prefix, then the other rows sorted by length."""
    shared, rest = group_by_prefix(turns, size)
    rest = sorted(rest, key=lambda t: len(t.prompt_ids) + len(t.response_ids))
    return shared + [rest[i:i + size] for i in range(0, len(rest), size)]


def forward(model, batch, call=None):
    """train.forward's contract: logits (B, R, V) predicting batch["targets"] of train.collate's batch.
    `call(model, part, **kwargs)` runs the model's decoder (no language-model head) on one part, "rows"
    (the plain forward), "prefix" or "tails", and returns its output; by default
    model.get_decoder()(**kwargs) (speedups/frozen_bottom.py passes its own)."""
    call = call or _call
    ids, attention, R = batch["input_ids"], batch["attention_mask"], batch["mask"].shape[1]
    B, L = ids.shape
    lengths = attention.sum(-1).tolist()  # (B,) real tokens of each row
    # (B,) |s_t|: a response fills the last positions of the (R,) window and its first token is always
    # trained (forced tokens, rollout.Turn.forced, come after it), so it starts at the first 1 of the
    # mask. Not the mask's sum: the forced tokens would count as prompt, and a prefix shared past the
    # true prompt (rows that drew the same tool) would lose the logit that predicts the tool token.
    starts = (batch["mask"] > 0).float().argmax(-1).tolist()  # (B,) first trained window position
    prompts = [n - (R - s) for n, s in zip(lengths, starts)]
    rows = [ids[b, L - lengths[b]:].tolist() for b in range(B)]
    P = min(prompts + [common_prefix(rows[0], r) for r in rows[1:]])  # shared by every row, and prompt only
    if B < 2 or P < MIN_SHARED or (model.training and _checkpointing(model)):
        hidden = call(model, "rows", input_ids=ids, attention_mask=attention, position_ids=batch["position_ids"],
                      use_cache=False).last_hidden_state  # (B, L, H)
        return head(model, hidden[:, L - R - 1:L - 1])  # position p predicts token p + 1
    # 1. The prefix once, (1, P); its cache expanded to the B rows, (B, heads, P, d): a view, no copy,
    #    so the gradients of the B rows add up in the prefix's computation.
    first = call(model, "prefix", input_ids=ids[:1, L - lengths[0]:L - lengths[0] + P], use_cache=True)
    cache = expand(getattr(first, CACHE), B)  # prefill.CACHE: the field is past_key_values in transformers 5.17
    # 2. Each row's own tokens after the prefix, right-padded: (B, T).
    T = max(lengths) - P
    tail, tail_attention = ids.new_zeros((B, T)), attention.new_zeros((B, T))
    for b in range(B):
        tail[b, :lengths[b] - P] = ids[b, L - lengths[b] + P:]
        tail_attention[b, :lengths[b] - P] = 1
    rest = call(model, "tails", input_ids=tail, attention_mask=torch.cat([attention.new_ones((B, P)), tail_attention], 1),
                position_ids=(P + torch.arange(T, device=ids.device)).expand(B, T), **{CACHE: cache},
                use_cache=False).last_hidden_state  # (B, T, H)
    # 3. The hidden states that predict each tail token: pred[:, j] predicts tail token j (the prefix's
    #    last one predicts tail token 0). Position r of row b's (R,) window holds its real token
    #    lengths[b] - R + r, tail token lengths[b] - R + r - P: the head (a 49k vocabulary, more work per
    #    position than the top layers of a small model) then runs on those B x R positions only, not on
    #    every tail position. A window position before the row's response takes a neighbouring state,
    #    which the loss mask leaves out.
    pred = torch.cat([first.last_hidden_state[:, -1:].expand(B, -1, -1), rest], 1)  # (B, 1 + T, H)
    index = torch.tensor(lengths, device=ids.device)[:, None] - R - P + torch.arange(R, device=ids.device)  # (B, R)
    index = index.clamp(0, T)
    return head(model, pred.gather(1, index[..., None].expand(-1, -1, pred.shape[-1])))  # (B, R, V)


def head(model, hidden):
    """The language-model head on hidden states (B, n, H) -> logits (B, n, V): what the model's own
    forward returns as logits for those positions (speedups.choose turns the speed-ups off for a model
    whose forward does more, such as soft-capping)."""
    return model.get_output_embeddings()(hidden)


@torch.no_grad()
def plain_head(model) -> bool:
    """True when the model's logits are its output embeddings applied to its decoder's last hidden
    state, as `head` computes them (not so under soft-capping or a logit scale)."""
    embeddings, ids = model.get_output_embeddings(), torch.tensor([[0, 1, 2]], device=model.device)
    return embeddings is not None and torch.allclose(
        model(input_ids=ids).logits, embeddings(model.get_decoder()(input_ids=ids).last_hidden_state), atol=1e-5)


def _call(model, part, **kwargs):
    return model.get_decoder()(**kwargs)


def expand(cache, rows: int):
    """A one-row KV cache seen as `rows` rows: a view of each layer, no copy."""
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    return cache


def _checkpointing(model) -> bool:
    """Gradient checkpointing on? (transformers 5.24 names it is_activation_checkpointing, 5.17 the older name.)"""
    name = next((n for n in ("is_activation_checkpointing", "is_gradient_checkpointing") if hasattr(type(model), n)), "")
    return bool(getattr(model, name)) if name else False
