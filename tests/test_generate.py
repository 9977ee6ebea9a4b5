"""The generation loop on tiny random models: HF-equivalence, batching, seeds, stop rules, bad input."""

import pytest
import torch

from eaglespec.config import ConfigError, GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
from helpers import tiny_target, tiny_tokenizer

PROMPTS = ["The quick brown fox", "def add(a, b):", "1 2 3 4 5 6", "Café, naïve"]


def encode(p):
    return tiny_tokenizer().encode(p)


def greedy(n, **kw):
    return GenerationConfig(max_new_tokens=n, **kw)


@pytest.fixture(scope="module")
def tiny():
    return tiny_target("llama")


def test_greedy_equals_hf_generate(tiny):
    target, hf = tiny
    engine = Engine(target)
    for p in PROMPTS:
        ids = encode(p)
        ours = engine.generate([Request(ids, greedy(24))])[0]
        with torch.no_grad():  # both stop at EOS (id 2) or after 24 tokens
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                              pad_token_id=0)[0, len(ids):].tolist()
        assert ours.token_ids == ref
        assert ours.stats.new_tokens == len(ref) and ours.stats.target_forwards == len(ref) - 1
        assert ours.finish_reason == ("stop" if ref[-1] == 2 else "length")


@pytest.mark.parametrize("batch_size", [2, 4])
def test_batched_equals_one_by_one(tiny, batch_size):
    target, _ = tiny
    reqs = [Request(encode(p), greedy(n)) for p, n in zip(PROMPTS * 2, [5, 17, 9, 30, 12, 3, 21, 8])]
    alone = [Engine(target).generate([r])[0] for r in reqs]
    together = Engine(target, max_batch_size=batch_size).generate(reqs)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason


def test_seeded_sampling_repeats_and_is_batch_independent(tiny):
    target, _ = tiny
    cfg = GenerationConfig(20, SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=123), ignore_eos=True)
    ids = [encode(p) for p in PROMPTS]
    a = Engine(target).generate([Request(ids[1], cfg)])[0].token_ids
    b = Engine(target).generate([Request(ids[1], cfg)])[0].token_ids
    batched = Engine(target, max_batch_size=4).generate([Request(x, cfg) for x in ids])[1].token_ids
    other = GenerationConfig(20, SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=124), ignore_eos=True)
    c = Engine(target).generate([Request(ids[1], other)])[0].token_ids
    assert a == b == batched
    assert a != c


def test_mixed_sampling_params_in_one_batch(tiny):
    target, _ = tiny
    ids = [encode(p) for p in PROMPTS]
    g = greedy(15, ignore_eos=True)
    s = GenerationConfig(15, SamplingParams(temperature=0.7, seed=5), ignore_eos=True)
    mixed = Engine(target, max_batch_size=4).generate(
        [Request(ids[0], g), Request(ids[1], s), Request(ids[2], g), Request(ids[3], s)])
    assert mixed[0].token_ids == Engine(target).generate([Request(ids[0], g)])[0].token_ids
    assert mixed[1].token_ids == Engine(target).generate([Request(ids[1], s)])[0].token_ids


def test_stream_chunks_add_up_to_the_completion(tiny):
    target, _ = tiny
    req = Request(encode(PROMPTS[0]), greedy(25, ignore_eos=True))
    streamed_ids, streamed_text, finished = [], "", []
    for chunks in Engine(target).stream([req]):
        for c in chunks:
            streamed_ids += c.token_ids
            streamed_text += c.text
            finished.append(c.finished)
    full = Engine(target).generate([req])[0]
    assert streamed_ids == full.token_ids and streamed_text == full.text
    assert finished[-1] and not any(finished[:-1])
    assert full.text == tiny_tokenizer().decode(full.token_ids, skip_special_tokens=True)


def test_stop_string_and_eos_through_the_engine(tiny):
    target, _ = tiny
    ids = encode(PROMPTS[0])
    full = Engine(target).generate([Request(ids, greedy(40, ignore_eos=True))])[0]
    tok = tiny_tokenizer()
    # Pick a stop string from the middle of the greedy continuation.
    text = full.text
    assert len(text) > 10
    # (random weights emit stray bytes that decode to U+FFFD; a stop string is ordinary text)
    start = next(i for i in range(4, len(text) - 3) if "\ufffd" not in text[i : i + 3])
    stop = text[start : start + 3]
    cut = Engine(target).generate([Request(ids, greedy(40, ignore_eos=True, stop=(stop,)))])[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.find(stop)]
    n = next(k for k in range(1, 41) if stop in tok.decode(full.token_ids[:k], skip_special_tokens=True))
    assert cut.token_ids == full.token_ids[:n]
    # EOS: make the 4th greedy token the EOS id; generation must stop right there, EOS counted.
    eos_target = type(target)(**{**vars(target), "eos_token_ids": [full.token_ids[3]]})
    first = full.token_ids.index(full.token_ids[3])
    e = Engine(eos_target).generate([Request(ids, greedy(40))])[0]
    assert e.token_ids == full.token_ids[: first + 1] and e.finish_reason == "stop"


@pytest.mark.parametrize("temperature,message", [(float("inf"), "finite and >= 0"), (-1.0, "finite and >= 0"),
                                                 (float("nan"), "must be a number")])
def test_a_bad_temperature_is_refused_before_anything_runs(temperature, message):
    """Python API: the one rule set refuses it where it enters (not mid-step), naming the parameter."""
    with pytest.raises(ConfigError, match=message) as e:
        SamplingParams(temperature=temperature)
    assert e.value.param == "temperature"


def test_bad_inputs_get_clear_errors(tiny):
    target, _ = tiny
    engine = Engine(target)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([Request([], greedy(5))])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([Request([5, 6], greedy(-1))])
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([Request([5, 6], GenerationConfig(5, SamplingParams(temperature=-0.5)))])
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([Request([5, 6], GenerationConfig(5, SamplingParams(temperature=1.0, top_p=0.0)))])
    with pytest.raises(ValueError, match="context"):
        engine.generate([Request([5] * 500, greedy(100))])
    with pytest.raises(ValueError, match="max_batch_size"):
        Engine(target, max_batch_size=0)


def test_submit_step_cancel_admits_between_steps(tiny):
    target, _ = tiny
    reqs = [Request(encode(p), greedy(12, ignore_eos=True)) for p in PROMPTS]
    alone = {i: Engine(target).generate([r])[0].token_ids for i, r in enumerate(reqs)}
    engine = Engine(target, max_batch_size=2, max_len=128)
    got: dict = {k: [] for k in "abcd"}
    done = {}
    engine.submit("a", reqs[0])
    engine.submit("b", reqs[1])
    for _ in range(3):
        for c in engine.step(on_finish=lambda c: done.__setitem__(c.index, c)):
            got[c.index] += c.token_ids
    engine.submit("c", reqs[2])  # waits: both rows busy
    assert engine.cancel("b")  # frees a row; "c" is admitted at the next step
    engine.submit("d", reqs[3])
    while not engine.idle:
        for c in engine.step(on_finish=lambda c: done.__setitem__(c.index, c)):
            got[c.index] += c.token_ids
    assert got["a"] == alone[0] and got["c"] == alone[2] and got["d"] == alone[3]
    assert "b" not in done and len(got["b"]) < 12  # cancelled: no completion, row freed
    assert not engine.cancel("zzz")
    with pytest.raises(ValueError, match="context"):
        engine.submit("e", Request([5] * 120, greedy(20)))
