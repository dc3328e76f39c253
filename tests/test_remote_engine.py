"""Tests of remote_engine.RemoteEngine over real HTTP on 127.0.0.1.

Every server here is a http.server.ThreadingHTTPServer started inside the test on port 0: one speaks
the chat-completions protocol in front of the tiny random-weight model (an engine.HFEngine), the others
misbehave on purpose (hang, HTTP 500, 429, malformed JSON, HTML, a closed connection). Nothing touches
the internet.

Run:  python -m pytest -q tests/test_remote_engine.py
"""

import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

import modules
from engine import HFEngine
from scaleout.remote_engine import RemoteConfig, RemoteEngine, from_url
from rollout import RolloutConfig, rollout
from tools import Toolbox

from conftest import make_tiny_model

SECRET = "sk-test-9f8e7d6c5b4a"  # a fake key; it must never show up in an error or a repr
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]


# ---------------------------------------------------------------------------------------------
# A small HTTP server whose replies a test function decides


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real inference servers do

    def log_message(self, *args):  # keep the test output quiet
        pass

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def _handle(self, method):
        fake = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = {"method": method, "path": self.path, "headers": dict(self.headers),
                   "json": json.loads(raw) if raw else None}
        with fake.lock:
            fake.requests.append(request)
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            out = request["reply"] = fake.reply(request)
        finally:
            with fake.lock:
                fake.in_flight -= 1
        if out is None:  # drop the connection without a reply
            self.close_connection = True
            return
        status, payload, ctype = out
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a hanging-server test): nothing to answer
            self.close_connection = True


class FakeServer:
    """Records every request (and the peak number in flight); `reply(request)` returns
    (status, payload, content type), or None to close the connection unanswered."""

    def __init__(self, reply):
        self.reply = reply
        self.requests = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = threading.Event()  # set at teardown to free handlers that hang

    def posts(self):
        return [r for r in self.requests if r["method"] == "POST"]


@contextmanager
def serve(reply):
    """Start a FakeServer on 127.0.0.1:<free port>; yield (server, base_url)."""
    fake = FakeServer(reply)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.fake = fake
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)  # fast shutdown
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        fake.release.set()
        httpd.shutdown()
        httpd.server_close()


def completion(content, finish="stop", usage=None, model="m"):
    """A chat.completion object as vLLM writes it."""
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return 200, body, "application/json"


def tiny_reply(engine, delay=lambda body: 0.05):
    """Chat completions in front of an HFEngine: GET /models, and POST /chat/completions answered by
    engine.generate with the request's messages, max_tokens, temperature, top_p, stop and continued
    assistant prefix. The small sleep (outside the model lock) lets concurrent requests overlap."""
    model_lock = threading.Lock()  # HFEngine is not meant to be called from several threads at once

    def reply(req):
        if req["method"] == "GET" and req["path"].endswith("/models"):
            return 200, {"object": "list", "data": [{"id": "tiny-model", "object": "model"}]}, "application/json"
        body = req["json"]
        if req["path"] != "/v1/chat/completions" or body.get("model") != "tiny-model":
            return 404, {"error": {"message": f"unknown path or model {body.get('model')!r}"}}, "application/json"
        messages, prefix = body["messages"], ""
        if body.get("continue_final_message") and messages[-1]["role"] == "assistant":
            messages, prefix = messages[:-1], messages[-1]["content"]
        time.sleep(delay(body))
        stop = tuple(body.get("stop") or ())
        with model_lock:
            g = engine.generate([messages], max_new_tokens=body["max_tokens"], temperature=body["temperature"],
                                top_p=body["top_p"], prefix=prefix, stop=stop)[0]
        text = g.text
        for s in stop:  # the protocol leaves the stop string out of the content (HFEngine keeps it)
            text = text.split(s)[0] if s in text else text
        usage = {"prompt_tokens": len(g.prompt_ids), "completion_tokens": len(g.response_ids),
                 "total_tokens": len(g.prompt_ids) + len(g.response_ids)}
        return completion(text, "length" if g.truncated else "stop", usage, model="tiny-model")

    return reply


@pytest.fixture
def server_engine(tokenizer):
    """The HFEngine behind the tiny-model server (its own copy of the tiny model)."""
    return HFEngine(make_tiny_model(len(tokenizer), seed=1), tokenizer)


def dead_url():
    """A URL on a port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def engine_for(url, **kw):
    kw.setdefault("model", "m")
    return RemoteEngine(RemoteConfig(base_url=url, **kw))


# ---------------------------------------------------------------------------------------------
# The protocol, against the tiny model


def test_batch_answers_come_back_in_input_order_from_concurrent_requests(server_engine):
    torch.manual_seed(0)
    chats = [[{"role": "user", "content": f"Question {i}"}] for i in range(5)]
    # Earlier chats wait longer, so replies tend to arrive out of order (the check below holds either way).
    delay = lambda body: 0.05 * (5 - int(body["messages"][-1]["content"].split()[-1]))
    with serve(tiny_reply(server_engine, delay)) as (fake, url):
        eng = engine_for(url, model="tiny-model", max_workers=2)
        gens = eng.generate(chats, max_new_tokens=4, temperature=1.0)
    # Sampled replies of a random model differ, so matching each to its request pins the order.
    served = {r["json"]["messages"][-1]["content"]: r for r in fake.posts()}
    assert len(served) == 5
    assert all(not g.error for g in gens)
    texts = [g.text for g in gens]
    assert len(set(texts)) == 5
    # What the server answered each question is what came back in that question's slot.
    answered = [served[c[0]["content"]]["reply"][1]["choices"][0]["message"]["content"] for c in chats]
    assert texts == answered
    assert fake.max_in_flight == 2  # concurrent, and bounded by max_workers
    assert [g.prompt_ids for g in gens] == [[]] * 5 and [g.logprobs for g in gens] == [[]] * 5
    assert eng.tokens_generated == 5 * 4 and eng.seconds > 0


def test_greedy_remote_text_equals_local_engine_text_with_prefix_sent_as_continued_assistant_message(server_engine):
    with serve(tiny_reply(server_engine)) as (fake, url):
        eng = engine_for(url, model="tiny-model")
        [remote] = eng.generate([CHAT], max_new_tokens=5, temperature=0.0, prefix="Command:", stop=("\n",))
        [plain] = eng.generate([CHAT], max_new_tokens=3, temperature=0.0)
    [local] = server_engine.generate([CHAT], max_new_tokens=5, temperature=0.0, prefix="Command:", stop=("\n",))
    assert remote.error == "" and remote.text == local.text.split("\n")[0]
    with_prefix, without = fake.posts()
    body = with_prefix["json"]
    assert body["messages"] == CHAT + [{"role": "assistant", "content": "Command:"}]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["stop"] == ["\n"] and body["max_tokens"] == 5 and body["temperature"] == 0.0 and body["top_p"] == 1.0
    # Without a prefix the chat goes as it is, with no continuation fields and no stop list.
    assert without["json"]["messages"] == CHAT
    assert not {"continue_final_message", "add_generation_prompt", "stop"} & set(without["json"])
    [local_plain] = server_engine.generate([CHAT], max_new_tokens=3, temperature=0.0)
    assert plain.error == "" and plain.text == local_plain.text and plain.truncated == local_plain.truncated


def test_model_name_is_discovered_once_from_models_endpoint(server_engine):
    with serve(tiny_reply(server_engine)) as (fake, url):
        eng = RemoteEngine(RemoteConfig(base_url=url + "/"))  # a trailing slash is fine
        eng.generate([CHAT], max_new_tokens=2, temperature=0.0)
        eng.generate([CHAT, CHAT], max_new_tokens=2, temperature=0.0)
        by_url = from_url(url + "#tiny-model")
    assert eng.model == "tiny-model" and by_url.model == "tiny-model"
    assert [r["path"] for r in fake.requests if r["method"] == "GET"] == ["/v1/models"]
    assert all(r["json"]["model"] == "tiny-model" for r in fake.posts())


def test_model_discovery_failure_raises_a_clear_error():
    with pytest.raises(RuntimeError, match=r"cannot ask .*/models .*connection refused.*name the model"):
        RemoteEngine(RemoteConfig(base_url=dead_url(), retries=0))
    with serve(lambda req: (200, {"object": "list", "data": []}, "application/json")) as (_, url):
        with pytest.raises(RuntimeError, match="lists no model id"):
            from_url(url)


def test_bearer_key_comes_from_the_named_env_var_and_never_shows_in_errors_or_repr(monkeypatch):
    monkeypatch.setenv("AGENTFLOW_TEST_KEY", SECRET)

    def echo_headers(req):  # a careless server that echoes the request headers in its error body
        return 401, {"error": f"bad auth {req['headers'].get('Authorization')}"}, "application/json"

    with serve(echo_headers) as (fake, url):
        eng = engine_for(url, api_key_env="AGENTFLOW_TEST_KEY")
        [g] = eng.generate([CHAT], max_new_tokens=2)
    assert fake.requests[0]["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert "HTTP 401" in g.error and "***" in g.error and SECRET not in g.error
    assert len(fake.requests) == 1  # 401 is not retried
    with serve(lambda req: (500, f"trace: {req['headers'].get('Authorization')}", "text/plain")) as (_, url):
        [g500] = engine_for(url, api_key_env="AGENTFLOW_TEST_KEY", retries=0).generate([CHAT])
    with pytest.raises(RuntimeError) as discovery:
        RemoteEngine(RemoteConfig(base_url=dead_url(), api_key_env="AGENTFLOW_TEST_KEY", retries=0))
    for text in (g500.error, str(discovery.value), repr(eng), repr(eng.cfg), str(vars(eng.cfg))):
        assert SECRET not in text
    # No variable, no header: a local vLLM needs no key.
    monkeypatch.delenv("AGENTFLOW_TEST_KEY")
    with serve(lambda req: completion("ok")) as (fake, url):
        [ok] = engine_for(url, api_key_env="AGENTFLOW_TEST_KEY").generate([CHAT])
    assert ok.text == "ok" and "Authorization" not in fake.requests[0]["headers"]


def test_echoed_prefix_is_stripped_once_and_length_finish_means_truncated():
    replies = iter([completion("Command: Command: ls", "length"), completion("Command: ls", None)])
    with serve(lambda req: next(replies)) as (_, url):
        eng = engine_for(url, max_workers=1)
        first = eng.generate([CHAT], prefix="Command:")[0]
        second = eng.generate([CHAT], prefix="Answer:")[0]
    assert first.text == " Command: ls" and first.truncated
    assert second.text == "Command: ls" and not second.truncated
    assert eng.tokens_generated == len(" Command: ls") // 4 + len("Command: ls") // 4  # no usage: rough count


# ---------------------------------------------------------------------------------------------
# Servers that misbehave: every failure is one clear line in Generation.error, never an exception


def test_hanging_server_gives_a_timeout_error_within_the_retry_bound():
    # The server answers only when the test releases it (or after 60 s), so a client that waited for
    # an answer instead of timing out would come back with "too late" and an answered request. No
    # clock is read: the bound is the retry count and the fact that no request was answered.
    answered = []

    def hang(req):
        fake.release.wait(60)
        answered.append(True)
        return completion("too late")

    with serve(hang) as (fake, url):
        eng = engine_for(url, timeout=0.5, retries=1, backoff=0.05)
        [g] = eng.generate([CHAT])
        attempts, answered_before_return = len(fake.posts()), len(answered)
    assert answered_before_return == 0, "the client waited for the hanging server instead of timing out"
    assert g.text == "" and g.error == f"{url}: timed out after 0.5 s (gave up after 2 tries)"
    assert attempts == 2


def test_http_500_is_retried_then_reported_with_the_attempt_count():
    with serve(lambda req: (500, "boom", "text/plain")) as (fake, url):
        [g] = engine_for(url, retries=2, backoff=0.01).generate([CHAT])
    assert len(fake.posts()) == 3
    assert g.text == "" and g.error == f"{url}: HTTP 500: boom (gave up after 3 tries)"


def test_429_then_success_is_retried_to_the_answer():
    replies = iter([(429, "slow down", "text/plain"), completion("four", usage={"completion_tokens": 2})])
    with serve(lambda req: next(replies)) as (fake, url):
        eng = engine_for(url, retries=2, backoff=0.01)
        [g] = eng.generate([CHAT])
    assert len(fake.posts()) == 2
    assert g.error == "" and g.text == "four" and eng.tokens_generated == 2


@pytest.mark.parametrize("payload, ctype, expected", [
    ("{not json", "application/json", "malformed JSON reply: {not json"),
    ("<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html", "malformed JSON reply: <html>"),
    ({"object": "error"}, "application/json", "malformed reply, no choices[0].message"),
])
def test_malformed_replies_give_a_clear_error_without_retrying(payload, ctype, expected):
    with serve(lambda req: (200, payload, ctype)) as (fake, url):
        gens = engine_for(url, retries=3, backoff=0.01).generate([CHAT] * 3)
    assert len(fake.posts()) == 3  # one request per chat: no retry storm
    assert all(g.text == "" and g.error.startswith(f"{url}: {expected}") for g in gens)
    assert all("\n" not in g.error for g in gens)


def test_closed_connection_and_refused_connection_become_errors():
    with serve(lambda req: None) as (fake, url):
        [closed] = engine_for(url, retries=1, backoff=0.01).generate([CHAT])
    assert closed.error == f"{url}: connection closed by the server without a reply (gave up after 2 tries)"
    assert len(fake.posts()) == 2
    url = dead_url()
    [refused] = engine_for(url, retries=0).generate([CHAT])
    assert refused.error == f"{url}: connection refused (gave up after 1 try)"


def test_failures_stay_in_their_slots_of_a_mixed_batch():
    def some_fail(req):
        content = req["json"]["messages"][-1]["content"]
        return (400, {"error": "context too long"}, "application/json") if "long" in content else completion(content.upper())

    chats = [[{"role": "user", "content": c}] for c in ("a", "long b", "c", "long d")]
    with serve(some_fail) as (_, url):
        gens = engine_for(url).generate(chats)
    assert [g.text for g in gens] == ["A", "", "C", ""]
    assert [bool(g.error) for g in gens] == [False, True, False, True]
    assert gens[1].error == f'{url}: HTTP 400: {{"error": "context too long"}}'


def test_toolbox_turns_a_remote_failure_into_an_error_result():
    eng = engine_for(dead_url(), retries=0)
    [result] = Toolbox(names=("Base_Generator",), llm=eng).run([("Base_Generator", "What is 2 + 2?")])
    assert result.startswith("Error: http://127.0.0.1:") and "connection refused" in result


def test_bad_configuration_raises_value_error_that_says_what_to_change():
    for url in ("", "   ", "127.0.0.1:8000/v1", "ftp://host/v1", "http://host:8000/v1/chat/completions"):
        with pytest.raises(ValueError, match=r"http://127\.0\.0\.1:8000/v1"):
            from_url(url) if url.strip() else RemoteEngine(RemoteConfig(base_url=url))
    with pytest.raises(ValueError, match="empty engine URL"):
        from_url("")
    with pytest.raises(ValueError, match="max_workers >= 1"):
        engine_for("http://127.0.0.1:8000/v1", max_workers=0)


# ---------------------------------------------------------------------------------------------
# The whole agent loop with the frozen modules on the server


def test_rollout_with_local_planner_and_remote_frozen_modules_completes(tiny_engine, server_engine):
    cfg = RolloutConfig(max_turns=1, temperature=1.0, analysis_tokens=0, planner_tokens=6, executor_tokens=6,
                        generator_tokens=4, tools="Base_Generator")
    with serve(tiny_reply(server_engine, delay=lambda body: 0.0)) as (fake, url):
        frozen = from_url(url + "#tiny-model")
        trajs = rollout(["What is 2 + 2?", "Name a prime."], tiny_engine, frozen,
                        Toolbox(names=cfg.tools, llm=frozen, generator_tokens=4), cfg)
    assert len(trajs) == 2
    for tr in trajs:
        assert tr.stop_reason == "max_turns" and len(tr.turns) == 1
        assert tr.final_output.startswith(modules.ANSWER_PREFIX)
        assert tr.turns[0].response_ids  # the planner's turn stays a training row from the local engine
    generator_calls = [r for r in fake.posts() if r["json"]["messages"][-1] == {"role": "assistant", "content": modules.ANSWER_PREFIX}]
    assert len(generator_calls) == 2 and frozen.tokens_generated > 0


def test_train_and_evaluate_route_the_frozen_modules_to_the_server(server_engine, tiny_model_dir, tmp_path):
    """--frozen-engine: the planner stays the local trainable model; every frozen call goes over HTTP."""
    from conftest import ROOT, run_main
    from test_train import TINY

    with serve(tiny_reply(server_engine, delay=lambda body: 0)) as (fake, url):
        res = run_main("train.py", *TINY, "--model", tiny_model_dir, "--out", tmp_path / "run", "--steps", "1",
                       "--max-turns", "1", "--frozen-engine", url)
        assert res.returncode == 0, res.stderr[-3000:]
        after_train = len(fake.posts())
        assert after_train >= 4  # at least the generator call of each of the 4 trajectories
        res = run_main("evaluate.py", "--data", "arithmetic", "--n", "2", "--model", tiny_model_dir, "--max-turns", "1",
                       "--analysis-tokens", "0", "--planner-tokens", "4", "--executor-tokens", "4", "--generator-tokens", "4",
                       "--out", tmp_path / "eval", "--frozen-engine", url)
        assert res.returncode == 0, res.stderr[-3000:]
        assert len(fake.posts()) >= after_train + 2
    res = subprocess.run([sys.executable, "train.py", *TINY, "--model", str(tiny_model_dir), "--out", str(tmp_path / "x"),
                          "--frozen-engine", dead_url()], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "--frozen-engine" in res.stderr.strip().splitlines()[-1]
