"""The learning curves of results/plan/, each broadcast run beside its --credit last ablation, with
the baselines on the 100 test questions as lines (demo.plot). Run from the repository root:
python results/plan/probes/plot_curves.py"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import demo

plan = ROOT / "results" / "plan"
# Before the generator's fix (6bff4de): the preset, no tool weight; baselines of c4d75a4's baselines.md.
before = {"broadcast (Flow-GRPO)": plan / "train-near-broadcast-30-steps.metrics.jsonl",
          "last turn only (--credit last)": plan / "train-near-credit-last-30-steps.metrics.jsonl"}
demo.plot(before, {demo.BASE: 0.0, demo.UNTRAINED: 0.26, demo.FIXED + "Fact_Lookup then Python_Coder": 0.42,
                   demo.ROUTER: 0.53, demo.ORACLE: 0.87}, 30, plan / "curve-broadcast-vs-last.png")
# With the fix and --tool-weight 15 (at 6bff4de); the baselines from their summaries (baselines.md).
weighted = {"broadcast (Flow-GRPO)": plan / "train-fix-tool-weight15-30-steps.metrics.jsonl",
            "last turn only (--credit last)": plan / "train-fix-tool-weight15-credit-last-30-steps.metrics.jsonl"}
now = {name: json.loads((plan / f"eval-{folder}.summary.json").read_text())["accuracy"]
       for name, folder in [(demo.BASE, "direct"), (demo.UNTRAINED, "untrained"), (demo.ROUTER, "oracle-router"),
                            (demo.ORACLE, "oracle-planner"), (demo.FIXED + "Python_Coder then Fact_Lookup",
                                                              "fixed-Python_Coder-Fact_Lookup")]}
demo.plot(weighted, now, 30, plan / "curve-fix-tool-weight15.png")
# The tool drawn calibrated at temperature 1 (1cde37a): the preset's kinds, and one calculation a step.
now[demo.UNTRAINED] = json.loads((plan / "eval-untrained-calibrated.summary.json").read_text())["accuracy"]
for kinds in ("", "one-calculation-"):
    calibrated = {"broadcast (Flow-GRPO)": plan / f"train-calibrated-{kinds}broadcast-30-steps.metrics.jsonl",
                  "last turn only (--credit last)": plan / f"train-calibrated-{kinds}credit-last-30-steps.metrics.jsonl"}
    demo.plot(calibrated, now, 30, plan / f"curve-calibrated-{kinds}broadcast-vs-last.png")
print("wrote", *sorted(plan.glob("curve-*.png")))
