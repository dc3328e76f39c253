"""The learning curves of results/plan/: the near-names broadcast run and its --credit last ablation,
with the baselines on the 100 test questions as lines (demo.plot). Run from the repository root:
python results/plan/probes/plot_curves.py"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import demo

plan = ROOT / "results" / "plan"
runs = {"broadcast (Flow-GRPO)": plan / "train-near-broadcast-30-steps.metrics.jsonl",
        "last turn only (--credit last)": plan / "train-near-credit-last-30-steps.metrics.jsonl"}
accuracy = {demo.BASE: 0.0, demo.UNTRAINED: 0.26, demo.FIXED + "Fact_Lookup then Python_Coder": 0.42,
            demo.ROUTER: 0.53, demo.ORACLE: 0.87}  # results/plan/baselines.md, eval-untrained-flfirst-near
demo.plot(runs, accuracy, 30, plan / "curve-broadcast-vs-last.png")
print("wrote", plan / "curve-broadcast-vs-last.png")
