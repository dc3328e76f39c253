"""The README's reading-path table is the output of `python -m bookkeeping.reading_path`, never figures
written by hand: after a change to one of the eight files, `python -m bookkeeping.reading_path --readme`
writes it again.

Run: python -m pytest -q tests/test_reading_path.py
"""

import subprocess
import sys

from conftest import ROOT

from bookkeeping import reading_path


def test_readme_holds_the_reading_path_table_the_command_prints_and_the_path_keeps_its_bounds():
    # --check exits 1 past issue 23's bounds: 2,000 lines on the whole path, 100 in any one function.
    res = subprocess.run([sys.executable, "-m", "bookkeeping.reading_path", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert res.stdout.strip() in readme, "README.md's reading-path table is stale: run python -m bookkeeping.reading_path --readme"


def test_the_counts_are_wc_l_and_the_function_lengths_span_def_to_last_line(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def a():\n    return 1\n\n\nclass K:\n    def b(self):\n        x = 1\n        return x\n")
    assert reading_path.line_count(f) == 8
    assert reading_path.functions(f) == [("a", 2), ("K.b", 3)]
    text = "intro\n\nOne training step (rollout, reward, advantage, loss, optimiser step) is in 9 files\n\n| 1 | old |\n\nrest\n"
    assert reading_path.readme_with(text, "NEW") == "intro\n\nNEW\n\nrest\n"
