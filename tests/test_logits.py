"""Reduced-precision output logits: the best candidates are rescored exactly, so greedy choices equal float32's even
where bfloat16 scores tie, and a row's logits do not depend on the other rows of the batch."""

import pytest
import torch
import torch.nn.functional as F

from eaglespec.runtime.logits import rescored_logits
from eaglespec.runtime.pack import pack_model
from eaglespec.runtime.quant import KernelPlan, PackedLinear
from helpers import tiny_target


def _int8_head(w):
    return PackedLinear.from_float(w, "int8", plan=KernelPlan({"int8": [(1 << 30, "packed")]}))


def test_candidates_get_float32_scores_and_the_rest_keep_the_fast_ones():
    torch.manual_seed(0)
    w, h = torch.randn(500, 64), torch.randn(3, 64)
    fast = _int8_head(w)
    got = rescored_logits(h, fast, w, top=8)
    exact, approx = F.linear(h, w), fast(h).float()
    cand = approx.topk(8, -1).indices
    torch.testing.assert_close(got.gather(-1, cand), exact.gather(-1, cand), rtol=1e-5, atol=1e-5)
    keep = torch.ones_like(got, dtype=torch.bool).scatter_(-1, cand, False)
    assert torch.equal(got[keep], approx[keep])
    assert torch.equal(got.argmax(-1), exact.argmax(-1))


def test_bfloat16_ties_are_broken_by_the_float32_scores():
    # Tokens 3 and 7 score ~20.0 and ~20.02: one bfloat16 step at 20 is 0.125, so the fast scores tie and argmax
    # takes the lower index (3); the float32 winner is 7.
    h = torch.zeros(1, 16)
    h[0, 0] = 1.0
    w = torch.zeros(10, 16)
    w[3, 0], w[7, 0] = 20.0, 20.02
    fast = lambda x: F.linear(x.bfloat16(), w.bfloat16())  # noqa: E731
    assert int(fast(h).float().argmax()) == 3
    assert int(rescored_logits(h, fast, w, top=4).argmax()) == 7


def test_a_rows_logits_do_not_depend_on_the_batch():
    torch.manual_seed(1)
    w, h = torch.randn(4000, 96), torch.randn(2, 5, 96)
    fast = _int8_head(w)
    together = rescored_logits(h, fast, w)
    for b in range(2):
        for t in range(5):
            alone = rescored_logits(h[b : b + 1, t : t + 1], fast, w)
            assert torch.equal(alone[0, 0], together[b, t])


def test_mismatched_weight_is_refused():
    w = torch.randn(50, 8)
    with pytest.raises(ValueError, match="50 rows"):
        rescored_logits(torch.randn(1, 8), lambda x: torch.zeros(1, 40), w)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_packed_models_rank_in_their_format_and_pick_float32_winners(fmt):
    torch.manual_seed(2)
    model = tiny_target()[0].model
    tokens = torch.randint(0, model.args.vocab_size, (2, 6))
    positions = torch.arange(6).expand(2, 6)
    want = model(tokens, positions, model.new_cache(2, 16), logits_at="all").logits
    pack_model(model, fmt)
    assert model.lm_head_packed is not None and model.lm_head_packed.fmt == fmt
    hidden = model(tokens, positions, model.new_cache(2, 16)).hidden
    got = model.output_logits(hidden)
    cand = got.topk(4, -1).indices
    torch.testing.assert_close(got.gather(-1, cand), F.linear(hidden, model.lm_head_weight).gather(-1, cand),
                               rtol=1e-5, atol=1e-5)
    assert got.dtype == torch.float32 and got.shape == want.shape
