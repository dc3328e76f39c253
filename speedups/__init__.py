"""CPU speed-ups, off the reading path: drop-ins for the plain engine and the plain update forward.

    prefill.py        the prompt batch's KV cache without waste (shared prefixes once, no pads), preallocated
    sampler.py        sampling by inverse CDF inside `generate`, recording log-probs as it goes
    generate.py       FastEngine: engine.HFEngine's interface, built from the two above
    shared_prompt.py  micro_batches and forward: the update computes a prompt prefix shared by several rows once
    frozen_bottom.py  FrozenBottom: that forward, running the layers below --train-layers once a step

Each is tested equal to the plain code it replaces (tests/test_engine.py, tests/test_update.py). `choose`
turns them on where they apply: one process (DDP and FSDP need one forward per backward; the
shared-prompt update makes two), a model whose KV cache is plain full-attention layers and whose logits
are its output embeddings of its last hidden state (the update applies the head itself), and the
transformers version they were tested with. `--speedups` / `--no-speedups` force the choice.
"""

import transformers

from engine import HFEngine
from speedups.generate import FastEngine
from speedups.prefill import plain_layers
from speedups.frozen_bottom import FrozenBottom
from speedups.shared_prompt import forward, micro_batches, plain_head

TESTED_TRANSFORMERS = ("5.24.0",)  # requirements.txt's pin; the tests above ran with it

__all__ = ["FastEngine", "FrozenBottom", "choose", "engine", "forward", "micro_batches", "update_forward"]


def choose(requested, model, processes: int = 1) -> tuple[bool, str]:
    """(on, the line that says so): `requested` True or False (--speedups / --no-speedups) decides; None
    (the default) turns the speed-ups on where they apply and says why not where they do not."""
    if requested is not None:
        return bool(requested), f"speed-ups {'on' if requested else 'off'} (--{'' if requested else 'no-'}speedups)"
    version = transformers.__version__
    why_not = ("several processes" if processes > 1 else
               "the model's KV cache is not plain full-attention layers" if not plain_layers(model) else
               "the model's logits are more than its output embeddings of its last hidden state" if not plain_head(model) else
               f"transformers {version} is not the tested {', '.join(TESTED_TRANSFORMERS)}"
               if version not in TESTED_TRANSFORMERS else "")
    if why_not:
        return False, f"speed-ups off: {why_not} (--speedups forces them on)"
    return True, "speed-ups on (one process, a plain KV cache and head, a tested transformers; --no-speedups turns them off)"


def engine(model, tokenizer, on: bool, max_batch: int = 16):
    """FastEngine where the speed-ups are on, else the plain engine.HFEngine."""
    return (FastEngine if on else HFEngine)(model, tokenizer, max_batch=max_batch)


def update_forward(model, train_layers: int):
    """The update's forward: FrozenBottom where --train-layers leaves layers below it frozen, else
    shared_prompt.forward."""
    layers = getattr(model.get_decoder(), "layers", ())
    return FrozenBottom(len(layers) - train_layers) if 0 < train_layers < len(layers) else forward
