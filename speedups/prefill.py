"""Prefill: turn a batch of prompts into the KV cache that `generate` continues from, without waste.

On a CPU the agent's rollouts are prefill-bound: every module call reads a few hundred prompt tokens
per row and writes a few dozen. A plain batch wastes much of that prefill in two ways:

1. Repeats. The G trajectories of one question share most of their prompts: the planner's first turn
   is the very same prompt G times, and later turns and the other modules share the instructions and
   the question. A plain batch computes every shared token G times.
2. Padding. Rows are left-padded to the longest; verifier and generator prompts carry memories of
   different lengths, so up to half of a plain batch is pad positions, computed and thrown away.

Here the prompts become a tree of shared prefixes (prefix_tree): the head every prompt starts with
once, each question once on top of it, each row's own tail on top of that; each node runs once, on top
of its parent's KV, and the nodes of a level run in buckets of similar length, so padding stays under
~20%. The result is laid out exactly as the plain left-padded batch, with the KV of every
token but each row's last in the cache:

    input_ids, attention = left_pad(prompts)          (B, W): what generate is given
    cache                                             (B, heads, W - 1, d): keys/values per layer

so `generate` only has to run the last column, and every real token sits at the position and sees the
tokens it would in the plain batch: the logits equal the plain batch's up to float rounding (tested in
tests/test_engine.py). The pads' cache entries are zeros that the attention mask hides.

The cache it returns is preallocated (`decode_cache`): room for the prompt and every token the call
may generate, written in place. Hugging Face's default DynamicCache instead grows by torch.cat, which
copies the whole cache of every layer at every decode step: for 8 rows of 500 tokens on a CPU that
copy was 21% of all of generate's time in a profile, and a decode step took 141 ms against ~85 ms
with the preallocated cache (8 rows x 500 prompt tokens, SmolLM2-135M, 2 threads).

Works with caches made of plain full-attention layers (Llama, Qwen2, SmolLM2, ...); for any other
cache structure (sliding windows, linear attention) `prefill` and `decode_cache` return None and the
caller falls back to the plain batch and Hugging Face's default cache.

Test: python -m pytest -q tests/test_engine.py
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from engine import left_pad

# The model's KV-cache keyword and output field: `cache` in transformers 5.24, `past_key_values` in 5.17
# (which a GPU machine may have preinstalled). 5.24 still takes the old name, but warns, so the
# speed-ups pass and read the cache under the installed version's own name.
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token lists (also the update's: shared_prompt.py)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


# A prefix shared by k rows is computed on its own only when it saves at least this many tokens,
# (k - 1) x its length: below that, the extra forward call and the copies of its KV into the rows that
# continue it cost more than the tokens saved.
MIN_SAVED = 32


@dataclass
class Node:
    """Tokens [start, end) of the prompts of `rows`, computed once, on top of the node `parent` (-1: none).
    Every row of a node has the same first `end` tokens."""

    start: int
    end: int
    rows: list
    parent: int
    depth: int


def prefix_tree(prompts) -> tuple[list[Node], list[int]]:
    """The prompts' tokens but each row's last (generate runs that one), as a tree of shared prefixes:
    (nodes, the node at which each row ends). Parents come before their children.

    A training call holds G samples of a few questions: the planner's first turn is the same prompt G
    times, every planner prompt starts with the same system line and tool list, and later prompts of a
    question share everything up to where their memories differ. So rows are split where they stop
    sharing tokens, again and again: the head of every prompt once, each question once on top of it,
    each row's own tail on top of that. A split that would save fewer than MIN_SAVED tokens is not made:
    those rows each compute the few tokens they share, as part of their own nodes.
    """
    seqs = [p[:-1] for p in prompts]
    nodes, end_of = [], [0] * len(seqs)

    def grow(rows, start, parent, depth):  # rows share seqs[r][:start] and each has a token past it
        pending = [rows]
        while pending:
            group = pending.pop()
            n = min(len(seqs[r]) for r in group) - start
            for r in group[1:]:
                n = common_prefix(seqs[group[0]][start:start + n], seqs[r][start:start + n])
            parts = {}  # the group's rows by the token after the shared part (None: a row that ends there)
            for r in group:
                parts.setdefault(seqs[r][start + n] if len(seqs[r]) > start + n else None, []).append(r)
            if len(parts) > 1 and (len(group) - 1) * n < MIN_SAVED:
                pending.extend(parts.values())  # too little shared: each part computes these n tokens itself
                continue
            node = len(nodes)
            nodes.append(Node(start, start + n, group, parent, depth))
            for r in parts.pop(None, []):
                end_of[r] = node
            for part in parts.values():
                grow(part, start + n, node, depth + 1)

    grow(list(range(len(seqs))), 0, -1, 0)
    return nodes, end_of


def buckets(lengths, slack: float = 0.8) -> list[list[int]]:
    """Indices grouped so that, in each group, every length is >= slack x the group's longest.

    A bucket is padded to its longest row, so at most 1 - slack of its positions are pads.
    """
    order = sorted((i for i in range(len(lengths)) if lengths[i] > 0), key=lambda i: -lengths[i])
    groups = []
    for i in order:
        if groups and lengths[i] >= slack * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def plain_layers(model) -> bool:
    """True when the model's KV cache is one full-attention (B, heads, L, d) tensor pair per layer."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def decode_cache(model, size: int, keys=(), values=()):
    """A preallocated cache of `size` positions per row, holding `keys`/`values` (per layer, (B, heads,
    L, d)) in its first L positions; None for a model whose cache is not plain full-attention layers.

    Each decode step then writes one column in place instead of concatenating a new cache."""
    if not plain_layers(model):
        return None
    cache = StaticCache(config=model.config, max_cache_len=size)  # full-attention layers: StaticLayers
    for layer, k, v in zip(cache.layers, keys, values):
        layer.update(k, v)  # positions 0 .. L-1; the layer's length is then L
    return cache


def _cache_of(model, keys, values):
    """A DynamicCache holding the given per-layer (B, heads, L, d) keys and values."""
    cache = DynamicCache(config=model.config)
    for layer, k, v in zip(cache.layers, keys, values):
        layer.update(k, v)
    return cache


def _stack(parts, width: int):
    """Per layer, (n, heads, width, d) keys and values with part j's (heads, len_j, d) right-aligned.

    `parts` holds one (keys, values) pair of per-layer tensors per row; the positions before a row's
    tokens stay zero: pads, hidden by the attention mask.
    """
    stacked = ([], [])
    for kind in (0, 1):
        for layer in range(len(parts[0][kind])):
            first = parts[0][kind][layer]
            full = first.new_zeros((len(parts), first.shape[0], width, first.shape[2]))
            for j, part in enumerate(parts):
                full[j, :, width - part[kind][layer].shape[1]:] = part[kind][layer]
            stacked[kind].append(full)
    return stacked


def _run(model, ids, mask, start, past=None):
    """One forward over a left-padded (n, w) block whose rows continue `past` from positions `start`.

    Returns the (keys, values) per layer of the whole cache, (n, heads, L + w, d).
    """
    positions = (start[:, None] + mask.cumsum(-1) - 1).clamp(min=0)
    full_mask = mask if past is None else torch.cat([past[1], mask], 1)
    out = model(input_ids=ids, attention_mask=full_mask, position_ids=positions, logits_to_keep=1, use_cache=True,
                **{CACHE: None if past is None else past[0]})
    layers = getattr(out, CACHE).layers
    return [layer.keys for layer in layers], [layer.values for layer in layers]


@torch.inference_mode()
def prefill(model, prompts, pad: int, room: int):
    """(input_ids, attention, cache) for `generate`, or None when the plain left-padded batch should run.

    room: positions to reserve in the cache after the prompts (the tokens generate will add).

    1. The nodes of prefix_tree, level by level: each node's tokens run once, on top of its parent's KV
       (its path: every token before it), nodes of a level in buckets of similar length (the parents
       left-padded inside a bucket, hidden by the mask). We keep each node's path KV unpadded.
    2. Every row's KV is the path of the node it ends at; the rows are placed right-aligned in one
       (B, heads, W - 1, d) cache per layer, the layout of the plain left-padded batch.
    """
    if len(prompts) < 2 or min(len(p) for p in prompts) < 2:
        return None
    if not plain_layers(model):
        return None  # sliding-window or other cache layers: not laid out as one (B, heads, L, d) tensor
    device = model.device
    nodes, end_of = prefix_tree(prompts)
    # 1. The nodes, level by level.
    path = [None] * len(nodes)  # per node, per layer (heads, end, d): the KV of its rows' first `end` tokens
    for depth in range(max(node.depth for node in nodes) + 1):
        level = [k for k, node in enumerate(nodes) if node.depth == depth]
        for group in buckets([nodes[k].end - nodes[k].start for k in level]):
            group = [level[j] for j in group]
            own = [prompts[nodes[k].rows[0]][nodes[k].start:nodes[k].end] for k in group]
            starts = [nodes[k].start for k in group]
            width = max(starts)  # the parents' paths, left-padded to the longest in this bucket
            past = None
            if width:
                pre_mask = torch.zeros((len(group), width), dtype=torch.long)
                for b, s in enumerate(starts):
                    pre_mask[b, width - s:] = 1
                past = (_cache_of(model, *_stack([path[nodes[k].parent] for k in group], width)), pre_mask.to(device))
            ids, mask = left_pad(own, pad)
            out = _run(model, ids.to(device), mask.to(device), torch.tensor(starts, device=device), past)
            last = out[0][0].shape[2]  # its parent's path ends the padded block; its own tokens end the row
            for b, (k, s) in enumerate(zip(group, starts)):
                sel = torch.cat([torch.arange(width - s, width), torch.arange(last - len(own[b]), last)]).to(device)
                path[k] = ([t[b, :, sel] for t in out[0]], [t[b, :, sel] for t in out[1]])

    # 2. One left-padded cache, W - 1 wide: the plain batch's layout, preallocated with `room` to spare.
    input_ids, attention = left_pad(prompts, pad)
    width = input_ids.shape[1]
    return input_ids, attention, decode_cache(model, width + room, *_stack([path[end_of[i]] for i in range(len(prompts))], width - 1))
