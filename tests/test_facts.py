"""Fact_Lookup (environment/facts.py), the planning suite's lookup tool: its tolerant reading of
commands (part by part, a name copied with a slip), that it never raises whatever it is given, and
how the toolbox runs it.
Run: python -m pytest -q tests/test_facts.py
"""

import random
import re

import pytest

import modules
from environment import facts, tasks
from tools import Toolbox


def test_fact_lookup_reads_loose_commands():
    assert facts.lookup("founder of Noullysk Foundry") == "founder of Noullysk Foundry: Brukras Veirtha"
    assert facts.lookup("**Who founded NOULLYSK foundry??**") == "founder of Noullysk Foundry: Brukras Veirtha"
    assert facts.lookup("Noullysk Foundry founding year") == "founding year of Noullysk Foundry: 1856"
    assert facts.lookup("birth city of Veirtha") == "birth city of Brukras Veirtha: Fulyrn"
    # No attribute named: every fact of the entity, on one line.
    assert facts.lookup("Brukras Veirtha") == "Brukras Veirtha: birth city Fulyrn; birth year 1822; profession shipwright"
    # One hop only: a chain gives a fact of the entity named, never of the bridge.
    assert facts.lookup("In which city was the founder of Noullysk Foundry born?").startswith("founder of Noullysk Foundry")


def test_fact_lookup_gives_the_first_hop_of_every_two_hop_question():
    """Asked a whole two-hop question, the tool answers its first hop, the relation written next to the
    name: "the headquarters city of X" ties with "what year ... founded" on keywords (two each) and wins,
    not X's own founding year, which no second hop can build on."""
    assert (facts.lookup("In what year was the headquarters city of Larhy Motors founded?")
            == "headquarters city of Larhy Motors: Vrabraques")
    assert facts.lookup("In what year was Larhy Motors founded?") == "founding year of Larhy Motors: 1856"
    two_hop = [e for e in tasks.load("planning", split="train", seed=0) if e["kind"] == "two-hop"]
    assert len({e["query"].split(" the ")[0] for e in two_hop}) >= 4  # several question forms
    for e in two_hop:
        assert facts.lookup(e["query"]).startswith(e["sub_goals"][0] + ":"), e["query"]


def test_fact_lookup_finds_the_entity_of_a_year_and_does_no_arithmetic():
    """A command that names no entity but a year and a kind: the entity of that year, or the fact asked
    of it; the year is the last one written in the first part that writes one, never a computed one."""
    assert facts.lookup("city founded in 1566") == "city founded in 1566: Pequisk"
    assert facts.lookup("population of the city founded in 1566") == (
        "population of Pequisk, the city founded in 1566: 1,334,000")
    # The year carried by the sub-goal, the rest from the question.
    question = "How many people live in the city that was founded in the year 1500 + 66?"
    for sub_goal in ("1566", "Found 1566", "1500 + 66 = 1566", "city founded in 1566"):
        assert facts.lookup(f"{sub_goal} | {question}").endswith("Pequisk, the city founded in 1566: 1,334,000"), sub_goal
    assert "1566" not in facts.lookup(question)  # the question alone asks 1500: the tool does no sum
    # sum-then-fact's step 2: the year from what the earlier steps found (after " || "), before any the
    # sub-goal or the question writes.
    for sub_goal in ("Find the population", "Found 2023", question):
        assert facts.lookup(f"{sub_goal} | {question} || 1566").endswith("Pequisk, the city founded in 1566: 1,334,000")
    assert facts.lookup(f"{question} || 1566; 1,334,000").endswith("1,334,000")  # the last finding's year
    # An entity is never taken from the context: the question's entity decides (a two-hop's bridge is
    # the planner's to carry), and a context that writes no year adds nothing.
    hop = "In which city was the founder of Noullysk Foundry born?"
    assert facts.lookup(f"{hop} || founder of Noullysk Foundry: Brukras Veirtha") == facts.lookup(hop)
    assert "1566" not in facts.lookup(f"{question} || 1,334,000; no year")  # the question's 1500 then
    # The kind named last decides; a year several entities share names them all; none: an error.
    assert facts.lookup("founder of the company founded in 1847") == (
        "founder of Thaerkiv Dynamics, the company founded in 1847: Dezhiv Teiskan")
    assert facts.lookup("city founded in 843") == "city founded in 843: Gykrou; Raskyndeirn"
    assert facts.lookup("city founded in 1999").startswith("Error: Fact_Lookup found no city founded in 1999")
    assert facts.lookup("What is 1856 * 37?").startswith("Error: Fact_Lookup found no person")  # no kind named


def test_fact_lookup_reads_a_command_part_by_part_and_the_first_part_that_names_an_entity_decides():
    """"sub-goal | question" (rollout.py's command): the first part naming an entity decides what is
    asked; a later part only supplies the attribute when that part names none, and never its entity."""
    question = "When was Noullysk Foundry founded?"
    # The sub-goal names an entity and an attribute: the question is not read (as one text it would
    # ask the founding year: "when" and "founded" outweigh "founder").
    assert facts.lookup(f"founder of Noullysk Foundry | {question}") == "founder of Noullysk Foundry: Brukras Veirtha"
    assert facts.lookup(f"founder of Noullysk Foundry {question}") == "founding year of Noullysk Foundry: 1856"
    # The sub-goal names only an entity: the question supplies the attribute ("when": a year), of the
    # sub-goal's entity, not the question's.
    assert facts.lookup(f"Brukras Veirtha | {question}") == "birth year of Brukras Veirtha: 1822"
    assert facts.lookup("Brukras Veirtha | Who founded Noullysk Foundry?") == facts.lookup("Brukras Veirtha")
    # A two-hop question's second step: the bridge's fact, though the question names the first entity.
    two_hop = "In which city was the founder of Noullysk Foundry born?"
    assert facts.lookup(f"birth city of Brukras Veirtha | {two_hop}") == "birth city of Brukras Veirtha: Fulyrn"
    # A sub-goal that copies the first step's finding is about the value it found, the bridge.
    assert facts.lookup(f"founder of Noullysk Foundry: Brukras Veirtha | {two_hop}") == "birth city of Brukras Veirtha: Fulyrn"
    assert facts.lookup(f"Find the founder of Noullysk Foundry: Brukras Veirtha | {two_hop}") == facts.lookup(
        f"Brukras Veirtha | {two_hop}")
    # ... only when the question asks something of that value: a one-step question looked up again
    # with its finding copied ("founder of X: Y | Who founded X?") asks the question's fact, not all of Y's.
    assert facts.lookup(f"founder of Noullysk Foundry: Brukras Veirtha | Who founded Noullysk Foundry?") == (
        "founder of Noullysk Foundry: Brukras Veirtha")
    assert facts.lookup("Found: Fulyrn | In which city was Brukras Veirtha born?") == "birth city of Brukras Veirtha: Fulyrn"
    # ... only when that value names an entity: a copied year leaves the part as it is.
    assert facts.lookup(f"founding year of Noullysk Foundry: 1856 | {question}") == "founding year of Noullysk Foundry: 1856"
    # The sub-goal names no entity: the next part decides.
    assert facts.lookup("Find a fact about a person | Who founded Noullysk Foundry?") == facts.lookup("Who founded Noullysk Foundry?")
    assert facts.lookup("a | b").startswith("Error: Fact_Lookup found no")


def test_fact_lookup_reads_a_name_copied_with_a_slip_as_the_name_it_nearly_spells():
    """The trained planner copies the bridge entity from its memory into the next sub-goal, often with
    a letter wrong ("Finds: Nequirn Holdings" for Neiquirn Holdings): a capitalised word that nearly
    spells an invented one stands for it; a common word, a lower-case word or a far one does not."""
    two_hop = "In which city is the maker of the Nendreisk loom headquartered?"
    right = "headquarters city of Neiquirn Holdings: Haquuzhy"
    assert facts.lookup(f"Finds: Neiquirn Holdings | {two_hop}") == right
    assert facts.lookup(f"Finds: Nequirn Holdings | {two_hop}") == right
    assert facts.lookup(f"Finds: Neiquimn Holdings | {two_hop}") == right
    first_hop = facts.lookup(two_hop)
    assert first_hop == "maker of Nendreisk loom: Neiquirn Holdings"
    assert facts.lookup(f"Finds: nequirn holdings | {two_hop}") == first_hop  # lower case: not a name
    assert facts.lookup(f"Finds: Nequishlooms | {two_hop}") == first_hop  # too far from any name
    assert facts.lookup("Holdings Motors Which Where Finds").startswith("Error: Fact_Lookup found no")
    # No question of the suites changes: their names are spelled right (the fixed plans' commands).
    by_word = facts._world()[1]
    for e in tasks.load("planning", "test"):
        assert facts._named(e["query"]) == [by_word[w] for w in re.findall(r"[a-z]+", e["query"].lower()) if w in by_word]


@pytest.mark.parametrize("command", ["", "   ", None, 42, "x" * 100_000, "What is 2 + 2?", "Zhervym\x00\n\t",
                                     "ünïcödé ℵ 🚀", "((((", "founder of", "Noullysk " * 5000, b"bytes"])
def test_fact_lookup_never_raises(command):
    result = facts.lookup(command)
    assert isinstance(result, str) and len(result) < 400


def test_fact_lookup_error_names_what_it_was_given():
    assert "in '42';" in facts.lookup(42)


def test_fact_lookup_fuzz_never_raises():
    rng = random.Random(0)
    words = ["founder", "year", "city", "Noullysk", "Veirtha", "born", "population", "Fulyrn", "?", "of", "the", "\n",
             "1566", "843", "+", "company"]
    for _ in range(300):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        assert isinstance(facts.lookup(text), str)


def test_the_toolbox_runs_fact_lookup_and_parses_its_command():
    result = Toolbox(("Fact_Lookup",)).run([("Fact_Lookup", "founder of Noullysk Foundry"), ("Fact_Lookup", "")])
    assert result == ["founder of Noullysk Foundry: Brukras Veirtha", "Error: the executor produced no command"]
    assert modules.parse_command("Command: Who founded Noullysk Foundry?", "Fact_Lookup") == "Who founded Noullysk Foundry?"
