"""The "planning" suite: questions whose right plan differs in length and order from one kind to the
next, so that a planner that plans well beats every fixed plan (the CPU demo's suite).

Five kinds, each example naming its right plan: the tools in order (`tools`) and a hand-written
sub-goal for each step (`sub_goals`, what evaluate.py's oracle planner writes):

    calculation    "What is 4821 * 37?"                                  Python_Coder
    fact           "Who founded Zhervym Motors?"                         Fact_Lookup
    fact-then-sum  "What is 57 plus the year in which Zhervym Motors     Fact_Lookup ("founding year of
                    was founded?"                                        Zhervym Motors"), then Python_Coder
                                                                         ("57 + 1856")
    two-hop        "In which city was the founder of Zhervym Motors      Fact_Lookup ("founder of Zhervym
                    born?"                                               Motors"), then Fact_Lookup
                                                                         ("birth city of Zhelleis Vraelein")
    sum-then-fact  "What is the population of the city founded in the     Python_Coder ("700 + 43"),
                    year 700 + 43?"                                      then Fact_Lookup ("population of
                                                                         the city founded in 743")

In the three multi-step kinds step 2 needs what step 1 found: the question alone does not hold the
year, the founder or the sum. They test two different things:
- fact-then-sum and two-hop, the planner's words: the tool of step 2 reads the question and the
  planner's sub-goal, and takes no entity from the memory (Fact_Lookup) or runs the sum the sub-goal
  writes (Python_Coder), so the planner's own sub-goal carries the result forward;
- sum-then-fact, the order of the turns: Fact_Lookup reads a year from what the earlier steps found
  (as an executor would fill in a command: environment/facts.py), so after a Python_Coder step any
  sub-goal finds the city, but a plan that starts with a lookup has found nothing by the last turn
  (the question writes no year and the tool does no arithmetic). It is the one kind whose first step
  is not Fact_Lookup: only turn 1's choice of Python_Coder leads anywhere, a choice that credit given
  to the last turn alone never trains.

Shaped to fit a frozen 135M executor and generator (each measured with the oracle planner, README):
- calculation keeps the shapes the executor turns into a correct one-line program most of the time
  (a product, an exact division, a * b - c * d, two short word problems);
- fact questions are corpus.py's one-hop questions, answered by Fact_Lookup's one labelled line;
- fact-then-sum ends in a sum (the executor writes the numbers of a subtraction in either order);
- two-hop questions are corpus.py's two-hop questions whose second hop is one Fact_Lookup of the
  bridge entity that the first hop named;
- sum-then-fact writes one sum (the year less a two-digit number, plus that number) and asks a number,
  a city's population, and only of years that one city was founded in (Fact_Lookup's year lookup then
  names one city): asked a company, an invention or a person of a year, the generator answered the
  year itself (correct for 0 to 9 of 20 with the oracle planner's memory; the population: 20 of 20).

The split is question-level: a hash of the query (tasks._in_test_split) puts each into train or test,
so no test question is trained on (an entity can appear in both, with another question).

Run:   python -m environment.tasks --suite planning --n 10
Test:  python -m pytest -q tests/test_planning.py
"""

import random
from collections import Counter

from environment import corpus
from environment.facts import ATTRIBUTES, KINDS, _world

PARTS = ("calculation", "fact", "fact-then-sum", "two-hop", "sum-then-fact")
SHARES = (2, 2, 2, 2, 2)  # of every 10 questions: 2 calculations, 2 facts, 6 multi-step
MULTI_STEP = ("fact-then-sum", "two-hop", "sum-then-fact")


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
        yield {"query": query, "answer": answer, "task": "exact", "kind": "calculation", "tools": ["Python_Coder"],
               "sub_goals": [query]}


def fact_pool(seed: int):
    """corpus.py's one-hop questions over the shipped world (seed 0), each answered by one Fact_Lookup."""
    del seed  # the world is the shipped one; the split, not the seed, decides which questions are tested
    world = corpus.build_world(seed=0)
    for item in corpus.lookup_questions(world):
        if item["hops"] == 1:
            [entity] = item["entities"]
            yield {"query": item["question"], "answer": item["answer"], "task": "exact", "kind": "fact",
                   "fact_kind": item["kind"], "tools": ["Fact_Lookup"], "sub_goals": [_ask(entity, FACT_KINDS[item["kind"]])]}


def fact_then_sum_pool(seed: int):
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
    ]
    for kind, attribute, template in templates:
        for e in world[kind]:
            k = rng.randint(11, 99)
            yield {"query": template.format(k=k, name=e["name"]), "answer": e[attribute] + k, "task": "exact",
                   "kind": "fact-then-sum", "tools": ["Fact_Lookup", "Python_Coder"],
                   "sub_goals": [_ask(e["id"], attribute), f"{k} + {e[attribute]}"], "intermediate": str(e[attribute]),
                   "addend": k}


def sum_then_fact_pool(seed: int):
    """A sum, then a fact of the city founded in that year: "What is the population of the city founded
    in the year 700 + 43?" (the population of the city founded in 743). Only years that one city has;
    three questions per city, each with its own addend."""
    rng = random.Random(seed)
    world, _, _ = _world()
    templates = ["What is the population of the city founded in the year {a} + {k}?",
                 "How many people live in the city that was founded in the year {a} + {k}?"]
    years = Counter(c["founded"] for c in world["cities"])
    for city in world["cities"]:
        y = city["founded"]
        if years[y] > 1:  # the year must name one city
            continue
        for i, k in enumerate(rng.sample(range(11, 100), 3)):
            yield {"query": templates[i % 2].format(a=y - k, k=k), "answer": city["population"], "task": "exact",
                   "kind": "sum-then-fact", "tools": ["Python_Coder", "Fact_Lookup"],
                   "sub_goals": [f"{y - k} + {k}", f"population of the city founded in {y}"], "intermediate": str(y)}


# corpus.py's two-hop question kinds: (attribute of the named entity that names the bridge, attribute
# of the bridge entity that is the answer).
TWO_HOP_KINDS = {
    "founder_birthplace": ("founder", "birth_city"), "founder_birth_year": ("founder", "birth_year"),
    "founder_profession": ("founder", "profession"), "hq_country": ("hq_city", "country"),
    "hq_founded": ("hq_city", "founded"), "inventor_birthplace": ("inventor", "birth_city"),
    "inventor_birth_year": ("inventor", "birth_year"), "maker_founder": ("maker", "founder"),
    "maker_hq": ("maker", "hq_city"), "birth_country": ("birth_city", "country"),
}
# corpus.py's one-hop question kinds: the attribute asked.
FACT_KINDS = {
    "birthplace": "birth_city", "birth_year": "birth_year", "profession": "profession", "company_founder": "founder",
    "company_founded": "founded", "company_hq": "hq_city", "inventor": "inventor", "invention_year": "year",
    "maker": "maker", "city_founded": "founded", "city_country": "country", "city_population": "population",
}


def two_hop_pool(seed: int):
    """corpus.py's two-hop questions: a fact names a bridge entity, a fact of the bridge is the answer
    ("In which city was the founder of X born?": the founder of X, then the founder's birth city)."""
    del seed
    world = corpus.build_world(seed=0)
    _, _, by_id = _world()
    for item in corpus.lookup_questions(world):
        if item["hops"] == 2:
            first, bridge = item["entities"]
            a1, a2 = TWO_HOP_KINDS[item["kind"]]
            yield {"query": item["question"], "answer": item["answer"], "task": "exact", "kind": "two-hop",
                   "fact_kind": item["kind"], "tools": ["Fact_Lookup", "Fact_Lookup"],
                   "sub_goals": [_ask(first, a1), _ask(bridge, a2)], "intermediate": by_id[bridge]["name"]}


def _ask(entity_id: str, attribute: str) -> str:
    """The hand-written sub-goal of a lookup, in Fact_Lookup's own words: "founder of Zhervym Motors"."""
    _, _, by_id = _world()
    entity = by_id[entity_id]
    kind = next(k for k in KINDS if any(e is entity for e in _world()[0][k]))
    label = next(label for a, label, _ in ATTRIBUTES[kind] if a == attribute)
    return f"{label} of {entity['name']}"
