#!/usr/bin/env bash
# The one-GPU check: tiny models built on the spot (no network, no embedded model), a few training
# steps through `accelerate launch` in fp32 and bf16, with and without gradient checkpointing, a
# resume and an evaluation, each asserted to have run on CUDA; one line per check, exit status 1 on
# a failure, 2 without a CUDA GPU. What each check runs: scripts/gpu_check.py's docstring.
#
# Run:  bash scripts/gpu_check.sh          (--cpu: the same checks on the CPU; --keep DIR: keep the runs)
# Test: python -m pytest -q tests/test_gpu_paths.py -k gpu_check
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
