"""Goodness-of-fit helpers shared by the statistical tests (no scipy needed)."""

from __future__ import annotations

import math

import torch

# Goodness-of-fit threshold shared by the statistical tests. Every test runs with a fixed seed, so it is
# deterministic; the threshold says how unlucky a seed would have to be for a CORRECT sampler to fail: a
# p-value below 1e-3 happens for 1 seed in 1000. The broken-verifier checks in test_verify.py show the same
# statistic lands many orders of magnitude beyond it when the algorithm is wrong.
P_VALUE_MIN = 1e-3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, float]:
    """Pearson chi-square of observed counts [C] against exact cell probabilities [C] -> (stat, dof, p-value).

    Cells with probability 0 must be empty (asserted). Cells expecting fewer than 5 observations are pooled
    into one cell (the usual validity condition of the chi-square approximation); a pool still under 5 joins
    the smallest regular cell. The p-value comes from scipy when installed, else from the Wilson-Hilferty
    approximation (`chi2_sf_wilson_hilferty`).
    """
    counts, probs = counts.double(), probs.double()
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, "a zero-probability outcome was observed"
    expected = probs * n
    big = expected >= 5
    obs_cells, exp_cells = list(counts[big]), list(expected[big])
    small = (~big) & (probs > 0)
    if small.any():
        if expected[small].sum() >= 5 or not obs_cells:
            obs_cells.append(counts[small].sum())
            exp_cells.append(expected[small].sum())
        else:
            i = min(range(len(exp_cells)), key=lambda j: float(exp_cells[j]))
            obs_cells[i] = obs_cells[i] + counts[small].sum()
            exp_cells[i] = exp_cells[i] + expected[small].sum()
    obs, exp = torch.stack(obs_cells), torch.stack(exp_cells)
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs_cells) - 1
    try:
        from scipy.stats import chi2

        p_value = float(chi2.sf(stat, dof))
    except ImportError:
        p_value = chi2_sf_wilson_hilferty(stat, dof)
    return stat, dof, p_value


def chi2_sf_wilson_hilferty(stat: float, dof: int) -> float:
    """P(X > stat) for X ~ chi-square(dof): (X / dof)^(1/3) is close to normal with mean 1 - 2/(9 dof) and
    variance 2/(9 dof) (Wilson-Hilferty); at the 1e-3 tail it is off by < 7% of the p-value for dof >= 10."""
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))
