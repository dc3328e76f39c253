"""A CPU replica of `accelerate launch --config_file configs/accelerate_8gpu_fsdp.yaml train.py`: the
project's own train.train() (rollout, reference and recomputed old log-probs, update, periodic
evaluation, checkpoints) under torch's FSDP, FULL_SHARD with one unit per decoder layer, on gloo CPU
processes. Accelerate refuses to set FSDP up without a GPU, so CPUFSDPAccelerator below stands in for
accelerate.Accelerator: it has the part of its interface that train.py uses and does what Accelerate
does there under FSDP (wrap in prepare, re-point the optimiser at the wrapped parameters, clip with
the FSDP module's clip_grad_norm_, gather a full state dict for checkpoints). Everything else is
train.py's and scaleout/distributed.py's own code, the code the Accelerate FSDP path runs.

The launcher's settings come from the environment, as Accelerate's do: ACCELERATE_MIXED_PRECISION=bf16
gives FSDP the MixedPrecision policy that Accelerate builds for bf16 (its FullyShardedDataParallelPlugin,
buffers included) and autocast; FSDP_CPU_RAM_EFFICIENT_LOADING=true (with ACCELERATE_USE_FSDP=true)
turns on sync_module_states, and from_pretrained then does what transformers 5.17 does on ranks other
than 0: every parameter and buffer zero (5.24 loads them; the replica must not depend on which).

The ranks are made to differ on purpose: rank r runs with max_turns 1 + 2r and planner_tokens
4 + 6r, so their trajectories differ in turn counts (rows, micro-batches) and in generated lengths
(decode steps). Each rank writes what it trained to OUT/driver-rank{r}.json, so the test can check
the difference really happened. A collective that one rank waits on alone fails after 60 s
(the process group's timeout) instead of hanging.

Run:  python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_driver.py --model DIR --out DIR [train.py flags]
Test: python -m pytest -q tests/test_gpu_paths.py -k fsdp
"""

import contextlib
import functools
import hashlib
import itertools
import json
import os
import sys
import types
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import DistributedType
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, ShardingStrategy, StateDictType
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # noqa: E402
from bookkeeping import models  # noqa: E402


class CPUFSDPAccelerator:
    """What train.py asks of accelerate.Accelerator, under torch FSDP on CPU processes (fp32 or bf16)."""

    distributed_type = DistributedType.FSDP
    device = torch.device("cpu")

    def __init__(self):
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a hang becomes an error
        # Accelerate's FSDP plugin will not be built without a GPU: its fields here, and its own code
        # for the precision policy (what AcceleratorState runs). bf16: param, reduce AND buffer dtype
        # bf16. cpu_ram_efficient_loading forces sync_module_states on, as the plugin does.
        self.mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        ram_efficient = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false").lower() == "true"
        plugin = types.SimpleNamespace(fsdp_version=1, mixed_precision_policy=None, sync_module_states=ram_efficient)
        if self.mixed_precision != "no":
            FullyShardedDataParallelPlugin.set_mixed_precision(plugin, self.mixed_precision)
        self.state = types.SimpleNamespace(fsdp_plugin=plugin)
        self.process_index = self.local_process_index = dist.get_rank()
        self.num_processes = dist.get_world_size()
        self.is_main_process = self.process_index == 0
        self.model = None

    def prepare(self, model, optimizer):
        # One FSDP unit per decoder layer, as fsdp_transformer_layer_cls_to_wrap does in the config;
        # device_id as Accelerate passes it (here the CPU: FSDP otherwise looks for a GPU and stops).
        layers = {type(m) for m in model.modules() if type(m).__name__ in (model._no_split_modules or [])}
        plugin = self.state.fsdp_plugin
        if plugin.sync_module_states:  # FSDP's own broadcast wants a GPU: rank 0's tensors, sent here
            with torch.no_grad():
                for t in [*model.parameters(), *model.buffers()]:
                    dist.broadcast(t, src=0)
        self.model = FullyShardedDataParallel(
            model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True, device_id=self.device,
            auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers),
            mixed_precision=plugin.mixed_precision_policy)
        g = optimizer.param_groups[0]  # Accelerate re-points the optimiser; a new one with its settings here
        optimizer = type(optimizer)(self.model.parameters(), lr=g["lr"], weight_decay=g["weight_decay"],
                                    betas=g["betas"], eps=g["eps"])
        return self.model, optimizer

    def unwrap_model(self, model):
        return model.module if isinstance(model, FullyShardedDataParallel) else model

    def wait_for_everyone(self):
        dist.barrier()

    def no_sync(self, model):
        return model.no_sync()

    def autocast(self):
        if self.mixed_precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, parameters, max_norm):
        return self.model.clip_grad_norm_(max_norm)  # a collective: the norm over every rank's shard

    def reduce(self, tensor, reduction="sum"):
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM)
        return out

    def get_state_dict(self, model):
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)  # Accelerate offloads; on a CPU that crashes
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            return model.state_dict()

    def end_training(self):
        dist.destroy_process_group()


def record_rows(log):
    """Wrap train.training_rows to write down what this rank trains: turns and response lengths."""
    plain = train.training_rows

    def recorded(trajs, rewards, group_of, cfg):
        rows = plain(trajs, rewards, group_of, cfg)
        log.append({"turns": [len(tr.turns) for tr in trajs], "response_lengths": [len(t.response_ids) for t, _ in rows]})
        return rows
    return recorded


def state_digest(model) -> str:
    """A checksum of every parameter and buffer, as loaded."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode() + t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


class RankZeroLoading:
    """AutoModelForCausalLM as transformers 5.17 behaves under fsdp_cpu_ram_efficient_loading: on every
    rank but local rank 0 the loaded model's parameters and buffers are zeros (modeling_utils.py, about
    line 4718 in 5.17), for FSDP's sync_module_states to overwrite. 5.24 loads them instead, which
    would hide a model that no broadcast fills in. `loads` gets a checksum of each model as loaded
    (the policy, then the frozen copy)."""

    def __init__(self, plain, loads):
        self.plain, self.loads = plain, loads

    def from_pretrained(self, *args, **kwargs):
        from transformers.integrations import is_fsdp_enabled

        model = self.plain.from_pretrained(*args, **kwargs)
        if is_fsdp_enabled() and os.environ.get("LOCAL_RANK") != "0":
            with torch.no_grad():
                for t in [*model.parameters(), *model.buffers()]:
                    t.zero_()
        self.loads.append({"digest": state_digest(model), "dtype": str(model.dtype)})
        return model


def rotary_buffers(model) -> dict:
    """{name: (dtype, values as floats)} of every rotary inv_freq buffer."""
    return {n: (str(b.dtype), b.float().tolist()) for n, b in model.named_buffers() if n.endswith("inv_freq")}


def main():
    accelerator = CPUFSDPAccelerator()
    rank = accelerator.process_index
    cfg, given = train.parse_args(sys.argv[1:])
    if not cfg.resume:  # a resumed run takes the saved config; the fresh one is made to differ by rank
        cfg.max_turns, cfg.planner_tokens = 1 + 2 * rank, 4 + 6 * rank
    log, loads = [], []
    train.training_rows = record_rows(log)
    models.AutoModelForCausalLM = RankZeroLoading(models.AutoModelForCausalLM, loads)  # bookkeeping/models.py's
    # Rewards 1, 0, 1, 0, ... in rollout order: every group of G = 2 has a spread, so every step has
    # a gradient (a random tiny model earns nothing from the real scorer).
    calls = itertools.count()
    train.train(cfg, reward_fn=lambda tr: float(next(calls) % 2 == 0), given=given, accelerator=accelerator)
    out = Path(cfg.resume or cfg.out)  # a resumed run writes into the run folder it continues
    (out / f"driver-rank{rank}.json").write_text(json.dumps(log))
    buffers = rotary_buffers(accelerator.model)  # as FSDP left them after the steps
    (out / f"loads-rank{rank}.json").write_text(json.dumps({"loads": loads, "policy_buffers": buffers}))
    # Leave without the interpreter's teardown: the work is done and written (the test reads it). Once
    # in about twenty runs on a busy machine, that teardown aborted a rank after destroy_process_group
    # ("terminate called without an active exception": a gloo thread still held by the FSDP module).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
