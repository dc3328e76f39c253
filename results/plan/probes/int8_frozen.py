"""Probe (issue 24, item 6): the frozen modules (executor, generator) on int8 weights, torch's dynamic
quantisation (int8 weights, activations quantised per call), then evaluate.py's row as it stands.

    WHAT    fp32     the frozen modules as the demo runs them on a CPU without bf16 (a separate fp32 copy)
            int8     every nn.Linear of the frozen copy, the language-model head included
            layers   the decoder layers' nn.Linear only; the head stays fp32

then evaluate.py's flags, e.g. the demo's oracle planner (the ceiling of the frozen modules and tools):

Run: python results/plan/probes/int8_frozen.py int8 --data planning --n 100 --seed 0 --mode agent \\
         --preset cpu-plan --batch-size 50 --oracle planner --out /tmp/int8"""
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import evaluate  # noqa: E402
from bookkeeping.models import DTYPES  # noqa: E402

if len(sys.argv) < 2 or sys.argv[1] not in ("fp32", "int8", "layers"):
    sys.exit(__doc__)
what, flags = sys.argv[1], sys.argv[2:]
INT8 = object()  # the frozen copy's "dtype": evaluate.py then loads it apart from the planner's model
load = evaluate.load_model


def load_quantised(name, dtype=None, device="cpu"):
    if dtype is not INT8:
        return load(name, dtype=dtype, device=device)
    model, tokenizer = load(name, dtype=torch.float32, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        if what == "layers":
            decoder = model.get_decoder()
            decoder.layers = torch.ao.quantization.quantize_dynamic(decoder.layers, {torch.nn.Linear}, dtype=torch.qint8)
        else:
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return model, tokenizer


if what != "fp32":  # fp32: evaluate.py as it is
    evaluate.DTYPES = {**DTYPES, "int8": INT8}
    evaluate.frozen_dtype_of = lambda frozen_dtype, device: "int8"
    evaluate.load_model = load_quantised
evaluate.main(flags)
