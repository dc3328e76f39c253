"""The plans an evaluated agent ran, per kind of question: how many test questions went through each
sequence of tools, and how many of those it answered right, read from evaluate.py's results.jsonl.

Run: python results/plan/probes/plans.py runs/demo-plan-cal/eval-train [more --out folders]"""
import json
import sys
from collections import Counter
from pathlib import Path

if len(sys.argv) < 2:
    sys.exit(__doc__)
for folder in sys.argv[1:]:
    rows = [json.loads(line) for line in (Path(folder) / "results.jsonl").read_text().splitlines() if line.strip()]
    runs, right = Counter(), Counter()
    for r in rows:
        plan = " then ".join(t["tool"] or "(invalid)" for t in r["trajectory"]["turns"])
        runs[r["suite"], plan] += 1
        right[r["suite"], plan] += bool(r["correct"])
    print(folder)
    for kind, plan in sorted(runs):
        print(f"  {kind:14s} {plan:30s} {runs[kind, plan]:3d} questions, {right[kind, plan]:3d} right")
