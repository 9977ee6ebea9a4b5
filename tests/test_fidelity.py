"""`eaglespec fidelity`: answer comparison, perplexity and refusals."""

import math

import pytest
import torch

from eaglespec.measure.fidelity import _ppl_text, compare, perplexity
from helpers import tiny_target


def test_compare_counts_identical_answers_and_first_differences():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    got = [[1, 2, 3, 4], [5, 6, 0, 8], [0, 9, 9, 9]]
    identical, first, agree = compare(got, ref)
    assert identical == 1
    assert first == (2 + 0) / 2
    assert agree == (4 + 2 + 0) / 12


def test_compare_treats_a_shorter_answer_as_differing_where_it_ends():
    identical, first, _ = compare([[1, 2]], [[1, 2, 3]])
    assert identical == 0 and first == 2


def test_perplexity_is_exp_of_the_mean_next_token_nll():
    target, _ = tiny_target("llama")
    ids = [[3, 7, 11, 4, 9], [5, 6]]
    got, n = perplexity(target, ids)
    model = target.model
    nll = 0.0
    with torch.inference_mode():
        for seq in ids:
            t = torch.tensor([seq])
            out = model(t, torch.arange(len(seq))[None], model.new_cache(1, len(seq)), logits_at="all")
            nll -= float(torch.log_softmax(out.logits[0, :-1], -1).gather(-1, t[0, 1:, None]).sum())
    assert n == 5
    assert got == pytest.approx(math.exp(nll / 5), rel=1e-5)


def test_perplexity_text_needs_a_question():
    assert _ppl_text({"question": "q", "answer": "a"}, "f") == "q\na"
    with pytest.raises(ValueError, match="no question"):
        _ppl_text({"text": "x"}, "f.jsonl")


def test_a_kernel_suffix_on_anything_but_int4_is_refused_before_loading():
    from types import SimpleNamespace

    from eaglespec.measure.fidelity import run

    args = SimpleNamespace(dtypes="float32,bfloat16:w4a8", max_new_tokens=8, limit=1, ppl_limit=1, ppl_max_len=16)
    with pytest.raises(ValueError, match="bfloat16:w4a8: only int4 takes a kernel"):
        run(args)


def test_a_prompt_dtype_on_an_unpacked_precision_or_an_unknown_one_is_refused():
    from types import SimpleNamespace

    from eaglespec.measure.fidelity import run

    for dtypes, why in (("float32,bfloat16@float32", "only packed precisions"),
                        ("int4:w4a8@float16", "unknown prompt dtype 'float16'")):
        args = SimpleNamespace(dtypes=dtypes, max_new_tokens=8, limit=1, ppl_limit=1, ppl_max_len=16)
        with pytest.raises(ValueError, match=why):
            run(args)


def test_prompt_path_perplexity_of_a_float32_model_is_the_decode_paths():
    """A float32 model runs prompts with the same weights: scoring as one prompt forward changes only rounding."""
    target, _ = tiny_target("llama")
    ids = [[3, 7, 11, 4, 9, 12, 30, 31], [5, 6, 8]]
    assert perplexity(target, ids, prefill=True)[0] == pytest.approx(perplexity(target, ids)[0], rel=1e-5)
