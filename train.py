"""Flow-GRPO: train the AgentFlow planner on-policy, inside the live multi-turn loop.

One training step (the paper's Algorithm 1, with the official code's batching) is the loop in train(),
top to bottom (the setup before it and the log's files are scaleout/launch.py's):

    1. rollout     sample Q questions; roll out G trajectories each with the current planner (no grad)
    2. reward      R_i = score(final answer of tau_i, gold) in {0, 1}: a verifiable reward, no judge
    3. advantage   A_i = (R_i - mean_G R) / (std_G R + eps), broadcast to every planner turn of tau_i;
                   each planner Turn is now one training row: prompt s_t, response a_t, A_i, T_i
    4. reference   log pi_ref(a_t | s_t) from the frozen copy (and pi_old again, if recomputed)
    5. loss+step   per mini-batch of questions: micro-batches of rows, clipped surrogate + beta * KL,
                   gradients accumulated, clip 1.0, AdamW step; `questions_per_step / mini_batch_questions`
                   optimiser steps per rollout batch, `epochs` passes. Only from the second optimiser
                   step of a batch on does pi_theta differ from pi_old; with one step per rollout batch
                   (both CPU presets) the ratio is 1 up to float rounding and the clip never acts.
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
- Precision, device and process count come from the Accelerate launcher and its config files; the frozen
  copy is held in bf16 when it says bf16. `--frozen-dtype bf16` runs the frozen modules alone on a bf16 copy.

Shapes (as in flow_grpo.py): N trajectories, G group size, B turn-rows of a micro-batch, L row width
(prompt + response), R response tokens, V vocabulary.

Run:   python train.py --preset cpu                  (the embedded model on this CPU)
       accelerate launch --config_file configs/accelerate_1gpu.yaml train.py --preset gpu-24gb
       python train.py --resume runs/flow-grpo       (continue from the last complete checkpoint)
Test:  python -m pytest -q tests/test_train.py
"""

import argparse
import hashlib
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

import speedups  # drop-ins for the engine and the update's forward, chosen in make_engines() only
from bookkeeping.cli import add_arguments
from bookkeeping.models import frozen_modules_model
from bookkeeping.metrics import add_micro_batch, add_optimizer_step, new_update_sums, step_metrics, write_param_digest
from bookkeeping.tool_choice import first_token_fields
from config import PRESETS, Config  # the run's fields and presets
from engine import HFEngine, left_pad
from environment import scoring
from flow_grpo import (broadcast, flat_groups, flow_grpo_loss, group_advantages, restrict_first_token, token_logprobs,
                       turn_rows)
from rollout import rollout
from scaleout import distributed, launch
from tools import Toolbox


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
        mask[b, [R - n + p for p in t.forced]] = 0  # tokens the rollout wrote, not the planner
        old[b, R - n:] = torch.tensor(t.logprobs)
        if t.ref_logp is not None:
            ref[b, R - n:] = torch.tensor(t.ref_logp)
    batch = dict(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                 targets=ids[:, L - R:], mask=mask, old_logp=old, ref_logp=ref,  # (B, L) x3, (B, R) x4
                 advantages=torch.tensor([t.advantage for t in turns], dtype=torch.float32),  # (B,) A_i
                 turns=torch.tensor([float(t.traj_turns) for t in turns]),  # (B,) T_i
                 # --tool-temperature: each row's first response position and the choices it was drawn from
                 **first_token_fields([t.first_choices for t in turns], [R - len(t.response_ids) for t in turns]))
    return {k: v.to(device) for k, v in batch.items()}


def micro_batches(turns, size: int) -> list[list]:
    """Rows sorted by length and cut into micro-batches of `size`: little padding per forward."""
    turns = sorted(turns, key=lambda t: len(t.prompt_ids) + len(t.response_ids))
    return [turns[i:i + size] for i in range(0, len(turns), size)]


def forward(model, batch: dict) -> torch.Tensor:
    """Logits (B, R, V) predicting each response token of a collated batch."""
    R = batch["targets"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], logits_to_keep=R + 1, use_cache=False)
    return out.logits[:, :-1]  # position p predicts token p + 1


class RowPath(NamedTuple):
    """How rows become logits: micro_batches(turns, size) -> [[Turn]], then forward(model, batch) on
    each collated micro-batch. PLAIN is the two functions above; make_engines() may choose speedups/'
    pair, which has the same contract and results (tests/test_update.py)."""

    micro_batches: Callable
    forward: Callable


PLAIN = RowPath(micro_batches, forward)


@torch.no_grad()
def fill_logprobs(model, turns, attr: str, cfg, accelerator, pad_id: int, path: RowPath = PLAIN):
    """Set log pi(a_t) of a no-grad model on every turn: `ref_logp` (the reference), or `logprobs`
    (pi_old, recomputed)."""
    for chunk, real in distributed.even_out(path.micro_batches(turns, cfg.micro_batch_rows), accelerator):
        batch = collate(chunk, pad_id, accelerator.device)
        logits = restrict_first_token(path.forward(model, batch), batch, cfg.temperature, cfg.tool_temperature)
        logp = token_logprobs(logits, batch["targets"], cfg.temperature).float().cpu()  # (B, R)
        for b, t in enumerate(chunk if real else []):  # a response is right-aligned in its row
            setattr(t, attr, logp[b, logp.shape[1] - len(t.response_ids):].tolist())


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


def update(cfg, accelerator, policy, optimizer, minis, pad: int, path: RowPath = PLAIN) -> dict:
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
    Returns the sums of the metrics line (bookkeeping/metrics.py adds them up and divides them).
    """
    world = accelerator.num_processes
    sums = new_update_sums()
    for epoch in range(cfg.epochs):
        for mini in minis:
            if not mini and world == 1:
                continue  # nothing to train in this mini-batch (every group filtered out): no step
            # The loss is normalised over ALL processes' rows of the mini-batch, so that DDP's
            # gradient average (divide by the world size) gives exactly the full-batch value.
            local = sum(len(t.response_ids) - len(t.forced) for t in mini) if cfg.agg == "token-mean" else sum(1.0 / t.traj_turns for t in mini)
            normaliser = accelerator.reduce(torch.tensor(float(local), device=accelerator.device), "sum").item()
            chunks = distributed.even_out(path.micro_batches(mini, cfg.micro_batch_rows), accelerator)
            loss_sum = 0.0
            for i, (chunk, real) in enumerate(chunks):
                # Accumulate: no gradient all-reduce until the last micro-batch of this mini-batch (under
                # FSDP every micro-batch reduce-scatters, so no full gradient is held: distributed.py).
                with distributed.accumulation_context(accelerator, policy, i == len(chunks) - 1), accelerator.autocast():
                    batch = collate(chunk, pad, accelerator.device)
                    logits = path.forward(policy, batch)  # (B, R, V)
                    logits = restrict_first_token(logits, batch, cfg.temperature, cfg.tool_temperature)  # the tool choice
                    logp = token_logprobs(logits, batch["targets"], cfg.temperature)  # (B, R)
                    loss, stats = flow_grpo_loss(logp, batch, cfg, normaliser)  # = -J for these rows
                    # A rank with fewer micro-batches than another runs a stand-in (real=False): weight 0.
                    accelerator.backward(loss * world * float(real))
                if real:
                    loss_sum += loss.item()
                    add_micro_batch(sums, stats, logits, batch, cfg.temperature)
            # One optimiser step per mini-batch; a non-finite gradient is skipped, never applied.
            grad_norm = accelerator.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            grad_norm = float(grad_norm) if grad_norm is not None else 0.0
            applied = math.isfinite(grad_norm) and math.isfinite(loss_sum)
            if applied:
                optimizer.step()
            else:
                warnings.warn(f"non-finite loss ({loss_sum}) or gradient norm ({grad_norm}): update skipped")
            optimizer.zero_grad(set_to_none=True)
            add_optimizer_step(sums, loss_sum / (cfg.epochs * len(minis)), grad_norm, applied)
    return sums


# ---------------------------------------------------------------------------------------------
# The loop


def make_engines(cfg, accelerator, policy, frozen, tokenizer, remote):
    """The planner's and the frozen modules' engines and the update's RowPath: the plain ones, or
    speedups/' drop-ins where they apply (speedups.choose: one process, a plain full-attention KV cache,
    the tested transformers; --speedups / --no-speedups force it). Returns them, whether the speed-ups
    run, and the line that says so."""
    fast, line = speedups.choose(cfg.speedups, frozen, accelerator.num_processes)
    Engine = speedups.FastEngine if fast else HFEngine
    # The planner generates with the policy itself, or under FSDP with a plain instance sharing the gathered
    # weights during a rollout, so that no rank's decoding waits on another's (distributed.py).
    planner = Engine(distributed.generation_model(accelerator, policy), tokenizer, max_batch=cfg.max_batch)
    # The executor, verifier, generator and Base_Generator run on a server with --frozen-engine, on a copy
    # with --frozen-dtype; the local frozen copy is then the KL reference pi_ref (and the frozen bottom) only.
    frozen_engine = remote
    if not remote:
        with distributed.load_on_every_rank():  # a --frozen-dtype copy is never wrapped either: real weights on every rank
            frozen_engine = Engine(frozen_modules_model(cfg.model, frozen, cfg.frozen_dtype), tokenizer, max_batch=cfg.max_batch)
    # The shared-prompt update makes two forward calls before one backward: one process only. Under
    # --train-layers it runs the frozen layers below once a step (speedups/frozen_bottom.py).
    path = (RowPath(speedups.micro_batches, speedups.update_forward(frozen, cfg.train_layers))
            if fast and accelerator.num_processes == 1 else PLAIN)
    return planner, frozen_engine, path, fast, line + ("" if path is not PLAIN or not fast else "; plain update rows")


def train(cfg: Config, reward_fn=None, given=frozenset(), accelerator=None) -> dict:
    """Run Flow-GRPO; returns the last step's metrics. reward_fn(traj) -> float overrides scoring.score.
    `accelerator`: one made by the caller (tests/fsdp_driver.py passes an Accelerate-like one that wraps
    with torch's FSDP on CPU processes, which Accelerate refuses without a GPU); default: the launcher's."""
    # ---- 0. setup: config and processes, questions, the planner and ONE frozen copy, engines ------
    cfg, accelerator, start_step, ckpt, remote = launch.start(cfg, given, accelerator)
    examples, test_examples = launch.load_questions(cfg, accelerator)
    policy, frozen, tokenizer, optimizer = launch.load_models(cfg, accelerator, ckpt, start_step)
    planner, frozen_engine, path, fast, line = make_engines(cfg, accelerator, policy, frozen, tokenizer, remote)
    rank, world, tools, pad = accelerator.process_index, accelerator.num_processes, cfg.tool_names(), tokenizer.pad_token_id
    toolbox = Toolbox(tools, llm=frozen_engine)
    run_info = {"device": str(accelerator.device), "mixed_precision": accelerator.mixed_precision, "processes": world,
                "distributed_type": str(accelerator.distributed_type.value), "speedups": fast}
    launch.write_config(cfg, accelerator, run_info, [line])
    n_mini = cfg.questions_per_step // cfg.mini_batch_questions  # optimiser steps per rollout batch
    per_mini = cfg.mini_batch_questions // world  # this process's questions per mini-batch
    if cfg.eval_every and cfg.eval_ends and start_step == 0:  # the untrained planner: step 0 of the learning curve
        acc = launch.test_accuracy(cfg, policy, planner, frozen_engine, toolbox, test_examples, accelerator)
        launch.write_step(cfg, accelerator, 0, {"step": 0, **acc}, run_info)
    metrics = {}
    for step in tqdm(range(start_step + 1, cfg.steps + 1), desc="steps", disable=not accelerator.is_main_process, file=sys.stderr):
        # ---- 1. rollout: G trajectories per question with the current planner, no gradients --------
        t0 = time.perf_counter()
        torch.manual_seed(step_seed(cfg.seed, step, rank))
        questions = launch.questions_for_step(examples, cfg, step, rank, world)
        group_of = [g for g in range(len(questions)) for _ in range(cfg.group_size)]  # (N,) question of each trajectory
        policy.eval()
        with distributed.full_weights(accelerator, policy, planner.model):
            trajs = rollout([questions[g]["query"] for g in group_of], planner, frozen_engine, toolbox, cfg,
                            examples=[questions[g] for g in group_of])
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
            fill_logprobs(frozen, trained, "ref_logp", cfg, accelerator, pad, path)
        if cfg.old_logprobs == "recompute":
            # The prepared policy itself, under the update's autocast: pi_old from the very kernels (and,
            # under FSDP, the same per-layer all-gathers, as many on every rank) that the update runs.
            policy.eval()
            with accelerator.autocast():
                fill_logprobs(policy, trained, "logprobs", cfg, accelerator, pad, path)
            policy.train()

        # ---- 5. loss and optimiser steps: one step per mini-batch, gradients accumulated ---------
        for group in optimizer.param_groups:  # the warm-up: lr * step / warmup_steps until it reaches lr
            group["lr"] = cfg.lr * min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
        upd = update(cfg, accelerator, policy, optimizer, minis, pad, path)
        update_s = time.perf_counter() - t1

        # ---- 6. log: metrics reduced over processes, one line per step; samples; checkpoints -----
        metrics = step_metrics(step, trajs, rewards, group_of, len(trained), upd, rollout_s, update_s, accelerator, tools,
                               groups_trained=len({g for _, g in rows}) if cfg.filter_groups else None,
                               kl_measured=cfg.kl_coef > 0, kinds=tuple(sorted(set(cfg.kind_names()))),
                               max_turns=cfg.max_turns, lr=optimizer.param_groups[0]["lr"])
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps) and (cfg.eval_ends or step < cfg.steps):
            metrics |= launch.test_accuracy(cfg, policy, planner, frozen_engine, toolbox, test_examples, accelerator)
        launch.write_step(cfg, accelerator, step, metrics, run_info, trajs)
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.steps:
            launch.save_checkpoint(cfg, accelerator, step, policy, tokenizer, optimizer)
    with distributed.full_weights(accelerator, policy, planner.model):  # under FSDP: the whole weights, not a shard
        write_param_digest(Path(cfg.out), planner.model, rank)
    accelerator.end_training()
    return metrics


def main(argv=None):
    cfg, given = parse_args(argv)
    launch.validate(cfg)
    if cfg.dry_run:  # nothing is loaded or downloaded: the config and what it will need
        return launch.dry_run(cfg)
    train(cfg, given=given)


if __name__ == "__main__":
    main()
