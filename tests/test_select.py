"""Our selection kernels (kernels/select.cpp: argmax and top-k of vocabulary rows) against torch's, and where
runtime.logits uses them."""

import pytest
import torch

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.logits import argmax, rescored_logits, topk_indices

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"our CPU kernels do not run here: {cpu_kernels.unavailable_reason()}")

SHAPES = [(1, 1, 49152), (3, 8192), (2, 5, 1000), (7,), (4, 33), (2, 16), (1, 17), (1, 15), (6, 130)]


def _rows(shape, kind, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 4
    if kind == "ties":  # few distinct values: equal maxima, equal k-th values
        x = x.round()
    elif kind == "neginf":  # masked logits
        x[..., ::2] = float("-inf")
    elif kind == "all_neginf":
        x.fill_(float("-inf"))
    elif kind == "nan":  # NaN ranks above every number, as in torch
        x.view(-1)[x.numel() // 3] = float("nan")
        x.view(-1)[x.numel() // 2] = float("nan")
    elif kind == "peak_in_tail":  # the largest values in the row's last, partial block (and vector)
        x[..., -1] = 1e4
        x[..., -2] = 1e4 - 1
    return x


KINDS = ["randn", "ties", "neginf", "all_neginf", "nan", "peak_in_tail"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_argmax_is_torchs_first_maximum(shape, kind):
    x = _rows(shape, kind, sum(shape) + KINDS.index(kind))
    got = torch.ops.eaglespec.argmax_rows(x)
    assert got.dtype == torch.long and got.shape == x.shape[:-1]
    assert torch.equal(got, x.argmax(-1))


@pytest.mark.parametrize("shape,k", [(shape, k) for shape in SHAPES for k in (1, 4, 32) if k <= shape[-1]])
@pytest.mark.parametrize("kind", KINDS)
def test_topk_selects_torchs_values_in_order_with_ties_by_index(shape, kind, k):
    x = _rows(shape, kind, 7 * sum(shape) + k)
    got = torch.ops.eaglespec.topk_rows(x, k)
    assert got.dtype == torch.long and got.shape == (*x.shape[:-1], k)
    values = x.gather(-1, got)
    ref = x.topk(k, dim=-1).values
    assert torch.equal(values.nan_to_num(nan=1e30), ref.nan_to_num(nan=1e30))  # the same values, descending
    assert (got.sort(-1).values.diff(dim=-1) > 0).all()  # k distinct indices
    # equal values come by ascending index (the expected order, built by a stable sort of the row)
    order = torch.sort(x.nan_to_num(nan=float("inf")), dim=-1, descending=True, stable=True).indices[..., :k]
    assert torch.equal(got, order)


def test_a_rows_selection_does_not_depend_on_the_other_rows():
    """Decoding selects over one row, verification over many (split over threads from 5 rows): the same row gives
    the same indices either way, which keeps greedy speculation identical to plain decoding."""
    x = _rows((9, 49152), "ties", 3)
    many_top, many_arg = torch.ops.eaglespec.topk_rows(x, 32), torch.ops.eaglespec.argmax_rows(x)
    for i in range(9):
        assert torch.equal(torch.ops.eaglespec.topk_rows(x[i : i + 1], 32)[0], many_top[i])
        assert torch.equal(torch.ops.eaglespec.argmax_rows(x[i : i + 1])[0], many_arg[i])


def test_bad_input_is_refused_with_the_problem_named():
    x = torch.randn(2, 100)
    with pytest.raises(RuntimeError, match="k must be in"):
        torch.ops.eaglespec.topk_rows(x, 0)
    with pytest.raises(RuntimeError, match="k must be in"):
        torch.ops.eaglespec.topk_rows(x, 101)
    with pytest.raises(RuntimeError, match="float32 scores only"):
        torch.ops.eaglespec.argmax_rows(x.double())
    with pytest.raises(RuntimeError, match="V > 0"):
        torch.ops.eaglespec.argmax_rows(torch.empty(3, 0))


def test_logits_helpers_use_the_kernels_for_float32_cpu_rows_and_torch_otherwise():
    x = _rows((2, 3, 49152), "randn", 11)
    assert torch.equal(argmax(x), torch.ops.eaglespec.argmax_rows(x))
    assert torch.equal(topk_indices(x, 32), torch.ops.eaglespec.topk_rows(x, 32))
    w = x.clone().requires_grad_(True)  # no autograd through the kernels: indices of a detached copy
    assert torch.equal(argmax(w), x.argmax(-1))
    half = x.bfloat16()  # other dtypes keep torch's
    assert torch.equal(argmax(half), half.argmax(-1))
    assert torch.equal(topk_indices(half, 5), half.topk(5, dim=-1).indices)
    h, wt = torch.randn(4, 64), torch.randn(3000, 64)  # the rescoring ranks with them: same as torch's topk here
    got = rescored_logits(h, lambda v: torch.nn.functional.linear(v.bfloat16(), wt.bfloat16()), wt, top=16)
    approx = torch.nn.functional.linear(h.bfloat16(), wt.bfloat16()).float()
    cand = topk_indices(approx, 16)  # (bfloat16 scores tie: torch's topk may pick other tied indices)
    torch.testing.assert_close(got.gather(-1, cand), (h @ wt.T).gather(-1, cand), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- rescore_rows_


def _torch_rescored(approx, h, w, top):
    """rescored_logits' torch form (before the kernel): the kernel's ranking, then gathered rows, product, sum."""
    cand = topk_indices(approx, top)
    return approx.clone().scatter_(-1, cand, (h.unsqueeze(-2) * w[cand]).sum(-1)), cand


@pytest.mark.parametrize("shape", [(1, 1), (3,), (2, 5)])
@pytest.mark.parametrize("kind", ["randn", "ties"])
def test_rescore_rows_gives_the_candidates_float32_scores_and_keeps_the_rest(shape, kind):
    g = torch.Generator().manual_seed(len(shape) + sum(shape))
    w = torch.randn(5000, 96, generator=g)
    h = torch.randn(*shape, 96, generator=g)
    approx = (h @ w.T).bfloat16().float()  # bfloat16 scores: many ties among the candidates
    if kind == "ties":
        approx = approx.round()
    want, cand = _torch_rescored(approx, h, w, 24)
    got = approx.clone()
    torch.ops.eaglespec.rescore_rows_(got, h, w, 24)
    keep = torch.ones_like(got, dtype=torch.bool).scatter_(-1, cand, False)
    assert torch.equal(got[keep], approx[keep])  # the same candidates as topk_rows: ties by ascending index
    torch.testing.assert_close(got.gather(-1, cand), (h @ w.T).gather(-1, cand), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # only the sum's order differs from torch's
    assert not torch.equal(got.gather(-1, cand), approx.gather(-1, cand))


def test_rescore_rows_of_a_row_do_not_depend_on_the_other_rows():
    """9 rows split over threads against each row alone, bit for bit (verification scores N tokens in one call)."""
    g = torch.Generator().manual_seed(5)
    w, h = torch.randn(4096, 64, generator=g), torch.randn(9, 64, generator=g)
    approx = (h @ w.T).bfloat16().float()
    many = approx.clone()
    torch.ops.eaglespec.rescore_rows_(many, h, w, 32)
    for i in range(9):
        alone = approx[i : i + 1].clone()
        torch.ops.eaglespec.rescore_rows_(alone, h[i : i + 1], w, 32)
        assert torch.equal(alone[0], many[i])


def test_rescored_logits_runs_the_kernel_where_it_can_and_torch_otherwise(monkeypatch):
    g = torch.Generator().manual_seed(6)
    w, h = torch.randn(3000, 64, generator=g), torch.randn(2, 3, 64, generator=g)
    fast = lambda v: torch.nn.functional.linear(v.bfloat16(), w.bfloat16())  # noqa: E731
    calls = []
    real = torch.ops.eaglespec.rescore_rows_
    monkeypatch.setattr(torch.ops.eaglespec, "rescore_rows_", lambda *a: (calls.append(1), real(*a))[1],
                        raising=False)
    got = rescored_logits(h, fast, w, top=16)
    assert calls, "float32 rows and weights on the CPU go to the kernel"
    want, _ = _torch_rescored(fast(h).float(), h, w, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    calls.clear()
    rescored_logits(h, fast, w.bfloat16(), top=16)  # a bfloat16 weight: torch's form
    w60 = w[:, :60].contiguous()
    rescored_logits(h[..., :60], lambda v: torch.nn.functional.linear(v, w60), w60, top=16)  # H % 16 != 0
    assert not calls


def test_rescore_rows_refuses_bad_input_with_the_problem_named():
    w, h, s = torch.randn(100, 32), torch.randn(2, 32), torch.randn(2, 100)
    with pytest.raises(RuntimeError, match="top must be in"):
        torch.ops.eaglespec.rescore_rows_(s, h, w, 0)
    with pytest.raises(RuntimeError, match="must be float32"):
        torch.ops.eaglespec.rescore_rows_(s, h, w.double(), 4)
    with pytest.raises(RuntimeError, match="weight must be contiguous"):
        torch.ops.eaglespec.rescore_rows_(s, h, w[:50], 4)
    with pytest.raises(RuntimeError, match="one row per row of scores"):
        torch.ops.eaglespec.rescore_rows_(s, h[:1], w, 4)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        torch.ops.eaglespec.rescore_rows_(s, torch.randn(2, 20), torch.randn(100, 20), 4)


# ------------------------------------------------------------------------------------------------ sample_rows


def _torch_draw(probs, u, monkeypatch):
    """spec.sampling.sample_from_probs' torch rule (the kernel's reference): the same function, the kernels off."""
    from eaglespec.spec import sampling

    with monkeypatch.context() as m:
        m.setattr(sampling.cpu_kernels, "serves", lambda *tensors: False)
        return sampling.sample_from_probs(probs, u)


@pytest.mark.parametrize("v", [1, 7, 16, 17, 1000, 49152])
@pytest.mark.parametrize("kind", ["softmax", "sparse", "unnormalised", "one_hot"])
def test_sample_rows_draws_torchs_token(v, kind, monkeypatch):
    """The first positive token whose cumulative mass exceeds u * total, as torch computes it, for uniforms
    that are not within rounding of a boundary (both sum in fixed but different orders)."""
    g = torch.Generator().manual_seed(v + len(kind))
    p = torch.softmax(3 * torch.randn(64, v, generator=g), -1)
    if kind == "sparse":
        p = p * (torch.rand(64, v, generator=g) < 0.3)
        p[:, -1] = torch.where(p.sum(-1) == 0, 1.0, p[:, -1])  # at least one positive value a row
    elif kind == "unnormalised":
        p = p * 37.5
    elif kind == "one_hot":
        p = torch.zeros(64, v).scatter_(1, torch.randint(0, v, (64, 1), generator=g), 1.0)
    u = torch.rand(64, generator=g)
    got = torch.ops.eaglespec.sample_rows(p, u)
    assert got.dtype == torch.long and got.shape == (64,)
    assert (p.gather(1, got[:, None]) > 0).all()  # never a zero-probability token
    cdf = p.double().cumsum(-1)
    margin = ((cdf - u.double()[:, None] * cdf[:, -1:]).abs().amin(-1) > 1e-5 * cdf[:, -1])  # clear of boundaries
    assert margin.sum() > 48
    assert torch.equal(got[margin], _torch_draw(p, u, monkeypatch)[margin])


def test_sample_rows_edges_and_shapes():
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 2.0], [0.0] * 5])
    assert torch.ops.eaglespec.sample_rows(p, torch.zeros(3)).tolist() == [1, 4, 0]  # u = 0: the first positive
    top = torch.full((3,), 1.0 - 2 ** -24)  # just below 1: the last positive, never the zeros after it
    assert torch.ops.eaglespec.sample_rows(p, top).tolist() == [3, 4, 0]
    x = torch.softmax(torch.randn(2, 3, 40), -1)
    u = torch.rand(2, 3)
    assert torch.equal(torch.ops.eaglespec.sample_rows(x, u),
                       torch.ops.eaglespec.sample_rows(x.reshape(6, 40), u.reshape(6)).reshape(2, 3))
    with pytest.raises(RuntimeError, match="u must be shaped as probs"):
        torch.ops.eaglespec.sample_rows(x, torch.rand(3))
    with pytest.raises(RuntimeError, match="float32 uniforms only"):
        torch.ops.eaglespec.sample_rows(x, u.double())


def test_sample_rows_frequencies_match_the_probabilities():
    from stats import P_VALUE_MIN, chi_square

    g = torch.Generator().manual_seed(2)
    probs = torch.tensor([0.05, 0.0, 0.3, 0.15, 0.0, 0.25, 0.2, 0.05] * 3) / 3  # 24 values: a partial block
    n = 200_000
    tokens = torch.ops.eaglespec.sample_rows(probs.expand(n, -1).contiguous(), torch.rand(n, generator=g))
    stat, dof, p_value = chi_square(torch.bincount(tokens, minlength=24), probs / probs.sum())
    assert p_value > P_VALUE_MIN, (stat, dof, p_value)


def test_sample_from_probs_runs_the_kernel_where_it_is_loaded(monkeypatch):
    from eaglespec.spec.sampling import sample_from_probs

    calls = []
    real = torch.ops.eaglespec.sample_rows

    class Ops:
        def sample_rows(self, p, u):
            calls.append(p.shape)
            return real(p, u)

    monkeypatch.setattr(torch.ops, "eaglespec", Ops())
    p = torch.softmax(torch.randn(3, 100), -1)
    u = torch.rand(3)
    assert torch.equal(sample_from_probs(p, u), real(p, u)) and calls == [(3, 100)]
    assert sample_from_probs(p.double(), u.double()).shape == (3,) and len(calls) == 2  # cast to float32 first
