"""The update runs the frozen bottom layers once a step: shared_prompt.forward, keeping what they compute.

With --train-layers n (the cpu-plan preset trains the top 6 of the embedded model's 30 layers) the
policy's embeddings and bottom L - n layers keep their initial weights (bookkeeping/models.py,
train_top_layers), which are the frozen copy's, the KL reference's. A step runs the same rows through
them three times: the reference pass, then each of the update's two epochs. What comes out of them,
the hidden state entering layer L - n, depends on the tokens alone. FrozenBottom computes it on the
first pass over a micro-batch, keeps it, keyed by the micro-batch's tokens, and from then on runs the
top n layers only:

    reference pass:   tokens -> [bottom L - n layers] -> h (kept) -> [top n of pi_ref]   -> logits
    each epoch:                                          h (kept) -> [top n of pi_theta] -> logits

It is shared_prompt.forward with each of its model calls split in two (`call` below): the bottom
layers (their KV cache of the shared prefix serves the rows' tails, as there) and the top layers on
what they gave. No gradient reaches the bottom layers in either path, so the loss, its gradient and
every log-prob equal shared_prompt.forward's (tests/test_update.py). Kept states are keyed by the
tokens, the parameters' dtype and the autocast state: a reference pass in fp32 and an update under
bf16 autocast (a GPU) do not share them. train.make_engines uses it where shared_prompt applies
and --train-layers leaves bottom layers frozen.

Test: python -m pytest -q tests/test_update.py
"""

import hashlib
from collections import OrderedDict
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from speedups import shared_prompt
from speedups.prefill import CACHE


class FrozenBottom:
    """A train.RowPath forward: shared_prompt.forward that runs the bottom `frozen` layers once per
    micro-batch's tokens. The most recent states are kept, up to `budget` bytes (a cpu-plan step's are
    about 40 MB); a micro-batch whose states were let go is computed again, not wrong."""

    def __init__(self, frozen: int, budget: int = 1 << 30):
        self.frozen, self.budget = frozen, budget
        self.kept = OrderedDict()  # key -> {part: (rows, tokens, hidden) states entering layer `frozen`}

    def __call__(self, model, batch):
        decoder = model.get_decoder()
        bottom = [decoder.embed_tokens, *decoder.layers[:self.frozen]]
        if any(p.requires_grad for m in bottom for p in m.parameters()):
            raise ValueError(f"FrozenBottom({self.frozen}): the bottom layers of this model are trained")
        dtype = next(decoder.parameters()).dtype
        key = _key(batch, dtype, torch.is_autocast_enabled(batch["input_ids"].device.type))
        states = self.kept.pop(key, {})
        self.kept[key] = states  # the most recent last; the oldest goes first
        while len(self.kept) > 1 and self.size() > self.budget:
            self.kept.popitem(last=False)
        prefix = {}  # the bottom layers' KV cache of the shared prefix, while the tails need it

        def call(model, part, input_ids, **kwargs):
            if part not in states:
                states[part] = self.bottom(model, part, input_ids, kwargs, prefix)
            if kwargs.get("use_cache"):  # a cache of the top layers only, numbered from 0 in it
                kwargs[CACHE] = DynamicCache()
            with layers(model, self.frozen, None):
                return model.get_decoder()(inputs_embeds=states[part], **kwargs)

        return shared_prompt.forward(model, batch, call)

    def size(self) -> int:
        """Bytes of the kept states."""
        return sum(h.numel() * h.element_size() for states in self.kept.values() for h in states.values())

    @torch.no_grad()
    def bottom(self, model, part, input_ids, kwargs, prefix):
        """The hidden states entering layer `frozen`, (rows, tokens, hidden)."""
        kwargs = dict(kwargs)
        if part == "prefix":
            kwargs[CACHE] = DynamicCache()
        elif part == "tails":
            kwargs[CACHE] = shared_prompt.expand(prefix["cache"], input_ids.shape[0])
        with layers(model, 0, self.frozen, norm=False):
            out = model.get_decoder()(input_ids=input_ids, **kwargs)
        if part == "prefix":
            prefix["cache"] = getattr(out, CACHE)
        return out.last_hidden_state


def _key(batch, dtype, autocast: bool) -> bytes:
    digest = hashlib.sha1(f"{dtype} {autocast}".encode())
    for name in ("input_ids", "attention_mask", "mask"):
        digest.update(batch[name].cpu().numpy().tobytes())
        digest.update(str(tuple(batch[name].shape)).encode())
    return digest.digest()


@contextmanager
def layers(model, start: int, stop, norm: bool = True):
    """The decoder with only its layers [start:stop] (each numbered from 0 for the KV cache), and no
    final norm unless `norm`: the bottom part, or the top part fed hidden states as inputs_embeds."""
    decoder = model.get_decoder()
    every, final = decoder.layers, decoder.norm
    kept = every[start:stop]  # a ModuleList of the same layer modules
    numbers = [layer.self_attn.layer_idx for layer in kept]
    try:
        for i, layer in enumerate(kept):
            layer.self_attn.layer_idx = i
        decoder.layers = kept
        if not norm:
            decoder.norm = torch.nn.Identity()
        yield
    finally:
        decoder.layers, decoder.norm = every, final
        for layer, number in zip(kept, numbers):
            layer.self_attn.layer_idx = number
