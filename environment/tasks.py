"""Task suites and benchmark files: the questions the agent trains and is evaluated on.

Two public functions, used by train.py, evaluate.py and the tests:

    load(name_or_path, split="test", n=None, seed=0) -> list[dict]   the examples
    (the reward, score(prediction, example) -> float in [0, 1], is scoring.py's)

Every example dict keeps the fields of its source and always carries these normalised keys:
    query   the exact text the agent receives
    answer  the gold as in the source: a string, a number, or a list of acceptable strings
    task    the scoring rule: "exact", "choice" or "game24" (see scoring.py)
    id      unique within the loaded list: f"{stem}-{index}" for files (by POSITION, since medqa
            repeats pids 0..99), f"{suite}-{split}-{index}" for generated suites
    suite   the file stem, or the suite that generated the example (the sub-suite, in "mixed")

What load() accepts, in this order:
1. A generated offline suite, deterministic for a seed, with "train" and "test" splits that share no
   question (a large pool is made from a fixed generator seed, deduplicated by query, and each query
   is hash-partitioned into a split; `seed` then picks n of the split; the first n of a larger n are
   the same n, so runs with more data extend runs with less):
     "arithmetic"  big multiplications, exact divisions, chains like (a + b) * c - d, word problems;
     "game24"      every solvable puzzle of four numbers 1-13 (any valid expression scores);
     "lookup"      one- and two-hop questions over the fictional corpus of corpus.py (seed 0 world);
     "mixed"       equal shares of the three, so the planner must learn which tool fits which question;
     "planning"    the CPU demo's suite (planning.py): calculations, facts and two multi-step kinds in
                   the proportions 2 : 2 : 1, each example naming its right tools ("tools").
2. An official AgentFlow benchmark by name ("bamboogle", "2wiki", "hotpotqa", "musique", "aime24",
   "amc23", "gameof24", "medqa"): the file shared/benchmarks/<name>.json, found in the folder named
   by $AGENTFLOW_BENCHMARKS, else in a parent folder of this file.
3. Any file: a JSON list, or JSONL (one object per line), of objects with question/answer (or
   query/answer) fields. A bad row raises ValueError("file:line: what is wrong"). With
   skip_bad_rows=True, bad rows are skipped instead; pass report={} to read how many were skipped
   (report["skipped"]) and why (report["errors"]). A JSON list with a syntax error cannot be
   resynchronised, so it always raises. For files, `n` takes the first n rows in order (the official
   runs score items 0-99) and `split` is ignored.

Simplifications vs. the paper / the official code:
- The paper trains on Natural Questions + DeepMath-103K (182,190 rows) with web search. With no
  network and a 135M planner we train on generated suites whose answers can be checked exactly:
  arithmetic stands in for DeepMath (a calculator tool helps), lookup for NQ (a search tool helps).
- The official gameof24 file holds exactly the first 300 solvable puzzles in sorted order
  (1,1,1,8 ... 1,7,9,9); our game24 suite puts those into its test split always, so that training on
  game24 never sees an official evaluation puzzle.

Run:   python -m environment.tasks --suite mixed --n 5        (prints examples to look at)
Test:  python -m pytest -q tests/test_tasks.py
"""

import argparse
import copy
import functools
import hashlib
import itertools
import json
import os
import random
import re
import sys
from pathlib import Path

if not __package__:  # run by path (python environment/tasks.py): the repository root, not this folder, goes on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from environment.game24 import game24_numbers, solve24
from environment.scoring import infer_task, score

BENCHMARKS = ("bamboogle", "2wiki", "hotpotqa", "musique", "aime24", "amc23", "gameof24", "medqa")
SUITES = ("arithmetic", "game24", "lookup", "mixed", "planning")
POOL_SEED = 20251  # fixed seed of the suite generators: the pools never change with `seed`
TEST_PERCENT = 20  # share of each pool that the hash partition puts into the test split
N_OFFICIAL_24 = 300  # the official gameof24 file = the first 300 solvable puzzles in sorted order

# ---------------------------------------------------------------------------------------------
# Loading: the entry point


def load(name_or_path, split="test", n=None, seed=0, *, skip_bad_rows=False, report=None) -> list[dict]:
    """The examples of a suite, a benchmark name or a file (see the module docstring).

    report: an optional dict that receives {"skipped": count, "errors": [messages]} for files.
    """
    if n is not None and n < 0:
        raise ValueError(f"n must be None or >= 0, got {n}")
    name = str(name_or_path)
    if name in SUITES:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if name == "planning":
            from environment import planning  # the demo's suite: one-step and multi-step questions

            return _mixed(split, n, seed, planning.PARTS, planning.SHARES)
        return _mixed(split, n, seed) if name == "mixed" else _sample(name, split, n, seed)
    if name in BENCHMARKS:
        path = benchmark_path(name)
        if path is None:
            raise FileNotFoundError(
                f"benchmark {name!r}: no shared/benchmarks/{name}.json above {Path(__file__).parent}; "
                "set AGENTFLOW_BENCHMARKS to the folder that holds it")
    else:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"{name!r} is not a suite {SUITES}, a benchmark {BENCHMARKS}, "
                                    "or an existing file")
    examples = read_examples(path, skip_bad_rows=skip_bad_rows, report=report)
    return examples if n is None else examples[:n]


def benchmark_path(name: str):
    """shared/benchmarks/<name>.json in $AGENTFLOW_BENCHMARKS or above this file; None if absent."""
    if os.environ.get("AGENTFLOW_BENCHMARKS"):
        path = Path(os.environ["AGENTFLOW_BENCHMARKS"]) / f"{name}.json"
        return path if path.is_file() else None
    for parent in Path(__file__).resolve().parents:
        path = parent / "shared" / "benchmarks" / f"{name}.json"
        if path.is_file():
            return path
    return None


# ---------------------------------------------------------------------------------------------
# Loading: files


def _json_list_rows(text: str, where: str):
    """Yield (line, object) for each item of a JSON list, decoding item by item to know its line."""
    decoder, ws = json.JSONDecoder(), re.compile(r"\s*")
    pos = ws.match(text, 0).end()
    if not text.startswith("[", pos):
        raise ValueError(f"{where}:1: expected a JSON list of objects, or one JSON object per line")
    pos = ws.match(text, pos + 1).end()
    line, counted = 1, 0  # lines counted incrementally, so the scan stays linear in the file size
    while not text.startswith("]", pos):
        line, counted = line + text.count("\n", counted, pos), pos
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}:{e.lineno}: invalid JSON ({e.msg})") from None
        yield line, obj
        pos = ws.match(text, pos).end()
        if text.startswith(",", pos):
            pos = ws.match(text, pos + 1).end()
        elif not text.startswith("]", pos):
            lineno = text.count("\n", 0, pos) + 1
            raise ValueError(f"{where}:{lineno}: invalid JSON (expected ',' or ']' after an item)")
    if text[pos + 1:].strip():
        raise ValueError(f"{where}:{text.count(chr(10), 0, pos) + 1}: unexpected text after the list")


def _jsonl_rows(text: str, where: str):
    """Yield (line, object or the error message) for each non-blank line of a JSONL text."""
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue  # blank lines separate nothing and are not rows
        try:
            yield line, json.loads(raw)
        except json.JSONDecodeError as e:
            yield line, ValueError(f"{where}:{line}: invalid JSON ({e.msg})")


def _normalise(row, index: int, stem: str) -> dict:
    """The example dict of one file row; raises ValueError(what is wrong) for a bad row."""
    if not isinstance(row, dict):
        raise ValueError(f"expected an object with question and answer, got {type(row).__name__}")
    # Official files carry the agent's text in "query" (gameof24's "question" is a list of numbers).
    field = "query" if "query" in row else "question"
    if field not in row:
        raise ValueError("missing field 'question' (or 'query')")
    query = row[field]
    if not isinstance(query, str):
        raise ValueError(f"field {field!r} must be a string, got {type(query).__name__}")
    if not query.strip():
        raise ValueError(f"empty question in field {field!r}")
    if "answer" not in row:
        raise ValueError("missing field 'answer'")
    answer = row["answer"]
    golds = answer if isinstance(answer, list) else [answer]
    if not golds or any(g is None or (isinstance(g, str) and not g.strip()) for g in golds):
        raise ValueError("empty answer")
    if not all(isinstance(g, (str, int, float)) for g in golds):
        raise ValueError("answer must be a string, a number, or a list of them")
    example = dict(row, query=query, answer=answer)
    example["task"] = infer_task(example)  # raises for an unknown "task" value
    if example["task"] == "game24":
        numbers = game24_numbers(example)
        if not numbers or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
            raise ValueError(f"game24 numbers must be a non-empty list of numbers, got {numbers!r}")
        example["numbers"] = numbers
    example["id"] = str(row["id"]) if row.get("id") is not None else f"{stem}-{index}"
    example["suite"] = str(row.get("suite") or stem)
    return example


def read_examples(path, skip_bad_rows=False, report=None) -> list[dict]:
    """Read a JSON-list or JSONL file of examples (format chosen by its first character)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is not a row
    rows = _json_list_rows(text, str(path)) if text.lstrip().startswith("[") else _jsonl_rows(text, str(path))
    examples, errors, first_line = [], [], {}
    for index, (line, row) in enumerate(rows):
        try:
            if isinstance(row, Exception):
                raise row
            example = _normalise(row, index, path.stem)
            if example["id"] in first_line:
                raise ValueError(f"duplicate id {example['id']!r} (first on line {first_line[example['id']]})")
        except ValueError as e:
            message = str(e) if str(e).startswith(f"{path}:") else f"{path}:{line}: {e}"
            if not skip_bad_rows:
                raise ValueError(message) from None
            errors.append(message)
            continue
        first_line[example["id"]] = line
        examples.append(example)
    if report is not None:
        report.update(skipped=len(errors), errors=errors)
    return examples


# ---------------------------------------------------------------------------------------------
# Generated suites: splits and sampling


def _in_test_split(query: str) -> bool:
    """A stable hash of the query decides its split, whatever n or seed a caller asks for."""
    return int(hashlib.sha256(query.encode()).hexdigest()[:8], 16) % 100 < TEST_PERCENT


@functools.lru_cache(maxsize=None)
def _pool(suite: str) -> dict:
    """{"train": [...], "test": [...]} of one generated suite, built once per process."""
    if suite in ("calculation", "fact", "fact-then-sum", "two-hop", "sum-then-fact"):  # the planning suite's parts
        from environment import planning

        make = functools.partial({"calculation": planning.calculation_pool, "fact": planning.fact_pool,
                                  "fact-then-sum": planning.fact_then_sum_pool, "two-hop": planning.two_hop_pool,
                                  "sum-then-fact": planning.sum_then_fact_pool}[suite], POOL_SEED)
    else:
        make = {"arithmetic": _arithmetic_pool, "game24": _game24_pool, "lookup": _lookup_pool}[suite]
    splits, seen = {"train": [], "test": []}, set()
    for example in make():
        if example["query"] in seen:
            continue  # the generators can repeat a question; keep its first occurrence only
        seen.add(example["query"])
        split = "test" if example.pop("force_test", False) or _in_test_split(example["query"]) else "train"
        example.update(id=f"{suite}-{split}-{len(splits[split])}", suite=suite)
        splits[split].append(example)
    return splits


def _sample(suite: str, split: str, n, seed: int) -> list[dict]:
    """n examples of a split, in an order shuffled by seed (a prefix-stable choice)."""
    pool = _pool(suite)[split]
    n = len(pool) if n is None else n
    if n > len(pool):
        raise ValueError(f"suite {suite!r} has {len(pool)} {split} examples; ask for n <= {len(pool)}")
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    return [copy.deepcopy(pool[i]) for i in order[:n]]  # copies: callers may edit their examples


def _mixed(split: str, n, seed: int, parts=("arithmetic", "game24", "lookup"), shares=(1, 1, 1)) -> list[dict]:
    """Parts in the proportions of `shares` (mixed: equal shares of arithmetic, game24 and lookup);
    the remainder of n goes to the first parts, one question each."""
    if n is None:
        n = sum(shares) * min(len(_pool(p)[split]) // s for p, s in zip(parts, shares))
    counts = [n * s // sum(shares) for s in shares]
    for i in range(n - sum(counts)):
        counts[i] += 1
    examples = []
    for part, count in zip(parts, counts):
        examples += _sample(part, split, count, seed)
    random.Random(seed).shuffle(examples)
    return examples


# ---------------------------------------------------------------------------------------------
# Generated suites: arithmetic


def _word_problem(rng: random.Random):
    """One short word problem with an exact integer answer, from a handful of templates."""
    kind = rng.randrange(5)
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    if kind == 0:
        return f"A shop sells {a} boxes of {b} pencils each. How many pencils is that?", a * b
    if kind == 1:
        c = rng.randint(10, a * b - 1)
        return (f"A farm has {a} rows of {b} trees. {c} trees are cut down. "
                f"How many trees are left?"), a * b - c
    if kind == 2:
        return f"{a * b} stickers are shared equally by {a} children. How many does each child get?", b
    if kind == 3:
        speed, hours = rng.randint(45, 180), rng.randint(3, 19)
        return f"A train goes {speed} km per hour for {hours} hours. How many km does it travel?", speed * hours
    paid = a * b + rng.randint(1, 999)
    return (f"Tickets cost {a} dollars each. A school buys {b} tickets and pays {paid} dollars. "
            f"How many dollars of change does it get?"), paid - a * b


def _arithmetic_pool(size: int = 6000):
    """Questions a 135M model cannot answer in its head but a calculator or Python tool can."""
    rng = random.Random(POOL_SEED)
    for i in range(size):
        kind = ("multiply", "divide", "chain", "word")[i % 4]
        if kind == "multiply":  # 3-4 digits times 2-3 digits
            a, b = rng.randint(100, 9999), rng.randint(10, 999)
            query, answer = f"What is {a} * {b}?", a * b
        elif kind == "divide":  # built from the quotient, so the result is exact
            b, q = rng.randint(12, 99), rng.randint(100, 999)
            query, answer = f"What is {b * q} / {b}?", q
        elif kind == "chain":
            a, b, c, d = rng.randint(100, 999), rng.randint(10, 999), rng.randint(11, 99), rng.randint(100, 999)
            shape = rng.randrange(3)
            if shape == 0:
                query, answer = f"What is ({a} + {b}) * {c} - {d}?", (a + b) * c - d
            elif shape == 1:
                query, answer = f"What is {a} * {c} - {b} * {d}?", a * c - b * d
            else:
                query, answer = f"What is ({a} - {b}) * ({c} + {d})?", (a - b) * (c + d)
        else:
            query, answer = _word_problem(rng)
        yield {"query": query, "answer": answer, "task": "exact", "kind": kind}


# ---------------------------------------------------------------------------------------------
# Generated suites: the game of 24 (a solver keeps only solvable puzzles)


def _game24_query(numbers) -> str:
    return (f"Using the numbers {list(numbers)}, create an expression that equals 24. "
            "Use +, -, ×, / and parentheses, and each number exactly once.")


def _game24_pool():
    """All solvable puzzles of four numbers 1-13, sorted; the first 300 are the official ones."""
    solved = 0
    for numbers in itertools.combinations_with_replacement(range(1, 14), 4):
        solution = solve24(numbers)
        if solution is None:
            continue
        solved += 1
        yield {"query": _game24_query(numbers), "answer": [solution], "task": "game24",
               "numbers": list(numbers), "force_test": solved <= N_OFFICIAL_24}


# ---------------------------------------------------------------------------------------------
# Generated suites: lookup questions over the fictional corpus


def _lookup_pool():
    """The questions corpus.py derives from the shipped world (seed 0), which Local_Search reads."""
    from environment import corpus  # imported here: loading files and the other suites must not need the corpus

    for item in corpus.lookup_questions(corpus.build_world(seed=0)):
        yield dict(item, query=item["question"], task="exact")


# ---------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description="Print examples of a suite, benchmark or file.")
    parser.add_argument("--suite", default="mixed", help=f"a suite {SUITES}, a benchmark name, or a file")
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for example in load(args.suite, split=args.split, n=args.n, seed=args.seed):
        print(f"[{example['id']}] suite={example['suite']} task={example['task']}")
        print(f"  query:  {example['query']}")
        reference = example["answer"][0] if isinstance(example["answer"], list) else example["answer"]
        print(f"  answer: {json.dumps(example['answer'], ensure_ascii=False)}"
              f"  (scores {score(str(reference), example):.0f})")


if __name__ == "__main__":
    main()
