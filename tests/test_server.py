"""`eaglespec serve` end to end on tiny random models: real uvicorn servers on 127.0.0.1, the real openai client.

Three servers: (1) a random EAGLE-3 head (the real speculative path) + the vanilla engine; (2) a replay drafter
that knows every answer, so each step commits 5 tokens (stop strings and max_tokens must cut inside a chunk;
acceptance metrics are exact); (3) vanilla only, one row, no queue, with an API key (429, 401).
Greedy outputs are compared with offline `Engine.generate` on an identical, separately built target.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from eaglespec.cli import encode_prompt
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.costmodel import CostTable
from eaglespec.spec.dispatch import DEFAULT_CANDIDATES, AdaptiveDispatcher
from eaglespec.spec.heads import DraftHead, save_head
from eaglespec.spec.proposer import ReplayProposer
from eaglespec.serve.server import ServerConfig, create_app
from eaglespec.spec.speculative import DraftOptions, build_proposer
from helpers import tiny_target

MODEL = "tiny"
PROMPTS = ["The quick brown fox", "def add(a, b):", "1 2 3 4 5 6", "Café, naïve", "Speculative decoding"]
REPLAY_DEPTH = 4


@contextlib.contextmanager
def serving(app):
    """Run `app` with uvicorn on a free 127.0.0.1 port in a background thread; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.05)
        else:
            raise RuntimeError("the server did not become healthy")
        yield url
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def client(url: str, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)


def greedy(n: int, stop=(), ignore_eos=False) -> GenerationConfig:
    return GenerationConfig(n, SamplingParams(temperature=0.0), tuple(stop), ignore_eos)


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def reference():
    """offline(prompt, chat, config) -> Completion from a vanilla Engine on a separate, identical target."""
    target, _ = tiny_target(seed=0)
    tok = target.tokenizer
    engine = Engine(target)
    cache = {}

    def ids(prompt: str, chat: bool) -> list[int]:
        return encode_prompt(tok, prompt, chat=chat)

    def offline(prompt: str, chat: bool, config: GenerationConfig):
        key = (prompt, chat, config)
        if key not in cache:
            with torch.inference_mode():
                cache[key] = engine.generate([Request(ids(prompt, chat), config)])[0]
        return cache[key]

    offline.ids = ids
    offline.tokenizer = tok
    return offline


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    target, _ = tiny_target(seed=0)
    torch.manual_seed(0)
    head_dir = save_head(DraftHead.for_target(target.model, "eagle3", draft_vocab_size=64),
                         tmp_path_factory.mktemp("head"))
    # `serve`'s default: the acceptance-aware dispatcher (over hand-made costs here: no calibration in tests)
    costs = CostTable({(b, n): 0.01 + 0.001 * n * b for b in (1, 4) for n in (1, 2, 4, 8, 16)},
                      {(b, c.label): 0.002 * c.num_nodes for b in (1, 4) for c in DEFAULT_CANDIDATES})
    proposer = build_proposer(target, DraftOptions(draft=str(head_dir)),
                              dispatcher_factory=lambda *_: AdaptiveDispatcher(costs, repick_every=2, probe_every=3))
    app = create_app(target, proposer, ServerConfig(MODEL, max_batch_size=4, max_queue=32, max_model_len=256))
    with serving(app) as url:
        yield url, app.state.server


@pytest.fixture(scope="module")
def replay_server(reference):
    target, _ = tiny_target(seed=0)
    continuations = {}
    for p in PROMPTS:
        for chat in (True, False):
            c = reference(p, chat, greedy(60, ignore_eos=True))
            continuations[tuple(c.prompt_ids)] = c.token_ids
    app = create_app(target, ReplayProposer(continuations, REPLAY_DEPTH),
                     ServerConfig(MODEL, max_batch_size=4, max_queue=8, max_model_len=256))
    with serving(app) as url:
        yield url, app.state.server


POISON = [300, 301, 300, 301]  # a prompt whose prefill makes FaultyModel raise


class FaultyModel:
    """The target model with a fixed delay per forward (so a request is still running when a test needs it)
    that raises when it prefills the POISON prompt (an engine failure the server must survive)."""

    def __init__(self, model, delay_s: float):
        self._model, self._delay_s = model, delay_s

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, tokens, *args, **kwargs):
        if tokens.shape[1] >= len(POISON) and tokens[:, : len(POISON)].tolist().count(POISON):
            raise RuntimeError("injected failure")
        time.sleep(self._delay_s)
        return self._model(tokens, *args, **kwargs)


@pytest.fixture(scope="module")
def small_server():
    target, _ = tiny_target(seed=0)
    target.model = FaultyModel(target.model, 0.005)  # 400 tokens take >= 2 s
    app = create_app(target, None, ServerConfig(MODEL, max_batch_size=1, max_queue=0, max_model_len=512,
                                                api_key="sekrit"))
    with serving(app) as url:
        yield url, app.state.server


def metrics(url: str, **headers) -> dict[tuple, float]:
    """{(sample name, sorted label items): value} from /metrics (parsed with prometheus_client's parser)."""
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert r.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def chat(c: openai.OpenAI, prompt: str, stream: bool = False, **kw) -> tuple[str, str, object]:
    """(text, finish_reason, usage) of one chat completion, streamed or not."""
    msgs = [{"role": "user", "content": prompt}]
    if not stream:
        r = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    text, finish, usage = "", None, None
    for ch in c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, stream=True,
                                        stream_options={"include_usage": True}, **kw):
        if ch.usage is not None:
            usage = ch.usage
        for choice in ch.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish, usage


def complete(c: openai.OpenAI, prompt: str, stream: bool = False, **kw) -> tuple[str, str, object]:
    if not stream:
        r = c.completions.create(model=MODEL, prompt=prompt, temperature=0, **kw)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    text, finish, usage = "", None, None
    for ch in c.completions.create(model=MODEL, prompt=prompt, temperature=0, stream=True,
                                   stream_options={"include_usage": True}, **kw):
        if ch.usage is not None:
            usage = ch.usage
        for choice in ch.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    return text, finish, usage


def assert_matches(got, expected) -> None:
    text, finish, usage = got
    assert text == expected.text
    assert finish == expected.finish_reason
    assert usage.prompt_tokens == len(expected.prompt_ids)
    assert usage.completion_tokens == len(expected.token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


# ---------------------------------------------------------------------------------------------- tests


def test_health_and_models(spec_server):
    url, _ = spec_server
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    models = client(url).models.list()
    assert [m.id for m in models.data] == [MODEL]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("speculative", [None, False])
def test_greedy_output_equals_offline_engine(spec_server, reference, stream, speculative):
    url, _ = spec_server
    c = client(url)
    extra = {} if speculative is None else {"extra_body": {"speculative": speculative}}
    for p in PROMPTS[:3]:
        assert_matches(chat(c, p, stream, max_tokens=20, **extra), reference(p, True, greedy(20)))
        assert_matches(complete(c, p, stream, max_tokens=20, **extra), reference(p, False, greedy(20)))


def test_sse_wire_format(spec_server):
    url, _ = spec_server
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 8,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(ch["object"] == "chat.completion.chunk" and ch["id"] == chunks[0]["id"] for ch in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert all(ch["usage"] is None for ch in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    # completions: text deltas, no role chunk, no usage chunk unless asked for
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(ch["object"] == "text_completion" and len(ch["choices"]) == 1 for ch in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_sixteen_concurrent_requests(spec_server, reference):
    url, state = spec_server
    c = client(url)
    jobs = []
    for i in range(16):
        p, is_chat, stream = PROMPTS[i % len(PROMPTS)], i % 2 == 0, i % 4 < 2
        extra = {"extra_body": {"speculative": False}} if i % 3 == 0 else {}
        jobs.append((p, is_chat, stream, 12 + i % 5, extra))

    def run(job):
        p, is_chat, stream, n, extra = job
        return (chat if is_chat else complete)(c, p, stream, max_tokens=n, **extra)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, jobs))
    for (p, is_chat, _, n, _), got in zip(jobs, results):
        assert_matches(got, reference(p, is_chat, greedy(n)))
    assert state.scheduler.queue_depth() == 0


def test_stop_strings_and_max_tokens_cut_inside_multi_token_commits(replay_server, reference):
    url, _ = replay_server
    c = client(url)
    p = PROMPTS[0]
    full = reference(p, True, greedy(40, ignore_eos=True)).text
    # a 2-character stop string (first occurrence at i) whose completing token is not the first of a commit
    for i in range(2, len(full) - 1):
        stop = full[i:i + 2]
        if "\ufffd" in stop or full.find(stop) != i:
            continue
        expected = reference(p, True, greedy(40, stop=[stop], ignore_eos=True))
        if (len(expected.token_ids) - 1) % (REPLAY_DEPTH + 1) != 0:
            break
    else:
        pytest.fail("no usable stop string in the reference text")
    assert expected.text == full[:i] and expected.finish_reason == "stop"
    for stream in (False, True):
        got = chat(c, p, stream, max_tokens=40, stop=[stop, "zzzz-never"], extra_body={"ignore_eos": True})
        assert_matches(got, expected)
    # budget ending inside a 5-token commit: 1 (prefill) + 5 + 5 > 9
    for stream in (False, True):
        got = complete(c, p, stream, max_tokens=9, extra_body={"ignore_eos": True})
        assert_matches(got, reference(p, False, greedy(9, ignore_eos=True)))
        assert got[1] == "length" and got[2].completion_tokens == 9


def test_acceptance_metrics_with_a_drafter_that_knows_the_answer(replay_server):
    url, _ = replay_server
    before = metrics(url)
    steps = 4
    n = 1 + steps * (REPLAY_DEPTH + 1)  # prefill token + 4 fully accepted 5-token steps
    _, finish, usage = complete(client(url), PROMPTS[2], max_tokens=n, extra_body={"ignore_eos": True})
    assert usage.completion_tokens == n and finish == "length"
    after = metrics(url)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("eaglespec_spec_decode_tokens_total") == n - 1
    assert delta("eaglespec_spec_target_forwards_total") == steps
    for d in range(1, REPLAY_DEPTH + 1):
        assert delta("eaglespec_spec_accepted_per_position_total", position=str(d)) == steps
    assert after[("eaglespec_mean_acceptance_length", ())] > 1.0
    assert delta("eaglespec_generation_tokens_total") == n
    assert delta("eaglespec_requests_total", route="/v1/completions", status="200") == 1
    assert delta("eaglespec_time_to_first_token_seconds_count") == 1
    assert delta("eaglespec_inter_token_latency_seconds_count") == n - 1


def test_metrics_parse_and_count(spec_server):
    url, _ = spec_server
    before = metrics(url)
    complete(client(url), PROMPTS[0], max_tokens=12, extra_body={"ignore_eos": True})
    httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1})
    after = metrics(url)
    # every verification round is counted under the tree the dispatcher chose; its prediction is a gauge
    rounds = {k: v - before.get(k, 0) for k, v in after.items() if k[0] == "eaglespec_spec_tree_rounds_total"}
    assert sum(rounds.values()) == 11 == (after[("eaglespec_spec_target_forwards_total", ())]
                                          - before.get(("eaglespec_spec_target_forwards_total", ()), 0))
    assert {dict(k[1])["tree"] for k, v in rounds.items() if v} <= {"none", *(c.label for c in DEFAULT_CANDIDATES)}
    assert after[("eaglespec_spec_predicted_speedup", ())] > 0
    # the step-cost feedback's state: measured / calibrated seconds per batch, tree and context band, and the
    # correction of each drafting tree's price (never below 1)
    ratios = {dict(k[1])["tree"]: v for k, v in after.items() if k[0] == "eaglespec_spec_cost_ratio"}
    assert ratios and all(0.5 <= v <= 2.0 for v in ratios.values())
    assert all(v >= 1.0 for k, v in after.items() if k[0] == "eaglespec_spec_cost_factor")
    for route, status in (("/v1/completions", "200"), ("/v1/completions", "400")):
        key = ("eaglespec_requests_total", (("route", route), ("status", status)))
        assert after[key] - before.get(key, 0) == 1
    assert after[("eaglespec_prompt_tokens_total", ())] > before.get(("eaglespec_prompt_tokens_total", ()), 0)
    assert after[("eaglespec_queue_depth", ())] == 0
    assert after[("eaglespec_running_requests", (("engine", "speculative"),))] == 0
    assert ("eaglespec_inter_token_latency_seconds_bucket", (("le", "+Inf"),)) in after


def _wait_until(cond, what: str, tries: int = 100) -> None:
    for _ in range(tries):
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_client_disconnect_frees_the_slot(spec_server):
    url, state = spec_server
    engine = state.scheduler.engines["speculative"]
    key = ("eaglespec_requests_finished_total", (("finish_reason", "cancelled"),))
    cancelled = metrics(url).get(key, 0)
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 200,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert len(engine.active) == 1
    # the connection is closed mid-stream: the sequence must be cancelled and its row freed
    _wait_until(lambda: not engine.active and len(engine.free_rows) == engine.max_batch_size, "the row to be freed")
    _wait_until(lambda: metrics(url).get(key, 0) == cancelled + 1, "the cancellation to be counted")
    assert chat(client(url), PROMPTS[0], max_tokens=3)[2].completion_tokens >= 1


def C(**fields) -> dict:
    """A valid chat body with `fields` changed."""
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def X(**fields) -> dict:
    """A valid completions body with `fields` changed."""
    return {"model": MODEL, "prompt": "hi", **fields}


BAD_REQUESTS = [
    # (route, body (dict or raw bytes), status, param, fragment of the message)
    ("chat", b'{"model": "tiny", "messages": [', 400, None, "not valid JSON"),
    ("chat", b"[1, 2]", 400, None, "JSON object"),
    ("chat", {"model": MODEL}, 400, "messages", "required"),
    ("chat", C(messages=[]), 400, "messages", "at least 1"),
    ("chat", C(messages="hi"), 400, "messages", ""),
    ("chat", C(messages=[{"role": "user"}]), 400, "messages.0.content", "required"),
    ("chat", C(messages=[{"role": "tool", "content": "x"}]), 400, "messages.0.role", ""),
    ("chat", {"messages": [{"role": "user", "content": "hi"}]}, 400, "model", "required"),
    ("chat", C(model="gpt-4"), 404, "model", "gpt-4"),
    ("chat", C(max_tokens="ten"), 400, "max_tokens", "integer"),
    ("chat", C(max_tokens=-5), 400, "max_tokens", "greater than or equal to 1"),
    ("chat", C(max_tokens=0), 400, "max_tokens", ""),
    ("chat", C(max_tokens=10**12), 400, "max_tokens", "context"),
    ("chat", C(max_completion_tokens=10**6), 400, "max_completion_tokens", "context"),
    ("chat", C(messages=[{"role": "user", "content": "fox " * 400}]), 400, "messages", "context"),
    ("chat", C(temperature=-1), 400, "temperature", "temperature must be finite and >= 0"),
    ("chat", C(temperature=float("inf")), 400, "temperature", "finite"),
    ("completions", X(temperature=float("nan")), 400, "temperature", "finite"),
    ("chat", C(temperature="hot"), 400, "temperature", ""),
    ("chat", C(top_p=0), 400, "top_p", ""),
    ("chat", C(top_k=-2), 400, "top_k", ""),
    ("chat", C(n=2), 400, "n", "n=1"),
    ("chat", C(logprobs=True), 400, "logprobs", "logprobs"),
    ("chat", C(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools", "tool"),
    ("chat", C(response_format={"type": "json_object"}), 400, "response_format", "response_format"),
    ("chat", C(presence_penalty=0.5), 400, "presence_penalty", "penalties"),
    ("chat", C(frequency_penalty=1.0), 400, "frequency_penalty", "penalties"),
    ("chat", C(logit_bias={"5": 10}), 400, "logit_bias", "logit_bias"),
    ("chat", C(store=True), 400, "store", "Unrecognized request argument"),
    ("chat", C(stop=[1]), 400, "stop", ""),
    ("chat", C(stop=""), 400, "stop", "non-empty"),
    ("chat", C(stream_options={"include_usage": True}), 400, "stream_options", "stream"),
    ("chat", C(max_tokens=5, max_completion_tokens=6), 400, "max_completion_tokens", "disagree"),
    ("chat", C(speculative="yes"), 400, "speculative", ""),
    ("completions", X(prompt=["a", "b"]), 400, "prompt", "one prompt"),
    ("completions", X(prompt=[5, 99999]), 400, "prompt", "vocabulary"),
    ("completions", X(prompt="  "), 400, "prompt", "empty"),
    ("completions", X(echo=True), 400, "echo", "echo"),
    ("completions", X(best_of=3), 400, "best_of", ""),
]


@pytest.mark.parametrize("route,body,status,param,fragment", BAD_REQUESTS)
def test_bad_input_gets_a_4xx_error_body(spec_server, route, body, status, param, fragment):
    url, _ = spec_server
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{url}{path}", content=content, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and fragment in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_server_survives_bad_input(spec_server):
    url, _ = spec_server
    big = b'{"model": "tiny", "prompt": "' + b"a" * (1 << 20) + b'"}'
    r = httpx.post(f"{url}/v1/completions", content=big, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    nan = b'{"model": "tiny", "prompt": "x", "temperature": NaN}'  # Python's json accepts NaN; we must not
    r = httpx.post(f"{url}/v1/completions", content=nan, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.get(f"{url}/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(f"{url}/v1/completions").status_code == 405
    with client(url).with_options(timeout=30) as c:
        with pytest.raises(openai.BadRequestError, match="n=1"):
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=3)
        assert chat(c, PROMPTS[0], max_tokens=4)[2].completion_tokens >= 1


def test_api_key_queue_limit_and_vanilla_only_server(small_server):
    url, state = small_server
    assert httpx.get(f"{url}/health").status_code == 200  # open without a key
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
        for path in ("/v1/models", "/metrics"):
            r = httpx.get(f"{url}{path}", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(url, "wrong").models.list()
    c = client(url, "sekrit")
    assert chat(c, PROMPTS[0], max_tokens=3)[2].completion_tokens >= 1
    with pytest.raises(openai.BadRequestError, match="draft head"):
        c.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"speculative": True})
    # one row and no queue: a second request while one runs gets 429, then the freed row admits again
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 400, "stream": True, "ignore_eos": True}
    auth = {"Authorization": "Bearer sekrit"}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=auth, timeout=30) as r:
        lines = r.iter_lines()  # keep a reference: a discarded iterator closes the connection
        next(lines)
        busy = httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, headers=auth, timeout=30)
        assert busy.status_code == 429 and "--max-queue" in busy.json()["error"]["message"]
    engine = state.scheduler.engines["vanilla"]
    _wait_until(lambda: not engine.active, "the cancelled stream to free its row")
    assert complete(c, PROMPTS[2], max_tokens=3)[2].completion_tokens >= 1
    assert metrics(url, **auth)[("eaglespec_requests_total", (("route", "/v1/completions"), ("status", "429")))] == 1
    # a non-streaming request whose client gives up is cancelled too (the server polls for the disconnect)
    cancelled = ("eaglespec_requests_finished_total", (("finish_reason", "cancelled"),))
    assert metrics(url, **auth)[cancelled] == 1
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, headers=auth, timeout=0.5)
    _wait_until(lambda: metrics(url, **auth).get(cancelled) == 2, "the cancellation of the abandoned request")
    _wait_until(lambda: not engine.active, "its row to be freed")


def test_engine_failure_fails_its_requests_and_the_server_goes_on(small_server):
    url, _ = small_server
    auth = {"Authorization": "Bearer sekrit"}
    for stream in (False, True):
        r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": POISON, "max_tokens": 4,
                                                      "stream": stream}, headers=auth, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert complete(client(url, "sekrit"), PROMPTS[3], max_tokens=3)[2].completion_tokens >= 1
    assert metrics(url, **auth)[("eaglespec_requests_finished_total", (("finish_reason", "error"),))] == 2


def test_feedback_metrics_keep_tree_labels_that_contain_colons():
    """The dynamic tree's label holds a colon ("dynamic5x4:16"): its gauges carry it whole, with its batch size and
    context band (a key joined with colons and split again broke on it)."""
    from prometheus_client import generate_latest

    from eaglespec.serve.scheduler import ServerMetrics
    from eaglespec.spec.costmodel import StepCostFeedback

    fb = StepCostFeedback(decay=1.0, min_weight=1)
    fb.observe(4, "dynamic5x4:16", 0.030, 0.020, context=300)
    fb.observe(4, "none", 0.010, 0.010, context=300)
    m = ServerMetrics()
    m.on_feedback(fb)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(generate_latest(m.registry).decode()) for s in fam.samples}
    key = (("batch", "4"), ("context", "256-512"), ("tree", "dynamic5x4:16"))
    assert got[("eaglespec_spec_cost_ratio", key)] == 1.5 and got[("eaglespec_spec_cost_factor", key)] == 1.5
    assert got[("eaglespec_spec_cost_ratio", (("batch", "4"), ("context", "256-512"), ("tree", "none")))] == 1.0
    assert not any(k[0] == "eaglespec_spec_cost_factor" and ("tree", "none") in k[1] for k in got)
