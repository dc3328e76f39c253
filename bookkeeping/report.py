"""Reading evaluation results: Wilson intervals, the static trajectory viewer, the comparison table.

evaluate.py produces summary.json, results.jsonl and trajectories.html per run; this file holds what
turns records into something a person reads: the 95% interval of an accuracy, one self-contained HTML
page per run (every model string escaped, a filter for the wrong answers), a trajectory as a JSON
record (trajectory_json: results.jsonl's) and as plain text (format_trajectory: ask.py's output, a
training run's sample files), and the markdown/JSON
table of several runs side by side (`python evaluate.py --compare DIR ...`), with the paired
difference of the last system and each other one on the questions both answered.

Two systems run on the same questions are compared question by question: d_i = a_i - b_i in
{-1, 0, 1}, the difference is mean(d), and its 95% interval is the percentile interval of the paired
bootstrap (resample the n questions with replacement, keep each question's pair together). For 0/1
scores that bootstrap needs no random draws: a resample holds X+ questions with d = 1 and X- with
d = -1, (X+, X-, n - X+ - X-) ~ Multinomial(n; p+, p-, p0), so the distribution of (X+ - X-)/n is
computed exactly and the interval has no seed and no Monte Carlo error. The pairing is what makes
it narrow: two systems that agree on most questions differ by little noise, even when each one's
own Wilson interval is wide.

Test: python -m pytest -q tests/test_evaluate.py tests/test_planning.py
"""

import dataclasses
import html
import json
import math
from pathlib import Path

import numpy as np

import modules


# ---------------------------------------------------------------------------------------------
# Statistics


def wilson(k, n, z=1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (see the module docstring); (0, 1) when n = 0.

    >>> [round(x, 4) for x in wilson(5, 10)]
    [0.2366, 0.7634]
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0  # no questions, no information
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Clamp away float noise such as -1e-17 at k = 0.
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(a, b, level=0.95) -> dict:
    """mean(a_i - b_i) of paired 0/1 scores, with the exact paired-bootstrap percentile interval.

    low is the smallest value v of the resampled difference with P(D <= v) >= (1 - level) / 2, high the
    smallest with P(D <= v) >= (1 + level) / 2. Worked example (tests/test_planning.py enumerates
    all 4^4 resamples): a = [1, 1, 1, 0], b = [0, 0, 1, 1], d = [1, 1, 0, -1]

    >>> r = paired_difference([1, 1, 1, 0], [0, 0, 1, 1]); r["difference"], r["ci95_low"], r["ci95_high"]
    (0.25, -0.5, 1.0)
    """
    if len(a) != len(b):
        raise ValueError(f"paired scores need equal lengths, got {len(a)} and {len(b)}")
    n = len(a)
    d = [float(x) - float(y) for x, y in zip(a, b)]
    if any(x not in (-1.0, 0.0, 1.0) for x in d):
        raise ValueError("paired_difference takes 0/1 scores")
    if n == 0:
        return {"difference": 0.0, "ci95_low": -1.0, "ci95_high": 1.0, "n": 0, "wins": 0, "losses": 0}
    wins, losses = d.count(1.0), d.count(-1.0)
    p_up, p_down, p_tie = wins / n, losses / n, (n - wins - losses) / n
    # log P(X+ = u, X- = v) on the grid u + v <= n, (n + 1, n + 1); log 0 = -inf where a share is 0.
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])  # log k!, (n + 1,)
    u, v = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    ok = u + v <= n
    rest = np.where(ok, n - u - v, 0)

    def term(count, p):  # count * log p, with 0 * log 0 = 0
        return np.where(count == 0, 0.0, count * np.log(p)) if p > 0 else np.where(count == 0, 0.0, -np.inf)

    with np.errstate(divide="ignore", invalid="ignore"):
        logp = log_fact[n] - log_fact[u] - log_fact[v] - log_fact[rest] + term(u, p_up) + term(v, p_down) + term(rest, p_tie)
    prob = np.bincount((u - v + n)[ok], weights=np.exp(np.where(ok, logp, -np.inf))[ok], minlength=2 * n + 1)
    cdf = np.cumsum(prob / prob.sum())  # P(X+ - X- <= k - n), k = 0 .. 2n

    def quantile(q):
        return (int(np.argmax(cdf >= q - 1e-12)) - n) / n

    return {"difference": (wins - losses) / n, "ci95_low": quantile((1 - level) / 2),
            "ci95_high": quantile((1 + level) / 2), "n": n, "wins": wins, "losses": losses}


# ---------------------------------------------------------------------------------------------
# The trajectory viewer: one static page, every model string escaped


_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;max-width:70em}
details{border:1px solid #ccc;border-radius:4px;margin:.4em 0;padding:.3em .6em}
details.right{border-left:6px solid #2a2}details.wrong{border-left:6px solid #c33}
summary{cursor:pointer}pre{white-space:pre-wrap;background:#f6f6f6;padding:.3em;margin:.2em 0;max-height:20em;overflow:auto}
.turn{border-top:1px dashed #bbb;margin-top:.4em}.k{color:#666;font-size:12px}
body.only-wrong details.right{display:none}"""
_JS = """document.getElementById('only-wrong').addEventListener('change',
  e => document.body.classList.toggle('only-wrong', e.target.checked));
document.getElementById('open-all').addEventListener('click',
  () => document.querySelectorAll('details').forEach(d => d.open = true));"""


def _gold_text(gold) -> str:
    return " OR ".join(str(g) for g in gold) if isinstance(gold, list) else str(gold)


def _block(name: str, text) -> str:
    return f'<div class="k">{name}</div><pre>{html.escape(str(text))}</pre>'


def _record_html(r: dict) -> str:
    """One question: a summary line that opens to show the analysis, every turn and the answer."""
    e, traj = html.escape, r["trajectory"]
    verdict = "right" if r["correct"] else "wrong"
    parts = [f'<details class="{verdict}"><summary><b>{verdict}</b> [{e(str(r["id"]))}] ({e(str(r["suite"]))}) '
             f'{e(r["query"][:160])} &mdash; predicted <code>{e(str(r["prediction"])[:80])}</code>, '
             f'gold <code>{e(_gold_text(r["gold"])[:80])}</code></summary>', _block("question", r["query"])]
    if traj.get("analysis"):
        parts.append(_block("query analysis (planner)", traj["analysis"]))
    for i, t in enumerate(traj["turns"], 1):
        parts.append(f'<div class="turn"><b>turn {i}</b>: tool <code>{e(t["tool"] or "(invalid)")}</code> '
                     f'&mdash; sub-goal: {e(t["sub_goal"])}</div>')
        # The planner's reply was forced to start with PLANNER_PREFIX, which planner_text leaves out.
        parts += [_block("planner action", modules.PLANNER_PREFIX + t["planner_text"]), _block("command (executor)", t["command"] or "(none)"),
                  _block("tool result", t["result"])]
        if t["verdict"]:
            parts.append(f'<div class="k">verifier: <b>{e(t["verdict"])}</b></div>')
    if not traj["turns"]:
        parts.append('<div class="k">no tool turns</div>')
    parts += [_block(f"final output ({r['stop_reason']})", traj["final_output"]), _block("answer", r["prediction"]),
              _block("gold", _gold_text(r["gold"])), f"<div>verdict: <b>{verdict}</b> (score {r['score']:g})</div></details>"]
    return "\n".join(parts)


def write_html(records, path, title="AgentFlow trajectories"):
    """Write a self-contained page (inline CSS and JS, no network) of every record's trajectory."""
    right = sum(bool(r["correct"]) for r in records)
    page = (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body><h2>{html.escape(title)}</h2>"
            f"<p>{right} of {len(records)} right. <label><input type=checkbox id=only-wrong> show only wrong answers</label> "
            f"<button id=open-all>open all</button></p>\n" + "\n".join(_record_html(r) for r in records) +
            f"\n<script>{_JS}</script></body></html>\n")
    Path(path).write_text(page, encoding="utf-8")


def trajectory_json(tr) -> dict:
    """A rollout.Trajectory as a JSON-ready record, what results.jsonl holds and the viewer reads (token
    ids left out: they are for training, not for reading)."""
    return {
        "query": tr.query, "analysis": tr.analysis, "answer": tr.answer, "final_output": tr.final_output,
        "stop_reason": tr.stop_reason, "reward": tr.reward, "seconds": tr.seconds,
        "turns": [{k: getattr(t, k) for k in ("planner_text", "tool", "sub_goal", "context", "valid_action",
                                              "command", "result", "verdict")} for t in tr.turns],
        "memory": [dataclasses.asdict(s) for s in tr.memory.steps],  # memory.Step's fields
    }


def format_trajectory(tr) -> str:
    """A rollout.Trajectory as plain text a person reads: every turn's action, command, result and
    verdict (ask.py prints it; a training run's samples/step-*.txt hold a group of them)."""
    lines = [f"QUESTION: {tr.query}", f"ANALYSIS: {tr.analysis}"]
    for i, t in enumerate(tr.turns, 1):
        lines.append(f"--- turn {i}: tool={t.tool or '(invalid)'}  sub-goal={t.sub_goal!r}")
        lines.append("    planner: " + (modules.PLANNER_PREFIX + t.planner_text).strip().replace("\n", "\n             "))
        lines.append("    command: " + (t.command or "(none)").replace("\n", "\n             "))
        lines.append("    result:  " + t.result[:400].replace("\n", "\n             "))
        if t.verdict:
            lines.append(f"    verdict: {t.verdict}")
    lines.append(f"FINAL ({tr.stop_reason}): {tr.final_output}")
    lines.append(f"ANSWER: {tr.answer}" + (f"   reward={tr.reward}" if tr.reward is not None else ""))
    lines.append("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in tr.seconds.items()))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Comparing systems side by side


def _scores(d: Path) -> dict:
    """{question id: (suite, score)} from a run's results.jsonl; {} when it has none."""
    path = d / "results.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {str(r["id"]): (r.get("suite", ""), float(r["score"])) for r in rows if "id" in r and "score" in r}


def compare(dirs) -> tuple[str, list[dict]]:
    """(markdown table, entries) of the summary.json files in dirs; rows systems, columns suites + all,
    and a last column: the LAST system minus this row, paired on the questions both answered (their
    ids in results.jsonl), in points with its 95% paired-bootstrap interval (paired_difference).

    Runs of one system (same label) on different suites are merged into one row, and its "all" column
    pools their questions; two runs of one system on the same suite get a row each. Each entry of a
    row that has a paired difference carries it under "minus_last": {"system", "difference",
    "ci95_low", "ci95_high", "n", "wins", "losses"} (per suite, and pooled in the "all" entry).
    """
    systems = {}  # label -> {suite: {"accuracy", "ci95", "n"}}
    scores = {}  # label -> {question id: (suite, score)}
    for d in dirs:
        path = Path(d) / "summary.json"
        if not path.is_file():
            raise SystemExit(f"--compare: {path} not found; run evaluate.py with --out {d} first")
        try:
            s = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise SystemExit(f"--compare: {path} is not valid JSON ({e}); rerun evaluate.py --out {d}") from None
        label = (s.get("label") or Path(d).name).replace("|", "/")  # a "|" would split the table cell
        if systems.get(label, {}).keys() & s["suites"].keys():
            label = f"{label} ({Path(d).name})"  # the same system run twice on a suite
        systems.setdefault(label, {}).update(s["suites"])
        scores.setdefault(label, {}).update(_scores(Path(d)))
    columns = list(dict.fromkeys(name for parts in systems.values() for name in parts)) + ["all"]
    last = list(systems)[-1]
    entries, rows = [], []
    for label, parts in systems.items():
        paired = {}  # suite (and "all") -> paired_difference(last, this row) on the shared questions
        shared = sorted(scores[label].keys() & scores[last].keys()) if label != last else []
        for col in columns:
            ids = [i for i in shared if col == "all" or scores[label][i][0] == col]
            if ids and all(scores[x][i][1] in (0.0, 1.0) for x in (label, last) for i in ids):
                diff = paired_difference([scores[last][i][1] for i in ids], [scores[label][i][1] for i in ids])
                paired[col] = {"system": last, **diff}
        k = sum(round(p["accuracy"] * p["n"]) for p in parts.values())
        n = sum(p["n"] for p in parts.values())
        pooled = {"accuracy": k / max(n, 1), "ci95": list(wilson(k, n)), "n": n}
        cells = []
        for col in columns:
            p = pooled if col == "all" else parts.get(col)  # None: this system was not run on that suite
            if p is not None:
                low, high = p["ci95"]
                entries.append({"system": label, "suite": col, "accuracy": p["accuracy"], "ci95_low": low, "ci95_high": high, "n": p["n"],
                                **({"minus_last": paired[col]} if col in paired else {})})
            cells.append("-" if p is None else f"{100 * p['accuracy']:.1f} [{100 * low:.1f}, {100 * high:.1f}] n={p['n']}")
        d = paired.get("all")
        cells.append("-" if d is None else f"{100 * d['difference']:+.1f} [{100 * d['ci95_low']:+.1f}, {100 * d['ci95_high']:+.1f}] "
                                           f"n={d['n']}")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    header = ["| system | " + " | ".join(columns) + f" | {last} minus this row |", "|---" * (len(columns) + 2) + "|"]
    note = (f"\naccuracy % [95% Wilson interval], n questions; last column: {last} minus this row, in points, "
            "paired on the same questions [95% paired-bootstrap interval]")
    return "\n".join(header + rows) + note, entries
