"""The demo's figures on its multi-step questions (fact-then-sum and two-hop): each row's count right,
and the trained agent minus the untrained one, paired, with report.paired_difference's interval.

Run: python results/plan/probes/multistep.py runs/demo"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bookkeeping.report import paired_difference  # noqa: E402
from environment.planning import MULTI_STEP  # noqa: E402

if len(sys.argv) != 2:
    sys.exit(__doc__)
out = Path(sys.argv[1])
scores = {}
for folder in sorted(out.glob("eval-*")):
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    scores[folder.name] = {r["id"]: float(r["correct"]) for r in rows if r["suite"] in MULTI_STEP}
for name, s in scores.items():
    print(f"{name:40s} {int(sum(s.values())):3d} of {len(s)} multi-step questions right")
if "eval-train" in scores and "eval-untrained" in scores:
    ids = sorted(scores["eval-train"])
    d = paired_difference([scores["eval-train"][i] for i in ids], [scores["eval-untrained"][i] for i in ids])
    print(f"trained minus untrained: {100 * d['difference']:+.1f} [{100 * d['ci95_low']:+.1f}, {100 * d['ci95_high']:+.1f}] "
          f"points, {d['wins']} won, {d['losses']} lost")
