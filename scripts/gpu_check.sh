#!/usr/bin/env bash
# The one-GPU check: tiny models built on the spot (no network, no embedded model), a few training
# steps through `accelerate launch` in fp32 and bf16, with and without gradient checkpointing, a
# resume and an evaluation, each asserted to have run on CUDA, then greedy decoding and FSDP's bf16
# buffers; one line per check, exit status 1 on a failure, 2 without a CUDA GPU or without a package
# it needs. What each check runs: scripts/gpu_check.py's docstring.
#
# Run:  bash scripts/gpu_check.sh          (--cpu: the same checks on the CPU; --keep DIR: keep the runs)
#       PYTHON=python3 bash scripts/gpu_check.sh   (where there is no `python`)
# Test: python -m pytest -q tests/test_gpu_paths.py -k gpu_check
set -euo pipefail
cd "$(dirname "$0")/.."
# PYTHON picks the interpreter (PYTHON=python3, or a virtual environment's); by default python, else python3.
PYTHON="${PYTHON:-$(command -v python || command -v python3 || true)}"
if [ -z "$PYTHON" ]; then
    echo "gpu_check: neither python nor python3 is on PATH: set PYTHON=/path/to/python" >&2
    exit 2
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
