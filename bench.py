"""Benchmark of one Flow-GRPO training step: where the time and the memory go, as ratios.

Every figure is a ratio against a baseline measured IN THE SAME RUN, on the same prompts, rows and
padding, so it holds on a noisy, shared machine where absolute seconds do not. One question of the
training data is rolled out G times (a group), exactly as train.py does at one step.

    figure                   how it is measured                                             target
    rollout_vs_generate      tok/s of rollout.rollout for the group (planner, executor,       >= 0.8
                             tools, verifier, generator, all in lockstep) / tok/s of a
                             replay: every engine.generate call the rollout made, recorded by
                             a thin wrapper (prompt ids, generated length per row), run again
                             as ONE plain greedy model.generate over the same left-padded
                             prompts with max_new_tokens = min_new_tokens = the call's longest
                             row. Both sides count the tokens the rollout produced, so the
                             ratio is the share of time the agent loop adds (tools, prompt
                             building, stop strings, log-prob recording).
    rollout_batched_speedup  seconds of the same G trajectories rolled out one by one          >= 3
                             (G calls of rollout with one query each) / seconds of the batched
                             rollout. torch.manual_seed is reset identically before each variant.
    rollout_fast_prefill_    seconds of the batched rollout on the plain engine (whole prompts
      speedup                left-padded, Hugging Face's cache and sampler) / with speedups/
                             (shared prefixes once, rows in length buckets, a preallocated
                             cache, our sampler), from the same seed
    update_vs_plain          tok/s of the update (reference log-probs by update.fill_logprobs  >= 0.7
                             from the frozen copy + update.update over the planner-turn rows)
                             / tok/s of a plain causal-LM forward (full logits, labels=...)
                             and loss.backward over the same rows, cut into the same
                             micro-batches with the same left padding. Tokens are the rows'
                             real (non-pad) tokens. The update's extra work is the reference
                             forward, the ratio/clip/KL terms and the AdamW step; what it saves
                             is the language-model head on the prompt (logits_to_keep).
    update_frozen_bottom_    with --train-layers N (the cpu-plan preset's 6): seconds of the same
      speedup                reference pass and update again with shared_prompt.forward alone
                             (every layer run on every pass) / seconds of the step's, where
                             speedups/frozen_bottom.py runs the frozen layers below N once
    pad_fraction             padded positions / all positions of the update's micro-batches     <= 0.25
    search_vs_generate       seconds of one Local_Search query (BM25 over the shipped corpus,   <= 0.1
                             the mean of 200) / seconds of one engine.generate call of the
                             rollout (the mean): the search must stay a small part of a turn
    peak_rss_gb              peak resident memory (ru_maxrss) after one full training step:
                             both models, the group's rollout, the reference pass, the update
                             and AdamW's state (read before the baselines run)
    model_copies             distinct parameter bytes held by every model and engine / bytes    <= 2
                             of one model (policy + frozen copy = 2; a bf16 copy counts 0.5)
    matmul_gflops            best fp32 torch.matmul GFLOP/s of this machine (1024^2, 2048^2)
    update_gflops            6 * parameters * update tokens / update seconds, also printed as
                             a fraction of matmul_gflops: how far the update is from the limit.
                             6 N T is the usual estimate; it overcounts the embedding (a lookup)
                             and the tied head on prompt tokens, which the update skips, so on a
                             model whose parameters are mostly vocabulary it can pass 100%.

Sizes default to train.py's `--preset cpu` with G = 8; the loss settings are config.Config's. The
figures depend on the machine. On a CPU a rollout call prefills 8 rows x 100-300 prompt tokens and
decodes 6-40, and a prefill costs the same batched or not; only what prefill.py removes (a prefix the
rows share, computed once; pads, never computed) and the decode steps (8 rows a step cost ~1.8x one
row, not 8x) make batching pay. On a GPU the decode steps dominate and batching pays more. On a CPU
shared with other busy processes, pass --threads 1: two processes that each spin two OpenMP threads
on two cores run several times slower than with one thread each, and the ratios turn to noise.

Run:   python bench.py                    (the embedded SmolLM2-135M; a few minutes on two cores)
       python bench.py --threads 1        (the same, steadier on a CPU other processes also use)
       python bench.py --threads 1 --train-layers 6   (the top 6 layers trained, as the cpu-plan preset)
       python bench.py --model Qwen/Qwen2.5-0.5B-Instruct --group-size 8 --max-turns 3 --out b.json
Test:  python -m pytest -q tests/test_bench.py
"""

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator

from environment import scoring, tasks
from bookkeeping.models import EMBEDDED, load_model, train_top_layers
from engine import HFEngine, left_pad
from rollout import rollout
from tools import Toolbox, local_search
import speedups
from config import PRESETS, Config
from scaleout.launch import questions_for_step
from train import RowPath, collate, fill_logprobs, micro_batches, step_seed, training_rows, update

# (key, comparison, target) of every figure that has one; the others are reported only.
TARGETS = {"rollout_vs_generate": (">=", 0.8), "rollout_batched_speedup": (">=", 3.0), "update_vs_plain": (">=", 0.7),
           "pad_fraction": ("<=", 0.25), "model_copies": ("<=", 2.0), "search_vs_generate": ("<=", 0.1)}


# ---------------------------------------------------------------------------------------------
# Rollout: the agent loop against a replay of its own generate calls


class RecordingEngine:
    """An HFEngine that keeps every generate call: each row's prompt ids and generated length."""

    def __init__(self, engine: HFEngine):
        self.engine = engine
        self.calls = []  # one (prompts, lengths) per generate call: [(P_b,) ids], [R_b]
        self.seconds = 0.0  # wall time spent inside generate, to split the rollout's time

    def generate(self, chats, **kwargs):
        t0 = time.perf_counter()
        gens = self.engine.generate(chats, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.calls.append(([g.prompt_ids for g in gens], [len(g.response_ids) for g in gens]))
        return gens


@torch.inference_mode()
def replay(recorders) -> tuple[float, int]:
    """Re-run every recorded call as plain greedy `model.generate`; returns (seconds, tokens counted).

    HFEngine sorts a call's prompts by length and cuts them into chunks of max_batch rows, each one
    `generate`; the replay cuts the same way, so it runs the same batches the rollout ran. Every row
    generates as many tokens as the longest row of its batch (min_new_tokens stops EOS from ending
    it early): that is what a batch costs the raw model, while only the tokens the rollout kept count.
    """
    seconds, tokens = 0.0, 0
    for rec in recorders:
        model, pad = rec.engine.model, rec.engine.tokenizer.pad_token_id
        for prompts, lengths in rec.calls:
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
            for start in range(0, len(order), rec.engine.max_batch):
                idx = order[start:start + rec.engine.max_batch]
                n = max(lengths[i] for i in idx)
                tokens += sum(lengths[i] for i in idx)
                if n == 0:
                    continue
                ids, attn = left_pad([prompts[i] for i in idx], pad)  # (B, P), the plain batch
                t0 = time.perf_counter()
                model.generate(input_ids=ids.to(model.device), attention_mask=attn.to(model.device), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, pad_token_id=pad)
                seconds += time.perf_counter() - t0
    return seconds, tokens


# ---------------------------------------------------------------------------------------------
# Update: the Flow-GRPO update against a plain causal-LM forward and backward on the same rows


def plain_step(model, rows, micro: int, pad_id: int, device) -> float:
    """Forward (full logits, HF's own shifted cross-entropy) and backward per micro-batch; seconds."""
    t0 = time.perf_counter()
    for chunk in micro_batches(rows, micro):
        batch = collate(chunk, pad_id, device)  # the update's padding, to the byte
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)  # (B, L), no loss on pads
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels)
        out.loss.backward()
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)  # the gradients were only for timing; none reaches the weights
    return seconds


def pad_fraction(rows, micro: int) -> float:
    """Padded positions / all positions of the micro-batches the update runs (collate pads to the longest)."""
    chunks = micro_batches(rows, micro)
    width = lambda t: len(t.prompt_ids) + len(t.response_ids)  # noqa: E731
    positions = sum(len(c) * max(width(t) for t in c) for c in chunks)
    return 1.0 - sum(width(t) for t in rows) / positions if positions else 0.0


# ---------------------------------------------------------------------------------------------
# Memory and the machine's limit


def weight_copies(*models) -> float:
    """Model weight copies held: distinct parameter storages of all models, in bytes of the first.

    Two references to one model (an engine and the trainer) share storages and count once; a frozen
    copy has its own storages and counts as one more (0.5 in bf16 beside an fp32 policy).
    """
    def storages(model):
        return {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}

    held = {}
    for m in models:
        held.update(storages(m))
    return sum(held.values()) / sum(storages(models[0]).values())


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KB


def matmul_gflops(sizes=(1024, 2048), repeats=5) -> float:
    """Best fp32 GFLOP/s of a square matmul (2 n^3 flops): the ceiling any dense model code can reach."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t0) / 1e9)
    return best


# ---------------------------------------------------------------------------------------------
# The benchmark


def parse_args(argv=None):
    cpu = PRESETS["cpu"]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=EMBEDDED, help="Hugging Face id or folder; 'embedded' = SmolLM2-135M-Instruct")
    p.add_argument("--group-size", type=int, default=8, help="G: trajectories of the one question")
    p.add_argument("--max-turns", type=int, default=cpu["max_turns"], help="planner turns per trajectory")
    for name in ("analysis", "planner", "executor", "verifier", "generator"):
        p.add_argument(f"--{name}-tokens", type=int, default=cpu[f"{name}_tokens"], help=f"max new tokens of the {name}")
    p.add_argument("--micro-batch-rows", type=int, default=Config.micro_batch_rows, help="turn-rows per forward/backward")
    p.add_argument("--data", default="mixed", help="suite, benchmark or file the question comes from")
    p.add_argument("--seed", type=int, default=0, help="picks the question and seeds the sampling")
    p.add_argument("--out", default="bench.json", help="where the figures are written as JSON")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default); 1 is steadier on a shared CPU")
    p.add_argument("--train-layers", type=int, default=0,
                   help="train only the top N decoder layers (train.py's --train-layers; 0 = every layer); "
                        "N > 0 measures update_frozen_bottom_speedup")
    args = p.parse_args(argv)
    if args.group_size < 2:
        p.error(f"--group-size {args.group_size}: must be >= 2 (batched vs one-by-one needs a group)")
    if args.threads < 0 or args.train_layers < 0:
        p.error(f"--threads {args.threads}, --train-layers {args.train_layers}: must be >= 0 (0 keeps the default)")
    if args.max_turns < 1 or args.planner_tokens < 1 or args.micro_batch_rows < 1:
        p.error("--max-turns, --planner-tokens and --micro-batch-rows must be >= 1")
    if min(args.analysis_tokens, args.executor_tokens, args.verifier_tokens, args.generator_tokens) < 0:
        p.error("token limits must be >= 0")
    return args


def bench(args) -> dict:
    # 0. The loss settings come from config.Config (the cpu preset), with this run's sizes on top.
    cfg = Config(**{**PRESETS["cpu"], "model": args.model, "data": args.data, "seed": args.seed,
                    "group_size": args.group_size, "questions_per_step": 1, "mini_batch_questions": 1,
                    "max_turns": args.max_turns, "micro_batch_rows": args.micro_batch_rows,
                    **{f"{n}_tokens": getattr(args, f"{n}_tokens") for n in ("analysis", "planner", "executor", "verifier", "generator")}})
    try:
        example = questions_for_step(tasks.load(cfg.data, split="train", seed=cfg.seed), cfg, 1, 0, 1)[0]
    except (ValueError, FileNotFoundError, IndexError) as e:
        raise SystemExit(f"bench.py: --data {cfg.data}: {e or 'no question'}") from None
    tools, rcfg = cfg.tool_names(), cfg

    # 1. Models as train.py holds them: a trainable policy under Accelerate and one frozen copy.
    accelerator = Accelerator(cpu=True)
    policy, tokenizer = load_model(cfg.model, device=accelerator.device)
    frozen, _ = load_model(cfg.model, device=accelerator.device)
    frozen.requires_grad_(False)
    trainable = train_top_layers(policy, args.train_layers)  # every parameter with --train-layers 0
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    planner = speedups.FastEngine(accelerator.unwrap_model(policy), tokenizer)  # what train.py chooses here
    frozen_engine = speedups.FastEngine(frozen, tokenizer)
    pad, device = tokenizer.pad_token_id, accelerator.device

    # 2. Warm-up, so no variant pays for first-call costs the others do not: generate on both
    #    engines, the search index, and one small forward/backward.
    hello = [[{"role": "user", "content": "Hi"}]]
    planner.generate(hello, max_new_tokens=2)
    frozen_engine.generate(hello, max_new_tokens=2, temperature=0.0)
    local_search()
    warm = torch.tensor([tokenizer.encode("warm up the training kernels")], device=device)
    policy(input_ids=warm, labels=warm).loss.backward()
    policy.zero_grad(set_to_none=True)

    # 3. The batched rollout of the group, every generate call recorded.
    queries, examples = [example["query"]] * cfg.group_size, [example] * cfg.group_size
    rec_planner, rec_frozen = RecordingEngine(planner), RecordingEngine(frozen_engine)
    seed = step_seed(cfg.seed, 1, 0)  # what train.py seeds step 1 with
    policy.eval()
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    trajs = rollout(queries, rec_planner, rec_frozen, Toolbox(tools, llm=rec_frozen), rcfg, examples=examples)
    batched_s = time.perf_counter() - t0
    rollout_tokens = sum(sum(lengths) for rec in (rec_planner, rec_frozen) for _, lengths in rec.calls)

    # 4. The same G trajectories one by one: G rollouts of one query each, from the same seed. The
    #    sampled tokens differ (the random stream is drawn in another order), so both token counts
    #    are kept beside the ratio of seconds.
    toolbox = Toolbox(tools, llm=frozen_engine)
    tokens_before = planner.tokens_generated + frozen_engine.tokens_generated
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    for q, ex in zip(queries, examples):
        rollout([q], planner, frozen_engine, toolbox, rcfg, examples=[ex])
    one_by_one_s = time.perf_counter() - t0
    one_by_one_tokens = planner.tokens_generated + frozen_engine.tokens_generated - tokens_before

    # 4b. The batched rollout again on the plain engine (every row's whole prompt left-padded into
    #     Hugging Face's growing cache, its own sampler), from the same seed: what speedups/ saves.
    plain_planner, plain_frozen = HFEngine(planner.model, tokenizer), HFEngine(frozen, tokenizer)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    rollout(queries, plain_planner, plain_frozen, Toolbox(tools, llm=plain_frozen), rcfg, examples=examples)
    plain_prefill_s = time.perf_counter() - t0

    # 5. One training step on the batched group: reward -> advantage -> rows -> ref log-probs -> update.
    #    The old log-probs are the sampled ones (old_logprobs=sample), as in train.py's cpu preset.
    rewards = torch.tensor([scoring.score(tr.final_output, tr.example) for tr in trajs])
    group_of = [0] * cfg.group_size
    rows = [t for t, _ in training_rows(trajs, rewards, group_of, cfg)]
    if not rows:
        raise SystemExit("bench.py: the rollout produced no planner token to train; raise --planner-tokens")
    update_tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in rows)  # real tokens of every row
    policy.train()
    t0 = time.perf_counter()
    shared = RowPath(speedups.micro_batches, speedups.update_forward(frozen, args.train_layers))  # what train.py chooses here
    fill_logprobs(frozen, rows, "ref_logp", cfg, accelerator, pad, shared)
    upd = update(cfg, accelerator, policy, optimizer, [rows], pad, shared)
    update_s = time.perf_counter() - t0
    # The step is over; what runs later belongs to a baseline. (The one-by-one rollouts ran before,
    # but one trajectory at a time needs less memory than the batched group.)
    peak = peak_rss_gb()
    copies = weight_copies(accelerator.unwrap_model(policy), frozen, planner.model, frozen_engine.model)

    # 6. Baselines: the plain forward/backward on the same rows, and the replay of the generate calls;
    #    with --train-layers, the step's reference pass and update again, every layer run on every pass.
    unfrozen_s = None  # not measured: no frozen bottom
    if isinstance(shared.forward, speedups.FrozenBottom):
        every_layer = RowPath(speedups.micro_batches, speedups.forward)
        t0 = time.perf_counter()
        fill_logprobs(frozen, rows, "ref_logp", cfg, accelerator, pad, every_layer)
        update(cfg, accelerator, policy, optimizer, [rows], pad, every_layer)
        unfrozen_s = time.perf_counter() - t0
    plain_s = plain_step(policy, rows, cfg.micro_batch_rows, pad, device)
    policy.eval()
    replay_s, replay_tokens = replay([rec_planner, rec_frozen])
    assert replay_tokens == rollout_tokens, "the replay must count exactly the rollout's tokens"
    peak_gflops = matmul_gflops()
    index = local_search()  # built in the warm-up
    queries_200 = [d["title"] + " founded born" for d in index.docs[:200]]
    t0 = time.perf_counter()
    for q in queries_200:
        index.bm25.scores(q)
    search_s = (time.perf_counter() - t0) / len(queries_200)
    generate_s = (rec_planner.seconds + rec_frozen.seconds) / max(len(rec_planner.calls) + len(rec_frozen.calls), 1)
    n_params = sum(p.numel() for p in policy.parameters())

    # 7. The figures. Ratios of tok/s on the same token count are ratios of seconds.
    eps = 1e-9
    rollout_tok_s, replay_tok_s = rollout_tokens / max(batched_s, eps), rollout_tokens / max(replay_s, eps)
    update_tok_s, plain_tok_s = update_tokens / max(update_s, eps), update_tokens / max(plain_s, eps)
    update_gflops = 6 * n_params * update_tokens / max(update_s, eps) / 1e9
    return {
        "rollout_vs_generate": rollout_tok_s / max(replay_tok_s, eps),
        "rollout_batched_speedup": one_by_one_s / max(batched_s, eps),
        "rollout_fast_prefill_speedup": plain_prefill_s / max(batched_s, eps),
        "update_vs_plain": update_tok_s / max(plain_tok_s, eps),
        "update_frozen_bottom_speedup": None if unfrozen_s is None else unfrozen_s / max(update_s, eps), "update_every_layer_s": unfrozen_s,
        "pad_fraction": pad_fraction(rows, cfg.micro_batch_rows),
        "search_vs_generate": search_s / max(generate_s, eps), "search_query_s": search_s, "generate_call_s": generate_s,
        "peak_rss_gb": peak,
        "model_copies": copies,
        "matmul_gflops": peak_gflops,
        "update_gflops": update_gflops,
        "update_gflops_fraction": update_gflops / max(peak_gflops, eps),
        # the raw sides of every ratio
        "rollout_tokens": rollout_tokens, "rollout_s": batched_s, "rollout_tok_s": rollout_tok_s,
        "replay_s": replay_s, "replay_tok_s": replay_tok_s,
        # where the rollout's time went: inside engine.generate, and the rest (tools, prompts, parsing)
        "rollout_generate_s": rec_planner.seconds + rec_frozen.seconds,
        "rollout_tools_s": max(tr.seconds.get("tools", 0.0) for tr in trajs),
        "generate_calls": sum(len(rec.calls) for rec in (rec_planner, rec_frozen)),
        "one_by_one_s": one_by_one_s, "one_by_one_tokens": one_by_one_tokens, "batched_s": batched_s,
        "plain_prefill_s": plain_prefill_s,
        "update_tokens": update_tokens, "update_rows": len(rows), "update_s": update_s, "update_tok_s": update_tok_s,
        "plain_s": plain_s, "plain_tok_s": plain_tok_s, "parameters": n_params,
        "turns_per_traj": sum(len(tr.turns) for tr in trajs) / len(trajs), "reward_mean": float(rewards.mean()),
        "update_loss": upd["loss"], "optimizer_steps": upd["optimizer_steps"],
        # what was measured, and what counts as good
        "sizes": {"model": cfg.model, "group_size": cfg.group_size, "max_turns": cfg.max_turns,
                  "analysis_tokens": cfg.analysis_tokens, "planner_tokens": cfg.planner_tokens,
                  "executor_tokens": cfg.executor_tokens, "verifier_tokens": cfg.verifier_tokens,
                  "generator_tokens": cfg.generator_tokens, "micro_batch_rows": cfg.micro_batch_rows,
                  "train_layers": args.train_layers, "data": cfg.data, "seed": cfg.seed, "question": example["query"], "threads": torch.get_num_threads()},
        "targets": {k: f"{op} {v:g}" for k, (op, v) in TARGETS.items()},
    }


def met(key: str, value: float) -> bool:
    """Whether a figure meets its target."""
    op, target = TARGETS[key]
    return value >= target if op == ">=" else value <= target


def table(r: dict) -> str:
    rows = [("rollout_vs_generate", f"{r['rollout_vs_generate']:.3f}", f"{r['rollout_tok_s']:.1f} vs {r['replay_tok_s']:.1f} tok/s"),
            ("  (rollout split)", "", f"generate {r['rollout_generate_s']:.3g} s, tools {r['rollout_tools_s']:.3g} s"),
            ("rollout_batched_speedup", f"{r['rollout_batched_speedup']:.2f}", f"{r['one_by_one_s']:.3g} s vs {r['batched_s']:.3g} s"),
            ("rollout_fast_prefill_speedup", f"{r['rollout_fast_prefill_speedup']:.2f}", f"{r['plain_prefill_s']:.3g} s plain prefill vs {r['batched_s']:.3g} s"),
            ("update_vs_plain", f"{r['update_vs_plain']:.3f}", f"{r['update_tok_s']:.1f} vs {r['plain_tok_s']:.1f} tok/s"),
            ("update_frozen_bottom_speedup", "-" if r["update_every_layer_s"] is None else f"{r['update_frozen_bottom_speedup']:.2f}",
             "not measured: no frozen layers (--train-layers)" if r["update_every_layer_s"] is None
             else f"{r['update_every_layer_s']:.3g} s every layer vs {r['update_s']:.3g} s"),
            ("pad_fraction", f"{r['pad_fraction']:.3f}", f"{r['update_rows']} rows, {r['update_tokens']} tokens"),
            ("search_vs_generate", f"{r['search_vs_generate']:.4f}", f"{1e3 * r['search_query_s']:.2f} ms a query vs {r['generate_call_s']:.3g} s a generate call"),
            ("peak_rss_gb", f"{r['peak_rss_gb']:.2f}", "one training step"),
            ("model_copies", f"{r['model_copies']:.2f}", "policy + frozen"),
            ("matmul_gflops", f"{r['matmul_gflops']:.1f}", "fp32 matmul, best"),
            ("update_gflops", f"{r['update_gflops']:.1f}", f"{r['update_gflops_fraction']:.1%} of matmul")]
    lines = [f"{'figure':<28} | {'value':>8} | {'target':>7} | {'met?':<4} | raw", "-" * 84]
    for key, value, raw in rows:
        flag = {True: "yes", False: "NO", None: "-" if value else ""}[r["met"].get(key)]
        lines.append(f"{key:<28} | {value:>8} | {r['targets'].get(key, '-' if value else ''):>7} | {flag:<4} | {raw}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        # Two busy processes that each spin two OpenMP threads on two cores can run 10-100x slower
        # than with one thread each; on a shared machine --threads 1 measures the code, not that.
        torch.set_num_threads(args.threads)
    result = bench(args)
    result["met"] = {k: met(k, result[k]) for k in TARGETS}
    bad = [k for k, v in result.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        print(f"bench.py: non-finite figures {bad}", file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    s = result["sizes"]
    print(f"model {s['model']} | G {s['group_size']} | max turns {s['max_turns']} | {result['generate_calls']} generate calls, "
          f"{result['rollout_tokens']} tokens | {result['update_rows']} update rows | {s['threads']} threads")
    print(table(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
