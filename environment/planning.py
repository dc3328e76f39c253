"""The "planning" suite: questions whose right tool differs from one kind to the next, so that a
planner that routes well beats every fixed plan (the CPU demo's suite).

Three kinds, each example naming the tools an oracle router would call in order (`tools`):

    calculation  "What is 4821 * 37?"                                 Python_Coder
    fact         "Who founded Zhervym Motors?"                        Fact_Lookup
    two-step     "What is 57 plus the year in which Zhervym Motors was founded?"
                                                                      Fact_Lookup, then Python_Coder
                 with the year from step 1 in its sub-goal or context: the question alone does not
                 hold it, so the executor can only write print(57 + 1856) if the planner passes it on

Shaped to fit a frozen 135M executor and generator (each measured with an oracle plan, README):
- calculation keeps the shapes the executor turns into a correct one-line program most of the time
  (a product, an exact division, a * b - c * d, two short word problems) and leaves out the ones it
  garbles (parentheses, which it drops: "(a + b) * c" becomes "a + b * c"; multi-sentence stories);
- fact questions are corpus.py's one-hop questions, answered by Fact_Lookup's one labelled line,
  which the generator copies; Local_Search's passages stay in the tool list, but at 135M the
  generator rarely finds the fact in them;
- two-step questions end in one sum with a looked-up number (the executor swaps the numbers of a
  subtraction), and are a fifth of the suite: the part that needs the planner to carry a result
  forward. The CPU demo runs one planner turn (train.py's cpu-demo preset: a second turn tripled the
  step), so there they stay unsolved by every system and are reported apart.

The split is corpus-question-level: a hash of the query (tasks._in_test_split) puts each into train
or test, so no test question is trained on (an entity can appear in both, with another question).

Run:   python -m environment.tasks --suite planning --n 10
Test:  python -m pytest -q tests/test_planning.py
"""

import random

from environment import corpus
from environment.facts import _world

PARTS = ("calculation", "fact", "two-step")
SHARES = (2, 2, 1)  # of every 5 questions: 2 calculations, 2 facts, 1 two-step


def calculation_pool(seed: int, size: int = 4000):
    """Arithmetic a 135M model cannot do in its head but its executor can write as one print()."""
    rng = random.Random(seed)
    for i in range(size):
        shape = i % 5
        a, b = rng.randint(100, 9999), rng.randint(12, 999)
        if shape == 0:
            query, answer = f"What is {a} * {b}?", a * b
        elif shape == 1:  # built from the quotient, so the division is exact
            q = rng.randint(100, 999)
            query, answer = f"What is {b * q} / {b}?", q
        elif shape == 2:
            c, d = rng.randint(11, 99), rng.randint(11, 99)
            query, answer = f"What is {a} * {c} - {b} * {d}?", a * c - b * d
        elif shape == 3:
            x, y = rng.randint(12, 99), rng.randint(12, 99)
            query, answer = f"A shop sells {x} boxes of {y} pencils each. How many pencils is that?", x * y
        else:
            speed, hours = rng.randint(45, 180), rng.randint(3, 19)
            query, answer = f"A train goes {speed} km per hour for {hours} hours. How many km does it travel?", speed * hours
        yield {"query": query, "answer": answer, "task": "exact", "kind": "calculation", "tools": ["Python_Coder"]}


def fact_pool(seed: int):
    """corpus.py's one-hop questions over the shipped world (seed 0), each answered by one Fact_Lookup."""
    del seed  # the world is the shipped one; the split, not the seed, decides which questions are tested
    for item in corpus.lookup_questions(corpus.build_world(seed=0)):
        if item["hops"] == 1:
            yield {"query": item["question"], "answer": item["answer"], "task": "exact", "kind": "fact",
                   "fact_kind": item["kind"], "tools": ["Fact_Lookup"]}


def two_step_pool(seed: int):
    """A fact, then one sum with it: "What is 57 plus the year in which X was founded?" (year + 57).
    A sum, because the frozen executor writes the numbers of a subtraction in either order
    (asked "How many years before 2030 ...?" with the year in its context it printed 1899 - 2030)."""
    rng = random.Random(seed)
    world, _, _ = _world()
    templates = [
        ("companies", "founded", "What is {k} plus the year in which {name} was founded?"),
        ("cities", "founded", "What is {k} plus the year in which {name} was founded?"),
        ("people", "birth_year", "What is {k} plus the year in which {name} was born?"),
        ("inventions", "year", "What is {k} plus the year in which the {name} was invented?"),
        ("cities", "population", "What is {k} plus the population of {name}?"),
    ]
    for kind, attribute, template in templates:
        for e in world[kind]:
            k = rng.randint(11, 99)
            shown = f"{e[attribute]:,}" if attribute == "population" else str(e[attribute])
            yield {"query": template.format(k=k, name=e["name"]), "answer": e[attribute] + k, "task": "exact",
                   "kind": "two-step", "tools": ["Fact_Lookup", "Python_Coder"], "intermediate": shown, "addend": k}
