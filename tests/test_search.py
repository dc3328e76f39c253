"""Tests for search.py: BM25 ranking and idf, Local_Search over the shipped corpus, and the Wikipedia
client against local HTTP servers (127.0.0.1, port 0) that answer, hang, fail, send HTML or hang up.
No test touches the internet.

Run:  cd /work/main && python -m pytest -q tests/test_search.py
"""
import http.server
import json
import math
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from environment import corpus  # noqa: E402
from environment import search  # noqa: E402

TOY_DOCS = [
    "The Zephyl loom weaves cloth quickly in the mills of Tellamar.",
    "Tellamar is a river city famous for its covered markets and its mills.",
    "Quorvex Dynamics builds pumps and valves for ships.",
    "A short history of the lighthouse lamp and its lenses.",
    "Arlen Vosk, born in Tellamar, founded Quorvex Dynamics.",
]


# ----------------------------------------------------------------------------
# tokenize and BM25


def test_tokenize_lowercases_splits_punctuation_and_drops_stop_words():
    assert search.tokenize("The Zephyl loom, made in 1911!") == ["zephyl", "loom", "made", "1911"]
    assert search.tokenize("") == [] and search.tokenize("of the a") == []


def test_bm25_ranks_the_matching_toy_document_first():
    bm25 = search.BM25(TOY_DOCS)
    assert bm25.top_k("Zephyl loom", k=1)[0][0] == 0
    assert bm25.top_k("who founded Quorvex Dynamics", k=1)[0][0] == 4
    assert bm25.top_k("lighthouse lenses", k=1)[0][0] == 3
    assert bm25.top_k("pumps for ships", k=2)[0][0] == 2


def test_bm25_score_matches_the_formula_by_hand():
    docs = ["apple apple banana", "banana cherry", "cherry date elder fig"]
    bm25 = search.BM25(docs, k1=1.5, b=0.75)
    # "apple" is in 1 of 3 docs; doc 0 has tf 2 and length 3; avgdl = (3 + 2 + 4) / 3 = 3.
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    expected = idf * 2 * 2.5 / (2 + 1.5 * (1 - 0.75 + 0.75 * 3 / 3))
    assert bm25.scores("apple")[0] == pytest.approx(expected)
    assert bm25.scores("apple")[1:].tolist() == [0.0, 0.0]


def test_rare_term_outweighs_common_term():
    docs = ["common common rare", "common common common", "common filler", "common words here"]
    bm25 = search.BM25(docs)
    assert bm25.idf["rare"] > bm25.idf["common"] > 0  # idf stays positive even for a term in every doc
    s = bm25.scores("common rare")
    assert s.argmax() == 0 and s[0] > 2 * s[1]


def test_empty_and_unknown_queries_give_zero_scores_and_no_hits():
    bm25 = search.BM25(TOY_DOCS)
    for q in ["", "   ", "the of a", "xyzzy plugh"]:
        assert bm25.scores(q).shape == (len(TOY_DOCS),)
        assert not bm25.scores(q).any()
        assert bm25.top_k(q) == []


def test_bm25_rejects_bad_arguments_with_clear_errors():
    with pytest.raises(ValueError, match="at least one document"):
        search.BM25([])
    with pytest.raises(TypeError, match="list of strings"):
        search.BM25(["ok", 3])
    with pytest.raises(ValueError, match="k1 >= 0"):
        search.BM25(["ok"], b=2.0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        search.BM25(["ok"]).top_k("ok", k=0)


# ----------------------------------------------------------------------------
# Local_Search over the shipped corpus


@pytest.fixture(scope="module")
def local():
    return search.LocalSearch()


def test_every_article_title_finds_its_own_article_first(local):
    for i, d in enumerate(local.docs):
        assert local.bm25.top_k(d["title"], k=1)[0][0] == i, d["title"]


def test_generated_questions_retrieve_the_entity_they_name(local):
    ids = [d["id"] for d in local.docs]
    questions = corpus.lookup_questions(corpus.build_world(0))
    first = 0
    for q in questions:
        top = [ids[i] for i, _ in local.bm25.top_k(q["question"], k=3)]
        assert q["entities"][0] in top, q["question"]
        first += top[0] == q["entities"][0]
    assert first / len(questions) >= 0.95


def test_local_search_formats_numbered_results_and_clips_text(local):
    out = local.search("Who founded Zhervym Motors?", k=2, max_chars=40)
    lines = out.split("\n")
    assert len(lines) == 2 and lines[0].startswith("[1] Zhervym Motors: ") and lines[1].startswith("[2] ")
    assert lines[0].endswith("...") and len(lines[0]) <= len("[1] Zhervym Motors: ") + 40 + 3


def test_local_search_never_raises_on_bad_input(local):
    assert local.search("") == "Error: empty query"
    assert local.search("   \n") == "Error: empty query"
    for out in [local.search(None), local.search(42), local.search("Zhervym", k=0),
                local.search("Zhervym", k="3"), local.search("Zhervym", max_chars=-1),
                local.search("xyzzy plugh"), local.search("the of"), local.search("\x00" * 10000)]:
        assert out.startswith("Error: ") and "\n" not in out, out
    assert local.search("Zhervym", k=10_000).startswith("[1] ")


def test_load_corpus_names_path_and_line_of_a_bad_line(tmp_path):
    good = json.dumps({"id": "a", "title": "A", "text": "t"})
    cases = {"{not json": r":2: not valid JSON", '["list"]': r":2: expected a JSON object",
             json.dumps({"id": "b", "text": "t"}): r":2: field 'title' is missing",
             good: r":2: duplicate id 'a'"}
    for bad, message in cases.items():
        path = tmp_path / "bad.jsonl"
        path.write_text(good + "\n" + bad + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=str(path).replace("\\", "\\\\") + message):
            search.load_corpus(path)
    with pytest.raises(FileNotFoundError, match="python -m environment.corpus"):
        search.load_corpus(tmp_path / "missing.jsonl")


def test_cli_prints_local_search_results():
    res = subprocess.run([sys.executable, "-m", "environment.search", "Zhervym Motors", "--k", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("[1] Zhervym Motors: ") and "\n[2] " in res.stdout


# ----------------------------------------------------------------------------
# Wikipedia client against local servers

SEARCH_JSON = {"batchcomplete": "", "query": {"searchinfo": {"totalhits": 2}, "search": [
    {"ns": 0, "title": "Ada Lovelace", "pageid": 974, "snippet": "..."},
    {"ns": 0, "title": "Analytical engine", "pageid": 1271, "snippet": "..."}]}}
EXTRACTS_JSON = {"batchcomplete": "", "query": {"pages": {
    "1271": {"pageid": 1271, "ns": 0, "title": "Analytical engine",
             "extract": "The analytical engine was a proposed digital mechanical computer."},
    "974": {"pageid": 974, "ns": 0, "title": "Ada Lovelace",
            "extract": "Augusta Ada King, Countess of Lovelace, was an English mathematician.\n\nShe..."}}}}


def serve(behaviour):
    """Start a threaded HTTP server on 127.0.0.1 (free port) whose GET handler calls
    behaviour(handler, params); returns (base_url, list of received (params, headers), stop)."""
    received = []
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            received.append((params, dict(self.headers)))
            behaviour(self, params, release)

        def log_message(self, *args):  # keep pytest output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # A short poll interval makes shutdown() quick (it waits for the serve loop to notice).
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop():
        release.set()  # let a hanging handler finish
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_address[1]}/w/api.php", received, stop


def send(handler, status, body: bytes, content_type="application/json"):
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def canned(handler, params, release):
    data = SEARCH_JSON if params.get("list") == "search" else EXTRACTS_JSON
    send(handler, 200, json.dumps(data).encode())


@pytest.fixture
def server():
    """server(behaviour) -> (url, received); every server started is stopped after the test."""
    stops = []

    def start(behaviour):
        url, received, stop = serve(behaviour)
        stops.append(stop)
        return url, received

    yield start
    for stop in stops:
        stop()


def test_wikipedia_search_sends_both_api_calls_and_formats_extracts(server):
    url, received = server(canned)
    out = search.wikipedia_search("Ada Lovelace engine", base_url=url, k=2, max_chars=40)
    # Search order is kept (the extracts answer lists the pages in another order); each text is cut
    # to max_chars characters plus "...".
    assert out.split("\n") == ["[1] Ada Lovelace: Augusta Ada King, Countess of Lovelace,...",
                               "[2] Analytical engine: The analytical engine was a proposed dig..."]
    (p1, h1), (p2, h2) = received
    assert p1 == {"action": "query", "list": "search", "srsearch": "Ada Lovelace engine", "srlimit": "2",
                  "format": "json"}
    assert p2 == {"action": "query", "prop": "extracts", "explaintext": "1", "exintro": "1",
                  "titles": "Ada Lovelace|Analytical engine", "format": "json"}
    assert h1["User-Agent"] == search.USER_AGENT and h2["User-Agent"] == search.USER_AGENT


def test_wikipedia_search_returns_error_within_timeout_when_server_hangs(server):
    # The server's handlers return only when the test ends (or after 60 s): a client that waited for
    # them instead of timing out would find one returned. No clock is read.
    returned = []
    url, received = server(lambda h, p, release: release.wait(60) or returned.append(True))
    timeout, retries, backoff = 0.3, 1, 0.1
    out = search.wikipedia_search("anything", base_url=url, timeout=timeout, retries=retries, backoff=backoff)
    assert returned == [], "the client waited for the hanging server instead of timing out"
    assert out.startswith("Error: ") and "timed out" in out and "\n" not in out, out
    assert len(received) == retries + 1


def test_wikipedia_search_retries_http_500_then_reports_it(server):
    url, received = server(lambda h, p, release: send(h, 500, b"oops", "text/plain"))
    out = search.wikipedia_search("anything", base_url=url, retries=2, backoff=0.01)
    assert out.startswith("Error: ") and "HTTP 500" in out and "3 attempts" in out, out
    assert len(received) == 3


def test_wikipedia_search_reports_html_instead_of_json(server):
    url, received = server(lambda h, p, release: send(h, 200, b"<html><body>Hi</body></html>", "text/html"))
    out = search.wikipedia_search("anything", base_url=url, backoff=0.01)
    assert out.startswith("Error: ") and "did not return JSON" in out and "text/html" in out, out
    assert len(received) == 1  # a wrong answer is not retried


def test_wikipedia_search_reports_a_connection_closed_without_answer(server):
    def hang_up(handler, params, release):
        handler.close_connection = True  # return without writing a status line

    url, received = server(hang_up)
    out = search.wikipedia_search("anything", base_url=url, retries=1, backoff=0.01)
    assert out.startswith("Error: ") and "connection failed" in out and "2 attempts" in out, out
    assert len(received) == 2


def test_wikipedia_search_reports_connection_refused():
    # A port that was free a moment ago: nothing listens there now.
    probe = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()
    out = search.wikipedia_search("x", base_url=f"http://127.0.0.1:{port}/w/api.php", retries=1, backoff=0.01)
    assert out.startswith("Error: ") and "connection failed" in out, out


@pytest.mark.parametrize("answer, message", [
    ({"error": {"code": "badvalue", "info": "Unrecognized value"}}, "MediaWiki API error badvalue"),
    ({"batchcomplete": ""}, "unexpected answer"),
    ({"query": {"search": []}}, "no Wikipedia results"),
    ([1, 2, 3], "unexpected answer"),
])
def test_wikipedia_search_reports_api_errors_missing_keys_and_no_results(server, answer, message):
    url, _ = server(lambda h, p, release: send(h, 200, json.dumps(answer).encode()))
    out = search.wikipedia_search("anything", base_url=url)
    assert out.startswith("Error: ") and message in out and "\n" not in out, out


def test_wikipedia_search_reports_extracts_answer_without_pages(server):
    def behaviour(handler, params, release):
        data = SEARCH_JSON if params.get("list") == "search" else {"query": {"normalized": []}}
        send(handler, 200, json.dumps(data).encode())

    url, _ = server(behaviour)
    out = search.wikipedia_search("anything", base_url=url)
    assert out.startswith("Error: Wikipedia extracts failed: unexpected answer"), out


def test_wikipedia_search_never_raises_on_bad_arguments(server):
    url, received = server(canned)
    for kwargs in [{"query": ""}, {"query": None}, {"query": "x", "k": 0}, {"query": "x", "max_chars": "9"},
                   {"query": "x", "base_url": "not a url"}, {"query": "x", "base_url": url, "session": object()}]:
        out = search.wikipedia_search(**{"base_url": url, **kwargs})
        assert out.startswith("Error: ") and "\n" not in out, (kwargs, out)
    assert received == []  # none of these reached the server
