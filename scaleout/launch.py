"""What a training run does around its steps, off the reading path: train.py's setup and its log.

    validate         the settings that cannot work, refused before any work starts, with what to change
    start            the run's config (a resumed run's, with the command line on top), the launcher's
                     processes and devices, and every check that needs no model
    load_questions   the training questions, checked, and the fixed test questions
    questions_for_step
                     the questions of one step, for this process (one fixed shuffle per epoch)
    load_models      the trainable planner, prepared for the processes with its AdamW, and one frozen
                     copy of the initial weights; restored from a checkpoint on --resume
    write_config     config.json and the run's first lines on the console
    test_accuracy    greedy accuracy of the current planner on the fixed test questions
    write_step       step 6 on the main process: metrics.jsonl, the console line, sample trajectories
    save_checkpoint  an atomic checkpoint of the planner and AdamW (a collective under FSDP)
    dry_run          --dry-run: the resolved config and the memory estimate, nothing loaded

Test: python -m pytest -q tests/test_train.py tests/test_robustness.py
"""

import dataclasses
import json
import os
import sys
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator, DistributedType
from tqdm import tqdm

from bookkeeping import checkpoint
from bookkeeping.cli import set_sandbox
from bookkeeping.metrics import console_line
from bookkeeping.models import FROZEN_DTYPES, load_model, train_top_layers
from bookkeeping.report import format_trajectory
from config import Config
from environment import scoring, tasks
from flow_grpo import AGGREGATIONS, KL_KINDS
from rollout import rollout
from scaleout import distributed, remote_engine, sizing


def validate(cfg: Config, world: int = 1):
    """Reject settings that cannot work, before any work starts, with what to change."""
    checks = [
        (cfg.group_size >= 2, f"--group-size {cfg.group_size}: G must be >= 2 (advantages compare trajectories within a group)"),
        (cfg.clip_low > 0 and cfg.clip_high > 0, "--clip-low and --clip-high must be > 0"),
        (cfg.clip_c == 0 or cfg.clip_c > 1, f"--clip-c {cfg.clip_c}: the dual clip needs c > 1 (or 0 to turn it off)"),
        (cfg.max_turns >= 1, f"--max-turns {cfg.max_turns}: must be >= 1"),
        (cfg.temperature > 0, "--temperature must be > 0: Flow-GRPO needs sampled, not greedy, trajectories"),
        (cfg.lr > 0 and cfg.steps >= 1, "--lr must be > 0 and --steps >= 1"),
        (cfg.warmup_steps >= 0, "--warmup-steps must be >= 0 (0 = a constant learning rate)"),
        (cfg.agg in AGGREGATIONS, f"--agg {cfg.agg!r}: choose from {', '.join(AGGREGATIONS)}"),
        (cfg.kl_kind in KL_KINDS, f"--kl-kind {cfg.kl_kind!r}: choose from {', '.join(KL_KINDS)}"),
        (cfg.credit in ("broadcast", "last"), f"--credit {cfg.credit!r}: choose broadcast or last"),
        (cfg.old_logprobs in ("sample", "recompute"), "--old-logprobs must be 'sample' or 'recompute'"),
        (cfg.frozen_dtype in FROZEN_DTYPES, f"--frozen-dtype {cfg.frozen_dtype!r}: choose {', '.join(FROZEN_DTYPES)}"),
        (cfg.mini_batch_questions >= 1 and cfg.questions_per_step % cfg.mini_batch_questions == 0,
         f"--questions-per-step {cfg.questions_per_step} must be a multiple of --mini-batch-questions {cfg.mini_batch_questions}"),
        (cfg.mini_batch_questions % world == 0,
         f"--mini-batch-questions {cfg.mini_batch_questions} must be a multiple of the {world} processes"),
        (cfg.micro_batch_rows >= 1 and cfg.epochs >= 1, "--micro-batch-rows and --epochs must be >= 1"),
        (cfg.train_layers >= 0, f"--train-layers {cfg.train_layers}: must be >= 0 (0 trains every layer)"),
        (cfg.tool_temperature >= 0, f"--tool-temperature {cfg.tool_temperature}: must be >= 0 (0 = the tool as free text)"),
        (not cfg.calibrate_tools or cfg.tool_temperature > 0,
         "--calibrate-tools calibrates the tool choice of --tool-temperature: give --tool-temperature > 0"),
        (cfg.questions_per_step % max(len(cfg.kind_names()), 1) == 0,
         f"--questions-per-step {cfg.questions_per_step} must be a multiple of the {len(cfg.kind_names())} --kinds"),
        (not cfg.filter_groups or world == 1, "--filter-groups leaves each process a different number of rows, which "
         "DDP's gradient all-reduce cannot follow: run one process or pass --no-filter-groups"),
    ]
    for ok, message in checks:
        if not ok:
            raise SystemExit(f"train.py: {message}")
    try:
        cfg.tool_names()
    except ValueError as e:
        raise SystemExit(f"train.py: --tools: {e}") from None


def start(cfg: Config, given, accelerator):
    """Returns (cfg, accelerator, the step to start after, the checkpoint folder or None, the frozen
    modules' server or None)."""
    start_step, ckpt = 0, None
    if cfg.resume:  # the saved config, with what was given on the command line on top (e.g. more --steps)
        ckpt = checkpoint.find(cfg.resume)
        saved = checkpoint.load_state(ckpt)
        known = {f.name for f in fields(Config)}  # a checkpoint from an older version may name other fields
        # The run goes on in the folder that holds the checkpoint, wherever the run was first written
        # (a copied or moved run folder), unless --out says otherwise.
        cfg = Config(**{**{k: v for k, v in saved["config"].items() if k in known}, "out": str(ckpt.parent.parent),
                        **{k: getattr(cfg, k) for k in given if k != "resume"}, "resume": cfg.resume})
        start_step = saved["step"]
    # Device, precision and processes are the launcher's (accelerate launch, its config file, --mixed_precision).
    # Only on a machine without a GPU do we say cpu=True: Accelerate then also sets up several CPU
    # processes started by torchrun (over gloo), which it does not detect by itself.
    accelerator = accelerator or Accelerator(**({} if torch.cuda.is_available() else {"cpu": True}))
    validate(cfg, accelerator.num_processes)
    set_sandbox(cfg.sandbox)  # strict where snippets cannot be isolated stops here, before any work
    if accelerator.distributed_type == DistributedType.FSDP and cfg.train_layers:
        # untested there: frozen and trained parameters would share FSDP's flat shards
        raise SystemExit("train.py: --train-layers is not supported under FSDP; pass --train-layers 0")
    out = Path(cfg.out)
    if not cfg.resume and ((out / "metrics.jsonl").exists() or any((out / "checkpoints").glob("step-*"))):
        # A fresh run would append its metrics to the old run's and mix their checkpoints.
        raise SystemExit(f"train.py: --out {out} already holds a run (metrics.jsonl or checkpoints/): pass "
                         f"--resume {out} to continue it, or another --out for a new run; nothing was changed")
    torch.manual_seed(cfg.seed)
    try:  # a frozen-module server is checked (it must answer /models) before the models are loaded
        remote = remote_engine.from_url(cfg.frozen_engine) if cfg.frozen_engine else None
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"train.py: --frozen-engine: {e}") from None
    return cfg, accelerator, start_step, ckpt, remote


def load_questions(cfg, accelerator) -> tuple[list, list]:
    """(training questions, the eval_n fixed test questions of --eval-every, or [])."""
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
    test = tasks.load(cfg.data, split="test", n=cfg.eval_n, seed=cfg.seed) if cfg.eval_every else []
    return examples, test


def questions_for_step(examples, cfg, step, rank, world):
    """The questions of one step, for this process: a fixed shuffle per epoch of the training set, or,
    with --kinds, of each listed kind's questions, questions_per_step / len(kinds) of each (so that
    every step holds each kind as often, not whatever mix a shuffle of 8 questions gives). A kind listed
    twice is two pools of it, each with its own shuffle: twice as many of its questions a step."""
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


def load_models(cfg, accelerator, ckpt, start_step):
    """(policy, frozen, tokenizer, optimizer): the trainable planner, prepared with its AdamW, and ONE
    frozen copy of the initial weights (executor, verifier, generator, Base_Generator, KL reference)."""
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    bf16 = accelerator.mixed_precision == "bf16"
    out = Path(cfg.out)
    # Under FSDP the fp32 policy stays in CPU memory until prepare() shards it onto the GPU unit by
    # unit (Accelerate passes device_id, and broadcasts rank 0's weights with sync_module_states);
    # a whole fp32 copy on every GPU first would need P x 4 B each (28 GiB at 7B) before sharding.
    policy, tokenizer = load_model(str(ckpt / "planner") if ckpt else cfg.model,
                                   device="cpu" if fsdp else accelerator.device)
    # The frozen copy is never wrapped, so no broadcast fills it in: it reads the checkpoint on every
    # rank even under fsdp_cpu_ram_efficient_loading (which loads on rank 0 only: distributed.py).
    with distributed.load_on_every_rank():
        frozen, _ = load_model(cfg.model, dtype=torch.bfloat16 if bf16 else torch.float32, device=accelerator.device)
    frozen.requires_grad_(False)
    trainable = train_top_layers(policy, cfg.train_layers)  # every parameter, unless --train-layers
    if cfg.gradient_checkpointing:  # transformers' default, non-reentrant: it works with frozen lower layers
        policy.gradient_checkpointing_enable()
    policy.train()
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
    distributed.keep_buffers_fp32(accelerator)  # FSDP + bf16: the rotary frequencies stay exact (distributed.py)
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
        print(sizing.report_for(cfg, accelerator.num_processes, fsdp, bf16), file=sys.stderr)
    return policy, frozen, tokenizer, optimizer


def write_config(cfg, accelerator, run_info: dict, lines=()):
    """config.json (the config, and under "run" what the launcher chose and which path runs) and the
    same on the console, with `lines` (e.g. the speed-ups' line)."""
    if accelerator.is_main_process:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({**dataclasses.asdict(cfg), "run": run_info}, indent=2))
        print("config: " + json.dumps(dataclasses.asdict(cfg)), file=sys.stderr)
        print("\n".join(["launcher: " + json.dumps(run_info), *lines]), file=sys.stderr)


def test_accuracy(cfg, policy, planner, frozen_engine, toolbox, examples, accelerator) -> dict:
    """Greedy accuracy of the current planner on fixed test questions, overall (test_accuracy) and per
    kind of question (test_accuracy_by_kind, when the examples name their kind). Every process takes its
    share of the questions and reduces the same counts (one per kind of the whole list); under FSDP
    every rank enters full_weights (a collective) even with none, and generates with no collective of
    its own, however long its questions take."""
    mine = examples[accelerator.process_index::accelerator.num_processes]
    policy.eval()
    with distributed.full_weights(accelerator, policy, planner.model):
        trajs = rollout([ex["query"] for ex in mine], planner, frozen_engine, toolbox,
                        dataclasses.replace(cfg, temperature=0.0), examples=mine) if mine else []
    policy.train()
    kinds = sorted({ex["kind"] for ex in examples if "kind" in ex})
    scores = [(tr.example.get("kind"), scoring.score(tr.final_output, tr.example)) for tr in trajs]
    counts = [sum(s for _, s in scores), len(scores)]
    for k in kinds:
        counts += [sum(s for kind, s in scores if kind == k), sum(kind == k for kind, _ in scores)]
    total = accelerator.reduce(torch.tensor(counts, dtype=torch.float, device=accelerator.device), "sum").tolist()
    out = {"test_accuracy": total[0] / max(total[1], 1)}
    if kinds:
        out["test_accuracy_by_kind"] = {k: total[2 + 2 * i] / max(total[3 + 2 * i], 1) for i, k in enumerate(kinds)}
    return out


def write_step(cfg, accelerator, step: int, metrics: dict, run_info: dict, trajs=()):
    """The metrics line (metrics.jsonl and console) and, every sample_every steps, one question's G
    trajectories as text for a person to read: question (step - 1) mod Q of the step's Q, so that the
    samples go through every kind of a --kinds run. Main process only. Step 0 has only a test accuracy."""
    if not accelerator.is_main_process:
        return
    out = Path(cfg.out)
    if trajs and cfg.sample_every and step % cfg.sample_every == 0:
        (out / "samples").mkdir(exist_ok=True)
        first = (step - 1) % (len(trajs) // cfg.group_size) * cfg.group_size
        text = "\n\n".join(format_trajectory(tr) for tr in trajs[first:first + cfg.group_size])
        (out / "samples" / f"step-{step:06d}.txt").write_text(text + "\n")
    checkpoint.append_metrics(out / "metrics.jsonl", {**metrics, **run_info})
    if "reward_mean" in metrics:
        tqdm.write(console_line(metrics, cfg.steps))  # below the progress bar
    else:
        print(f"step {step} | test_accuracy {metrics['test_accuracy']:.3f}", file=sys.stderr)


def save_checkpoint(cfg, accelerator, step: int, policy, tokenizer, optimizer):
    """checkpoint.save of the prepared planner: its state dict is gathered on every rank (FSDP)."""
    accelerator.wait_for_everyone()
    weights = accelerator.get_state_dict(policy)  # a collective under FSDP
    if accelerator.is_main_process:
        checkpoint.save(Path(cfg.out), step, accelerator.unwrap_model(policy), tokenizer, optimizer,
                        dataclasses.asdict(cfg), state_dict=weights)
    accelerator.wait_for_everyone()


def dry_run(cfg):
    """Print the resolved config and what it will need; nothing is loaded or downloaded."""
    # What the launcher would set (accelerate launch exports these); a plain `python` run is fp32.
    bf16 = os.environ.get("ACCELERATE_MIXED_PRECISION", "no") == "bf16"
    print("config: " + json.dumps(dataclasses.asdict(cfg), indent=2))
    if "ACCELERATE_MIXED_PRECISION" in os.environ:
        print(f"mixed precision: {'bf16' if bf16 else 'no (fp32)'}, from the launcher (accelerate launch --mixed_precision)")
    else:  # the GPU configs launch in bf16, and the estimate below would then be another one
        print("mixed precision: fp32 assumed (no launcher: ACCELERATE_MIXED_PRECISION is unset); for the bf16 estimate "
              "of configs/accelerate_*.yaml: ACCELERATE_MIXED_PRECISION=bf16 python train.py ... --dry-run")
    print(sizing.report_for(cfg, int(os.environ.get("WORLD_SIZE", "1")), sharded=False, bf16=bf16))
    print(sizing.report_for(cfg, 8, sharded=True, bf16=bf16))
