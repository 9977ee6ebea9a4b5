"""Exact truncation at EOS, stop strings and the token budget, chunk by chunk."""

import pytest

from eaglespec.engine.stopping import IncrementalDetokenizer, StopChecker
from helpers import tiny_tokenizer

EOS = 2


def ids_of(text):
    return tiny_tokenizer().encode(text)


def feed_in_chunks(checker, ids, size):
    results = []
    for i in range(0, len(ids), size):
        r = checker.feed(ids[i : i + size])
        results.append(r)
        if r.finished:
            break
    return results


def test_incremental_detokenizer_never_splits_multibyte_characters():
    tok = tiny_tokenizer()
    text = "Café naïve 你好，世界！ fox"
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok)
    deltas = [d.add([i]) for i in ids] + [d.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in x for x in deltas)


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_eos_inside_a_chunk_truncates_exactly(chunk):
    body = ids_of("The quick brown fox")
    ids = body + [EOS] + ids_of(" jumps over")
    c = StopChecker(tiny_tokenizer(), [EOS], max_new_tokens=100)
    res = feed_in_chunks(c, ids, chunk)
    kept = [t for r in res for t in r.token_ids]
    assert kept == body + [EOS]  # EOS counted, nothing after it
    assert "".join(r.text for r in res) == "The quick brown fox"
    assert res[-1].finished and res[-1].finish_reason == "stop"


@pytest.mark.parametrize("chunk", [1, 2, 5, 50])
def test_max_new_tokens_inside_a_chunk(chunk):
    ids = ids_of("The quick brown fox jumps over the lazy dog.")
    c = StopChecker(tiny_tokenizer(), [EOS], max_new_tokens=5)
    res = feed_in_chunks(c, ids, chunk)
    kept = [t for r in res for t in r.token_ids]
    assert kept == ids[:5]
    assert "".join(r.text for r in res) == tiny_tokenizer().decode(ids[:5])
    assert res[-1].finish_reason == "length"


@pytest.mark.parametrize("chunk", [1, 4, 50])
def test_stop_string_cuts_text_and_tokens(chunk):
    tok = tiny_tokenizer()
    ids = ids_of("def add(a, b):\n    return a + b\n")
    c = StopChecker(tok, [EOS], max_new_tokens=100, stop=["return"])
    res = feed_in_chunks(c, ids, chunk)
    kept = [t for r in res for t in r.token_ids]
    text = "".join(r.text for r in res)
    assert text == "def add(a, b):\n    "
    # The kept tokens are the shortest prefix whose text contains the stop string.
    n = next(k for k in range(1, len(ids) + 1) if "return" in tok.decode(ids[:k]))
    assert kept == ids[:n]
    assert res[-1].finish_reason == "stop"


def test_stop_string_straddling_chunks_is_not_streamed_early():
    tok = tiny_tokenizer()
    ids = ids_of("The quick brown fox jumps")
    c = StopChecker(tok, [EOS], max_new_tokens=100, stop=["brown fox"])
    streamed = ""
    for t in ids:
        r = c.feed([t])
        streamed += r.text
        assert "brown" not in streamed  # held back until we know it is not the start of the stop string
        if r.finished:
            break
    assert streamed == "The quick "


def test_ignore_eos_keeps_going_and_feed_after_finish_raises():
    c = StopChecker(tiny_tokenizer(), [EOS], max_new_tokens=3, ignore_eos=True)
    r = c.feed([EOS, EOS, EOS, EOS])
    assert r.token_ids == [EOS, EOS, EOS] and r.finish_reason == "length"
    with pytest.raises(RuntimeError):
        c.feed([5])
