"""Search backends for the agent's search tools: BM25 over the local corpus, and the MediaWiki API.

Local_Search ranks the fictional encyclopedia of corpus.py with Okapi BM25, written here with numpy:

    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))          (the +1 keeps it positive)
    score(d, q) = sum_{t in q} idf(t) * tf(t,d) * (k1 + 1) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))

with k1 = 1.5, b = 0.75, N documents, df(t) the number of documents holding term t, tf(t,d) the
count of t in d, |d| the length of d in tokens and avgdl the mean length.

wikipedia_search is a small client of the real MediaWiki API (list=search, then prop=extracts), for
machines that are online. Like every tool the agent calls, it never raises: any failure comes back
as one line starting with "Error:", which the agent's memory records and the planner can react to.

Simplifications vs. the paper / the official code:
- The official Wikipedia_Search lets an LLM pick up to three pages and then runs web RAG over them
  (200-word chunks, embedding ranking, an LLM summary). We return the intro extracts of the top k
  search hits directly: no embeddings, no extra LLM calls, and tests that need no network.
- The official training also used Google_Search (Gemini with grounding, needs an API key). Training
  here runs offline, so Local_Search over the fictional corpus stands in for web search.
- BM25 sums over the distinct query terms (a repeated query word counts once) and uses no stemming,
  so "founder" and "founded" are different terms.

Try it:  python -m environment.search "Who founded Zhervym Motors?" [--k 3] [--wikipedia]
Test:    python -m pytest -q tests/test_search.py
"""
import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import requests

if not __package__:  # run by path (python environment/search.py): the repository root, not this folder, goes on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from environment import corpus

# A tiny stop-word list: words that occur in nearly every question and article and carry no topic.
# BM25's idf would shrink them anyway; dropping them also keeps the postings short.
STOP_WORDS = {"a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from",
              "in", "is", "it", "its", "of", "on", "or", "that", "the", "this", "to", "was", "were",
              "what", "when", "where", "which", "who", "whom", "with"}


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens without stop words: "The Zephyl loom, 1911!" -> ["zephyl", "loom", "1911"]"""
    return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in STOP_WORDS]


# ----------------------------------------------------------------------------
# BM25


class BM25:
    """Okapi BM25 over a fixed list of documents (see the module docstring for the formula).

    The index is a posting dict: term -> (ids of the documents holding it, their BM25 weight for that
    term). The weights do not depend on the query, so they are computed once here, and a query costs
    one numpy scatter-add per query term."""

    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75):
        if not isinstance(docs, (list, tuple)) or not all(isinstance(d, str) for d in docs):
            raise TypeError("BM25 needs a list of strings, one per document")
        if len(docs) == 0:
            raise ValueError("BM25 needs at least one document")
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1, self.b, self.n_docs = k1, b, len(docs)
        # 1. Term counts per document, and document lengths in tokens.
        counts: dict[str, dict[int, int]] = {}  # term -> {doc id: tf}
        self.doc_len = np.zeros(self.n_docs)  # (N,) |d|
        for i, doc in enumerate(docs):
            tokens = tokenize(doc)
            self.doc_len[i] = len(tokens)
            for t in tokens:
                counts.setdefault(t, {}).setdefault(i, 0)
                counts[t][i] += 1
        # An all-empty corpus would make avgdl 0; 1 keeps the length norm defined (every tf is 0).
        self.avgdl = max(float(self.doc_len.mean()), 1.0)
        # 2. Per-document length normaliser: k1 * (1 - b + b * |d| / avgdl).
        norm = k1 * (1 - b + b * self.doc_len / self.avgdl)  # (N,)
        # 3. One posting per term, holding the finished weight idf(t) * tf (k1 + 1) / (tf + norm).
        self.idf: dict[str, float] = {}
        self.postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for t, per_doc in counts.items():
            ids = np.fromiter(per_doc.keys(), dtype=np.int64)
            tf = np.fromiter(per_doc.values(), dtype=np.float64)
            df = len(ids)
            self.idf[t] = float(np.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5)))
            self.postings[t] = (ids, self.idf[t] * tf * (k1 + 1) / (tf + norm[ids]))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for the query, shape (N,); all zeros when no term matches."""
        out = np.zeros(self.n_docs)  # (N,)
        for t in dict.fromkeys(tokenize(query)):  # distinct terms, in query order (not set order,
            # so that the float sums, and so ties, are the same in every process)
            if t in self.postings:
                ids, weights = self.postings[t]
                out[ids] += weights  # ids are unique within a posting, so plain fancy-index add works
        return out

    def top_k(self, query: str, k: int = 3) -> list[tuple[int, float]]:
        """The k best (document index, score) pairs, best first; only documents with a positive score
        (a document that shares no term with the query is not a result). Ties go to the lower index."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        s = self.scores(query)
        order = np.argsort(-s, kind="stable")[:k]
        return [(int(i), float(s[i])) for i in order if s[i] > 0]


# ----------------------------------------------------------------------------
# Local_Search over the corpus


def load_corpus(path=corpus.CORPUS_PATH) -> list[dict]:
    """Read the JSONL corpus: one {"id", "title", "text"} object per line (blank lines are skipped).
    Bad input raises ValueError("path:line: what is wrong"), so the line to fix is named."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: corpus not found; write it with `python -m environment.corpus --out {path}`")
    docs, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(doc, dict):
                raise ValueError(f"{where}: expected a JSON object with id, title and text")
            for key in ("id", "title", "text"):
                if not isinstance(doc.get(key), str):
                    raise ValueError(f"{where}: field {key!r} is missing or not a string")
            if doc["id"] in seen:
                raise ValueError(f"{where}: duplicate id {doc['id']!r}")
            seen.add(doc["id"])
            docs.append(doc)
    if not docs:
        raise ValueError(f"{path}: no documents in the corpus")
    return docs


def _clip(text: str, max_chars: int) -> str:
    """Cut text to max_chars characters, marking the cut with "..."."""
    return text if len(text) <= max_chars else text[:max_chars].rstrip() + "..."


class LocalSearch:
    """BM25 search over the corpus file; indexes title + text of every article."""

    def __init__(self, path=corpus.CORPUS_PATH):
        self.docs = load_corpus(path)
        self.bm25 = BM25([d["title"] + "\n" + d["text"] for d in self.docs])

    def search(self, query: str, k: int = 3, max_chars: int = 600) -> str:
        """"[1] Title: text...\\n[2] ..." for the k best articles, each text cut to max_chars.
        Never raises: bad arguments and queries that match nothing return one "Error: ..." line."""
        try:
            if not isinstance(query, str):
                return f"Error: query must be a string, got {type(query).__name__}"
            if not query.strip():
                return "Error: empty query"
            if not isinstance(k, int) or k < 1 or not isinstance(max_chars, int) or max_chars < 1:
                return f"Error: k and max_chars must be positive integers, got {k!r} and {max_chars!r}"
            hits = self.bm25.top_k(query, k)
            if not hits:
                return f"Error: no results for {query!r}; try other keywords, such as a name"
            lines = [f"[{rank}] {self.docs[i]['title']}: {_clip(self.docs[i]['text'], max_chars)}"
                     for rank, (i, _) in enumerate(hits, start=1)]
            return "\n".join(lines)
        except Exception as e:  # the tool contract: report, never raise
            return f"Error: local search failed: {type(e).__name__}: {_one_line(str(e))}"


# ----------------------------------------------------------------------------
# Wikipedia (MediaWiki API)

USER_AGENT = "agentflow-mini/0.1 (educational AgentFlow reimplementation; offline-first)"
# Retryable: the server may come back (connection refused or dropped, timeouts, HTTP 5xx).
RETRYABLE = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


def _one_line(text: str, limit: int = 300) -> str:
    """Collapse whitespace so an error stays on one line, and cap its length."""
    return _clip(" ".join(text.split()), limit)


def _get_json(session, url: str, params: dict, timeout: float, retries: int, backoff: float):
    """GET url?params and decode JSON. Returns (data, None) or (None, "reason").
    Connection errors, timeouts and HTTP 5xx are retried up to `retries` times, sleeping
    backoff * 2^(attempt-1) seconds before each retry; anything else fails at once."""
    reason = ""
    for attempt in range(retries + 1):
        if attempt > 0:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            r = session.get(url, params=params, timeout=timeout, headers={"User-Agent": USER_AGENT})
        except requests.Timeout:  # before ConnectionError: ConnectTimeout is both
            reason = f"timed out after {timeout} s"
            continue
        except RETRYABLE as e:
            reason = f"connection failed ({type(e).__name__})"
            continue
        except requests.RequestException as e:  # a bad URL or similar: retrying cannot help
            return None, f"request to {url} failed: {type(e).__name__}: {_one_line(str(e))}"
        if r.status_code >= 500:
            reason = f"server answered HTTP {r.status_code}"
            continue
        if r.status_code != 200:
            return None, f"{url} answered HTTP {r.status_code}"
        try:
            return r.json(), None
        except ValueError:  # requests' JSONDecodeError is a ValueError
            kind = r.headers.get("Content-Type", "unknown content type")
            return None, f"{url} did not return JSON (got {kind}: {_one_line(r.text, 60)!r})"
    return None, f"{reason} after {retries + 1} attempts at {url}"


def _api_error(data) -> str | None:
    """MediaWiki reports errors inside a 200 answer as {"error": {"code", "info"}}."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        return f"MediaWiki API error {err.get('code', '?')}: {_one_line(str(err.get('info', '')))}"
    return None


def wikipedia_search(query: str, base_url: str = "https://en.wikipedia.org/w/api.php", k: int = 2,
                     timeout: float = 10.0, retries: int = 2, backoff: float = 0.5, max_chars: int = 800,
                     session=None) -> str:
    """Search Wikipedia and return "[1] Title: intro extract...\\n[2] ..." for the top k pages.

    Two API calls: action=query&list=search&srsearch=QUERY (titles), then
    action=query&prop=extracts&explaintext=1&exintro=1&titles=A|B (plain-text intros).
    Never raises: every failure is one line "Error: ...". The worst case takes about
    2 * (timeout * (retries + 1) + backoff * (2^retries - 1)) seconds (both calls time out)."""
    try:
        if not isinstance(query, str) or not query.strip():
            return "Error: empty query"
        if not isinstance(k, int) or k < 1 or not isinstance(max_chars, int) or max_chars < 1:
            return f"Error: k and max_chars must be positive integers, got {k!r} and {max_chars!r}"
        own_session = session is None
        session = session or requests.Session()
        try:
            # 1. Search: the titles of the best k pages.
            params = {"action": "query", "list": "search", "srsearch": query, "srlimit": k,
                      "format": "json"}
            data, err = _get_json(session, base_url, params, timeout, retries, backoff)
            if err or _api_error(data):
                return f"Error: Wikipedia search failed: {err or _api_error(data)}"
            try:
                titles = [hit["title"] for hit in data["query"]["search"]][:k]
            except (KeyError, TypeError):
                return "Error: Wikipedia search failed: unexpected answer (no query.search titles)"
            if not titles:
                return f"Error: no Wikipedia results for {query!r}; try other keywords"
            # 2. Extracts: plain-text intro of each page, in one call.
            params = {"action": "query", "prop": "extracts", "explaintext": 1, "exintro": 1,
                      "titles": "|".join(titles), "format": "json"}
            data, err = _get_json(session, base_url, params, timeout, retries, backoff)
            if err or _api_error(data):
                return f"Error: Wikipedia extracts failed: {err or _api_error(data)}"
            try:
                pages = data["query"]["pages"]
                pages = pages.values() if isinstance(pages, dict) else pages  # formatversion 1 or 2
                extracts = {p["title"]: p.get("extract", "") for p in pages}
                # The API may rename a title ("normalized"); map the asked title to the answered one.
                renamed = {n["from"]: n["to"] for n in data["query"].get("normalized", [])}
            except (KeyError, TypeError, AttributeError):
                return "Error: Wikipedia extracts failed: unexpected answer (no query.pages with titles)"
            lines = []
            for title in titles:
                text = " ".join(str(extracts.get(renamed.get(title, title), "")).split())
                if text:
                    lines.append(f"[{len(lines) + 1}] {title}: {_clip(text, max_chars)}")
            if not lines:
                return f"Error: Wikipedia pages {titles} have no text extract"
            return "\n".join(lines)
        finally:
            if own_session:
                session.close()
    except Exception as e:  # the tool contract: report, never raise
        return f"Error: Wikipedia search failed: {type(e).__name__}: {_one_line(str(e))}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Search the local corpus (or Wikipedia) by hand.")
    parser.add_argument("query", help="search words, e.g. a name from the corpus")
    parser.add_argument("--k", type=int, default=3, help="number of results")
    parser.add_argument("--corpus", type=Path, default=corpus.CORPUS_PATH, help="JSONL corpus to search")
    parser.add_argument("--wikipedia", action="store_true", help="query the real Wikipedia API instead")
    args = parser.parse_args()
    if args.wikipedia:
        print(wikipedia_search(args.query, k=args.k))
    else:
        print(LocalSearch(args.corpus).search(args.query, k=args.k))
