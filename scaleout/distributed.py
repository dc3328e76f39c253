"""What several processes need around the training step: whole weights for generation, and the same
collectives on every rank.

Under FSDP each rank holds a shard of every tensor, and every forward pass of a sharded layer is a
collective (an all-gather of its weights): all ranks must run the same forwards in the same order,
whatever their own data. Two places in a Flow-GRPO step break that unless handled:

- Micro-batches. The rows of a mini-batch are a rank's own planner turns, and trajectories differ
  in turn counts, so one rank may have 3 micro-batches where another has 2. `even_out` gives every
  rank as many as the rank with the most, the missing ones as stand-ins that carry weight 0.
- Generation needs whole weights (`full_weights`).

DDP needs neither (its only collective is the gradient all-reduce at the synced backward), but the
stand-ins cost it nothing wrong, so train.py evens out whenever there are several processes.

Test: python -m pytest -q tests/test_train.py -k processes
"""

import contextlib

import torch
from accelerate import DistributedType


def full_weights(accelerator, policy):
    """Generation needs whole weights. Under FSDP the rollout runs inside summon_full_params (a 7B
    model in bf16 is 15 GB per GPU for that time); DDP and single-process runs use a no-op."""
    if accelerator.distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(policy, writeback=False)
    return contextlib.nullcontext()


def even_out(chunks, accelerator) -> list[tuple[list, bool, bool]]:
    """(rows, shared, real) for every micro-batch, as many on every rank as the rank with the most.

    A stand-in (real=False) repeats one of this rank's rows, or, for a rank with none, a one-token row
    of pad ids; the caller multiplies its loss by 0 and records nothing from it."""
    out = [(chunk, shared, True) for chunk, shared in chunks]
    if accelerator.num_processes == 1:
        return out
    most = int(accelerator.reduce(torch.tensor(len(out), device=accelerator.device), "max").item())
    if len(out) < most:
        stand_in = [out[0][0][0]] if out and not out[0][1] else [_blank_row()]
        out += [(stand_in, False, False)] * (most - len(out))
    return out


def _blank_row():
    """A planner turn with one response token and nothing to learn from (advantage 0)."""
    from rollout import Turn  # a record, not a dependency of the method on this file

    return Turn(prompt_ids=[0, 0], response_ids=[0], logprobs=[0.0], planner_text="", tool="", sub_goal="",
                context="", valid_action=False, truncated=False, advantage=0.0, traj_turns=1, ref_logp=[0.0])
