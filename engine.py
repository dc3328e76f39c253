"""The language-model engine: batched sampling on plain Hugging Face `generate`.

Every module of the agent (planner, executor, verifier, generator, and the Base_Generator tool) talks
to a language model through one tiny interface:

    engine.generate(list_of_chats, max_new_tokens=..., temperature=..., prefix=..., stop=...) -> list[Generation]

where a chat is a list of {"role": ..., "content": ...} messages and `prefix` is text the reply is
forced to start with (the modules use it to pin their output format: a 135M model keeps to
"Tool Name: ..." far better when the reply already starts with it). HFEngine implements it over any
Hugging Face causal LM that has a chat template. For the trainable planner it also returns what
Flow-GRPO needs from the sampling pass: the exact prompt and response token ids, and the log-probability
of every sampled token under the policy that sampled it,

    logp_{t,j} = log softmax(logits_{t,j} / temperature)[a_{t,j}]

which is pi_old(a_{t,j} | s_t, a_{t,<j}) in the paper's ratio while the policy has not changed since
sampling (so train.py can skip a second forward pass for the old log-probs).

The plain path below: prompts left-padded into one batch, `model.generate` sampling with Hugging
Face's own sampler, a logits processor that records each sampled token's log-prob. A faster drop-in
with the same results is chosen where it applies (speedups/; tests/test_engine.py holds the two equal).

Simplifications vs. the official code:
- The official system samples with vLLM (top_p 0.99, frequency penalty 1.2). We sample from the full
  tempered distribution (top_k off, top_p 1.0 by default, no penalties, whatever the model's own
  generation_config says) so that the recorded log-probs are exactly the policy's, and the sampling
  distribution is the one the ratio assumes.

Test:  python -m pytest -q tests/test_engine.py
"""

import time
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

# (B rows, W prompt width, S generated steps, V vocabulary)


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


def left_pad(prompts, pad: int):
    """(B, W) token ids, left-padded, and the (B, W) attention mask marking real tokens.

    Generation appends on the right, so every row's last prompt token must sit in the last column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = 1
    return ids, mask


class RecordLogprobs(LogitsProcessor):
    """Record log pi(token) of every sampled token, at the sampling temperature, inside `generate`.

    A logits processor sees each step's next-token logits (B, V) before the token is drawn, so it keeps
    that step's tempered log-softmax and reads the drawn token's entry one step later, from the last
    column of input_ids; the final step's token is read from the output (`finish`). Hugging Face runs
    custom processors before its sampling warpers (temperature, top-p), so `scores` are the model's
    logits here. Memory stays O(B * V): one step of log-probs at a time.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature or 1.0  # greedy decoding records log-probs at T = 1
        self.last = None  # (B, V) log-probs of the step whose token is not drawn yet
        self.picked = []  # one (B,) tensor per step

    def __call__(self, input_ids, scores):
        if self.last is not None:
            self.picked.append(self.last.gather(1, input_ids[:, -1:]).squeeze(1))
        self.last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences) -> torch.Tensor | None:
        """(B, S) log-probs, once generate has returned its (B, W + S) sequences."""
        if self.last is not None:
            self.picked.append(self.last.gather(1, sequences[:, -1:]).squeeze(1))
            self.last = None
        return torch.stack(self.picked, dim=1) if self.picked else None


class FirstTokenChoice(LogitsProcessor):
    """Restrict the FIRST generated token to `choices`, at a temperature of its own (--tool-temperature),
    then force the tokens `then` gives for the choice drawn (the rest of a tool's name and "\nSub-Goal:").

    At the first step every other token gets -inf and the choices are scaled by temperature /
    choice_temperature, so that the sampler's softmax(scores / temperature) is softmax over the choices
    of ((logits + offsets) / choice_temperature), the offsets 0 unless `choices` is {token id: offset}
    (--calibrate-tools). Then each token of then[choice] is the only one allowed (log-prob log 1 = 0);
    later steps pass through. Placed before the processor that records the log-probs, so the recorded
    log-prob is the restricted draw's, which flow_grpo.restrict_first_token recomputes. Greedy: the likeliest."""

    def __init__(self, choices, temperature: float, choice_temperature: float, then=None):
        self.choices, self.offsets = list(choices), torch.tensor([choices[c] if isinstance(choices, dict) else 0.0 for c in choices])
        self.scale = (temperature / choice_temperature) if temperature > 0 else 1.0
        self.then = then or {}  # {choice token id: [token ids forced after it]}
        self.step, self.todo = 0, []  # per row, from the second step on: the tokens still to force

    def __call__(self, input_ids, scores):
        self.step += 1
        if self.step == 1:
            out = torch.full_like(scores, float("-inf"))
            out[:, self.choices] = (scores[:, self.choices] + self.offsets.to(scores)) * self.scale
            return out
        if self.step == 2:  # each row's choice is the last token of input_ids now
            self.todo = [list(self.then.get(c, ())) for c in input_ids[:, -1].tolist()]
        for r in [r for r, todo in enumerate(self.todo) if todo]:  # a forced token: the only one allowed
            scores[r] = float("-inf")
            scores[r, self.todo[r].pop(0)] = 0.0
        return scores


class StopAt(StoppingCriteria):
    """End a row at EOS or once its text contains a stop string, and record where each row ended: rows
    are cut exactly, without guessing from token ids (pad == eos in many tokenizers, SmolLM2's too).
    `then` (FirstTokenChoice's): the tokens forced after a row's first token are not searched for stop
    strings ("\nSub-Goal:" does not end the line it opens) nor counted against `limit`, the tokens a row
    may generate; a row that reaches it ends there, in `cut` (truncated)."""

    def __init__(self, tokenizer, prompt_width: int, eos: int, stop: tuple[str, ...], then=None, limit=None):
        self.tokenizer, self.width, self.eos, self.stop = tokenizer, prompt_width, eos, stop
        self.then, self.limit = then or {}, limit
        self.ends = None  # per row: number of generated tokens when it finished, or None
        self.cut = set()  # rows ended by `limit`

    def __call__(self, input_ids, scores, **kwargs):
        if self.ends is None:
            self.ends = [None] * input_ids.shape[0]
        n = input_ids.shape[1] - self.width  # tokens generated so far
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row in range(input_ids.shape[0]):
            if self.ends[row] is None:
                forced = len(self.then.get(int(input_ids[row, self.width]), ())) if self.then else 0
                written = input_ids[row, self.width + (1 + forced if self.then else 0):]  # after the choice and forced
                text = self.tokenizer.decode(written, skip_special_tokens=True) if self.stop else ""
                if int(input_ids[row, -1]) == self.eos or any(s in text for s in self.stop):
                    self.ends[row] = n
                elif self.limit is not None and n - forced >= self.limit:
                    self.ends[row] = n
                    self.cut.add(row)
            done[row] = self.ends[row] is not None
        return done


def sampling_config(max_new_tokens: int, temperature: float, top_p: float, pad: int, eos: int) -> GenerationConfig:
    """The whole generation config, so that nothing of the model's own (Qwen2.5 ships top_k 20,
    top_p 0.8 and a repetition penalty) changes the distribution the recorded log-probs describe.

    Temperature 0 sets do_sample=False too: transformers fills every field left unset from the model's
    own generation_config, and Qwen2.5-Instruct's says do_sample=True, so greedy would sample
    (tests/test_gpu_stack.py). Greedy decoding applies no temperature, top_k or top_p; they are left at
    values that make transformers warn about no flag (it warns about top_k=0 without sampling)."""
    if temperature > 0:
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=top_p)
    else:
        sampling = dict(do_sample=False, temperature=1.0, top_p=1.0)
    return GenerationConfig(max_new_tokens=max_new_tokens, num_beams=1, repetition_penalty=1.0, pad_token_id=pad,
                            eos_token_id=eos, **sampling)


class HFEngine:
    """Batched chat generation over a Hugging Face causal LM (left padding, KV cache)."""

    def __init__(self, model, tokenizer, max_batch: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"  # generation appends on the right, so pad on the left
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.max_batch = max_batch  # rows per `generate` call; more prompts are split into chunks
        self.tokens_generated = 0  # running count, read by benchmarks and metrics
        self.seconds = 0.0

    def encode(self, chat, prefix: str = "") -> list[int]:
        return encode_chat(self.tokenizer, chat, prefix)

    @torch.inference_mode()
    def generate(self, chats, max_new_tokens=64, temperature=0.7, top_p=1.0, prefix="", stop=(), choices=(),
                 choice_temperature=1.0, then=None) -> list[Generation]:
        """Sample one completion per chat (after the forced `prefix`, if any), ending a row at EOS or at the
        first `stop` string (kept in the output); rows grouped by prompt length. Generation.text holds only
        what the model wrote. `choices`: token ids the first new token is drawn from, at choice_temperature;
        `then`: {choice: token ids written after it}, on top of max_new_tokens (FirstTokenChoice)."""
        prompts = [self.encode(c, prefix) for c in chats]
        return self.generate_batched(prompts, max_new_tokens, temperature, top_p, stop, choices, choice_temperature, then)

    def generate_batched(self, prompts, max_new_tokens, temperature, top_p, stop, choices, choice_temperature, then=None):
        """generate's batching: rows grouped by prompt length (less padding), max_batch rows a call."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        for start in range(0, len(order), self.max_batch):
            idx = order[start : start + self.max_batch]
            for i, gen in zip(idx, self.generate_ids([prompts[i] for i in idx], max_new_tokens, temperature, top_p, stop,
                                                     choices, choice_temperature, then)):
                results[i] = gen
        return results

    @torch.inference_mode()
    def generate_ids(self, prompts, max_new_tokens=64, temperature=0.7, top_p=1.0, stop=(), choices=(),
                     choice_temperature=1.0, then=None) -> list[Generation]:
        """One `generate` call over already-tokenised prompts."""
        t0 = time.perf_counter()
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        then = then if choices else None  # the tokens forced after the choice come on top of max_new_tokens
        stopper = StopAt(self.tokenizer, width, eos, tuple(stop), then, max_new_tokens if then else None)
        first = [FirstTokenChoice(choices, temperature, choice_temperature, then)] if choices else []
        steps = max_new_tokens + max(map(len, then.values()), default=0) if then else max_new_tokens
        new, logprobs = self.sample(prompts, pad, eos, steps, temperature, top_p, stopper, first)  # (B, S) x2
        # Cut each row where it ended (EOS kept: the policy sampled it and it is trained on).
        results = []
        for row in range(len(prompts)):
            ended = stopper.ends is not None and stopper.ends[row] is not None
            end = stopper.ends[row] if ended else new.shape[1]
            ids = new[row, :end].tolist()
            lps = logprobs[row, :end].tolist() if logprobs is not None else []
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            results.append(Generation(text, list(prompts[row]), ids, lps, truncated=not ended or row in stopper.cut))
            self.tokens_generated += len(ids)
        self.seconds += time.perf_counter() - t0
        return results

    def sample(self, prompts, pad, eos, max_new_tokens, temperature, top_p, stopper, first=()):
        """The plain batch: (B, S) new tokens (padded after each row's end) and their (B, S) log-probs.
        `first`: processors that run before the recorder (FirstTokenChoice)."""
        device = self.model.device
        input_ids, attention = left_pad(prompts, pad)  # (B, W)
        recorder = RecordLogprobs(temperature)
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device),
            generation_config=sampling_config(max_new_tokens, temperature, top_p, pad, eos),
            logits_processor=LogitsProcessorList([*first, recorder]), stopping_criteria=StoppingCriteriaList([stopper]),
        )  # (B, W + S)
        logprobs = recorder.finish(out)
        return out[:, input_ids.shape[1]:].cpu(), None if logprobs is None else logprobs.cpu()
