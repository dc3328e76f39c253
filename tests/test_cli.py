"""Every entry point a user runs answers --help with exit status 0 (argparse %-formats help texts, so
a stray "%" in one crashes it). Run: python -m pytest -q tests/test_cli.py
"""

import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPTS = [["train.py"], ["evaluate.py"], ["ask.py"], ["demo.py"], ["bench.py"],
           ["-m", "environment.tasks"], ["-m", "environment.corpus"], ["-m", "environment.search"],
           ["-m", "environment.sandbox"], ["-m", "environment.facts"], ["-m", "bookkeeping.tool_choice"], ["-m", "bookkeeping.reading_path"], ["-m", "scaleout.remote_engine"], ["scripts/gpu_check.py"],
           # the same scripts run by path, as their docstrings also allow (the repository root goes on sys.path)
           ["environment/tasks.py"], ["environment/search.py"], ["environment/sandbox.py"], ["environment/facts.py"],
           ["environment/corpus.py"], ["bookkeeping/tool_choice.py"], ["scaleout/remote_engine.py"]]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: " ".join(s))
def test_help_exits_0_and_says_how_to_use_it(script):
    res = subprocess.run([sys.executable, *script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("usage:")
