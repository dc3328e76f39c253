"""How much accelerator memory a training run needs, estimated before anything is loaded.

train.py prints this at start (and `python train.py --preset paper --dry-run` prints only this), so a
user knows before launching whether Qwen2.5-7B-Instruct fits on their GPUs. The architecture is read
from a local model folder's config.json, or from the table of known architectures below: nothing is
downloaded.

Per GPU, with P parameters, W GPUs and FSDP full sharding (DDP and one GPU: nothing is sharded):

    policy weights       P x 4 B (fp32: Accelerate's bf16 autocast computes in bf16 but keeps
                         the trained weights in fp32)                               / W with FSDP
    gradients            P x 4 B (fp32)                                             / W with FSDP
                         (train.py accumulates under FSDP WITHOUT no_sync: every micro-batch
                         reduce-scatters, so no rank ever holds the full unsharded gradient, which
                         no_sync would keep on every GPU, P x 4 B = 28 GiB at 7B; scaleout/distributed.py)
    AdamW states         P x 8 B (exp_avg and exp_avg_sq, fp32)                     / W with FSDP
    frozen copy          P x 2 B in bf16 (P x 4 B in fp32), no gradients, never sharded: executor,
                         verifier, generator, Base_Generator, KL reference
    activations          per micro-batch row of L tokens, in bf16 (twice that in fp32):
                         L x layers x (10 x hidden + 4 x intermediate) x 2 B without gradient
                         checkpointing (attention's q, k, v, output and norms; the MLP's gate, up,
                         activation and product), L x layers x hidden x 2 B with it (one saved
                         input per layer; the layer being recomputed adds one layer's worth).
                         Autocast is not pure bf16: it keeps the residual stream and RMSNorm in
                         fp32 and saves the cast inputs besides, so x 1.25 without checkpointing,
                         and the saved layer input (the residual stream) is fp32, 4 B, with it
    autocast weights     P x 2 B under bf16 autocast without FSDP: the bf16 copies of the weights that
                         autocast makes for the forward and keeps for the backward (0.9 GiB at 0.5B);
                         FSDP's bf16 policy gathers bf16 weights unit by unit instead
    logits               rows x R x vocab x 4 B x 2 in fp32 (the log-softmax over the response positions
                         only, and its gradient); under autocast x 2: the bf16 logits, their fp32
                         copy (flow_grpo.scaled_logits), both gradients and the entropy's softmax
    rollout KV cache     rows x L x layers x 2 x kv_heads x head_dim x 2 B (4 B in fp32), for at most 16 rows:
                         the engine generates 16 rows a call (engine.HFEngine.max_batch), however
                         many trajectories the step rolls out
    gathered weights     P x 4 B under FSDP, while the rollout runs (summon_full_params gathers the
                         fp32 weights; the planner generates on them, scaleout/distributed.py)

The update and the rollout do not overlap, so the peak is the held states plus the larger phase.
Sizes are in GiB (1024^3 bytes), the unit nvidia-smi and torch.cuda report in.

These are estimates (the allocator, CUDA context and fragmentation add 1-3 GiB); they are meant to
tell 20 GiB from 200 GiB, not to predict to the gigabyte. None has been checked against a real GPU's
peak here (no GPU in this project's sessions so far).

Test: python -m pytest -q tests/test_scaling.py
"""

import json
from pathlib import Path

GIB = 1024**3
# Autocast's activations over pure bf16 ones, without checkpointing: the fp32 residual stream and
# RMSNorm, and the cast copies of inputs saved for the backward (about 20-25% more; not measured here).
AUTOCAST_ACTIVATIONS = 1.25

# Known architectures, from their published config.json files (read once; nothing is downloaded).
KNOWN = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                     tie_word_embeddings=False),
    "Qwen/Qwen2.5-3B-Instruct": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                     num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                                     tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True),
    "HuggingFaceTB/SmolLM2-135M-Instruct": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                                num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                                tie_word_embeddings=True),
}
KNOWN["embedded"] = KNOWN["HuggingFaceTB/SmolLM2-135M-Instruct"]


def architecture(model: str) -> dict:
    """The fields of config.json the estimate needs, from a local folder or the table above."""
    path = Path(model) / "config.json"
    if path.exists():
        cfg = json.loads(path.read_text())
        cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the language model's config inside
        return {k: cfg.get(k, KNOWN["embedded"][k] if k == "tie_word_embeddings" else None) for k in KNOWN["embedded"]}
    if model in KNOWN:
        return dict(KNOWN[model])
    raise ValueError(f"unknown architecture for {model!r}: pass a local model folder (with config.json) or one of "
                     + ", ".join(k for k in KNOWN if "/" in k))


def parameter_count(a: dict) -> int:
    """Parameters of a Llama/Qwen-style decoder: embeddings, attention, SwiGLU MLP, norms."""
    h, layers, v = a["hidden_size"], a["num_hidden_layers"], a["vocab_size"]
    head_dim = h // a["num_attention_heads"]
    kv = a["num_key_value_heads"] * head_dim
    attention = h * h * 2 + h * kv * 2 + (h + 2 * kv)  # q, o, k, v projections (+ Qwen's qkv biases)
    mlp = 3 * h * a["intermediate_size"]
    per_layer = attention + mlp + 2 * h
    embeddings = v * h * (1 if a["tie_word_embeddings"] else 2)
    return layers * per_layer + embeddings + h


def estimate(model: str, gpus: int = 1, sharded: bool = False, bf16: bool = True, checkpointing: bool = True,
             micro_rows: int = 8, row_tokens: int = 4096, response_tokens: int = 512, rollout_rows: int = 16) -> dict:
    """Estimated GiB per GPU for one training step; see the module docstring for each term."""
    a = architecture(model)
    p = parameter_count(a)
    shard = gpus if sharded else 1
    h, layers = a["hidden_size"], a["num_hidden_layers"]
    head_dim = h // a["num_attention_heads"]
    width = 2 if bf16 else 4  # bytes of an activation or a cached key/value: bf16 under autocast, else fp32
    saved = h if checkpointing else 10 * h + 4 * a["intermediate_size"]  # values kept per token and layer
    if checkpointing:  # the one saved input per layer is the residual stream, fp32 even under autocast
        act_per_token = layers * saved * 4
    else:  # autocast's fp32 residual stream and norms, and the inputs it saves after casting them
        act_per_token = layers * saved * width * (AUTOCAST_ACTIVATIONS if bf16 else 1)
    replicated = not (sharded and gpus > 1)
    states = {  # held for the whole run
        "policy_weights": p * 4 / shard,
        "gradients": p * 4 / shard,
        "adamw_states": p * 8 / shard,
        "frozen_copy": p * (2 if bf16 else 4),
    }
    update = {  # only during the update
        "activations": micro_rows * row_tokens * act_per_token,
        "autocast_weights": p * 2 if bf16 and replicated else 0,  # autocast's bf16 copies of the weights
        # fp32 logits and their gradient; under autocast also the bf16 logits, their gradient, the softmax
        "logits": micro_rows * response_tokens * a["vocab_size"] * 4 * 2 * (2 if bf16 else 1),
    }
    rollout = {  # only during the rollout; under FSDP the shards are gathered into full fp32 weights
        "rollout_full_weights": 0 if replicated else p * 4,
        "rollout_kv_cache": rollout_rows * row_tokens * layers * 2 * a["num_key_value_heads"] * head_dim * width,
    }
    gib = {k: v / GIB for k, v in {**states, **update, **rollout}.items()}
    held = sum(states.values()) / GIB
    gib["peak_update"] = held + sum(update.values()) / GIB
    gib["peak_rollout"] = held + sum(rollout.values()) / GIB
    gib["total"] = max(gib["peak_update"], gib["peak_rollout"])
    gib["parameters_billion"] = p / 1e9
    return gib


def report(model: str, **kw) -> str:
    """The estimate as lines a person reads before launching."""
    e = estimate(model, **kw)
    where = f"{kw.get('gpus', 1)} GPU(s), {'FSDP-sharded' if kw.get('sharded') else 'replicated (DDP or one device)'}"
    where += ", bf16 autocast" if kw.get("bf16", True) else ", fp32"
    lines = [f"memory estimate for {model} ({e['parameters_billion']:.2f} B parameters), per GPU, {where}:"]
    for k, v in e.items():
        if k not in ("total", "parameters_billion", "peak_update", "peak_rollout"):
            lines.append(f"  {k:<20} {v:8.2f} GiB")
    lines.append(f"  {'peak in the update':<20} {e['peak_update']:8.2f} GiB")
    lines.append(f"  {'peak in the rollout':<20} {e['peak_rollout']:8.2f} GiB")
    lines.append(f"  {'total (the larger)':<20} {e['total']:8.2f} GiB  (+1-3 GiB allocator and CUDA context)")
    return "\n".join(lines)


def report_for(cfg, gpus: int, sharded: bool, bf16: bool) -> str:
    """report() for a train.Config: the longest row is a full planner prompt plus its response, and a
    rollout generates at most 16 rows a call (engine.HFEngine.max_batch), however many it holds."""
    row_tokens = cfg.memory_chars // 3 + 400 + cfg.planner_tokens  # ~3 characters a token, ~400 of instructions
    try:
        return report(cfg.model, gpus=gpus, sharded=sharded, bf16=bf16, checkpointing=cfg.gradient_checkpointing,
                      micro_rows=cfg.micro_batch_rows, row_tokens=row_tokens, response_tokens=cfg.planner_tokens,
                      rollout_rows=min(cfg.questions_per_step * cfg.group_size // gpus, 16))
    except ValueError as e:
        return f"memory estimate: {e}"
