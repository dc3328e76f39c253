"""A fictional encyclopedia, generated deterministically from a seed, for the Local_Search tool.

Why fictional: the agent must answer from what its search tool returns, not from what the language
model memorised in pre-training, and multi-hop questions (the kind AgentFlow is trained on: Natural
Questions, HotpotQA, Musique) need facts that link articles. So we build a small "world" of people,
cities, companies and inventions with invented names, link them by attributes, write one short
encyclopedia article per entity, and derive every question the world supports:

    single hop:  "Who founded Zhervym Motors?"                         (the company's article)
    two hops:    "In which city was the founder of Zhervym Motors born?"
                 (company article -> founder Zhelleis Vraelein -> person article -> Vraldith)

Names are made of random syllables; every invented word is used by exactly one entity (companies and
inventions add a common word such as "Dynamics" or "loom"), and no invented word is a substring of
another invented word or of a template word, so a name in a question points at one article only.

Simplifications vs. the paper / the official code:
- The official system searches the real web (Google with Gemini grounding, Wikipedia + web RAG).
  We have no network at run time, so Local_Search (search.py) reads this corpus instead; search.py
  still has a real MediaWiki client for machines that are online.
- Questions are template-generated, not Natural Questions; answers are exact strings, so a simple
  normalised string match can judge them instead of the paper's GPT-4o judge.

Run:   python -m environment.corpus [--seed 0] [--out data/corpus.jsonl]
Test:  python -m pytest -q tests/test_corpus.py
"""
import argparse
import json
import random
import re
from pathlib import Path

CORPUS_PATH = Path(__file__).resolve().parents[1] / "data" / "corpus.jsonl"

# World size: 160 + 80 + 140 + 140 = 520 articles (the brief asks for at least 500).
N_PEOPLE, N_CITIES, N_COMPANIES, N_INVENTIONS, N_COUNTRIES = 160, 80, 140, 140, 12

# ----------------------------------------------------------------------------
# Vocabulary: syllables for invented names, and the fixed words the templates use

# Plain letters are listed more than once so that most names stay short and pronounceable.
ONSETS = ["b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
          "b", "d", "k", "l", "m", "n", "r", "s", "t", "v", "br", "dr", "kr", "tr", "th", "sk", "qu",
          "vr", "zh"]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ae", "ou", "y", "ei"]
MID_CODAS = ["", "", "", "", "l", "n", "r"]
END_CODAS = ["", "n", "r", "l", "s", "th", "x", "v", "m", "sk", "rn", "k"]
# Every invented word must hold one of these letter groups, which are rare in English and in real
# names; that keeps out accidents like "Roman" or "Laser" (random syllables make those, too).
FOREIGN_MARKS = ["ae", "ei", "y", "zh", "qu", "vr", "kr"]
# Real words and names that the rules above still let through (found by checking generated worlds
# against a tokenizer vocabulary); the list cannot be complete, so it only covers what we saw.
REAL_WORDS = {"lady", "byron", "kyle", "tyler", "ryan", "dylan", "lynn", "yuri", "neil", "keith",
              "heidi", "reid", "zhou", "kyoto", "lyon", "myth", "kraken", "quest", "query", "sky"}

PROFESSIONS = ["engineer", "chemist", "cartographer", "physician", "architect", "clockmaker",
               "metallurgist", "botanist", "shipwright", "astronomer", "glassblower", "merchant",
               "mathematician", "geologist", "printer", "weaver", "surveyor", "instrument maker"]
COMPANY_SUFFIXES = ["Dynamics", "Works", "Foundry", "Industries", "Instruments", "Holdings",
                    "Mills", "Laboratories", "Engineering", "Textiles", "Optics", "Motors"]
# (name word, what the thing is) for inventions: "the Barlyn lens is an optical lens".
INVENTION_KINDS = [("loom", "weaving machine"), ("lamp", "lighting device"),
                   ("engine", "heat engine"), ("valve", "pressure valve"),
                   ("compass", "navigation instrument"), ("lens", "optical lens"),
                   ("pump", "water pump"), ("telegraph", "signalling apparatus"),
                   ("kiln", "firing furnace"), ("scale", "weighing instrument"),
                   ("clock", "timekeeping device"), ("plough", "farming implement")]

# Article templates. Core sentences carry the facts questions ask about; filler sentences add variety
# but never a number or another entity's name, so every answer in an article is unambiguous.
PERSON_CORE = ["{name} was {a_profession} born in {city} in {year}.",
               "Born in {city} in {year}, {name} worked as {a_profession}.",
               "{name} was born in {year} in {city} and became {a_profession}."]
PERSON_FOUNDED = ["{short} founded {items}.", "{short} went on to found {items}."]
PERSON_INVENTED = ["{short} invented {items}.", "{short} is credited with the invention of {items}."]
PERSON_FILLER = ["{short} kept detailed notebooks that historians still consult.",
                 "Colleagues remembered {short} for patient and careful work.",
                 "Letters written by {short} survive in several private archives.",
                 "{short} trained many apprentices over a long career.",
                 "{short} rarely travelled and disliked public lectures."]
CITY_CORE = ["{name} is a city in {country}. It was founded in {year}.",
             "{name} is a city in {country}, founded in {year}.",
             "Founded in {year}, {name} is a city in {country}."]
CITY_POPULATION = ["It has a population of {population}.", "Its population is {population}.",
                   "{name} has a population of {population}."]
CITY_HQ = ["Companies headquartered in {name} include {items}.",
           "{name} is the home of companies such as {items}."]
CITY_FILLER = ["{name} lies along a broad river valley.",
               "The old quarter of {name} is known for its covered markets.",
               "{name} is a regional centre of trade and crafts.",
               "The city hosts a well-attended autumn fair.",
               "Stone bridges connect the districts of {name}."]
COMPANY_CORE = ["{name} is a company founded by {founder} in {year}. It is headquartered in {city}.",
                "{name} was founded in {year} by {founder} and is headquartered in {city}.",
                "Founded by {founder} in {year}, {name} is a company headquartered in {city}."]
COMPANY_PRODUCTS = ["{name} makes {items}.", "Its products include {items}."]
COMPANY_FILLER = ["The company began as a small workshop.",
                  "{name} is known for its long-running apprenticeship programme.",
                  "Its early growth came from regional contracts.",
                  "The company has changed owners several times.",
                  "{name} publishes a yearly catalogue of its products."]
INVENTION_CORE = ["The {name} is {a_what} invented by {inventor} in {year}. It is made by {maker}.",
                  "The {name} is {a_what} that {inventor} invented in {year}. {maker} makes it.",
                  "Invented by {inventor} in {year}, the {name} is {a_what} made by {maker}."]
INVENTION_FILLER = ["Early versions of the {name} were built by hand.",
                    "The design was widely copied in the decades that followed.",
                    "The {name} is praised for its simple and sturdy construction.",
                    "Museums in several countries display working examples.",
                    "Repairs to the {name} need only common tools."]

ALL_TEMPLATES = (PERSON_CORE + PERSON_FOUNDED + PERSON_INVENTED + PERSON_FILLER + CITY_CORE
                 + CITY_POPULATION + CITY_HQ + CITY_FILLER + COMPANY_CORE + COMPANY_PRODUCTS
                 + COMPANY_FILLER + INVENTION_CORE + INVENTION_FILLER + PROFESSIONS
                 + COMPANY_SUFFIXES + [w for pair in INVENTION_KINDS for w in pair]
                 # the words of the questions in lookup_questions
                 + ["In what which year was founded country is the population of city born",
                    "What profession Who founded headquartered invented company makes founder",
                    "inventor headquarters maker that"])
TEMPLATE_WORDS = {w for t in ALL_TEMPLATES for w in re.findall(r"[a-z]+", t.lower())}

# ----------------------------------------------------------------------------
# Names


def _new_word(rng, used: list[str], syllables: int) -> str:
    """A capitalised invented word, e.g. "Gykrou", that no other word of the world contains or is
    contained in (so neither search nor a substring check can confuse two entities)."""
    while True:
        word = ""
        for i in range(syllables):
            coda = rng.choice(END_CODAS if i == syllables - 1 else MID_CODAS)
            word += rng.choice(ONSETS) + rng.choice(VOWELS) + coda
        if not 4 <= len(word) <= 11 or not any(m in word for m in FOREIGN_MARKS) or word in REAL_WORDS:
            continue
        # Reject collisions with template words ("engine", "city") and with earlier names.
        if any(word in t for t in TEMPLATE_WORDS):
            continue
        if any(word in u or u in word for u in used):
            continue
        used.append(word)
        return word.capitalize()


def _a(noun: str) -> str:
    """The noun with its indefinite article: "an engineer", "a chemist"."""
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _list_items(names: list[str]) -> str:
    """["A"] -> "A"; ["A", "B", "C"] -> "A, B and C"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# ----------------------------------------------------------------------------
# The world


def build_world(seed: int = 0) -> dict:
    """Entities by kind, each a plain dict with an id, a name and attributes that hold entity ids:

    {"seed": 0, "countries": ["Verdaebruv", ...], "cities": [{"id": "city-0001", "name": "Gykrou",
     "country": "Souvrines", "population": 855700, "founded": 843}, ...], "people": [...],
     "companies": [...], "inventions": [...]}
    The same seed always gives the same world (one random.Random drives every choice, in order)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    used: list[str] = []  # every invented word so far, lowercase

    countries = [_new_word(rng, used, 3) for _ in range(N_COUNTRIES)]
    cities = [{"id": f"city-{i + 1:04d}", "name": _new_word(rng, used, rng.choice([2, 3])),
               "country": rng.choice(countries), "population": rng.randrange(40, 25000) * 100,
               "founded": rng.randrange(700, 1750)} for i in range(N_CITIES)]
    people = []
    for i in range(N_PEOPLE):
        name = f"{_new_word(rng, used, 2)} {_new_word(rng, used, 2)}"
        people.append({"id": f"person-{i + 1:04d}", "name": name,
                       "birth_city": rng.choice(cities)["id"], "birth_year": rng.randrange(1790, 1960),
                       "profession": rng.choice(PROFESSIONS)})
    companies = []
    for i in range(N_COMPANIES):
        founder = rng.choice(people)
        # A company is founded when its founder is an adult: 24 to 57 years after the birth.
        companies.append({"id": f"company-{i + 1:04d}",
                          "name": f"{_new_word(rng, used, 2)} {rng.choice(COMPANY_SUFFIXES)}",
                          "founder": founder["id"],
                          "founded": founder["birth_year"] + rng.randrange(24, 58),
                          "hq_city": rng.choice(cities)["id"]})
    inventions = []
    for i in range(N_INVENTIONS):
        inventor = rng.choice(people)
        thing, what = rng.choice(INVENTION_KINDS)
        inventions.append({"id": f"invention-{i + 1:04d}", "name": f"{_new_word(rng, used, 2)} {thing}",
                           "what": what, "inventor": inventor["id"],
                           "year": inventor["birth_year"] + rng.randrange(22, 62),
                           "maker": rng.choice(companies)["id"]})
    return {"seed": seed, "countries": countries, "cities": cities, "people": people,
            "companies": companies, "inventions": inventions}


def _entities(world) -> dict:
    """Every entity (not countries) by id."""
    return {e["id"]: e for kind in ("people", "cities", "companies", "inventions") for e in world[kind]}


def _article_text(rng, sentences: list[str], fillers: list[str]) -> str:
    """Pad the fact sentences with fillers to 3-6 sentences (sometimes one more than needed)."""
    count = lambda: sum(s.count(". ") + 1 for s in sentences)  # a core template may hold two
    want = min(6, max(3, count() + rng.randrange(2)))
    pool = rng.sample(fillers, len(fillers))
    while count() < want and pool:
        sentences.append(pool.pop())
    return " ".join(sentences)


def articles(world) -> list[dict]:
    """One article per entity: [{"id": "person-0001", "title": "Brukras Veirtha", "text": ...}, ...].
    Each article names the entities it links to (birth city, founder, maker, ...) and, as reverse
    links, what links to it (a person's companies and inventions, a city's companies)."""
    ents = _entities(world)
    name = lambda eid: ents[eid]["name"]
    founded_by, invented_by, hq_of, made_by = {}, {}, {}, {}
    for c in world["companies"]:
        founded_by.setdefault(c["founder"], []).append(c)
        hq_of.setdefault(c["hq_city"], []).append(c)
    for v in world["inventions"]:
        invented_by.setdefault(v["inventor"], []).append(v)
        made_by.setdefault(v["maker"], []).append(v)

    docs = []
    for e in world["people"] + world["cities"] + world["companies"] + world["inventions"]:
        # Template choices come from a generator seeded by (world seed, id): the same world always
        # gives the same text, and one article's choices do not shift another's.
        rng = random.Random(f"{world['seed']}/{e['id']}")
        if e["id"].startswith("person"):
            short = e["name"].split()[1]  # the surname alone is unique, too
            sents = [rng.choice(PERSON_CORE).format(name=e["name"], a_profession=_a(e["profession"]),
                                                    city=name(e["birth_city"]), year=e["birth_year"])]
            if e["id"] in founded_by:
                own = sorted(founded_by[e["id"]], key=lambda c: c["founded"])
                items = _list_items([f"{c['name']} in {c['founded']}" for c in own])
                sents.append(rng.choice(PERSON_FOUNDED).format(short=short, items=items))
            if e["id"] in invented_by:
                own = sorted(invented_by[e["id"]], key=lambda v: v["year"])
                items = _list_items([f"the {v['name']} in {v['year']}" for v in own])
                sents.append(rng.choice(PERSON_INVENTED).format(short=short, items=items))
            fillers = [f.format(short=short) for f in PERSON_FILLER]
        elif e["id"].startswith("city"):
            population = f"{e['population']:,}"  # "1,334,000", as questions quote it
            sents = [rng.choice(CITY_CORE).format(name=e["name"], country=e["country"], year=e["founded"]),
                     rng.choice(CITY_POPULATION).format(name=e["name"], population=population)]
            if e["id"] in hq_of:
                # At most three, so that a big city's article stays short ("include" keeps it true).
                items = _list_items([c["name"] for c in hq_of[e["id"]][:3]])
                sents.append(rng.choice(CITY_HQ).format(name=e["name"], items=items))
            fillers = [f.format(name=e["name"]) for f in CITY_FILLER]
        elif e["id"].startswith("company"):
            sents = [rng.choice(COMPANY_CORE).format(name=e["name"], founder=name(e["founder"]),
                                                     year=e["founded"], city=name(e["hq_city"]))]
            if e["id"] in made_by:
                items = _list_items([f"the {v['name']}" for v in made_by[e["id"]]])
                sents.append(rng.choice(COMPANY_PRODUCTS).format(name=e["name"], items=items))
            fillers = [f.format(name=e["name"]) for f in COMPANY_FILLER]
        else:
            sents = [rng.choice(INVENTION_CORE).format(
                name=e["name"], a_what=_a(e["what"]), year=e["year"],
                inventor=name(e["inventor"]), maker=name(e["maker"]))]
            fillers = [f.format(name=e["name"]) for f in INVENTION_FILLER]
        docs.append({"id": e["id"], "title": e["name"], "text": _article_text(rng, sents, fillers)})
    return docs


# ----------------------------------------------------------------------------
# Questions


def lookup_questions(world) -> list[dict]:
    """Every single-hop and two-hop question the world supports, e.g.

    {"question": "In which city was the founder of Zhervym Motors born?", "answer": "Vraldith",
     "hops": 2, "kind": "founder_birthplace", "entities": ["company-0031", "person-0029"]}
    `entities` lists the articles a reader needs, in the order of the hops: the answer is in the
    text of the last one, and each article names the next. Each question names exactly one entity."""
    ents = _entities(world)
    name = lambda eid: ents[eid]["name"]
    qs = []

    def add(question, answer, kind, *entity_ids):
        qs.append({"question": question, "answer": str(answer), "hops": len(entity_ids),
                   "kind": kind, "entities": list(entity_ids)})

    # Single hop: the answer is an attribute written in the named entity's own article.
    for c in world["cities"]:
        add(f"In what year was {c['name']} founded?", c["founded"], "city_founded", c["id"])
        add(f"In which country is {c['name']}?", c["country"], "city_country", c["id"])
        add(f"What is the population of {c['name']}?", f"{c['population']:,}", "city_population",
            c["id"])
    for p in world["people"]:
        add(f"In which city was {p['name']} born?", name(p["birth_city"]), "birthplace", p["id"])
        add(f"In what year was {p['name']} born?", p["birth_year"], "birth_year", p["id"])
        add(f"What was the profession of {p['name']}?", p["profession"], "profession", p["id"])
    for c in world["companies"]:
        add(f"Who founded {c['name']}?", name(c["founder"]), "company_founder", c["id"])
        add(f"In what year was {c['name']} founded?", c["founded"], "company_founded", c["id"])
        add(f"In which city is {c['name']} headquartered?", name(c["hq_city"]), "company_hq", c["id"])
    for v in world["inventions"]:
        add(f"Who invented the {v['name']}?", name(v["inventor"]), "inventor", v["id"])
        add(f"In what year was the {v['name']} invented?", v["year"], "invention_year", v["id"])
        add(f"Which company makes the {v['name']}?", name(v["maker"]), "maker", v["id"])

    # Two hops: the named entity's article gives a bridge entity, whose article gives the answer.
    for p in world["people"]:
        city = ents[p["birth_city"]]
        add(f"In which country was {p['name']} born?", city["country"], "birth_country",
            p["id"], city["id"])
    for c in world["companies"]:
        f, h = ents[c["founder"]], ents[c["hq_city"]]
        add(f"In which city was the founder of {c['name']} born?", name(f["birth_city"]),
            "founder_birthplace", c["id"], f["id"])
        add(f"In what year was the founder of {c['name']} born?", f["birth_year"],
            "founder_birth_year", c["id"], f["id"])
        add(f"What was the profession of the founder of {c['name']}?", f["profession"],
            "founder_profession", c["id"], f["id"])
        add(f"In which country is the headquarters city of {c['name']}?", h["country"],
            "hq_country", c["id"], h["id"])
        add(f"In what year was the headquarters city of {c['name']} founded?", h["founded"],
            "hq_founded", c["id"], h["id"])
    for v in world["inventions"]:
        i, m = ents[v["inventor"]], ents[v["maker"]]
        add(f"In which city was the inventor of the {v['name']} born?", name(i["birth_city"]),
            "inventor_birthplace", v["id"], i["id"])
        add(f"In what year was the inventor of the {v['name']} born?", i["birth_year"],
            "inventor_birth_year", v["id"], i["id"])
        add(f"Who founded the company that makes the {v['name']}?", name(m["founder"]),
            "maker_founder", v["id"], m["id"])
        add(f"In which city is the maker of the {v['name']} headquartered?", name(m["hq_city"]),
            "maker_hq", v["id"], m["id"])
    return qs


# ----------------------------------------------------------------------------
# Writing the JSONL


def write_corpus(path=CORPUS_PATH, seed: int = 0) -> int:
    """Write the articles of build_world(seed) as JSONL (one {"id", "title", "text"} per line) and
    return the number of documents written."""
    docs = articles(build_world(seed))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    return len(docs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write the fictional encyclopedia as JSONL.")
    parser.add_argument("--seed", type=int, default=0, help="world seed (the shipped corpus uses 0)")
    parser.add_argument("--out", type=Path, default=CORPUS_PATH, help="output JSONL path")
    args = parser.parse_args()
    n = write_corpus(args.out, args.seed)
    print(f"wrote {n} documents to {args.out}")
