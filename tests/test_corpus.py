"""Tests for corpus.py: the world is deterministic and consistent, the shipped corpus is current, and
every generated question is answerable from the articles it names.

Run:  cd /work/main && python -m pytest -q tests/test_corpus.py
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from environment import corpus  # noqa: E402

KINDS = ("people", "cities", "companies", "inventions")


@pytest.fixture(scope="module")
def world():
    return corpus.build_world(0)


@pytest.fixture(scope="module")
def docs(world):
    return {d["id"]: d for d in corpus.articles(world)}


@pytest.fixture(scope="module")
def questions(world):
    return corpus.lookup_questions(world)


def has_word(text: str, phrase: str) -> bool:
    """phrase occurs in text as whole words ("1872" must not match inside "18720")."""
    return re.search(r"(?<![\w,])" + re.escape(phrase) + r"(?!\w|,\d)", text) is not None


def test_world_has_at_least_500_entities_of_four_kinds(world):
    sizes = {kind: len(world[kind]) for kind in KINDS}
    assert sum(sizes.values()) >= 500
    assert all(n >= 50 for n in sizes.values()), sizes
    assert len(world["countries"]) >= 5


def test_same_seed_gives_same_world_and_other_seed_differs(world):
    assert corpus.build_world(0) == world
    assert corpus.articles(corpus.build_world(0)) == corpus.articles(world)
    assert corpus.build_world(1)["people"][0]["name"] != world["people"][0]["name"]


def test_non_int_seed_is_rejected_with_clear_error():
    with pytest.raises(TypeError, match="seed must be an int"):
        corpus.build_world("0")


def test_names_are_unique_and_no_invented_word_contains_another(world):
    names = world["countries"] + [e["name"] for kind in KINDS for e in world[kind]]
    assert len(set(names)) == len(names)
    # Invented words: every word of a name except the shared common ones ("Dynamics", "loom").
    common = set(corpus.COMPANY_SUFFIXES) | {thing for thing, _ in corpus.INVENTION_KINDS}
    words = [w.lower() for n in names for w in n.split() if w not in common]
    assert len(set(words)) == len(words), "an invented word is used by two entities"
    for w in words:
        clashes = [u for u in words if u != w and (w in u or u in w)]
        assert not clashes, f"{w} overlaps {clashes}"
        # Nor may an invented word hide inside a template word ("Tor" in "inventor").
        assert not any(w in t for t in corpus.TEMPLATE_WORDS), w


def test_attributes_link_to_existing_entities_with_plausible_years(world):
    ids = {e["id"]: e for kind in KINDS for e in world[kind]}
    for p in world["people"]:
        assert p["birth_city"].startswith("city-") and p["birth_city"] in ids
        assert p["profession"] in corpus.PROFESSIONS
    for c in world["cities"]:
        assert c["country"] in world["countries"] and c["population"] > 0
    for c in world["companies"]:
        assert c["founded"] - ids[c["founder"]]["birth_year"] >= 18
        assert c["hq_city"].startswith("city-") and c["hq_city"] in ids
    for v in world["inventions"]:
        assert v["year"] - ids[v["inventor"]]["birth_year"] >= 18
        assert v["maker"].startswith("company-") and v["maker"] in ids


def test_every_entity_has_one_article_of_three_to_six_sentences(world, docs):
    assert len(docs) == sum(len(world[kind]) for kind in KINDS)
    for d in docs.values():
        assert re.fullmatch(r"(person|city|company|invention)-\d{4}", d["id"])
        n_sentences = len(re.findall(r"[.!?](?:\s|$)", d["text"]))
        assert 3 <= n_sentences <= 6, (n_sentences, d["text"])
        assert d["title"] in d["text"]


def test_articles_name_their_linked_entities(world, docs):
    name = {d_id: d["title"] for d_id, d in docs.items()}
    for p in world["people"]:
        assert name[p["birth_city"]] in docs[p["id"]]["text"]
    for c in world["companies"]:
        text = docs[c["id"]]["text"]
        assert name[c["founder"]] in text and name[c["hq_city"]] in text
        assert c["name"] in docs[c["founder"]]["text"]  # the reverse link, in the founder's article
    for v in world["inventions"]:
        text = docs[v["id"]]["text"]
        assert name[v["inventor"]] in text and name[v["maker"]] in text


def test_shipped_corpus_equals_a_fresh_write_for_seed_0(tmp_path):
    fresh = tmp_path / "corpus.jsonl"
    n = corpus.write_corpus(fresh, seed=0)
    assert corpus.CORPUS_PATH.exists(), "data/corpus.jsonl is missing: run python -m environment.corpus"
    assert n >= 500
    assert corpus.CORPUS_PATH.read_bytes() == fresh.read_bytes(), \
        "data/corpus.jsonl is stale: regenerate it with python -m environment.corpus"
    lines = fresh.read_text(encoding="utf-8").splitlines()
    assert len(lines) == n
    assert set(json.loads(lines[0])) == {"id", "title", "text"}


def test_there_are_hundreds_of_one_hop_and_two_hop_questions(questions):
    assert sum(q["hops"] == 1 for q in questions) >= 300
    assert sum(q["hops"] == 2 for q in questions) >= 300
    assert len({q["kind"] for q in questions if q["hops"] == 2}) >= 5
    assert len({q["question"] for q in questions}) == len(questions), "duplicate question text"


def test_every_answer_is_in_the_article_the_question_depends_on(docs, questions):
    for q in questions:
        assert len(q["entities"]) == q["hops"]
        first, last = docs[q["entities"][0]], docs[q["entities"][-1]]
        assert has_word(last["text"], q["answer"]), (q, last["text"])
        if q["hops"] == 2:
            # The first article names the bridge entity, so the chain can be followed.
            assert last["title"] in first["text"], (q, first["text"])


def test_every_question_names_exactly_one_entity(docs, questions):
    titles = [d["title"] for d in docs.values()]
    for q in questions:
        named = [t for t in titles if t in q["question"]]
        assert named == [docs[q["entities"][0]]["title"]], (q["question"], named)


def test_two_hop_answer_is_not_stated_in_the_first_article(docs, questions):
    """A two-hop question must need the second article: the company article does not give its
    founder's profession, nor a city article's country. (Kinds whose answer may appear in the first
    article by coincidence, such as a company headquartered in its founder's birth city, are left out.)"""
    for q in questions:
        if q["kind"] in ("founder_profession", "birth_country", "hq_country"):
            assert not has_word(docs[q["entities"][0]]["text"], q["answer"]), q


def test_cli_writes_the_corpus_for_a_seed(tmp_path):
    out = tmp_path / "c.jsonl"
    res = subprocess.run([sys.executable, str(Path(corpus.__file__)), "--seed", "2", "--out", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) >= 500 and f"wrote {len(lines)} documents" in res.stdout
    assert lines[0] != corpus.CORPUS_PATH.read_text(encoding="utf-8").splitlines()[0]
