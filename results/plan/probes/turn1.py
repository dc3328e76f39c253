"""Turn 1 of the demo's greedy evaluations: on the questions whose right plan starts with Fact_Lookup,
how often the planner's turn 1 is Fact_Lookup AND finds the fact the right first step finds (and, of
those, how many end right). With main's Fact_Lookup, which reads "sub-goal | question", turn 1 finds it
whatever the sub-goal says; with results/plan/fact-lookup-sub-goal-alone.patch it finds what the
planner's words ask (results/plan/history.md, fourth section).

Run: python results/plan/probes/turn1.py runs/demo"""
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from environment import facts, tasks  # noqa: E402

if len(sys.argv) != 2:
    sys.exit(__doc__)
gold = {ex["id"]: ex for ex in tasks.load("planning", split="test", seed=0)}
for folder in sorted(Path(sys.argv[1]).glob("eval-*")):
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    n, found, right = Counter(), Counter(), Counter()
    for r in rows:
        ex = gold.get(r["id"])
        if not ex or ex["tools"][0] != "Fact_Lookup" or "trajectory" not in r or not r["trajectory"]["turns"]:
            continue
        t1 = r["trajectory"]["turns"][0]
        n[r["suite"]] += 1
        ok = t1["tool"] == "Fact_Lookup" and t1.get("result") == facts.lookup(ex["sub_goals"][0])
        found[r["suite"]] += ok
        right[r["suite"]] += ok and r["correct"]
    if n:
        print(f"{folder.name:38s} " + "  ".join(f"{k} {found[k]}/{n[k]} ({right[k]} right)" for k in sorted(n)))
