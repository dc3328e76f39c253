"""Prefill: turn a batch of prompts into the KV cache that `generate` continues from, without waste.

On a CPU the agent's rollouts are prefill-bound: every module call reads a few hundred prompt tokens
per row and writes a few dozen. A plain batch wastes much of that prefill in two ways:

1. Repeats. The G trajectories of one question share most of their prompts: the planner's first turn
   is the very same prompt G times, and later turns and the other modules share the instructions and
   the question. A plain batch computes every shared token G times.
2. Padding. Rows are left-padded to the longest; verifier and generator prompts carry memories of
   different lengths, so up to half of a plain batch is pad positions, computed and thrown away.

Here each distinct shared prefix is run once, and rows run in buckets of similar length, so padding
stays under ~20%. The result is laid out exactly as the plain left-padded batch, with the KV of every
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


def plan_prefix_sharing(prompts):
    """Group rows by a shared prompt prefix: (prefixes, which, cut), or None when nothing is shared.

    Sorted, rows with common prefixes sit next to each other. Cutting the sorted list wherever two
    neighbours share fewer than t tokens gives groups whose common prefix is computed once; every row
    keeps at least its last token for itself (generate must have one token to run), and a row alone
    keeps all but that token as its "prefix", so it costs what it did. We try every t that occurs and
    keep the grouping that computes the fewest tokens (the distinct prefixes + every row's rest).
    Returns the K distinct prefixes, each row's prefix index and each row's prefix length.
    """
    if len(prompts) < 2 or min(len(p) for p in prompts) < 2:
        return None
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    shared = [common_prefix(prompts[a], prompts[b]) for a, b in zip(order, order[1:])]  # neighbours' common prefix
    best, best_cost = None, sum(map(len, prompts))  # nothing shared
    for t in sorted(set(shared) - {0}):
        groups, runs = [[order[0]]], [[]]  # rows of each group, and the neighbour overlaps inside it
        for b, s in zip(order[1:], shared):
            if s >= t:
                groups[-1].append(b)
                runs[-1].append(s)
            else:
                groups.append([b])
                runs.append([])
        prefixes, which, cut = [], [0] * len(prompts), [0] * len(prompts)
        for g, run in zip(groups, runs):
            n = min(min(run, default=len(prompts[g[0]])), *(len(prompts[i]) - 1 for i in g))
            for i in g:
                which[i], cut[i] = len(prefixes), n
            prefixes.append(prompts[g[0]][:n])
        cost = sum(map(len, prefixes)) + sum(len(p) - c for p, c in zip(prompts, cut))
        if cost < best_cost:
            best, best_cost = (prefixes, which, cut), cost
    return best


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

    1. Each distinct prefix runs once, in buckets of similar length; we keep each one's KV unpadded.
    2. Each row's rest (all its tokens after its prefix but the last) runs on top of its prefix's KV,
       in buckets of similar rest length (the prefixes are left-padded inside a bucket, hidden by the
       mask).
    3. Every row's KV (prefix + rest) is placed right-aligned in one (B, heads, W - 1, d) cache per
       layer, the layout of the plain left-padded batch.
    """
    if len(prompts) < 2 or min(len(p) for p in prompts) < 2:
        return None
    if not plain_layers(model):
        return None  # sliding-window or other cache layers: not laid out as one (B, heads, L, d) tensor
    device = model.device
    plan = plan_prefix_sharing(prompts)
    if plan is None:  # nothing shared: every row's "prefix" is all but its last token
        plan = ([p[:-1] for p in prompts], list(range(len(prompts))), [len(p) - 1 for p in prompts])
    prefixes, which, cut = plan

    # 1. The distinct prefixes: kv[k] = per layer, (heads, len_k, d).
    kv = [None] * len(prefixes)
    for group in buckets([len(p) for p in prefixes]):
        ids, mask = left_pad([prefixes[k] for k in group], pad)
        out = _run(model, ids.to(device), mask.to(device), torch.zeros(len(group), dtype=torch.long, device=device))
        for b, k in enumerate(group):
            n = len(prefixes[k])
            kv[k] = ([t[b, :, t.shape[2] - n:] for t in out[0]], [t[b, :, t.shape[2] - n:] for t in out[1]])

    # 2. The rests, on top of their prefixes: rows[i] = per layer, (heads, len_i - 1, d).
    rows = [kv[which[i]] for i in range(len(prompts))]  # a row with no rest IS its prefix
    rests = [prompts[i][cut[i]:-1] for i in range(len(prompts))]
    for group in buckets([len(r) for r in rests]):
        width = max(cut[i] for i in group)  # the prefixes, left-padded to the longest in this bucket
        pre_mask = torch.zeros((len(group), width), dtype=torch.long)
        for b, i in enumerate(group):
            pre_mask[b, width - cut[i]:] = 1
        past = (_cache_of(model, *_stack([kv[which[i]] for i in group], width)), pre_mask.to(device))
        ids, mask = left_pad([rests[i] for i in group], pad)
        out = _run(model, ids.to(device), mask.to(device), torch.tensor([cut[i] for i in group], device=device), past)
        for b, i in enumerate(group):
            end = out[0][0].shape[2]  # its prefix ends the padded prefix block; its rest ends the row
            sel = torch.cat([torch.arange(width - cut[i], width), torch.arange(end - len(rests[i]), end)]).to(device)
            rows[i] = ([t[b, :, sel] for t in out[0]], [t[b, :, sel] for t in out[1]])

    # 3. One left-padded cache, W - 1 wide: the plain batch's layout, preallocated with `room` to spare.
    input_ids, attention = left_pad(prompts, pad)
    width = input_ids.shape[1]
    return input_ids, attention, decode_cache(model, width + room, *_stack(rows, width - 1))
