"""An engine over any OpenAI-compatible chat endpoint, for the frozen modules at paper scale.

In the paper the planner is Qwen2.5-7B-Instruct trained with Flow-GRPO, while the executor, verifier,
generator and the Base_Generator tool are a frozen copy of the same model served by an inference
engine. RemoteEngine lets this code do the same: it has the interface of engine.HFEngine,

    engine.generate(list_of_chats, max_new_tokens=..., temperature=..., top_p=..., prefix=..., stop=...)
        -> list[engine.Generation]

and answers each chat with one POST {base_url}/chat/completions to a server such as

    vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000          -> http://127.0.0.1:8000/v1
    llama-server -m model.gguf --port 8080                    -> http://127.0.0.1:8080/v1

train.py and evaluate.py take it as `--frozen-engine http://127.0.0.1:8000/v1` (or
`...:8000/v1#Qwen/Qwen2.5-7B-Instruct` to name the model; without it the first id of GET /models is
used); from_url() below builds the engine from that string. The key, if the server wants one, is read
from the environment variable named by RemoteConfig.api_key_env (OPENAI_API_KEY by default) and sent
as a Bearer header; it never appears in a repr, a log line or an error message.

A remote engine serves ONLY frozen modules. It returns text, not the prompt/response token ids and
sampled log-probs that Flow-GRPO trains on (Generation.prompt_ids, response_ids and logprobs stay
empty), so it must never be used as the trained planner.

The forced reply prefix (modules.py pins every module's format with one, e.g. "Command:") is sent as a
final assistant message that the server continues:

    messages = [..., {"role": "assistant", "content": prefix}]
    body["continue_final_message"] = True; body["add_generation_prompt"] = False

which is vLLM's extension of the protocol; llama.cpp's server continues a final assistant message on
its own and ignores the two fields. The reply's content is what follows the prefix; a server that
echoes the prefix at the start of its content has it stripped once, so Generation.text means the same
as with HFEngine.

Every failure of the network or the server becomes Generation(text="", error="one line") after
bounded retries (connection errors, timeouts, HTTP 429 and 5xx, with exponential backoff); generate
never raises for them, and tools.Toolbox turns the error into an "Error: ..." tool result.

Simplifications vs. the official code / the full protocol:
- One request per chat, concurrent in a bounded thread pool; no streaming and no n > 1 sampling.
- Stop strings follow the OpenAI convention and are NOT included in the returned text (HFEngine keeps
  them); the parsers in modules.py do not need them.
- Retry-After headers are ignored: the backoff is backoff * 2**attempt seconds.
- `timeout` bounds the connection and each read, as in requests, not the total time of a reply that
  keeps trickling bytes.
- tokens_generated uses the reply's usage.completion_tokens; when a server leaves usage out it falls
  back to a rough len(text) / 4, good only for throughput logs.
- The default session ignores proxy and .netrc settings from the environment (a .netrc entry would
  replace the Bearer header); pass your own requests.Session for proxies or custom certificates.

Try it against a running server:  python -m scaleout.remote_engine http://127.0.0.1:8000/v1 "What is 2 + 2?"
Test:  python -m pytest -q tests/test_remote_engine.py
"""

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

if not __package__:  # run by path (python scaleout/remote_engine.py): the repository root, not this folder, goes on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import Generation


@dataclass
class RemoteConfig:
    base_url: str  # API root, e.g. http://127.0.0.1:8000/v1 (requests go to {base_url}/chat/completions)
    model: str = ""  # model name sent in each request; "" = the first id of GET {base_url}/models, asked once
    api_key_env: str = "OPENAI_API_KEY"  # NAME of the env var holding the key (sent as Bearer; never logged)
    timeout: float = 60.0  # seconds allowed for the connection and for each read of one request
    retries: int = 2  # extra tries after a connection error, timeout, HTTP 429 or 5xx
    backoff: float = 0.5  # seconds before the first retry; doubled before each further one
    max_workers: int = 8  # concurrent requests: a batch of chats is sent through a pool this wide


class _Failure(Exception):
    """A request that failed; `retry` says whether trying again may help."""

    def __init__(self, message: str, retry: bool):
        super().__init__(message)
        self.retry = retry


def _snippet(text: str, n: int = 160) -> str:
    """The start of a reply body on one line, for error messages."""
    flat = " ".join(str(text).split())
    return flat[:n] + ("..." if len(flat) > n else "") if flat else "(empty body)"


def _describe(e: requests.RequestException, timeout: float) -> str:
    """One plain line for a requests exception (its own text is a long nested repr)."""
    if isinstance(e, requests.Timeout):  # includes ConnectTimeout
        return f"timed out after {timeout:g} s"
    text = repr(e)
    if "refused" in text.lower():
        return "connection refused"
    if "RemoteDisconnected" in text or "Connection aborted" in text or "reset by peer" in text.lower():
        return "connection closed by the server without a reply"
    return f"connection failed: {_snippet(str(e), 120)}"


class RemoteEngine:
    """Chat generation on an OpenAI-compatible server, with HFEngine's `generate` interface."""

    def __init__(self, cfg: RemoteConfig, session=None):
        # 1. Check the configuration: these are programming errors, so they raise at once.
        url = (cfg.base_url or "").strip().rstrip("/")
        if not url:
            raise ValueError("RemoteConfig.base_url is empty: give the API root, e.g. http://127.0.0.1:8000/v1")
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ValueError(f"base_url {url!r} is not an http(s) URL: give e.g. http://127.0.0.1:8000/v1")
        if url.endswith("/chat/completions"):
            raise ValueError(f"base_url {url!r} names the endpoint: give the API root, e.g. http://127.0.0.1:8000/v1")
        if cfg.timeout <= 0 or cfg.retries < 0 or cfg.backoff < 0 or cfg.max_workers < 1:
            raise ValueError("RemoteConfig needs timeout > 0, retries >= 0, backoff >= 0 and max_workers >= 1")
        self.cfg = cfg
        self.base_url = url
        # 2. The key is read once; it lives only in the headers and is scrubbed from every error text.
        self._key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self._headers = {"Content-Type": "application/json"}
        if self._key:
            self._headers["Authorization"] = f"Bearer {self._key}"
        # 3. One session shared by the pool threads (urllib3's connection pool is thread-safe), with
        #    room for max_workers kept-alive connections so concurrent requests do not reconnect.
        if session is None:
            session = requests.Session()
            session.trust_env = False  # no proxy / .netrc from the environment (see the docstring)
            adapter = HTTPAdapter(pool_connections=1, pool_maxsize=cfg.max_workers)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        self.session = session
        self._lock = threading.Lock()  # guards the counters, updated from the pool threads
        self.tokens_generated = 0  # running count of completion tokens, as in HFEngine
        self.seconds = 0.0  # wall time spent inside generate
        # 4. Ask the server for its model name once, when none was given.
        self.model = cfg.model or self._discover_model()

    def __repr__(self):
        # Written by hand so that the key (or even whether one was found) cannot leak into logs.
        return f"RemoteEngine(base_url={self.base_url!r}, model={self.model!r})"

    def _scrub(self, text: str) -> str:
        """Remove the key from a message (a server may echo the request headers in its error body)."""
        return text.replace(self._key, "***") if self._key else text

    # -----------------------------------------------------------------------------------------
    # HTTP with bounded retries

    def _request(self, method: str, path: str, body=None) -> dict:
        """Send one request, retrying transient failures; return the parsed JSON or raise _Failure.

        Retried: connection errors, timeouts, HTTP 429 and 5xx (the server may recover). Not retried:
        other HTTP errors and malformed replies, which would fail the same way again.
        """
        url = f"{self.base_url}{path}"
        tries = self.cfg.retries + 1
        for attempt in range(tries):
            if attempt:
                time.sleep(self.cfg.backoff * 2 ** (attempt - 1))  # backoff, 2 * backoff, 4 * backoff, ...
            try:
                return self._try_once(method, url, body)
            except _Failure as e:
                if not e.retry:
                    raise _Failure(self._scrub(f"{self.base_url}: {e}"), retry=False) from None
                last = str(e)
        n = f"{tries} {'try' if tries == 1 else 'tries'}"
        raise _Failure(self._scrub(f"{self.base_url}: {last} (gave up after {n})"), retry=False)

    def _try_once(self, method: str, url: str, body) -> dict:
        try:
            r = self.session.request(method, url, json=body, headers=self._headers,
                                     timeout=(self.cfg.timeout, self.cfg.timeout))
        except requests.RequestException as e:
            raise _Failure(_describe(e, self.cfg.timeout), retry=True) from None
        if r.status_code == 429 or r.status_code >= 500:
            raise _Failure(f"HTTP {r.status_code}: {_snippet(r.text, 80)}", retry=True)
        if r.status_code != 200:
            raise _Failure(f"HTTP {r.status_code}: {_snippet(r.text)}", retry=False)
        try:
            data = r.json()
        except ValueError:  # json.JSONDecodeError, or a body that is not even text
            raise _Failure(f"malformed JSON reply: {_snippet(r.text)}", retry=False) from None
        if not isinstance(data, dict):
            raise _Failure(f"malformed JSON reply (not an object): {_snippet(r.text)}", retry=False)
        return data

    def _discover_model(self) -> str:
        """The first model id of GET {base_url}/models, with an error that says what to change."""
        hint = "start the server, or name the model in RemoteConfig.model (after '#' in a --frozen-engine URL)"
        try:
            data = self._request("GET", "/models")
        except _Failure as e:
            why = str(e).removeprefix(f"{self.base_url}: ")
            raise RuntimeError(f"cannot ask {self.base_url}/models for the model name: {why}; {hint}") from None
        models = data.get("data")
        if not isinstance(models, list) or not models or not isinstance(models[0], dict) or not models[0].get("id"):
            raise RuntimeError(self._scrub(f"{self.base_url}/models lists no model id ({_snippet(json.dumps(data))}); {hint}"))
        return str(models[0]["id"])

    # -----------------------------------------------------------------------------------------
    # Generation

    def _body(self, chat, max_new_tokens, temperature, top_p, prefix, stop) -> dict:
        """The chat-completions request of one chat."""
        messages = [{"role": m["role"], "content": m["content"]} for m in chat]
        body = {"model": self.model, "messages": messages, "max_tokens": max_new_tokens,
                "temperature": temperature, "top_p": top_p}
        if stop:
            body["stop"] = list(stop)
        if prefix:
            # The forced prefix is an assistant message the server continues (vLLM's extension; it
            # rejects continue_final_message together with add_generation_prompt, hence False).
            messages.append({"role": "assistant", "content": prefix})
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        return body

    def _one(self, body: dict, prefix: str) -> Generation:
        """Send one chat and read its reply; every failure becomes Generation(error=...)."""
        try:
            data = self._request("POST", "/chat/completions", body)
            choice = data["choices"][0]
            content = choice["message"].get("content") or ""  # null content = an empty reply
            finish = choice.get("finish_reason")
        except _Failure as e:
            return Generation(text="", error=str(e))
        except (KeyError, IndexError, TypeError, AttributeError):
            msg = f"{self.base_url}: malformed reply, no choices[0].message: {_snippet(json.dumps(data))}"
            return Generation(text="", error=self._scrub(msg))
        if not isinstance(content, str):
            return Generation(text="", error=self._scrub(f"{self.base_url}: malformed reply, content is not text"))
        # A server that echoes the continued prefix would otherwise make rollout.py read it twice.
        if prefix and content.startswith(prefix):
            content = content[len(prefix):]
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        tokens = usage.get("completion_tokens")
        with self._lock:
            self.tokens_generated += tokens if isinstance(tokens, int) else len(content) // 4
        return Generation(text=content, truncated=finish == "length")

    def generate(self, chats, max_new_tokens=64, temperature=0.7, top_p=1.0, prefix="", stop=()) -> list[Generation]:
        """One completion per chat, in the order of `chats`, sent as concurrent requests.

        Generation.text is what the model wrote after `prefix` (stop strings not included);
        truncated = the server's finish_reason was "length"; a failed request gives text "" and a
        one-line `error`. Never raises for network or server problems.
        """
        if not chats:
            return []
        t0 = time.perf_counter()
        bodies = [self._body(c, max_new_tokens, temperature, top_p, prefix, stop) for c in chats]
        # pool.map returns results in the order of its inputs, whatever order the replies arrive in.
        with ThreadPoolExecutor(max_workers=min(self.cfg.max_workers, len(bodies))) as pool:
            results = list(pool.map(lambda b: self._one(b, prefix), bodies))
        with self._lock:
            self.seconds += time.perf_counter() - t0
        return results


def from_url(url: str, **overrides) -> RemoteEngine:
    """Build a RemoteEngine from "http://host:port/v1" or "http://host:port/v1#model-name".

    The part after '#' is the model name (it may contain '/', e.g. #Qwen/Qwen2.5-7B-Instruct); without
    it the server is asked for its first model. `overrides` set other RemoteConfig fields.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("empty engine URL: give e.g. http://127.0.0.1:8000/v1 or http://127.0.0.1:8000/v1#model-name")
    base, _, model = url.strip().partition("#")
    return RemoteEngine(RemoteConfig(base_url=base, model=model.strip(), **overrides))


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description="Ask an OpenAI-compatible server one question through RemoteEngine.")
    p.add_argument("url", help="http://host:port/v1, optionally #MODEL")
    p.add_argument("question", nargs="*", help="the question (default: What is the capital of France?)")
    args = p.parse_args(argv)
    engine = from_url(args.url)
    question = " ".join(args.question) or "What is the capital of France?"
    [gen] = engine.generate([[{"role": "user", "content": question}]], max_new_tokens=64, temperature=0)
    print(f"Error: {gen.error}" if gen.error else gen.text)


if __name__ == "__main__":
    main()
