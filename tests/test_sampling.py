"""process_logits, sample_from_probs and draw_uniforms: hand-computed values, edge cases, statistics."""

from __future__ import annotations

import math

import pytest
import torch

from eaglespec.config import ConfigError, SamplingParams
from eaglespec.spec.sampling import draw_uniforms, one_token_acceptance, process_logits, sample_from_probs
from stats import P_VALUE_MIN, chi2_sf_wilson_hilferty, chi_square

def test_chi2_fallback_matches_scipy():
    chi2 = pytest.importorskip("scipy.stats").chi2
    for dof in (7, 14, 76, 215):
        crit = chi2.isf(1e-3, dof)
        assert chi2_sf_wilson_hilferty(crit, dof) == pytest.approx(1e-3, rel=0.15)
        assert chi2_sf_wilson_hilferty(dof, dof) == pytest.approx(chi2.sf(dof, dof), rel=0.05)


# --------------------------------------------------------------------------------------------- process_logits


def _logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()


def test_temperature_scaling():
    logits = torch.tensor([0.0, math.log(2), math.log(4)])
    assert torch.allclose(process_logits(logits, 1.0), torch.tensor([1, 2, 4]) / 7)
    assert torch.allclose(process_logits(logits, 0.5), torch.tensor([1, 4, 16]) / 21)  # logits doubled
    assert torch.allclose(process_logits(logits, 2.0), torch.tensor([1, 2**0.5, 2]) / (3 + 2**0.5))


def test_top_k():
    logits = _logits_of([0.1, 0.4, 0.2, 0.3])
    assert torch.allclose(process_logits(logits, 1.0, top_k=2), torch.tensor([0, 4, 0, 3]) / 7)
    assert torch.allclose(process_logits(logits, 1.0, top_k=1), torch.tensor([0.0, 1, 0, 0]))
    for off in (0, 4, 10):  # 0 = off, k >= V keeps everything
        assert torch.allclose(process_logits(logits, 1.0, top_k=off), torch.tensor([0.1, 0.4, 0.2, 0.3]))
    # tokens tied with the k-th largest are all kept (no dependence on tie order)
    tied = torch.tensor([1.0, 3.0, 3.0, 0.0])
    assert torch.allclose(process_logits(tied, 1.0, top_k=1), torch.tensor([0, 0.5, 0.5, 0]))


def test_top_p():
    logits = _logits_of([0.5, 0.25, 0.125, 0.125])
    cases = {
        0.5: [1, 0, 0, 0],  # the top token alone reaches 0.5
        0.6: [2 / 3, 1 / 3, 0, 0],
        0.75: [2 / 3, 1 / 3, 0, 0],  # exactly reached by two tokens: the smallest set is kept
        0.76: [4 / 7, 2 / 7, 1 / 7, 0],  # tie at the boundary: the lower token id comes first
        1e-9: [1, 0, 0, 0],  # the top token is always kept
        1.0: [0.5, 0.25, 0.125, 0.125],
    }
    for top_p, want in cases.items():
        assert torch.allclose(process_logits(logits, 1.0, top_p=top_p), torch.tensor(want, dtype=torch.float32)), top_p


def test_order_is_temperature_then_top_k_then_top_p():
    logits = _logits_of([0.4, 0.3, 0.2, 0.1])
    # top-k=3 leaves [4, 3, 2] / 9; top_p=0.75 then keeps 2 tokens (mass before the 3rd: 7/9 >= 0.75).
    # Top-p on the unfiltered distribution would have kept 3 (mass before the 3rd: 0.7 < 0.75).
    assert torch.allclose(process_logits(logits, 1.0, top_k=3, top_p=0.75), torch.tensor([4, 3, 0, 0]) / 7)
    # temperature comes first: at T=0.5 the distribution is [16, 9, 4, 1] / 30 and top_p=0.6 keeps 2 tokens
    assert torch.allclose(process_logits(logits, 0.5, top_p=0.6), torch.tensor([16, 9, 0, 0]) / 25)


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 0.0, 1.0, 2.0]])
    want = torch.tensor([[0.0, 1, 0, 0], [1, 0, 0, 0]])  # first index on ties
    assert torch.equal(process_logits(logits, 0.0), want)
    assert torch.equal(process_logits(logits, 0.0, top_k=2, top_p=0.3), want)


def test_any_leading_shape_dtype_and_masked_vocab():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    logits[..., 5] = float("-inf")  # a masked vocabulary entry
    out = process_logits(logits, 0.8, top_k=4, top_p=0.9)
    assert out.shape == (2, 3, 7) and out.dtype == torch.float32
    assert torch.equal(out, process_logits(logits.reshape(6, 7), 0.8, top_k=4, top_p=0.9).reshape(2, 3, 7))
    assert torch.allclose(out.sum(-1), torch.ones(2, 3))
    assert (out[..., 5] == 0).all() and ((out > 0).sum(-1) <= 4).all()
    assert process_logits(logits.bfloat16(), 1.0).dtype == torch.float32


@pytest.mark.parametrize(
    "temperature, top_k, top_p, match",
    [
        (-0.1, 0, 1.0, "temperature"),
        (float("nan"), 0, 1.0, "temperature"),
        (float("inf"), 0, 1.0, "temperature"),
        ("1", 0, 1.0, "temperature"),
        (1.0, -1, 1.0, "top_k"),
        (1.0, 2.5, 1.0, "top_k"),
        (1.0, True, 1.0, "top_k"),
        (1.0, 0, 0.0, "top_p"),
        (1.0, 0, 1.5, "top_p"),
        (1.0, 0, -0.2, "top_p"),
        (1.0, 0, float("nan"), "top_p"),
    ],
)
def test_validation_errors(temperature, top_k, top_p, match):
    """The one rule set: refused where the value enters, naming it."""
    with pytest.raises(ConfigError, match=match) as e:
        SamplingParams(temperature, top_p, top_k)
    assert e.value.param == match


# ------------------------------------------------------------------------------------------ sample_from_probs


def test_sample_edges_never_return_zero_probability_tokens():
    probs = torch.tensor([[0.0, 0.0, 0.5, 0.5, 0.0], [0.3, 0.7, 0.0, 0.0, 0.0], [0.3, 0.7, 0.0, 0.0, 0.0]])
    below_one = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))  # largest float32 < 1
    u = torch.tensor([0.0, below_one.item(), 1.0])  # 1.0 is outside the contract but must stay safe
    assert sample_from_probs(probs, u).tolist() == [2, 1, 1]
    # u = 0 picks the first positive token, u -> 1 the last one
    assert sample_from_probs(probs[:1], torch.tensor([below_one.item()])).tolist() == [3]


def test_sample_inverse_cdf_boundaries_and_unnormalised_rows():
    probs = torch.tensor([[1.0, 0.0, 3.0]]).expand(4, 3)  # unnormalised: CDF 0.25 | 0.25 | 1.0
    u = torch.tensor([0.0, 0.2499, 0.25, 0.9999])
    assert sample_from_probs(probs, u).tolist() == [0, 0, 2, 2]


def test_sample_random_sparse_rows_never_hit_zeros():
    g = torch.Generator().manual_seed(1)
    probs = torch.rand(20000, 50, generator=g) ** 8  # many tiny entries
    probs[torch.rand(20000, 50, generator=g) < 0.7] = 0.0
    probs[:, 17] += 1e-30  # every row keeps at least one (tiny) positive entry
    u = torch.rand(20000, generator=g)
    u[:500], u[500:1000] = 0.0, 1.0 - 2.0**-24
    tokens = sample_from_probs(probs, u)
    assert tokens.dtype == torch.int64
    assert (probs.gather(1, tokens[:, None]) > 0).all()


def test_sample_frequencies_match_probs():
    g = torch.Generator().manual_seed(2)
    probs = torch.tensor([0.05, 0.0, 0.3, 0.15, 0.0, 0.25, 0.2, 0.05])
    n = 200_000
    tokens = sample_from_probs(probs.expand(n, -1), torch.rand(n, generator=g))
    counts = torch.bincount(tokens, minlength=8)
    stat, dof, p_value = chi_square(counts, probs)
    assert p_value > P_VALUE_MIN, (stat, dof, p_value)


def test_sample_is_deterministic_given_u():
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(64, 10, generator=g), -1)
    u = torch.rand(64, generator=g)
    assert torch.equal(sample_from_probs(probs, u), sample_from_probs(probs.clone(), u.clone()))


# ---------------------------------------------------------------------------------------------- draw_uniforms


def test_draw_uniforms_per_row_streams_do_not_depend_on_the_batch():
    def gens(seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    batch = draw_uniforms(gens([11, 22, 33]), 5, "cpu")  # [3, 5]
    alone = draw_uniforms(gens([22]), 5, "cpu")  # [1, 5]
    assert batch.shape == (3, 5) and batch.dtype == torch.float32
    assert torch.equal(batch[1], alone[0])
    assert ((batch >= 0) & (batch < 1)).all()
    assert draw_uniforms([], 4, "cpu").shape == (0, 4)


# ------------------------------------------------------------------------------------- one_token_acceptance


def _every_token_mean(logits, temperature, p, draft_of):
    """E_{x ~ p}[one_token_acceptance(...)] computed exactly: the estimate at every target token x, weighted by
    p(x). logits [R, V'], temperature [R], p [R, V], draft_of [V] (the draft id of each target id, -1 = none)."""
    R, V = p.shape
    x = draft_of.expand(R, V)  # [R, V]
    est = one_token_acceptance(logits[:, None].expand(R, V, -1), temperature[:, None].expand(R, V), x, p)  # [R, V]
    return (p * est).sum(dim=1)  # [R]


def test_one_token_acceptance_is_unbiased_for_what_verification_accepts():
    """Its mean over the target's token x ~ p is the chance verification accepts a one-token draft: sum min(p, q)
    for a child drawn from q = softmax(logits / t), p(argmax) for the head's top-1 at t = 0; a draft vocabulary
    smaller than the target's (ids outside it never drafted) included."""
    g = torch.Generator().manual_seed(11)
    R, V = 64, 12
    p = torch.softmax(2 * torch.randn(R, V, generator=g), -1)
    p[:8, 5] = 0.0  # tokens the target's filters removed
    p = p / p.sum(-1, keepdim=True)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.6]).repeat(R // 4)
    for draft_of in (torch.arange(V), torch.tensor([0, -1, 1, 2, -1, 3, 4, 5, 6, -1, 7, 8])):
        draft_ids = (draft_of >= 0).nonzero()[:, 0]  # [V'] the target id of each draft id
        logits = 3 * torch.randn(R, draft_ids.numel(), generator=g)  # [R, V']
        q = torch.zeros(R, V)
        q[:, draft_ids] = torch.softmax(logits / torch.where(temperature > 0, temperature, 1.0)[:, None], -1)
        top1 = p.gather(1, draft_ids[logits.argmax(-1)][:, None])[:, 0]
        want = torch.where(temperature > 0, torch.minimum(p, q).sum(-1), top1)
        torch.testing.assert_close(_every_token_mean(logits, temperature, p, draft_of), want, rtol=1e-5, atol=1e-6)


def test_one_token_acceptance_matches_the_verifiers_acceptance_rate():
    """Drawn x ~ p and a child drawn from q and verified (``verify_sampling``): the estimate's mean and the
    acceptance rate agree within sampling noise (tying the estimate to the rule verification applies)."""
    from eaglespec.spec.tree import DraftTree
    from eaglespec.spec.verify import verify_sampling

    g = torch.Generator().manual_seed(12)
    n, V = 200_000, 6
    p = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    logits = torch.tensor([0.2, 1.5, 0.1, -0.5, 0.9, 0.0])
    q = torch.softmax(logits, -1)
    child = sample_from_probs(q.expand(n, -1), torch.rand(n, generator=g))  # [n]
    tree = DraftTree(torch.stack([torch.zeros(n, dtype=torch.long), child], 1), torch.tensor([[-1, 0]]).expand(n, 2),
                     torch.tensor([[0, 1]]).expand(n, 2), torch.ones(n, 2, dtype=torch.bool), torch.zeros(n, 2),
                     torch.stack([q.expand(n, -1), q.expand(n, -1)], 1))
    v = verify_sampling(tree, p.expand(n, 2, -1), torch.rand(n, 2, generator=g), torch.rand(n, generator=g), True)
    rate = v.n_accepted.float().mean().item()
    x = sample_from_probs(p.expand(n, -1), torch.rand(n, generator=g))  # the target's own draws
    est = one_token_acceptance(logits.expand(n, -1), torch.ones(n), x, p[x]).mean().item()
    exact = torch.minimum(p, q).sum().item()
    assert abs(rate - exact) < 0.005 and abs(est - exact) < 0.005, (rate, est, exact)
