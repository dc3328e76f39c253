"""FastEngine: engine.HFEngine with the speed-ups, the plain engine's contract, faster on a CPU.

engine.HFEngine.sample left-pads the prompts, lets `generate` prefill the whole batch into Hugging
Face's growing DynamicCache and sample with its own sampler. FastEngine changes four things, each
measured on the embedded model (README, "Results"):

1. prefill.py computes the prompts' KV cache without waste: a prefix shared by several rows (the G
   samples of a question) once, rows in length buckets so no pad is computed. `generate` then only
   runs each row's last prompt token.
2. The cache is preallocated for the prompt and max_new_tokens (prefill.decode_cache), so a decode
   step writes in place instead of concatenating the whole cache (21% of generate's time at 8 rows
   x 500 prompt tokens).
3. sampler.Sample draws each token by inverse CDF and records its log-prob; `generate` runs greedy
   on its pick.
4. Greedy calls decode each distinct prompt once: greedy decoding is a function of the prompt, and
   the frozen modules of a group see many equal prompts (same question, same tool, same sub-goal).

Where a piece cannot apply (a sliding-window or other non-plain cache, a single row) it falls back to
the plain batch and Hugging Face's cache. Greedy decoding gives the plain engine's tokens and
log-probs; sampling gives the same distribution from another random stream (tests/test_engine.py).

Test: python -m pytest -q tests/test_engine.py
"""

import dataclasses

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList

from engine import HFEngine, left_pad, sampling_config
from speedups.prefill import CACHE, decode_cache, prefill
from speedups.sampler import Sample


@torch.inference_mode()
def sample(model, prompts, pad, eos, max_new_tokens, temperature, top_p, stopper, first=()):
    """(B, S) new tokens and (B, S) log-probs, as engine.HFEngine.sample returns them (`first`: processors
    that run before the sampler, engine.FirstTokenChoice)."""
    device = model.device
    prepared = prefill(model, prompts, pad, room=max_new_tokens)
    if prepared is None:
        input_ids, attention = left_pad(prompts, pad)
        prepared = input_ids, attention, decode_cache(model, input_ids.shape[1] + max_new_tokens)
    input_ids, attention, cache = prepared  # (B, W), (B, W), a cache of every token but each row's last
    sampler = Sample(temperature, top_p)
    config = sampling_config(max_new_tokens, 0.0, 1.0, pad, eos)  # greedy: Sample has picked every token
    # With a preallocated cache, Hugging Face would torch.compile the forward on a GPU, and compile
    # again for every new batch shape; rollout shapes change at every call.
    config.disable_compile = True
    out = model.generate(
        input_ids=input_ids.to(device), attention_mask=attention.to(device), **{CACHE: cache}, generation_config=config,
        logits_processor=LogitsProcessorList([*first, sampler]), stopping_criteria=StoppingCriteriaList([stopper]),
    )
    logprobs = sampler.logprobs()
    return out[:, input_ids.shape[1]:].cpu(), None if logprobs is None else logprobs.cpu()


class FastEngine(HFEngine):
    """engine.HFEngine with the speed-ups: the same interface and results (tests/test_engine.py)."""

    def generate_batched(self, prompts, max_new_tokens, temperature, top_p, stop, choices, choice_temperature, then=None):
        """Greedy: each distinct prompt decoded once, its completion copied to the prompts equal to it
        (a group's samples that chose the same tool send the executor and the generator the same prompt)."""
        distinct = list(dict.fromkeys(map(tuple, prompts)))
        if temperature > 0 or len(distinct) == len(prompts):
            return super().generate_batched(prompts, max_new_tokens, temperature, top_p, stop, choices, choice_temperature, then)
        done = dict(zip(distinct, super().generate_batched([list(p) for p in distinct], max_new_tokens, temperature,
                                                           top_p, stop, choices, choice_temperature, then)))
        return [dataclasses.replace(done[tuple(p)], prompt_ids=list(p), response_ids=list(done[tuple(p)].response_ids),
                                    logprobs=list(done[tuple(p)].logprobs)) for p in prompts]

    def sample(self, prompts, pad, eos, max_new_tokens, temperature, top_p, stopper, first=()):
        return sample(self.model, prompts, pad, eos, max_new_tokens, temperature, top_p, stopper, first)
