"""Flow-GRPO: train the AgentFlow planner on-policy, inside the live multi-turn loop.

One training step (the paper's Algorithm 1, with the official code's batching):

    1. rollout     sample Q questions; roll out G trajectories each with the current planner (no grad)
    2. reward      R_i = score(final answer of tau_i, gold) in {0, 1}: a verifiable reward, no judge
    3. advantage   A_i = (R_i - mean_G R) / (std_G R + eps), broadcast to every planner turn of tau_i
    4. rows        one training row per planner turn: prompt s_t + response a_t, loss mask on a_t only
    5. loss        clipped surrogate + beta * KL(pi_theta || pi_ref), over micro-batches of rows
                   sorted by length, gradients accumulated with Accelerate (no_sync, then backward)
    6. step        grad clip 1.0 -> AdamW; `questions_per_step / mini_batch_questions` optimiser steps
                   per rollout batch, `epochs` passes, so the ratio and the clip do real work
    7. log         one metrics line per step (metrics.jsonl and console), sample trajectories,
                   atomic checkpoints

Only the planner's next-step call is trained. One frozen copy of the initial weights serves the
executor, verifier, generator and the Base_Generator tool, and is the KL reference pi_ref.

Simplifications vs. the paper / the official code (see flow_grpo.py for the objective itself):
- pi_old is the sampling policy: its log-probs are recorded during generation and reused for every
  mini-batch and epoch (`old_logprobs=sample`); on GPU in bf16 the sampling and training kernels
  differ, so `old_logprobs=recompute` runs one no-grad forward pass before the updates, as verl does.
- The reward is rule-based (tasks.score); the official reward is a GPT-4o judge.
- Every process rolls out its own questions; there is no separate inference server.
- The per-step RNG seed is derived from (seed, step, rank), so a resumed run samples exactly what an
  uninterrupted run would have.

Run:   python train.py --preset cpu                  (the embedded model on this CPU)
       accelerate launch train.py --model Qwen/Qwen2.5-7B-Instruct --bf16   (GPUs)
       python train.py --resume runs/flow-grpo       (continue from the last complete checkpoint)
Test:  python -m pytest -q tests/test_train.py
"""

import argparse
import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator, DistributedType
from tqdm import tqdm

from bookkeeping import checkpoint
from bookkeeping.metrics import console_line, step_metrics, test_accuracy, write_param_digest
from scaleout import remote_engine
from scaleout import sizing
from environment import tasks
from engine import EMBEDDED, HFEngine, load_model
from flow_grpo import AGGREGATIONS, KL_KINDS, flat_groups, group_advantages
from rollout import RolloutConfig, format_trajectory, rollout
from tools import Toolbox, check_tool_names
from update import fill_logprobs, make_rows, update


@dataclass
class Config:
    # model
    model: str = EMBEDDED  # initial planner weights and frozen modules: HF id, folder, or 'embedded' (SmolLM2-135M)
    bf16: bool = False  # bf16 autocast on GPU; the frozen copy is then held in bf16
    frozen_engine: str = ""  # URL of an OpenAI-compatible server (http://host:port/v1[#model]) for the frozen modules
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, ~30% more time
    # data
    data: str = "mixed"  # training questions: a suite (arithmetic, game24, lookup, mixed) or a JSON/JSONL file
    seed: int = 0  # the one seed; per-step rollout seeds derive from (seed, step, rank)
    skip_bad_rows: bool = False  # skip (and count) malformed rows of a --data file instead of stopping at the first
    # rollout
    group_size: int = 8  # G: trajectories sampled per question
    questions_per_step: int = 32  # questions per rollout batch, over all processes (paper: 32)
    max_turns: int = 3  # T_max: planner turns per trajectory (paper: 3 in training)
    temperature: float = 0.7  # planner sampling temperature (paper: 0.7)
    analysis_tokens: int = 48  # max new tokens of the query analysis (0 = skip it)
    planner_tokens: int = 48  # max new tokens |a_t| of a planner action
    executor_tokens: int = 64  # max new tokens of an executor command
    verifier_tokens: int = 12  # max new tokens of a verifier verdict
    generator_tokens: int = 32  # max new tokens of the final answer
    memory_chars: int = 900  # budget of the rendered memory in each prompt
    tools: str = "Python_Coder,Local_Search,Base_Generator"  # tools the planner may choose (comma-separated)
    # flow-grpo
    clip_low: float = 0.2  # eps_low
    clip_high: float = 0.3  # eps_high
    clip_c: float = 0.0  # dual-clip c for negative advantages (official 3.0; 0 = off, the paper's formula)
    kl_coef: float = 0.001  # beta
    kl_kind: str = "low_var_kl"  # KL estimator: low_var_kl (k3, official) or k1
    agg: str = "token-mean"  # loss aggregation: token-mean (official) or flow (the paper's 1/G 1/T_i 1/|a|)
    scale_advantages: bool = True  # divide by the group std (paper); off = Dr. GRPO
    old_logprobs: str = "sample"  # pi_old from the sampling pass ('sample') or a fresh forward ('recompute')
    filter_groups: bool = False  # leave groups whose G rewards are all equal out of the update (one process only)
    # optimisation
    lr: float = 1e-6  # AdamW learning rate, constant (paper: 1e-6)
    weight_decay: float = 0.01  # AdamW weight decay (paper: 0.01)
    grad_clip: float = 1.0  # max global gradient norm (paper: 1.0)
    mini_batch_questions: int = 8  # questions per optimiser step (paper: 8, so 4 steps per rollout batch)
    epochs: int = 1  # passes over each rollout batch
    micro_batch_rows: int = 8  # turn-rows per forward/backward; gradients accumulate over micro-batches
    steps: int = 100  # training steps (rollout batches)
    # logging
    out: str = "runs/flow-grpo"  # run folder: metrics.jsonl, samples/, checkpoints/
    sample_every: int = 1  # write one question's G trajectories as text every N steps (0 = never)
    checkpoint_every: int = 10  # save a checkpoint every N steps (and at the end)
    eval_every: int = 0  # greedy test accuracy on eval_n test questions of --data every N steps, and before step 1 (0 = never)
    eval_n: int = 30  # test questions for eval_every (the same ones each time)
    resume: str = ""  # run or checkpoint folder to continue from
    dry_run: bool = False  # print the resolved config and the memory estimate, then exit (loads nothing)


PRESETS = {
    # demo.py's training run on 2 CPU cores (25 minutes with its evaluations): the embedded 135M
    # model, the offline mixed suite, G = 8, four questions a step, short replies. The reward is sparse
    # here: with 2 questions a step at temperature 0.7, 93% of the groups had all-equal rewards (the
    # planner's 8 samples mostly agreed, and lookup and Game of 24 pay nothing at 135M), so only 4 of
    # 30 steps had any signal. Hence temperature 1.0 (more varied samples), filter_groups (no update
    # time spent on groups without signal) and a higher learning rate for the fewer optimiser steps.
    "cpu-demo": dict(model=EMBEDDED, data="mixed", group_size=8, questions_per_step=4, mini_batch_questions=4,
                     max_turns=2, analysis_tokens=0, planner_tokens=24, executor_tokens=32, verifier_tokens=6,
                     generator_tokens=16, memory_chars=500, temperature=1.0, filter_groups=True, lr=2e-5, steps=30,
                     eval_every=10, eval_n=20, checkpoint_every=10),
    # The official recipe (the paper's Sec. 4 and the official training script): Qwen2.5-7B-Instruct,
    # G = 8, 32 questions per step in mini-batches of 8, lr 1e-6, clip 0.2/0.3, beta 0.001 low_var_kl,
    # 3 turns in training, temperature 0.7, bf16 with gradient checkpointing; old log-probs recomputed
    # because bf16 sampling and training kernels disagree. Launch with configs/accelerate_8gpu_fsdp.yaml.
    "paper": dict(model="Qwen/Qwen2.5-7B-Instruct", group_size=8, questions_per_step=32, mini_batch_questions=8,
                  lr=1e-6, clip_low=0.2, clip_high=0.3, kl_coef=0.001, kl_kind="low_var_kl", max_turns=3,
                  temperature=0.7, bf16=True, gradient_checkpointing=True, old_logprobs="recompute",
                  analysis_tokens=256, planner_tokens=256, executor_tokens=512, verifier_tokens=64,
                  generator_tokens=512, memory_chars=16000, micro_batch_rows=4, steps=500, checkpoint_every=25),
    # The embedded 135M model on two CPU cores: small groups, short outputs, a higher learning rate
    # (a 135M model moves little at the 7B rate of 1e-6 in a few dozen steps).
    "cpu": dict(model=EMBEDDED, data="mixed", group_size=4, questions_per_step=2, mini_batch_questions=2,
                max_turns=2, analysis_tokens=0, planner_tokens=24, executor_tokens=40, verifier_tokens=6,
                generator_tokens=16, memory_chars=600, lr=2e-6, steps=20, checkpoint_every=5),
}

# One-line help per field, read from the comments above so that they are written once.
_HELP = dict(re.findall(r"^    (\w+): .*?  # (.*)$", inspect.getsource(Config), flags=re.M))


def parse_args(argv=None) -> tuple[Config, set]:
    """Config from defaults < --preset < command line; also returns the fields set on the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named set of defaults")
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=_HELP.get(f.name))
        else:
            p.add_argument(flag, type=type(f.default), default=None, help=_HELP.get(f.name))
    args = p.parse_args(argv)
    given = {k for k, v in vars(args).items() if v is not None and k != "preset"}
    values = dict(PRESETS[args.preset]) if args.preset else {}
    values.update({k: getattr(args, k) for k in given})
    return Config(**values), given


def validate(cfg: Config, world: int = 1):
    """Reject settings that cannot work, before any work starts, with what to change."""
    checks = [
        (cfg.group_size >= 2, f"--group-size {cfg.group_size}: G must be >= 2 (advantages compare trajectories within a group)"),
        (cfg.clip_low > 0 and cfg.clip_high > 0, "--clip-low and --clip-high must be > 0"),
        (cfg.clip_c == 0 or cfg.clip_c > 1, f"--clip-c {cfg.clip_c}: the dual clip needs c > 1 (or 0 to turn it off)"),
        (cfg.max_turns >= 1, f"--max-turns {cfg.max_turns}: must be >= 1"),
        (cfg.temperature > 0, "--temperature must be > 0: Flow-GRPO needs sampled, not greedy, trajectories"),
        (cfg.lr > 0 and cfg.steps >= 1, "--lr must be > 0 and --steps >= 1"),
        (cfg.agg in AGGREGATIONS, f"--agg {cfg.agg!r}: choose from {', '.join(AGGREGATIONS)}"),
        (cfg.kl_kind in KL_KINDS, f"--kl-kind {cfg.kl_kind!r}: choose from {', '.join(KL_KINDS)}"),
        (cfg.old_logprobs in ("sample", "recompute"), "--old-logprobs must be 'sample' or 'recompute'"),
        (cfg.mini_batch_questions >= 1 and cfg.questions_per_step % cfg.mini_batch_questions == 0,
         f"--questions-per-step {cfg.questions_per_step} must be a multiple of --mini-batch-questions {cfg.mini_batch_questions}"),
        (cfg.mini_batch_questions % world == 0,
         f"--mini-batch-questions {cfg.mini_batch_questions} must be a multiple of the {world} processes"),
        (cfg.micro_batch_rows >= 1 and cfg.epochs >= 1, "--micro-batch-rows and --epochs must be >= 1"),
        (not cfg.filter_groups or world == 1, "--filter-groups leaves each process a different number of rows, which "
         "DDP's gradient all-reduce cannot follow: run one process or pass --no-filter-groups"),
    ]
    for ok, message in checks:
        if not ok:
            raise SystemExit(f"train.py: {message}")
    try:
        check_tool_names([t.strip() for t in cfg.tools.split(",") if t.strip()])
    except ValueError as e:
        raise SystemExit(f"train.py: --tools: {e}") from None


# ---------------------------------------------------------------------------------------------
# The loop


def full_weights(accelerator, policy):
    """Generation needs whole weights. Under FSDP each rank holds a shard of every tensor, so the
    rollout runs inside summon_full_params (a 7B model in bf16 is 15 GB per GPU for that time).
    NOTE: written for GPUs and not exercised by the CPU tests; DDP and single-process runs use a no-op."""
    if accelerator.distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(policy, writeback=False)
    return contextlib.nullcontext()


def step_seed(seed: int, step: int, rank: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{step}/{rank}".encode()).digest()[:4], "little")


def questions_for_step(examples, cfg, step, rank, world):
    """The questions of one step, for this process: a fixed shuffle per epoch of the training set."""
    q = cfg.questions_per_step
    start = (step - 1) * q
    picked, orders = [], {}
    for k in range(start, start + q):
        epoch, pos = divmod(k, len(examples))
        if epoch not in orders:  # one shuffle per epoch, not one per question
            orders[epoch] = np.random.default_rng(cfg.seed + epoch).permutation(len(examples))
        picked.append(examples[orders[epoch][pos]])
    return picked[rank::world]


def train(cfg: Config, reward_fn=None, given=frozenset()) -> dict:
    """Run Flow-GRPO; returns the last step's metrics. reward_fn(traj) -> float overrides tasks.score."""
    # 0. Resume: the saved config, with what was given on the command line on top (e.g. more --steps).
    start_step, ckpt = 0, None
    if cfg.resume:
        ckpt = checkpoint.find(cfg.resume)
        saved = checkpoint.load_state(ckpt)
        cfg = Config(**{**saved["config"], **{k: getattr(cfg, k) for k in given if k != "resume"}, "resume": cfg.resume})
        start_step = saved["step"]
    accelerator = Accelerator(mixed_precision="bf16" if cfg.bf16 else "no", cpu=not torch.cuda.is_available())
    validate(cfg, accelerator.num_processes)
    rank, world = accelerator.process_index, accelerator.num_processes
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
    if report.get("skipped") and accelerator.is_main_process:
        print(f"skipped {report['skipped']} bad rows of {cfg.data}: " + "; ".join(report["errors"][:3]), file=sys.stderr)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        print("config: " + json.dumps(dataclasses.asdict(cfg)), file=sys.stderr)

    try:  # a frozen-module server is checked (it must answer /models) before the models are loaded
        remote = remote_engine.from_url(cfg.frozen_engine) if cfg.frozen_engine else None
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"train.py: --frozen-engine: {e}") from None

    # 1. Models: the trainable planner, and ONE frozen copy of the initial weights (executor, verifier,
    #    generator, Base_Generator and the KL reference).
    policy, tokenizer = load_model(str(ckpt / "planner") if ckpt else cfg.model, device=accelerator.device)
    frozen, _ = load_model(cfg.model, dtype=torch.bfloat16 if cfg.bf16 else torch.float32, device=accelerator.device)
    frozen.requires_grad_(False)
    if cfg.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    if ckpt:
        if accelerator.distributed_type == DistributedType.FSDP:
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
        print(memory_report(cfg, world, accelerator.distributed_type == DistributedType.FSDP), file=sys.stderr)
    tools = check_tool_names([t.strip() for t in cfg.tools.split(",") if t.strip()])
    rcfg = RolloutConfig(cfg.max_turns, cfg.temperature, cfg.analysis_tokens, cfg.planner_tokens, cfg.executor_tokens,
                         cfg.verifier_tokens, cfg.generator_tokens, cfg.memory_chars, tools)
    planner = HFEngine(accelerator.unwrap_model(policy), tokenizer)
    # With --frozen-engine the executor, verifier, generator and Base_Generator run on a server; the
    # local frozen copy then only serves as the KL reference pi_ref.
    frozen_engine = remote or HFEngine(frozen, tokenizer)
    toolbox = Toolbox(tools, llm=frozen_engine)
    n_mini = cfg.questions_per_step // cfg.mini_batch_questions
    per_mini = max(cfg.mini_batch_questions // world, 1)
    metrics = {}

    test_examples = tasks.load(cfg.data, split="test", n=cfg.eval_n, seed=cfg.seed) if cfg.eval_every else []
    if cfg.eval_every and start_step == 0:  # the untrained planner: step 0 of the learning curve
        acc = test_accuracy(cfg, planner, frozen_engine, toolbox, rcfg, test_examples, accelerator)
        if accelerator.is_main_process:
            checkpoint.append_metrics(out / "metrics.jsonl", {"step": 0, "test_accuracy": acc})
            print(f"step 0 | test_accuracy {acc:.3f}", file=sys.stderr)
    bar = tqdm(range(start_step + 1, cfg.steps + 1), desc="steps", disable=not accelerator.is_main_process, file=sys.stderr)
    for step in bar:
        # ---- 1. rollout: G trajectories per question with the current planner, no gradients --------
        t0 = time.perf_counter()
        torch.manual_seed(step_seed(cfg.seed, step, rank))
        questions = questions_for_step(examples, cfg, step, rank, world)
        group_of = [g for g in range(len(questions)) for _ in range(cfg.group_size)]
        policy.eval()
        with full_weights(accelerator, policy):
            trajs = rollout([questions[g]["query"] for g in group_of], planner, frozen_engine, toolbox, rcfg,
                            examples=[questions[g] for g in group_of])
        policy.train()
        rollout_s = time.perf_counter() - t0

        # ---- 2. reward: one verifiable reward per trajectory -------------------------------------
        for tr in trajs:
            tr.reward = float(reward_fn(tr)) if reward_fn else tasks.score(tr.final_output, tr.example)

        # ---- 3. advantage: normalised within each group of G, broadcast to every turn -----------
        rewards = torch.tensor([tr.reward for tr in trajs])
        advantages = group_advantages(rewards, group_of, scale=cfg.scale_advantages)  # (N,)
        keep = list(range(len(trajs)))
        if cfg.filter_groups:
            # A group whose G rewards are all equal has advantage 0 on every turn: its rows would only
            # add the small KL term, at the cost of a reference pass and a forward/backward each. With a
            # sparse reward (most groups all 0) that is most of the update. As in DAPO's dynamic sampling
            # (without its resampling), they are left out, and the token-mean runs over the others.
            flat = flat_groups(rewards, group_of)
            keep = [i for i, g in enumerate(group_of) if g not in flat]
        rows = make_rows([trajs[i] for i in keep], advantages[keep], [group_of[i] for i in keep], per_mini)

        # ---- 4. reference (and recomputed old) log-probs, no gradients --------------------------
        t1 = time.perf_counter()
        pad = tokenizer.pad_token_id
        if cfg.kl_coef > 0:
            fill_logprobs(frozen, rows, "ref_logp", pad, accelerator.device, cfg.temperature, cfg.micro_batch_rows)
        if cfg.old_logprobs == "recompute":
            policy.eval()
            with full_weights(accelerator, policy):
                fill_logprobs(accelerator.unwrap_model(policy), rows, "old_logp", pad, accelerator.device, cfg.temperature, cfg.micro_batch_rows)
            policy.train()

        # ---- 5-6. loss and optimiser steps ------------------------------------------------------
        upd = update(cfg, accelerator, policy, optimizer, rows, n_mini, pad)
        update_s = time.perf_counter() - t1

        # ---- 7. log: metrics gathered over processes, one line per step -------------------------
        metrics = step_metrics(step, trajs, rewards, group_of, rows, upd, rollout_s, update_s, accelerator, tools)
        if accelerator.is_main_process and cfg.sample_every and step % cfg.sample_every == 0:
            (out / "samples").mkdir(exist_ok=True)  # one question's G trajectories, for a person to read
            text = "\n\n".join(format_trajectory(tr) for tr in trajs[: cfg.group_size])
            (out / "samples" / f"step-{step:06d}.txt").write_text(text + "\n")
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            metrics["test_accuracy"] = test_accuracy(cfg, planner, frozen_engine, toolbox, rcfg, test_examples, accelerator)
        if accelerator.is_main_process:
            checkpoint.append_metrics(out / "metrics.jsonl", metrics)
            bar.write(console_line(metrics, cfg.steps))
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            accelerator.wait_for_everyone()
            weights = accelerator.get_state_dict(policy)  # gathered on every rank (a collective under FSDP)
            if accelerator.is_main_process:
                checkpoint.save(out, step, accelerator.unwrap_model(policy), tokenizer, optimizer, dataclasses.asdict(cfg),
                                state_dict=weights)
            accelerator.wait_for_everyone()
    write_param_digest(out, accelerator.unwrap_model(policy), rank)
    accelerator.end_training()
    return metrics


def memory_report(cfg: Config, gpus: int, sharded: bool) -> str:
    """sizing.report for this config: the longest row is a full planner prompt plus its response."""
    row_tokens = cfg.memory_chars // 3 + 400 + cfg.planner_tokens  # ~3 characters a token, ~400 of instructions
    try:
        return sizing.report(cfg.model, gpus=gpus, sharded=sharded, bf16=cfg.bf16, checkpointing=cfg.gradient_checkpointing,
                             micro_rows=cfg.micro_batch_rows, row_tokens=row_tokens, response_tokens=cfg.planner_tokens,
                             rollout_rows=cfg.questions_per_step * cfg.group_size // gpus)
    except ValueError as e:
        return f"memory estimate: {e}"


def main(argv=None):
    cfg, given = parse_args(argv)
    validate(cfg)
    if cfg.dry_run:  # nothing is loaded or downloaded: the config and what it will need
        print("config: " + json.dumps(dataclasses.asdict(cfg), indent=2))
        gpus = int(os.environ.get("WORLD_SIZE", "1"))
        print(memory_report(cfg, gpus, sharded=False))
        print(memory_report(cfg, 8, sharded=True))
        return
    train(cfg, given=given)


if __name__ == "__main__":
    main()
