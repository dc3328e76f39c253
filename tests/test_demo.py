"""demo.py end to end on the tiny model with tiny sizes: it writes the table as markdown and JSON and
the learning curve as a PNG.  Run: python -m pytest -q tests/test_demo.py
"""

import json
import subprocess
import sys

from conftest import ROOT


def test_demo_writes_the_table_and_the_learning_curve(tiny_model_dir, tmp_path):
    out = tmp_path / "demo"
    res = subprocess.run([sys.executable, "demo.py", "--model", str(tiny_model_dir), "--n", "5", "--steps", "1", "--baselines", "all",
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    entries = json.loads((out / "results.json").read_text())
    systems = {e["system"] for e in entries}
    assert systems == {"base model alone", "AgentFlow, untrained planner", "AgentFlow, fixed plan: Python_Coder",
                       "AgentFlow, fixed plan: Fact_Lookup", "AgentFlow, fixed plan: Local_Search",
                       "AgentFlow, oracle router", "AgentFlow + Flow-GRPO"}  # a fixed plan per tool of the preset
    for e in entries:
        assert {"system", "suite", "accuracy", "ci95_low", "ci95_high", "n"} <= e.keys()
        assert 0 <= e["ci95_low"] <= e["accuracy"] <= e["ci95_high"] <= 1
        # Every row but the trained one carries "trained minus this row", paired on the same questions.
        if e["system"] != "AgentFlow + Flow-GRPO":
            d = e["minus_last"]
            assert d["system"] == "AgentFlow + Flow-GRPO" and d["n"] == e["n"]
            assert -1 <= d["ci95_low"] <= d["difference"] <= d["ci95_high"] <= 1
    assert {e["suite"] for e in entries} == {"calculation", "fact", "two-step", "all"}
    assert "AgentFlow + Flow-GRPO minus this row" in (out / "results.md").read_text()
    assert "AgentFlow + Flow-GRPO" in (out / "results.md").read_text()
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
