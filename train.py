"""Flow-GRPO: train the AgentFlow planner on-policy, inside the live multi-turn loop.

One training step (the paper's Algorithm 1, with the official code's batching), top to bottom below:

    1. rollout     sample Q questions; roll out G trajectories each with the current planner (no grad)
    2. reward      R_i = score(final answer of tau_i, gold) in {0, 1}: a verifiable reward, no judge
    3. advantage   A_i = (R_i - mean_G R) / (std_G R + eps), broadcast to every planner turn of tau_i;
                   each planner Turn is now one training row: prompt s_t, response a_t, A_i, T_i
    4. reference   log pi_ref(a_t | s_t) from the frozen copy (and pi_old again, if recomputed)
    5. loss+step   per mini-batch of questions: micro-batches of rows, clipped surrogate + beta * KL,
                   gradients accumulated, clip 1.0, AdamW step; `questions_per_step / mini_batch_questions`
                   optimiser steps per rollout batch, `epochs` passes, so the ratio and the clip do work
    6. log         one metrics line per step (metrics.jsonl and console), sample trajectories,
                   atomic checkpoints

Only the planner's next-step call is trained. One frozen copy of the initial weights serves the
executor, verifier, generator and the Base_Generator tool, and is the KL reference pi_ref.

Simplifications vs. the paper / the official code (see flow_grpo.py for the objective itself):
- pi_old is the sampling policy: its log-probs are recorded during generation and reused for every
  mini-batch and epoch (`old_logprobs=sample`); on GPU in bf16 the sampling and training kernels
  differ, so `old_logprobs=recompute` runs one no-grad forward pass before the updates, as verl does.
- The reward is rule-based (environment/scoring.py); the official reward is a GPT-4o judge.
- Every process rolls out its own questions; there is no separate inference server.
- The per-step RNG seed is derived from (seed, step, rank), so a resumed run samples exactly what an
  uninterrupted run would have.
- Precision, device and process count come from the Accelerate launcher and its config files
  (`accelerate launch --mixed_precision bf16 ...`); the frozen copy is held in bf16 when it says bf16.

Shapes: N trajectories, G group size, B turn-rows of a micro-batch, L row width, R response tokens, V vocabulary.

Run:   python train.py --preset cpu                  (the embedded model on this CPU)
       accelerate launch --config_file configs/accelerate_1gpu.yaml train.py --preset gpu-24gb
       python train.py --resume runs/flow-grpo       (continue from the last complete checkpoint)
Test:  python -m pytest -q tests/test_train.py
"""

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator, DistributedType
from tqdm import tqdm

from bookkeeping import checkpoint
from bookkeeping.metrics import console_line, step_metrics, write_param_digest
from bookkeeping.models import load_model, train_top_layers
from config import PRESETS, Config, validate  # the run's fields and presets (also train.PRESETS, train.Config)
from engine import HFEngine, left_pad
from environment import scoring, tasks
from flow_grpo import (broadcast, entropy_from_logits, flat_groups, flow_grpo_loss,
                       first_token_fields, group_advantages, restrict_first_token, token_logprobs, turn_rows)
from rollout import add_arguments, format_trajectory, rollout
from scaleout import distributed, remote_engine, sizing
from speedups import shared_prompt
from tools import Toolbox, set_sandbox


def parse_args(argv=None) -> tuple[Config, set]:
    """Config from defaults < --preset < command line; also returns the fields set on the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named set of defaults (PRESETS in config.py)")
    add_arguments(p, Config)
    args = p.parse_args(argv)
    given = {f.name for f in fields(Config) if getattr(args, f.name) is not None}
    values = dict(PRESETS[args.preset]) if args.preset else {}
    values.update({k: getattr(args, k) for k in given})
    return Config(**values), given


def step_seed(seed: int, step: int, rank: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{step}/{rank}".encode()).digest()[:4], "little")


def questions_for_step(examples, cfg, step, rank, world):
    """The questions of one step, for this process: a fixed shuffle per epoch of the training set, or,
    with --kinds, of each listed kind's questions, questions_per_step / len(kinds) of each.

    Why --kinds: with 4 questions a step the kinds come in whatever mix the shuffle gives (3 facts
    and 1 calculation, say), and each group's gradient moves the tool of every question towards its
    own kind's tool; equal numbers of each kind a step make that shared part cancel in expectation
    (README, the CPU demo: what it did and did not do for routing)."""
    kinds = cfg.kind_names()
    pools = [[e for e in examples if e.get("kind") == k] for k in kinds] if kinds else [examples]
    q = cfg.questions_per_step // len(pools)
    picked = []
    for i, pool in enumerate(pools):
        start, orders = (step - 1) * q, {}
        for k in range(start, start + q):
            epoch, pos = divmod(k, len(pool))
            if epoch not in orders:  # one shuffle per epoch, not one per question
                orders[epoch] = np.random.default_rng(cfg.seed + epoch + 1000 * i).permutation(len(pool))
            picked.append(pool[orders[epoch][pos]])
    return picked[rank::world]


def tool_orders(tools, group_size: int, rotate: bool) -> list[tuple]:
    """The tool list each trajectory of a group sees: trajectory j the list rotated by j (--rotate-tools),
    else every one the given order.

    Why: a small planner mostly names the FIRST tool of its list (the embedded 135M model picked
    Python_Coder, listed first, for 24 of 32 samples of fact questions, Fact_Lookup for 3). Then the
    G samples of a question hardly ever try another tool, every group's rewards come from one tool,
    and Flow-GRPO can only reinforce it (it learned "always Python_Coder" in 5 steps). Rotated, every
    tool comes first for G/k of the G trajectories, so each group compares the tools on its question:
    the signal that teaches routing. The state s_t holds the order, so the loss stays on-policy; the
    planner must learn to choose by the question, not the position, because evaluation keeps the
    given order. Rotations (not shuffles): k distinct prompts per question, each shared by G/k rows
    in the prefill and the update."""
    k = len(tools) if rotate else 1
    return [tuple(tools[j % k:]) + tuple(tools[:j % k]) for j in range(group_size)]


# ---------------------------------------------------------------------------------------------
# Turn-rows as tensors. Each row is a planner Turn: prompt s_t + response a_t, left-padded so that
# every response sits at the end of its row and the language-model head only runs on the last R
# positions (logits_to_keep): on a 49k vocabulary that is most of the memory of a forward pass.


def collate(turns, pad_id: int, device) -> dict:
    """Left-pad rows into tensors. The loss mask is built from recorded lengths, never from token ids."""
    ids, attn = left_pad([t.prompt_ids + t.response_ids for t in turns], pad_id)  # (B, L)
    B, L, R = len(turns), ids.shape[1], max(len(t.response_ids) for t in turns)
    mask, old, ref = torch.zeros((B, R)), torch.zeros((B, R)), torch.zeros((B, R))
    for b, t in enumerate(turns):
        n = len(t.response_ids)
        mask[b, R - n:] = 1
        old[b, R - n:] = torch.tensor(t.logprobs)
        if t.ref_logp is not None:
            ref[b, R - n:] = torch.tensor(t.ref_logp)
    batch = dict(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                 targets=ids[:, L - R:], mask=mask, old_logp=old, ref_logp=ref,  # (B, L) x3, (B, R) x4
                 advantages=torch.tensor([t.advantage for t in turns], dtype=torch.float32),  # (B,) A_i
                 turns=torch.tensor([float(t.traj_turns) for t in turns]),  # (B,) T_i
                 **first_token_fields([t.first_choices for t in turns], [R - len(t.response_ids) for t in turns]))
    return {k: v.to(device) for k, v in batch.items()}


def micro_batches(turns, size: int, share_prompts: bool = False) -> list[tuple[list, bool]]:
    """Rows sorted by length and cut into micro-batches of `size` (little padding per forward), as
    (rows, shared) pairs. share_prompts (speedups) first puts rows with a long common prompt prefix
    together, to have that prefix computed once (speedups/shared_prompt.py)."""
    shared, turns = shared_prompt.group_by_prefix(turns, size) if share_prompts else ([], turns)
    turns = sorted(turns, key=lambda t: len(t.prompt_ids) + len(t.response_ids))
    return [(chunk, True) for chunk in shared] + [(turns[i:i + size], False) for i in range(0, len(turns), size)]


def forward(model, chunk, shared: bool, pad_id: int, device):
    """(logits (B, R, V) predicting each response token, batch, real tokens computed) for one micro-batch."""
    if shared:
        batch = shared_prompt.collate(chunk, device)
        return shared_prompt.response_logits(model, batch), batch, shared_prompt.tokens_computed(batch)
    batch = collate(chunk, pad_id, device)
    R = batch["targets"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], logits_to_keep=R + 1, use_cache=False)
    return out.logits[:, :-1], batch, int(batch["attention_mask"].sum())  # position p predicts token p + 1


def row_values(values, b: int, n: int, batch: dict):
    """Row b's n response values: at the row's own offset in the shared layout, right-aligned when left-padded."""
    if batch.get("shared"):
        s = int(batch["start"][b])
        return values[b, s:s + n]
    return values[b, values.shape[1] - n:]


@torch.no_grad()
def fill_logprobs(model, turns, attr: str, cfg, accelerator, share_prompts: bool, pad_id: int):
    """Set log pi(a_t) of a no-grad model on every turn: `ref_logp` (the reference), or `logprobs`
    (pi_old, recomputed)."""
    for chunk, shared, real in distributed.even_out(micro_batches(turns, cfg.micro_batch_rows, share_prompts), accelerator):
        logits, batch, _ = forward(model, chunk, shared, pad_id, accelerator.device)
        logits = restrict_first_token(logits, batch, cfg.temperature, cfg.tool_temperature)
        logp = token_logprobs(logits, batch["targets"], cfg.temperature).float().cpu()  # (B, R)
        for b, t in enumerate(chunk if real else []):
            setattr(t, attr, row_values(logp, b, len(t.response_ids), batch).tolist())


def training_rows(trajs, rewards, group_of, cfg) -> list[tuple]:
    """Step 3: advantages, broadcast to every planner turn. Returns (Turn, question index) for every
    turn to train; each Turn now carries its trajectory's A_i (advantage) and T_i (traj_turns)."""
    advantages = group_advantages(rewards, group_of, scale=cfg.scale_advantages)  # (N,) A_i
    turn_counts = [len(tr.turns) for tr in trajs]  # T_i
    traj_of, row_turns = turn_rows(turn_counts)  # (B,) trajectory and T_i of every turn-row
    row_adv = broadcast(advantages, turn_counts)  # (B,) r_t^i = R_i, so every turn of tau_i gets A_i
    turns = [t for tr in trajs for t in tr.turns]  # the same trajectory-by-trajectory order
    for t, a, T in zip(turns, row_adv.tolist(), row_turns.tolist()):
        t.advantage, t.traj_turns = a, T
    # A turn with an empty response has no token to train. With filter_groups, a group whose G
    # rewards are all equal (advantage 0 on every turn) is left out: its rows would only add the
    # small KL term, at the cost of a reference pass and a forward/backward each; with a sparse
    # reward that is most of the update (DAPO's dynamic sampling, without its resampling).
    flat = flat_groups(rewards, group_of) if cfg.filter_groups else set()
    # credit "last" (the ablation): only each trajectory's last turn is trained, so an earlier turn's
    # choice (turn 1's tool, the sub-goal that carried a result forward) gets no credit at all.
    last = {id(tr.turns[-1]) for tr in trajs if tr.turns}
    return [(t, group_of[i]) for t, i in zip(turns, traj_of.tolist())
            if t.response_ids and group_of[i] not in flat and (cfg.credit == "broadcast" or id(t) in last)]


def update(cfg, accelerator, policy, optimizer, minis, pad: int, share_prompts: bool) -> dict:
    """Step 5: one optimiser step per mini-batch of rows, gradients accumulated over its micro-batches.

        for each epoch, for each mini-batch (one optimiser step):
            for each micro-batch of rows sorted by length:            # gradient accumulation
                logp = log pi_theta(a_t | s_t)                          (B, R)
                loss = clipped surrogate + beta * KL                    flow_grpo.flow_grpo_loss
                backward(loss * world)                                  no all-reduce until the last
            clip_grad_norm(1.0); AdamW step (skipped, and counted, when non-finite)

    Accumulation uses Accelerate's `no_sync` + `backward` rather than `accelerator.accumulate`: the
    number of micro-batches varies from one mini-batch to the next (trajectories have different turn
    counts), and each micro-batch loss is already normalised by the whole mini-batch's token count
    (or trajectory count for "flow"), summed over processes. DDP averages gradients over the W
    processes, so each process multiplies its loss by W and the result is the full-batch loss.
    Returns sums for the metrics line (bookkeeping/metrics.py divides them by `micro`).
    """
    world = accelerator.num_processes
    n_mini = len(minis)
    upd = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0,
           "ratio_mean": 0.0, "grad_norm": 0.0, "skipped_updates": 0, "optimizer_steps": 0, "tokens": 0, "micro": 0}
    for epoch in range(cfg.epochs):
        for mini in minis:
            if not mini and world == 1:
                continue  # nothing to train in this mini-batch (every group filtered out): no step
            # The loss is normalised over ALL processes' rows of the mini-batch, so that DDP's
            # gradient average (divide by the world size) gives exactly the full-batch value.
            local = sum(len(t.response_ids) for t in mini) if cfg.agg == "token-mean" else sum(1.0 / t.traj_turns for t in mini)
            normaliser = accelerator.reduce(torch.tensor(float(local), device=accelerator.device), "sum").item()
            chunks = distributed.even_out(micro_batches(mini, cfg.micro_batch_rows, share_prompts), accelerator)
            loss_sum = 0.0
            for i, (chunk, shared, real) in enumerate(chunks):
                # Accumulate: no gradient all-reduce until the last micro-batch of this mini-batch (under
                # FSDP every micro-batch reduce-scatters, so no full gradient is held: distributed.py).
                last = i == len(chunks) - 1
                with distributed.accumulation_context(accelerator, policy, last), accelerator.autocast():
                    logits, batch, tokens = forward(policy, chunk, shared, pad, accelerator.device)  # (B, R, V)
                    logits = restrict_first_token(logits, batch, cfg.temperature, cfg.tool_temperature)  # the tool choice
                    logp = token_logprobs(logits, batch["targets"], cfg.temperature)  # (B, R)
                    loss, st = flow_grpo_loss(logp, batch, cfg, normaliser)  # = -J for these rows
                    if not real:  # a rank with fewer micro-batches than another runs a stand-in, weight 0
                        loss = loss * 0.0
                    accelerator.backward(loss * world)
                loss_sum += loss.item()
                if real:
                    with torch.no_grad():
                        m = batch["mask"].bool()
                        upd["entropy"] += entropy_from_logits(logits[m][None], cfg.temperature).mean().item()
                    for k in ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "pg_loss"):
                        upd[k] += st[k]
                    upd["tokens"] += tokens
                    upd["micro"] += 1
            # One optimiser step per mini-batch; a non-finite gradient is skipped, never applied.
            grad_norm = accelerator.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            grad_norm = float(grad_norm) if grad_norm is not None else 0.0
            if math.isfinite(grad_norm) and math.isfinite(loss_sum):
                optimizer.step()
                upd["optimizer_steps"] += 1
            else:
                warnings.warn(f"non-finite loss ({loss_sum}) or gradient norm ({grad_norm}): update skipped")
                upd["skipped_updates"] += 1
            optimizer.zero_grad(set_to_none=True)
            upd["loss"] += loss_sum / (cfg.epochs * n_mini)
            upd["grad_norm"] = max(upd["grad_norm"], grad_norm) if math.isfinite(grad_norm) else upd["grad_norm"]
    return upd


# ---------------------------------------------------------------------------------------------
# The loop


def train(cfg: Config, reward_fn=None, given=frozenset(), accelerator=None) -> dict:
    """Run Flow-GRPO; returns the last step's metrics. reward_fn(traj) -> float overrides scoring.score.
    `accelerator`: one made by the caller (tests/fsdp_driver.py passes an Accelerate-like one that wraps
    with torch's FSDP on CPU processes, which Accelerate refuses without a GPU); default: the launcher's."""
    # 0. Resume: the saved config, with what was given on the command line on top (e.g. more --steps).
    start_step, ckpt = 0, None
    if cfg.resume:
        ckpt = checkpoint.find(cfg.resume)
        saved = checkpoint.load_state(ckpt)
        known = {f.name for f in fields(Config)}  # a checkpoint from an older version may name other fields
        cfg = Config(**{**{k: v for k, v in saved["config"].items() if k in known},
                        **{k: getattr(cfg, k) for k in given if k != "resume"}, "resume": cfg.resume})
        start_step = saved["step"]
    # Device, precision and processes are the launcher's (accelerate launch, its config file, --mixed_precision).
    # Only on a machine without a GPU do we say cpu=True: Accelerate then also sets up several CPU
    # processes started by torchrun (over gloo), which it does not detect by itself.
    accelerator = accelerator or Accelerator(**({} if torch.cuda.is_available() else {"cpu": True}))
    validate(cfg, accelerator.num_processes)
    set_sandbox(cfg.sandbox)  # strict where snippets cannot be isolated stops here, before any work
    rank, world = accelerator.process_index, accelerator.num_processes
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp and cfg.train_layers:  # untested there: frozen and trained parameters would share FSDP's flat shards
        raise SystemExit("train.py: --train-layers is not supported under FSDP; pass --train-layers 0")
    bf16 = accelerator.mixed_precision == "bf16"
    out = Path(cfg.out)
    if not cfg.resume and ((out / "metrics.jsonl").exists() or any((out / "checkpoints").glob("step-*"))):
        # A fresh run would append its metrics to the old run's and mix their checkpoints.
        raise SystemExit(f"train.py: --out {out} already holds a run (metrics.jsonl or checkpoints/): pass "
                         f"--resume {out} to continue it, or another --out for a new run; nothing was changed")
    torch.manual_seed(cfg.seed)
    report = {}
    try:
        examples = tasks.load(cfg.data, split="train", seed=cfg.seed, skip_bad_rows=cfg.skip_bad_rows, report=report)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"train.py: --data: {e} (or pass --skip-bad-rows to skip and count bad rows)") from None
    if not examples:
        raise SystemExit(f"train.py: --data {cfg.data} holds no usable question")
    missing = [k for k in cfg.kind_names() if not any(e.get("kind") == k for e in examples)]
    if missing:
        have = sorted({str(e.get("kind")) for e in examples})
        raise SystemExit(f"train.py: --kinds {','.join(missing)}: no training question of --data {cfg.data} has that "
                         f"kind; its kinds are {', '.join(have)}")
    if report.get("skipped") and accelerator.is_main_process:
        print(f"skipped {report['skipped']} bad rows of {cfg.data}: " + "; ".join(report["errors"][:3]), file=sys.stderr)
    run_info = {"device": str(accelerator.device), "mixed_precision": accelerator.mixed_precision, "processes": world,
                "distributed_type": str(accelerator.distributed_type.value)}
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        print("config: " + json.dumps(dataclasses.asdict(cfg)), file=sys.stderr)
        print("launcher: " + json.dumps(run_info), file=sys.stderr)

    try:  # a frozen-module server is checked (it must answer /models) before the models are loaded
        remote = remote_engine.from_url(cfg.frozen_engine) if cfg.frozen_engine else None
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"train.py: --frozen-engine: {e}") from None

    # 1. Models: the trainable planner, and ONE frozen copy of the initial weights (executor, verifier,
    #    generator, Base_Generator and the KL reference).
    #    Under FSDP the fp32 policy stays in CPU memory until prepare() shards it onto the GPU unit by
    #    unit (Accelerate passes device_id, and broadcasts rank 0's weights with sync_module_states);
    #    a whole fp32 copy on every GPU first would need P x 4 B each (28 GiB at 7B) before sharding.
    policy, tokenizer = load_model(str(ckpt / "planner") if ckpt else cfg.model,
                                   device="cpu" if fsdp else accelerator.device)
    frozen, _ = load_model(cfg.model, dtype=torch.bfloat16 if bf16 else torch.float32, device=accelerator.device)
    frozen.requires_grad_(False)
    trainable = train_top_layers(policy, cfg.train_layers)  # every parameter, unless --train-layers
    if cfg.gradient_checkpointing:  # transformers' default, non-reentrant: it works with frozen lower layers
        policy.gradient_checkpointing_enable()
    policy.train()
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    if ckpt:
        if fsdp:
            # optimizer.pt holds rank 0's shard of the AdamW moments only: restoring it on every rank would be
            # wrong, so an FSDP run resumes the weights exactly and restarts the moments (a known gap).
            warnings.warn("FSDP resume: AdamW moments are not restored (only the planner weights and the step)")
            checkpoint.restore(ckpt, optimizer=None)
        else:
            checkpoint.restore(ckpt, optimizer)
        if accelerator.is_main_process:
            checkpoint.clean_partial(out)
            checkpoint.truncate_metrics(out / "metrics.jsonl", start_step)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(sizing.report_for(cfg, world, fsdp, bf16), file=sys.stderr)
    tools = cfg.tool_names()
    # The planner generates with the policy itself, or under FSDP with a plain instance that shares the
    # gathered weights during a rollout, so that no rank's decoding waits on another's (distributed.py).
    planner = HFEngine(distributed.generation_model(accelerator, policy), tokenizer, speedups=cfg.speedups,
                       max_batch=cfg.max_batch)
    # With --frozen-engine the executor, verifier, generator and Base_Generator run on a server; the
    # local frozen copy then only serves as the KL reference pi_ref.
    frozen_engine = remote or HFEngine(frozen, tokenizer, speedups=cfg.speedups, max_batch=cfg.max_batch)
    toolbox = Toolbox(tools, llm=frozen_engine)
    pad = tokenizer.pad_token_id
    n_mini = cfg.questions_per_step // cfg.mini_batch_questions
    per_mini = cfg.mini_batch_questions // world  # this process's questions per mini-batch
    # The shared-prompt update makes two forward calls before one backward: one process only, and not
    # under gradient checkpointing (which turns the KV cache off). Elsewhere the plain rows run.
    share_prompts = cfg.speedups and world == 1 and not cfg.gradient_checkpointing
    orders = tool_orders(tools, cfg.group_size, cfg.rotate_tools)  # (G,) the tool list of each trajectory of a group
    metrics = {}

    test_examples = tasks.load(cfg.data, split="test", n=cfg.eval_n, seed=cfg.seed) if cfg.eval_every else []
    if cfg.eval_every and start_step == 0:  # the untrained planner: step 0 of the learning curve
        acc = test_accuracy(cfg, policy, planner, frozen_engine, toolbox, test_examples, accelerator)
        if accelerator.is_main_process:
            checkpoint.append_metrics(out / "metrics.jsonl", {"step": 0, "test_accuracy": acc, **run_info})
            print(f"step 0 | test_accuracy {acc:.3f}", file=sys.stderr)
    bar = tqdm(range(start_step + 1, cfg.steps + 1), desc="steps", disable=not accelerator.is_main_process, file=sys.stderr)
    for step in bar:
        # ---- 1. rollout: G trajectories per question with the current planner, no gradients --------
        t0 = time.perf_counter()
        torch.manual_seed(step_seed(cfg.seed, step, rank))
        questions = questions_for_step(examples, cfg, step, rank, world)
        group_of = [g for g in range(len(questions)) for _ in range(cfg.group_size)]  # (N,) question of each trajectory
        policy.eval()
        with distributed.full_weights(accelerator, policy, planner.model):
            trajs = rollout([questions[g]["query"] for g in group_of], planner, frozen_engine, toolbox, cfg,
                            examples=[questions[g] for g in group_of], tool_orders=orders * len(questions))
        policy.train()
        rollout_s = time.perf_counter() - t0

        # ---- 2. reward: one verifiable reward per trajectory -------------------------------------
        for tr in trajs:
            tr.reward = float(reward_fn(tr)) if reward_fn else scoring.score(tr.final_output, tr.example)
        rewards = torch.tensor([tr.reward for tr in trajs])  # (N,)

        # ---- 3. advantage: normalised within each group of G, broadcast to every planner turn -----
        rows = training_rows(trajs, rewards, group_of, cfg)  # [(Turn, question)], each Turn now carries A_i, T_i
        minis = [[t for t, g in rows if g // per_mini == m] for m in range(n_mini)]  # one optimiser step each

        # ---- 4. reference (and recomputed old) log-probs, no gradients --------------------------
        t1 = time.perf_counter()
        trained = [t for t, _ in rows]
        if cfg.kl_coef > 0:
            fill_logprobs(frozen, trained, "ref_logp", cfg, accelerator, cfg.speedups and world == 1, pad)
        if cfg.old_logprobs == "recompute":
            # The prepared policy itself, under the update's autocast: pi_old from the very kernels (and,
            # under FSDP, the same per-layer all-gathers, as many on every rank) that the update runs.
            policy.eval()
            with accelerator.autocast():
                fill_logprobs(policy, trained, "logprobs", cfg, accelerator, cfg.speedups and world == 1, pad)
            policy.train()

        # ---- 5. loss and optimiser steps: one step per mini-batch, gradients accumulated ---------
        upd = update(cfg, accelerator, policy, optimizer, minis, pad, share_prompts)
        update_s = time.perf_counter() - t1

        # ---- 6. log: metrics reduced over processes, one line per step ---------------------------
        metrics = step_metrics(step, trajs, rewards, group_of, len(trained), upd, rollout_s, update_s, accelerator, tools)
        if cfg.filter_groups:  # one process: how many groups had signal and were trained
            metrics["groups_trained"] = len({g for _, g in rows})
        if cfg.kl_coef == 0:
            metrics["kl"] = None  # no reference pass, so no KL to the reference was measured
        if accelerator.is_main_process and cfg.sample_every and step % cfg.sample_every == 0:
            (out / "samples").mkdir(exist_ok=True)  # one question's G trajectories, for a person to read
            text = "\n\n".join(format_trajectory(tr) for tr in trajs[: cfg.group_size])
            (out / "samples" / f"step-{step:06d}.txt").write_text(text + "\n")
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            metrics["test_accuracy"] = test_accuracy(cfg, policy, planner, frozen_engine, toolbox, test_examples, accelerator)
        if accelerator.is_main_process:
            checkpoint.append_metrics(out / "metrics.jsonl", {**metrics, **run_info})
            bar.write(console_line(metrics, cfg.steps))
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            accelerator.wait_for_everyone()
            weights = accelerator.get_state_dict(policy)  # gathered on every rank (a collective under FSDP)
            if accelerator.is_main_process:
                checkpoint.save(out, step, accelerator.unwrap_model(policy), tokenizer, optimizer, dataclasses.asdict(cfg),
                                state_dict=weights)
            accelerator.wait_for_everyone()
    with distributed.full_weights(accelerator, policy, planner.model):  # under FSDP: the whole weights, not a shard
        write_param_digest(out, planner.model, rank)
    accelerator.end_training()
    return metrics


def test_accuracy(cfg, policy, planner, frozen_engine, toolbox, examples, accelerator) -> float:
    """Greedy accuracy of the current planner on fixed test questions. Every process takes its share
    of the questions; under FSDP every rank enters full_weights (a collective) even with none, and
    generates with no collective of its own, however long its questions take."""
    mine = examples[accelerator.process_index::accelerator.num_processes]
    policy.eval()
    with distributed.full_weights(accelerator, policy, planner.model):
        trajs = rollout([ex["query"] for ex in mine], planner, frozen_engine, toolbox,
                        dataclasses.replace(cfg, temperature=0.0), examples=mine) if mine else []
    policy.train()
    correct = sum(scoring.score(tr.final_output, tr.example) for tr in trajs)
    both = accelerator.reduce(torch.tensor([float(correct), float(len(mine))], device=accelerator.device), "sum")
    return float(both[0] / both[1].clamp(min=1))


def main(argv=None):
    cfg, given = parse_args(argv)
    validate(cfg)
    if cfg.dry_run:  # nothing is loaded or downloaded: the config and what it will need
        # What the launcher would set (accelerate launch exports these); a plain `python` run is fp32.
        bf16 = os.environ.get("ACCELERATE_MIXED_PRECISION", "no") == "bf16"
        print("config: " + json.dumps(dataclasses.asdict(cfg), indent=2))
        print(f"mixed precision: {'bf16' if bf16 else 'no (fp32)'}, from the launcher (accelerate launch --mixed_precision)")
        gpus = int(os.environ.get("WORLD_SIZE", "1"))
        print(sizing.report_for(cfg, gpus, sharded=False, bf16=bf16))
        print(sizing.report_for(cfg, 8, sharded=True, bf16=bf16))
        return
    train(cfg, given=given)


if __name__ == "__main__":
    main()
