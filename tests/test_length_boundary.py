"""The context boundary mid-speculation: a sequence whose last verification step would run the draft tree past
the KV cache (the model's maximum length) must end with finish_reason "length" and the same tokens as vanilla
greedy decoding, never an index error or a silently overwritten cache slot; one token more is refused up front.

Tiny random Llama with max_position_embeddings = 40; drafters: a random EAGLE-3 head with a deep chain and with a
dynamic tree (wide trees: slack 17 of the 40 slots), and a drafter that knows the answer (every step commits
depth + 1 tokens, so the boundary falls inside a multi-token commit).
"""

from __future__ import annotations

import pytest
import torch
from starlette.testclient import TestClient

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.heads import DraftHead, save_head
from eaglespec.spec.proposer import ReplayProposer
from eaglespec.serve.server import ServerConfig, create_app
from eaglespec.spec.speculative import DraftOptions, build_proposer
from helpers import tiny_target

CONTEXT = 40
PROMPT = [5, 17, 60, 61, 99, 120, 7, 8, 9, 33, 34, 35]


def greedy(n: int) -> GenerationConfig:
    return GenerationConfig(n, SamplingParams(temperature=0.0), (), ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=0, max_position_embeddings=CONTEXT)[0]


@pytest.fixture(scope="module")
def head_dir(target, tmp_path_factory):
    torch.manual_seed(0)
    return save_head(DraftHead.for_target(target.model, "eagle3", draft_vocab_size=64), tmp_path_factory.mktemp("h"))


@pytest.fixture(scope="module")
def vanilla(target):
    """prompt -> the greedy continuation that fills the whole context (vanilla engine, slack 1)."""
    engine = Engine(target)
    cache = {}

    def run(prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in cache:
            with torch.inference_mode():
                cache[key] = engine.generate([Request(prompt, greedy(CONTEXT - len(prompt) - 1))])[0].token_ids
        return cache[key]

    return run


PROPOSERS = {
    "chain8": dict(tree="chain", depth=8),
    "dynamic": dict(tree="dynamic", depth=6, topk=4, tree_tokens=16),
}


def make_proposer(name, target, head_dir, vanilla):
    if name == "replay":
        return ReplayProposer({tuple(PROMPT[:k]): vanilla(PROMPT[:k]) for k in range(1, len(PROMPT) + 1)}, 6)
    return build_proposer(target, DraftOptions(draft=str(head_dir), **PROPOSERS[name]))


@pytest.mark.parametrize("name", ["chain8", "dynamic", "replay"])
def test_speculation_up_to_the_last_slot_ends_with_length(name, target, head_dir, vanilla):
    proposer = make_proposer(name, target, head_dir, vanilla)
    engine = Engine(target, proposer, max_batch_size=3, max_len=CONTEXT)
    slack = engine.slack
    assert slack >= 7
    # Prompt lengths that put the boundary at every offset inside a (depth + 1)-token commit.
    prompts = [PROMPT[:k] for k in range(1, len(PROMPT) + 1)]
    requests = [Request(p, greedy(CONTEXT - slack - len(p))) for p in prompts]
    with torch.inference_mode():
        for i, r in enumerate(requests):  # submit/step (the server's path), three rows sharing the batch
            engine.submit(i, r)
        done = {}
        while not engine.idle:
            engine.step(lambda c: done.__setitem__(c.index, c))
        offline = Engine(target, proposer, max_batch_size=2).generate(requests)  # stream(): cache sized to fit
    for i, (p, r) in enumerate(zip(prompts, requests)):
        for c in (done[i], offline[i]):
            assert c.finish_reason == "length"
            assert len(c.token_ids) == r.config.max_new_tokens
            assert c.token_ids == vanilla(p)[: r.config.max_new_tokens]
    assert sorted(engine.free_rows) == [0, 1, 2] and engine.cache.lengths.tolist() == [0, 0, 0]


@pytest.mark.parametrize("name", ["chain8", "dynamic"])
def test_one_token_past_the_context_is_refused_up_front(name, target, head_dir, vanilla):
    proposer = make_proposer(name, target, head_dir, vanilla)
    engine = Engine(target, proposer, max_len=CONTEXT)
    p = PROMPT[:5]
    with pytest.raises(ValueError, match="exceeds the context"):
        engine.submit(0, Request(p, greedy(CONTEXT - engine.slack - len(p) + 1)))
    with pytest.raises(ValueError, match="exceeds the context"):
        next(Engine(target, proposer).stream([Request(p, greedy(CONTEXT - engine.slack - len(p) + 1))]))
    assert engine.idle


def test_server_default_max_tokens_runs_to_the_context_and_ends_with_length(target, head_dir, vanilla):
    """Through the server: no max_tokens = fill what the prompt leaves; the response ends with "length"; one
    token more is a 400 context_length_exceeded; a prompt that fills the context is refused."""
    proposer = make_proposer("dynamic", target, head_dir, vanilla)
    app = create_app(target, proposer, ServerConfig("tiny", max_batch_size=2, max_queue=8, max_model_len=CONTEXT))
    slack = app.state.server.scheduler.limits("speculative")[1]
    with TestClient(app) as c:
        for k in (1, 6, 12):
            for stream in (False, True):
                body = {"model": "tiny", "prompt": PROMPT[:k], "temperature": 0, "ignore_eos": True,
                        "stream": stream}
                r = c.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                if stream:
                    assert '"finish_reason":"length"' in r.text and '"error"' not in r.text
                else:
                    out = r.json()
                    assert out["choices"][0]["finish_reason"] == "length"
                    assert out["usage"]["completion_tokens"] == CONTEXT - slack - k
                    assert out["choices"][0]["text"] == target.tokenizer.decode(vanilla(PROMPT[:k])[: CONTEXT - slack - k])
            r = c.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT[:k], "max_tokens": CONTEXT - slack - k + 1})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": [5] * (CONTEXT - slack)})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert c.get("/health").status_code == 200
