"""Protocol fuzzing of `eaglespec serve` (hypothesis, seeded and bounded): arbitrary JSON documents, raw bytes,
and schema-shaped requests whose fields hold wrong types, NaN/inf, huge numbers, huge stop lists, unknown
fields or unknown models, against the FastAPI app in-process (starlette's TestClient) with a tiny random target
and a random EAGLE-3 head. Every answer must be a 2xx, or a 4xx whose JSON error body names the problem; never a
500, and never an error event inside a 200 stream.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from eaglespec.spec.heads import DraftHead, save_head
from eaglespec.spec.sampling import process_logits
from eaglespec.serve.server import ServerConfig, create_app
from eaglespec.spec.speculative import DraftOptions, build_proposer
from helpers import tiny_target

MODEL = "tiny"
ROUTES = ("/v1/chat/completions", "/v1/completions")
FUZZ = settings(derandomize=True, max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    """A TestClient over a speculative + vanilla server with a short context (64 slots), so any request the
    fuzzer gets through generates at most a few dozen tokens."""
    target, _ = tiny_target(seed=0)
    torch.manual_seed(0)
    head_dir = save_head(DraftHead.for_target(target.model, "eagle3", draft_vocab_size=64),
                         tmp_path_factory.mktemp("head"))
    proposer = build_proposer(target, DraftOptions(draft=str(head_dir), tree="dynamic", depth=3))
    app = create_app(target, proposer, ServerConfig(MODEL, max_batch_size=2, max_queue=64, max_model_len=64))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def check(r) -> None:
    """2xx, or 4xx with an OpenAI-shaped error body; a 200 stream must not carry an error event."""
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"], err
        assert err["type"] in ("invalid_request_error", "rate_limit_error"), err
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", r.text[-300:]
        for e in events[:-1]:
            assert "error" not in json.loads(e), e
    else:
        body = r.json()
        assert body["choices"][0]["finish_reason"] in ("stop", "length"), body


def post(c, path: str, content: bytes, content_type: str = "application/json"):
    return c.post(path, content=content, headers={"content-type": content_type})


# ---------------------------------------------------------------------------------------- strategies

json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**80), max_value=2**80)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
# Values of the right type near and past every boundary, plus every wrong type.
numbers = st.sampled_from([0, 1, -1, 2, 3, 0.5, 1e-300, 5e-324, -0.0, 1e300, 2**31, 2**63, 2**64, -(2**63) - 1,
                           10**30, math.nan, math.inf, -math.inf, 1.0000001, 2.0000001, 1e-8])
wild = numbers | json_values
token_ids = st.lists(st.integers(min_value=-5, max_value=400) | st.sampled_from([2**63, -(2**63), 10**20]),
                     max_size=8)
stops = (st.text(max_size=4) | st.lists(st.text(max_size=3), max_size=40)
         | st.lists(st.text(min_size=1, max_size=2000), min_size=1, max_size=3))
models = st.sampled_from([MODEL, MODEL + " ", "TINY", "", "/etc/passwd", "../tiny", "./tiny", "~/tiny",
                          "file:///etc/passwd", "tiny\x00", "/tmp"]) | st.text(max_size=12)
message_content = (st.text(max_size=40) | st.sampled_from(["\ud800", "a\udfffb", "\x00", "<|im_end|>" * 3])
                   | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                     "text": st.text(max_size=20)}), max_size=3))
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                                           "content": message_content}), max_size=3) | wild
FIELDS = {
    "max_tokens": st.integers(min_value=-2, max_value=80) | wild,
    "max_completion_tokens": st.integers(min_value=-2, max_value=80) | wild,
    "temperature": st.floats(min_value=0, max_value=2) | wild,
    "top_p": st.floats(min_value=0, max_value=1) | wild,
    "top_k": st.integers(min_value=-2, max_value=1000) | wild,
    "seed": numbers | st.integers() | wild,
    "n": numbers | wild,
    "stop": stops | wild,
    "stream": st.booleans() | wild,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | wild,
    "logit_bias": st.dictionaries(st.text(max_size=5), numbers, max_size=3) | wild,
    "presence_penalty": numbers | wild,
    "frequency_penalty": numbers | wild,
    "speculative": st.booleans() | st.none() | wild,
    "ignore_eos": st.booleans() | wild,
    "user": st.text(max_size=10) | wild,
    "logprobs": wild,
    "response_format": wild,
    "tools": wild,
    "echo": wild,
    "best_of": wild,
}


@st.composite
def shaped_requests(draw):
    """A request with the right skeleton for its route and a random subset of fields holding edge values."""
    chat = draw(st.booleans())
    body = {"model": draw(models) if draw(st.integers(0, 4)) == 0 else MODEL}
    if chat:
        body["messages"] = draw(messages) if draw(st.integers(0, 2)) == 0 else [
            {"role": "user", "content": draw(message_content)}]
    else:
        body["prompt"] = draw(st.text(max_size=40) | token_ids | st.lists(token_ids, max_size=2) | wild)
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        body[name] = draw(FIELDS[name])
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(min_size=1, max_size=8))] = draw(json_values)  # an unknown (or duplicated) field
    if draw(st.integers(0, 3)) == 0:
        body.pop(draw(st.sampled_from(sorted(body))))  # a missing required field (sometimes)
    # Keep generation short whatever else was drawn (unless the fuzzer chose max_tokens itself).
    body.setdefault("max_tokens", 4)
    return ROUTES[0] if chat else ROUTES[1], body


# ---------------------------------------------------------------------------------------------- tests


@FUZZ
@given(doc=json_values, route=st.sampled_from(ROUTES))
def test_arbitrary_json_documents(app_client, doc, route):
    check(post(app_client, route, json.dumps(doc).encode()))


@FUZZ
@given(raw=st.binary(max_size=200) | st.sampled_from([b"", b"{", b'{"model": "tiny"', b"\xff\xfe{}", b"[]" * 50,
                                                      b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000,
                                                      b'\xef\xbb\xbf{"model": "tiny"}', b"null", b"1e999999"]),
       route=st.sampled_from(ROUTES), ctype=st.sampled_from(["application/json", "text/plain", ""]))
def test_raw_byte_bodies(app_client, raw, route, ctype):
    check(post(app_client, route, raw, ctype))


@settings(FUZZ, max_examples=150)
@given(req=shaped_requests())
def test_schema_shaped_but_wrong_requests(app_client, req):
    route, body = req
    check(post(app_client, route, json.dumps(body).encode()))


@pytest.mark.parametrize("model", ["/etc/passwd", "../tiny", "./tiny", "file:///etc/hostname", "/tmp", "."])
def test_a_model_that_is_a_path_is_an_unknown_model(app_client, model):
    """No request field makes the server read a path: a filesystem path as `model` is just an unknown name."""
    r = app_client.post(ROUTES[1], json={"model": model, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_the_server_still_answers_after_fuzzing(app_client):
    r = app_client.post(ROUTES[1], json={"model": MODEL, "prompt": "The quick", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(app_client.get("/metrics").text) for s in fam.samples}
    assert metrics.get(("eaglespec_requests_finished_total", (("finish_reason", "error"),)), 0) == 0
    assert not any(name == "eaglespec_requests_total" and dict(labels)["status"].startswith("5") and value
                   for (name, labels), value in metrics.items())


@pytest.mark.parametrize("temperature,top_p", [(1e-300, 1.0), (5e-324, 1.0), (1e-40, 1.0), (1.0, 1e-300),
                                               (1.0, 5e-324)])
def test_extreme_sampling_values_behave_like_their_limit(app_client, temperature, top_p):
    """A temperature or top_p too small for float32 is (in the limit) greedy: the same tokens as temperature 0,
    not NaN probabilities that silently sample token 0. (Found by the fuzzer: a 200 with an empty text.)"""
    logits = torch.randn(3, 50) * 5
    probs = process_logits(logits, temperature, 0, top_p)
    assert torch.equal(probs, process_logits(logits, 0.0)), probs
    body = {"model": MODEL, "prompt": "The quick", "max_tokens": 6, "ignore_eos": True}
    greedy = app_client.post(ROUTES[1], json={**body, "temperature": 0}).json()
    r = app_client.post(ROUTES[1], json={**body, "temperature": temperature, "top_p": top_p, "seed": 1}).json()
    assert r["choices"][0]["text"] == greedy["choices"][0]["text"] and r["usage"] == greedy["usage"]


def test_binding_beyond_localhost_without_a_key_warns():
    import argparse

    from eaglespec.serve.cli import exposure_warning, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["serve"]).host == "127.0.0.1"  # localhost unless told otherwise
    for host in ("127.0.0.1", "localhost", "::1"):
        assert exposure_warning(host, None) is None
    for host in ("0.0.0.0", "::", "192.168.1.5"):
        assert "without an API key" in exposure_warning(host, None)
        assert exposure_warning(host, "sekrit") is None
