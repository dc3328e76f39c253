"""Checkpoints that are never half written, and a metrics log that survives `kill -9`.

A checkpoint is one folder per step:

    RUN/checkpoints/step-000010/
        planner/        the trained planner in save_pretrained format (loadable by transformers, --model)
        optimizer.pt    AdamW state
        rng.pt          torch, numpy and python RNG states
        state.json      step, the run's config, and the data position

It is written into a temporary sibling folder and renamed into place at the end: a rename within one
filesystem is atomic, so a crash leaves either the complete folder or a stray `.tmp-*` folder that is
ignored and cleaned up, never a checkpoint that looks complete but is not.

metrics.jsonl gets one line per step, flushed and fsynced. After a crash it can end in a torn line, and
it can hold steps newer than the last checkpoint (they will be redone). `truncate_metrics` rewrites it
(atomically too) to the complete lines up to the resumed step, so the log never has a duplicated or
a lost step.

Test: python -m pytest -q tests/test_train.py -k resume
"""

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

STEP_DIR = re.compile(r"^step-(\d{6})$")
REQUIRED = ("planner/config.json", "optimizer.pt", "rng.pt", "state.json")


def save(run_dir, step: int, model, tokenizer, optimizer, config: dict, state_dict=None) -> Path:
    """Write RUN/checkpoints/step-XXXXXX atomically; return its path. `state_dict`: the full weights
    when the model is sharded (Accelerator.get_state_dict), else the model's own are used."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp / "planner", state_dict=state_dict)
    tokenizer.save_pretrained(tmp / "planner")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}, tmp / "rng.pt")
    state = {"step": step, "config": config, "data_position": step * config.get("questions_per_step", 0)}
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (e.g. a resumed run): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def _fsync_tree(folder: Path):
    """Flush every file to disk before the rename makes the folder visible."""
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def is_complete(folder) -> bool:
    folder = Path(folder)
    return all((folder / r).exists() for r in REQUIRED)


def find(path) -> Path:
    """A checkpoint folder, or the latest complete one in a run folder. One-line error otherwise."""
    path = Path(path)
    if STEP_DIR.match(path.name) or (path / "state.json").exists():
        missing = [r for r in REQUIRED if not (path / r).exists()]
        if missing:
            raise SystemExit(f"checkpoint {path} is incomplete (missing {', '.join(missing)}): "
                             "resume from its run folder to use the latest complete checkpoint")
        return path
    root = path / "checkpoints"
    steps = sorted(p for p in root.glob("step-*") if STEP_DIR.match(p.name) and is_complete(p)) if root.is_dir() else []
    if not steps:
        raise SystemExit(f"no complete checkpoint under {path}: pass a run folder written by train.py "
                         "(with checkpoints/step-XXXXXX inside) or a checkpoint folder")
    return steps[-1]


def load_state(folder) -> dict:
    return json.loads((Path(folder) / "state.json").read_text())


def restore(folder, optimizer):
    """Load optimizer and RNG states saved by `save` (the planner weights are loaded by the caller)."""
    folder = Path(folder)
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False))
    rng = torch.load(folder / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])


def clean_partial(run_dir):
    """Remove temporary folders left by a checkpoint write that was killed."""
    for p in (Path(run_dir) / "checkpoints").glob(".tmp-step-*"):
        shutil.rmtree(p, ignore_errors=True)


def append_metrics(path, record: dict):
    """One JSON line per step, flushed and fsynced so a kill loses at most the line being written."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_metrics(path, last_step: int):
    """Keep only complete lines with step <= last_step (a resumed run redoes the rest)."""
    path = Path(path)
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn last line of a killed run
        if isinstance(rec, dict) and rec.get("step", 1 << 60) <= last_step:
            keep.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)
