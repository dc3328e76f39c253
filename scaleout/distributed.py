"""What several processes need around the training step: whole weights for generation, and the same
collectives on every rank.

Under FSDP (FULL_SHARD) each rank holds a shard of every tensor, and every forward or backward pass of
a sharded layer is a collective (an all-gather of its weights, a reduce-scatter of its gradients):
all ranks must run the same passes in the same order, whatever their own data. A Flow-GRPO step
breaks that in three places unless handled here:

- Micro-batches. The rows of a mini-batch are a rank's own planner turns, and trajectories differ
  in turn counts, so one rank may have 3 micro-batches where another has 2 (in the update and in
  the log-prob passes). `even_out` gives every rank as many as the rank with the most, the missing
  ones as stand-ins that carry weight 0.
- Generation. Ranks decode different numbers of tokens, so generation must run no collective at
  all. `generation_model` is a plain, unwrapped instance of the policy's architecture that FSDP has
  never seen, and `full_weights` points its tensors at the whole weights that summon_full_params
  gathers (one all-gather per unit, the same on every rank, before any rank decodes). Calling the
  FSDP-wrapped model instead would all-gather at every layer of every decode step, and transformers
  turns on `synced_gpus` for an FSDP-managed module (torch marks every submodule it wraps), so a rank
  that has finished keeps decoding dummy steps past the end of a preallocated KV cache.
- Gradient accumulation. FSDP's `no_sync` keeps a full, unsharded fp32 gradient of the whole model
  on every rank until the synced micro-batch (28 GiB at 7B). `accumulation_context` therefore never
  skips the sync under FSDP: every micro-batch's backward reduce-scatters, and the gradients stay
  sharded (P x 4 B / W, what scaleout/sizing.py counts), at the price of one reduce-scatter per
  micro-batch instead of per mini-batch. DDP keeps its full gradient anyway, so there `no_sync`
  saves the all-reduces for free.

DDP needs neither the stand-ins nor the plain generation model (its collectives are the buffer
broadcast at each forward and the gradient all-reduce), but the stand-ins keep those counts equal
too, so train.py evens out whenever there are several processes.

Two things of the launcher's FSDP setup are undone before the models exist on the GPUs:
- `keep_buffers_fp32`: Accelerate's bf16 policy would cast the rotary frequencies to bf16;
- `load_on_every_rank`: fsdp_cpu_ram_efficient_loading would leave the frozen copy zeros off rank 0.

Test: python -m pytest -q tests/test_gpu_paths.py -k fsdp   (two gloo CPU processes, torch's FSDP)
"""

import contextlib
import os

import torch
from accelerate import DistributedType

# Name pieces that FSDP and activation-checkpoint wrappers insert into parameter names.
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def is_fsdp(accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.FSDP


def keep_buffers_fp32(accelerator):
    """Under FSDP, keep the policy's buffers (the rotary inv_freq) in fp32 whatever the launcher's precision.

    Accelerate's FSDP plugin gives its bf16 MixedPrecision policy buffer_dtype bf16 too
    (FullyShardedDataParallelPlugin.set_mixed_precision), and FSDP's lazy init (summon_full_params
    runs it as well) casts every buffer to it. inv_freq in bf16 is off by up to 0.4% (7 stored
    mantissa bits), a phase error of radians at positions in the thousands, in the update, the recomputed
    old log-probs and the rollout, while the reference model keeps fp32: the KL would not be 0 at
    step 0. Parameters are still gathered and multiplied in bf16; only the buffers stay fp32. Call it
    before prepare(); FSDP2's policy casts no buffers, so there is nothing to do for it."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None) if is_fsdp(accelerator) else None
    policy = getattr(plugin, "mixed_precision_policy", None)
    if getattr(policy, "buffer_dtype", None) not in (None, torch.float32):
        policy.buffer_dtype = torch.float32


@contextlib.contextmanager
def load_on_every_rank():
    """from_pretrained reads the checkpoint on every rank inside this block.

    With Accelerate's fsdp_cpu_ram_efficient_loading (configs/accelerate_8gpu_fsdp.yaml), the launcher
    sets FSDP_CPU_RAM_EFFICIENT_LOADING, and transformers then loads a model's weights on local rank 0
    only: transformers 5.17 leaves every parameter and buffer zero on the other ranks, waiting for
    FSDP's sync_module_states broadcast. That broadcast happens for the policy, which prepare() wraps,
    but never for the frozen copy, which is not wrapped: ranks 1-7 would run the executor, verifier,
    generator and the reference log-probs on zeros. (5.24 happens to load the weights everywhere.)"""
    key = "FSDP_CPU_RAM_EFFICIENT_LOADING"  # read by transformers' is_fsdp_enabled() at each load
    saved = os.environ.pop(key, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[key] = saved


def generation_model(accelerator, policy):
    """The module the planner generates with.

    One process or DDP: the policy itself (unwrapped). FSDP: a plain instance of the same
    architecture, built on the meta device (no memory), whose tensors `full_weights` fills in with the
    gathered weights for the time of a rollout; outside that it holds nothing."""
    inner = accelerator.unwrap_model(policy)
    if not is_fsdp(accelerator):
        return inner
    with torch.device("meta"):
        plain = type(inner)(inner.config)
    plain.generation_config = inner.generation_config
    return plain.eval().requires_grad_(False)


def _clean(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


@contextlib.contextmanager
def full_weights(accelerator, policy, plain=None):
    """Whole weights for generation (and the parameter digest) while the context is open.

    One process or DDP: nothing to do. FSDP: summon_full_params gathers every unit's weights (a
    collective, entered by every rank); `plain` (from generation_model) then shares those tensors,
    nothing is copied, and runs under the launcher's autocast, as the one-GPU path's policy does. The
    gathered weights are fp32 (P x 4 B per GPU for the rollout: sizing.py's rollout_full_weights)."""
    if not is_fsdp(accelerator):
        yield
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(policy, writeback=False):
        if plain is None:
            yield
            return
        _share(plain, policy)
        try:
            with accelerator.autocast():
                yield
        finally:
            plain.to_empty(device="meta")  # the gathered storage is freed on exit: hold no view of it


def _share(plain, policy):
    """Point every parameter and buffer of `plain` at the policy's tensor of the same name (detached
    views: nothing is copied, and the policy's own parameters keep requires_grad). remove_duplicate=False
    names a tied weight under both of its names (embed_tokens and lm_head), so both get it."""
    tensors = {_clean(n): t for n, t in policy.named_parameters(remove_duplicate=False)}
    buffers = {_clean(n): b for n, b in policy.named_buffers(remove_duplicate=False)}  # incl. rotary inv_freq
    wanted = [n for n, _ in plain.named_parameters(remove_duplicate=False)]
    wanted_buffers = [n for n, _ in plain.named_buffers(remove_duplicate=False)]
    missing = [n for n in wanted if n not in tensors] + [n for n in wanted_buffers if n not in buffers]
    if missing:
        raise RuntimeError(f"the generation model's tensors {missing[:3]} are not among the FSDP policy's: "
                           "the policy must be a plain Hugging Face causal LM before accelerator.prepare")
    for names, source, slot in ((wanted, tensors, "_parameters"), (wanted_buffers, buffers, "_buffers")):
        for name in names:
            module, _, leaf = name.rpartition(".")
            value = source[name].detach()
            getattr(plain.get_submodule(module), slot)[leaf] = (
                torch.nn.Parameter(value, requires_grad=False) if slot == "_parameters" else value)


def accumulation_context(accelerator, policy, last: bool):
    """No gradient sync before the last micro-batch of a mini-batch, except under FSDP (see above)."""
    if last or is_fsdp(accelerator):
        return contextlib.nullcontext()
    return accelerator.no_sync(policy)


def even_out(chunks, accelerator) -> list[tuple[list, bool]]:
    """(rows, real) for every micro-batch, as many on every rank as the rank with the most.

    A stand-in (real=False) repeats one of this rank's rows, or, for a rank with none, a one-token row
    of pad ids; the caller multiplies its loss by 0 and records nothing from it."""
    out = [(chunk, True) for chunk in chunks]
    if accelerator.num_processes == 1:
        return out
    most = int(accelerator.reduce(torch.tensor(len(out), device=accelerator.device), "max").item())
    if len(out) < most:
        stand_in = [out[0][0][0]] if out else [_blank_row()]
        out += [(stand_in, False)] * (most - len(out))
    return out


def _blank_row():
    """A planner turn with one response token and nothing to learn from (advantage 0)."""
    from rollout import Turn  # a record, not a dependency of the method on this file

    return Turn(prompt_ids=[0, 0], response_ids=[0], logprobs=[0.0], planner_text="", tool="", sub_goal="",
                context="", valid_action=False, truncated=False, advantage=0.0, traj_turns=1, ref_logp=[0.0])
