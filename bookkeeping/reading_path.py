"""The reading path: the eight files one training step runs through, in the order to read them, with
their line counts and their longest functions, printed as the README's table (a test keeps the README
equal to this output, so its figures are never written by hand).

Run:   python -m bookkeeping.reading_path           (the table, as the README has it)
       python -m bookkeeping.reading_path --readme  (write it into README.md, in place of the old one)
       python -m bookkeeping.reading_path --check   (also exit 1 past 2,000 lines or a 100-line function)
Test:  python -m pytest -q tests/test_reading_path.py
"""

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES, MAX_FUNCTION = 2000, 100  # issue 23's bounds: the whole path, and any one function on it

# (file, what it teaches), in reading order.
FILES = [
    ("config.py", "the run's fields (one dataclass, a help line per field) and the named presets in `PRESETS`, with "
                  "why each setting"),
    ("train.py", "one step top to bottom in `train()`: rollout -> reward -> advantage and broadcast (`training_rows`) "
                 "-> reference log-probs -> loss and optimiser steps (`update`: mini-batches, micro-batches, "
                 "accumulation, clip, AdamW) -> log; where the engine and the update's forward are chosen "
                 "(`make_engines`)"),
    ("flow_grpo.py", "the objective, equation by equation: group advantages, broadcast, k3 KL, clipped surrogate, "
                     "aggregations, the tool choice's log-prob"),
    ("rollout.py", "the AgentFlow loop for many trajectories in lockstep; `Turn`, the one record that carries a "
                   "planner turn from the rollout to the loss (ids, log-probs, advantage, T_i); `RolloutConfig`"),
    ("modules.py", "the four modules' prompts and tolerant parsers, with each parser's documented fallback"),
    ("memory.py", "the evolving memory M_t: one record per step, rendered within a budget (oldest results cut first)"),
    ("tools.py", "the tools' metadata as the planner and executor see it, and how a batch of tool calls runs "
                 "(never raises)"),
    ("engine.py", "batched sampling on plain Hugging Face `generate` (left padding), the exact log-prob of every "
                  "sampled token, forced reply prefixes, stop strings and the first-token tool choice"),
]


def line_count(path: Path) -> int:
    """What `wc -l` says: the number of newline characters."""
    return path.read_bytes().count(b"\n")


def functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function and method in the file."""
    found = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child.end_lineno - child.lineno + 1))
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")

    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def report(root: Path = ROOT) -> dict:
    """{"files": [(file, lines, what)], "total": lines, "longest": (file, function, lines)}."""
    rows = [(name, line_count(root / name), what) for name, what in FILES]
    longest = max(((name, fn, n) for name, _ in FILES for fn, n in functions(root / name)), key=lambda x: x[2])
    return {"files": rows, "total": sum(n for _, n, _ in rows), "longest": longest}


def markdown(rep: dict) -> str:
    """The README's paragraph and table."""
    name, fn, n = rep["longest"]
    lines = [f"One training step (rollout, reward, advantage, loss, optimiser step) is in {len(rep['files'])} files, "
             f"{rep['total']:,} lines (`wc -l`; the longest function is {name}'s `{fn}`, {n} lines; "
             "`python -m bookkeeping.reading_path` prints this table). **Read in this order:**",
             "", "| # | file | lines | what it teaches |", "|---|---|---|---|"]
    lines += [f"| {i} | `{f}` | {k} | {what} |" for i, (f, k, what) in enumerate(rep["files"], 1)]
    return "\n".join(lines)


def readme_with(text: str, table: str) -> str:
    """README text with its reading-path paragraph and table (from "One training step" to the first
    blank line after the table) replaced by `table`."""
    start = text.index("One training step (rollout, reward, advantage, loss, optimiser step) is in")
    end = text.index("\n\n", text.index("| 1 |", start))
    return text[:start] + table + text[end:]


def main(argv=None):
    p = argparse.ArgumentParser(description="The reading path's files, lines and longest function, as the README's table.")
    p.add_argument("--check", action="store_true", help=f"exit 1 past {MAX_LINES:,} lines or a {MAX_FUNCTION}-line function")
    p.add_argument("--readme", action="store_true", help="write the table into README.md")
    args = p.parse_args(argv)
    rep = report()
    print(markdown(rep))
    if args.readme:
        readme = ROOT / "README.md"
        readme.write_text(readme_with(readme.read_text(encoding="utf-8"), markdown(rep)), encoding="utf-8")
    if args.check:
        over = [f"{f}'s {fn}: {n} lines" for f, _ in FILES for fn, n in functions(ROOT / f) if n > MAX_FUNCTION]
        if rep["total"] > MAX_LINES or over:
            sys.exit(f"reading path: {rep['total']:,} lines (at most {MAX_LINES:,}); functions over {MAX_FUNCTION} "
                     f"lines: {', '.join(over) or 'none'}")


if __name__ == "__main__":
    main()
