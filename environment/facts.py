"""Fact_Lookup's backend: one fact of the fictional world of corpus.py, as one short labelled line.

Local_Search returns passages, and a 135M generator rarely finds the one fact in them (6 of 30
one-hop questions with the top-3 passages in memory, 7 of 30 with the gold sentence alone). Given a
short labelled line instead, the same frozen generator copies the value (23 of 30). So this tool
answers a command such as "founder of Zhervym Motors" or "Who founded Zhervym Motors?" with

    founder of Zhervym Motors: Zhelleis Vraelein

read from the world itself (corpus.build_world(seed=0), the world whose articles Local_Search reads).
The command is read loosely, because a frozen 135M executor writes it:

    entity     every invented word of the world names one entity (corpus.py guarantees it), so any
               invented word in the command picks its entity; several: the one whose attribute the
               command names, else the first named. A capitalised word of 5 to 24 letters that is no
               invented word stands for the invented word it nearly spells ("Nequirn" for "Neiquirn",
               difflib ratio >= 0.75): a 135M planner that copies a name from its memory often
               misspells it (README, "The multi-step planner")
    attribute  keywords of the entity's kind ("year", "founded", "born", "city", "country", ...),
               each attribute scored by how many of its keywords the command holds; a tie goes to
               the attribute named just before the entity ("the headquarters city of X"), then to
               the first listed; none named: every fact of the entity, on one line
    year       no entity named, but a year and a kind of entity: the entity of that kind whose founding,
               invention or birth year it is ("city founded in 743: Gykrou"), or the attribute asked of it
               ("population of Gykrou, the city founded in 743: 855,700"). The year is the last one
               written in the context (below), else in the first part that writes one ("700 + 43 = 743"
               asks 743); the tool does no arithmetic: "the year 27 * 26 + 41" asks no year
    context    after " || ", what the earlier steps found (rollout.py sends it), as an executor would
               fill in a command: read only for the year, which it gives first ("population of the city
               founded in the year 27 * 26 + 41 || 743" asks 743). An entity is never taken from it:
               the bridge of a two-hop question is the planner's to carry
    nothing    neither: an "Error: ..." line that says what the input must name

One hop only: "the city where the founder of Zhervym Motors was born" gives a fact of Zhervym Motors,
not of its founder. A two-step question needs a second lookup that names the founder, which is what
the planner's sub-goal must carry.

Simplifications: the official system has no such tool (it searches the web and summarises with an
LLM); this one stands in for a search engine that returns an answer box.

Run:   python -m environment.facts "founder of Zhervym Motors"
Test:  python -m pytest -q tests/test_facts.py
"""

import difflib
import functools
import os
import re
import sys

if not __package__:  # run by path (python environment/facts.py): the repository root, not this folder, goes on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from environment import corpus

# Per kind of entity: (attribute, label in the result, keywords). The keywords are regexes matched
# as whole words, case-insensitively; the order breaks ties ("Who founded X?" names both "founded"
# and "who founded": the founder, listed first, wins).
ATTRIBUTES = {
    "people": [
        # "country": a person's facts hold no country, and the birth city is the way to it (a second hop)
        ("birth_city", "birth city", [r"city", r"where", r"birth ?place", r"born in which", r"home ?town", r"country"]),
        ("birth_year", "birth year", [r"years?", r"when", r"born", r"birth", r"birth ?year"]),
        ("profession", "profession", [r"profession", r"job", r"occupation", r"work(?:ed)?", r"what was"]),
    ],
    "cities": [
        ("population", "population", [r"population", r"people", r"inhabitants", r"residents"]),
        ("country", "country", [r"country", r"nation", r"where", r"which country"]),
        ("founded", "founding year", [r"years?", r"when", r"founded", r"founding"]),
    ],
    "companies": [
        ("founder", "founder", [r"founder", r"who founded", r"founded by", r"who"]),
        ("founded", "founding year", [r"years?", r"when", r"founded", r"founding"]),
        ("hq_city", "headquarters city", [r"headquarter(?:s|ed)?", r"hq", r"city", r"where", r"based"]),
    ],
    "inventions": [
        ("inventor", "inventor", [r"inventor", r"who invented", r"invented by", r"who"]),
        ("year", "year of invention", [r"years?", r"when", r"invented", r"invention"]),
        ("maker", "maker", [r"maker", r"makes", r"made by", r"company", r"manufacturer", r"produces"]),
    ],
}
KINDS = tuple(ATTRIBUTES)
# The year lookup, by kind of entity: (the year attribute, label in the result, keywords of the kind).
BY_YEAR = {
    "cities": ("founded", "city founded in", [r"city", r"cities", r"town"]),
    "companies": ("founded", "company founded in", [r"compan(?:y|ies)", r"firm"]),
    "inventions": ("year", "invention made in", [r"inventions?", r"invented", r"made"]),
    "people": ("birth_year", "person born in", [r"born", r"person", r"people"]),
}
YEAR = r"(?<![\d,.])(\d{3,4})(?![\d,])"
# Characters before an entity's name searched for the attribute that a tie goes to: in "In what year
# was the headquarters city of X founded?" the headquarters city (2 keywords, "headquarters city of")
# ties with the founding year (2, "year", "founded"), and the relation written next to the name is the
# first hop, as "the founder of X" is in "In which city was the founder of X born?".
NEAR = 32


def _words(name: str) -> list[str]:
    """The invented words of a name: "Zhervym Motors" -> ["zhervym"] (suffixes and kinds are common words)."""
    return [w.lower() for w in name.split() if w.lower() not in _common()]


@functools.lru_cache(maxsize=1)
def _world():
    """(world, {invented word: (kind, entity)}, {id: entity}), built once per process."""
    world = corpus.build_world(seed=0)
    by_word, by_id = {}, {}
    for kind in KINDS:
        for e in world[kind]:
            by_id[e["id"]] = e
            for w in _words(e["name"]):
                by_word[w] = (kind, e)
    return world, by_word, by_id


def value(kind: str, entity: dict, attribute: str) -> str:
    """The attribute as text, written as the questions write it (populations with commas, names of ids)."""
    _, _, by_id = _world()
    v = entity[attribute]
    if isinstance(v, str) and v in by_id:
        return by_id[v]["name"]
    return f"{v:,}" if attribute == "population" else str(v)


def _has(pattern: str, text: str) -> bool:
    return re.search(rf"(?<![a-z]){pattern}(?![a-z])", text) is not None


def lookup(command) -> str:
    """The fact the command asks for, '<attribute> of <entity>: <value>'; never raises (see the docstring).

    A command of several parts, "sub-goal | question || context" (what rollout.py sends), is read part by part:
    the first part that names an entity decides, and a later part only names the attribute when that
    part names none ("Zhelleis Vraelein | In which city was the founder of X born?" asks Zhelleis
    Vraelein's birth city, not X's founder). A part that ends in a copied finding, "founder of X:
    Zhelleis Vraelein", stands for the entity after its last ": " when the rest asks something of that
    entity (a two-hop question's second step); else the rest decides (a one-step question looked up again).

    >>> lookup("Who founded Noullysk Foundry?")
    'founder of Noullysk Foundry: Brukras Veirtha'
    """
    command, _, context = command.partition(" || ") if isinstance(command, str) else (command, "", "")
    written = command.split(" | ") if isinstance(command, str) else [""]
    # A part that ends in a copied finding, "... maker of X: Larhy Motors", is about the value it found:
    # what one lookup found is what the next is asked about (a two-hop question's second hop).
    parts = [_found(part) for part in written]
    for i, part in enumerate(parts):
        if _named(part):
            if i + 1 < len(parts) and not _attribute_named(part):  # the entity alone: the rest says what of it
                rest = " ".join(_unnamed(p) for p in parts[i + 1:])
                if part != written[i] and not _asks_of(part, rest):
                    # The rest asks nothing of the found value ("inventor of X lamp: Y | Who invented the X
                    # lamp?"): a one-step question looked up again, so the rest decides, not Y.
                    return lookup(" | ".join(written[i + 1:]))
                return _lookup_one(part + " " + rest)
            return _lookup_one(part)
    return _by_year([context] + written if context.strip() else written) or _lookup_one(command)


def _by_year(parts: list[str]) -> str | None:
    """The entity whose year a command that names none asks ("city founded in 743"), as one line; None
    when no part writes a year or no kind of entity is named. Read as lookup() reads a command: the
    year is the last one written in the first part that writes one, and that part names the kind and
    the attribute asked, a later part only what that part leaves out."""
    i = next((i for i, p in enumerate(parts) if re.search(YEAR, p)), None)
    if i is None:
        return None
    year = int(re.findall(YEAR, parts[i])[-1])
    texts = [parts[i].lower(), " ".join(parts).lower()]
    # The kind: the one named last ("founder of the company founded in 1861" asks of a company).
    named = next((hits for t in texts if (hits := [(m.start(), kind) for kind, (_, _, keys) in BY_YEAR.items()
                                                    for k in keys for m in re.finditer(rf"(?<![a-z]){k}(?![a-z])", t)])), None)
    if not named:
        return None
    kind = max(named)[1]
    attribute, label, _ = BY_YEAR[kind]
    world, _, _ = _world()
    found = [e for e in world[kind] if e[attribute] == year]
    if not found:
        return f"Error: Fact_Lookup found no {label} {year}; name an entity, or a year that one of its kind has"
    # Another attribute of the kind asked ("population of the city founded in 743"): its value.
    asked = next((hits for t in texts if (hits := [(a, lab) for a, lab, keys in ATTRIBUTES[kind]
                                                    if a != attribute and any(_has(k, t) for k in keys)])), None)
    if asked and len(found) == 1:
        a, lab = asked[0]
        return f"{lab} of {found[0]['name']}, the {label} {year}: {value(kind, found[0], a)}"
    return f"{label} {year}: {'; '.join(e['name'] for e in found)}"


def _found(part: str) -> str:
    """The value after a part's last ": " when that value names an entity, else the part as it is."""
    value = part.rpartition(": ")[2]
    return value if value != part and _named(value) else part


def _unnamed(text: str) -> str:
    """The text with every invented word taken out (so that it names an attribute but no entity)."""
    return re.sub(r"[A-Za-z]+", lambda m: "" if _named(m.group()) else m.group(), text)


def _named(text: str) -> list:
    """The (kind, entity) of every entity the text names, in order, an entity as often as it is named."""
    return [hit for _, hit in _hits(text)]


def _hits(text: str) -> list:
    """(position, (kind, entity)) of every word of the text that names an entity: an invented word, or a
    capitalised word that nearly spells one (_near)."""
    _, by_word, _ = _world()
    found = []
    for m in re.finditer(r"[A-Za-z]+", text):
        word = m.group()
        hit = by_word.get(word.lower()) or (_near(word.lower()) if word[0].isupper() and 5 <= len(word) <= 24 else None)
        if hit:
            found.append((m.start(), hit))
    return found


@functools.lru_cache(maxsize=4096)
def _near(word: str):
    """The entity of the invented word that `word` nearly spells, or None; common words never match."""
    _, by_word, _ = _world()
    if word in _common():
        return None
    close = difflib.get_close_matches(word, by_word.keys(), n=1, cutoff=0.75)
    return by_word[close[0]] if close else None


@functools.lru_cache(maxsize=1)
def _common() -> frozenset:
    return frozenset({w.lower() for w in corpus.COMPANY_SUFFIXES} | {thing for thing, _ in corpus.INVENTION_KINDS})


def _attribute_named(text: str) -> bool:
    return _asks_of(text, text)


def _asks_of(entity_text: str, text: str) -> bool:
    """Does `text` name an attribute of an entity that `entity_text` names?"""
    t = text.lower()
    return any(_has(k, t) for kind, _ in _named(entity_text) for _, _, keys in ATTRIBUTES[kind] for k in keys)


def _lookup_one(command) -> str:
    text = command.lower() if isinstance(command, str) else ""
    named = []  # (position in the command, kind, entity), each entity once
    for pos, hit in _hits(command if isinstance(command, str) else ""):
        if all(hit[1] is not e for _, _, e in named):
            named.append((pos, *hit))
    if not named:
        return ("Error: Fact_Lookup found no person, city, company or invention of the encyclopedia in "
                f"{str(command)[:80]!r}; name one, e.g. 'founder of <company>'")
    best = None  # ((score, named just before the entity, -position, -rank), kind, entity, attribute, label)
    for pos, kind, entity in named:
        before = text[max(0, pos - NEAR):pos]  # "... the headquarters city of " in front of the name
        for rank, (attribute, label, keys) in enumerate(ATTRIBUTES[kind]):
            score = sum(_has(k, text) for k in keys)
            near = any(_has(k, before) for k in keys)
            if score and (best is None or (score, near, -pos, -rank) > best[0]):
                best = ((score, near, -pos, -rank), kind, entity, attribute, label)
    if best is None:  # an entity but no attribute: every fact of the first one named
        _, kind, entity = named[0]
        facts = "; ".join(f"{label} {value(kind, entity, a)}" for a, label, _ in ATTRIBUTES[kind])
        return f"{entity['name']}: {facts}"
    _, kind, entity, attribute, label = best
    return f"{label} of {entity['name']}: {value(kind, entity, attribute)}"


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description="Fact_Lookup by hand: one fact of the fictional world as one line.")
    parser.add_argument("query", nargs="*", help="e.g. founder of Noullysk Foundry (default: Who founded Noullysk Foundry?)")
    args = parser.parse_args(argv)
    print(lookup(" ".join(args.query) or "Who founded Noullysk Foundry?"))


if __name__ == "__main__":
    main()
