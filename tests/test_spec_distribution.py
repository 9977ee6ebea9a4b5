"""Speculative sampling through the whole engine reproduces vanilla sampling's distribution.

A tiny-vocabulary target (V = 10), a random EAGLE-3 head, target processing T = 0.9 / top-k 4 / top-p 0.95
(so every sampling parameter is exercised). We sample the first 3 generated tokens of one prompt N times with
speculation and compare their joint distribution with the EXACT joint of vanilla sampling, computed from
the target's own processed distributions over every 1- and 2-token continuation. Chi-square with cells
expecting < 5 pooled; a correct sampler fails with probability 1e-3 per fixed seed (see tests/stats.py), and
the verifier tests show broken rules land far beyond that threshold.
"""

import itertools

import pytest
import torch

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.heads import DraftHead
from eaglespec.spec.proposer import EagleProposer
from eaglespec.spec.sampling import process_logits
from eaglespec.spec.strategies import Chain, StaticTree
from helpers import tiny_target
from stats import P_VALUE_MIN, chi_square

V = 10
PARAMS = SamplingParams(temperature=0.9, top_k=4, top_p=0.95)
PROMPT = [5, 7, 3, 9]
N_SAMPLES = 3000


@pytest.fixture(scope="module")
def small():
    target, _ = tiny_target("llama", vocab_size=V, seed=3)
    return target


def exact_joint(target) -> torch.Tensor:
    """P(t1, t2, t3) under vanilla sampling, [V**3]."""
    model = target.model

    def probs_after(seqs):  # list of token lists -> processed next-token probs [len, V]
        out = []
        for s in seqs:
            cache = model.new_cache(1, len(s))
            logits = model(torch.tensor([s]), torch.arange(len(s))[None], cache, logits_at="all").logits
            out.append(process_logits(logits[0, -1], PARAMS.temperature, PARAMS.top_k, PARAMS.top_p))
        return torch.stack(out)

    with torch.inference_mode():
        p1 = probs_after([PROMPT])[0]  # [V]
        p2 = probs_after([PROMPT + [a] for a in range(V)])  # [V, V]
        p3 = probs_after([PROMPT + [a, b] for a, b in itertools.product(range(V), range(V))]).view(V, V, V)
    return (p1[:, None, None] * p2[:, :, None] * p3).flatten().double()


@pytest.mark.parametrize("tree,draft_temperature", [
    (Chain(2), 0.0),  # deterministic top-1 children
    (StaticTree([[0], [1], [2], [0, 0], [0, 1], [1, 0]]), 0.0),  # deterministic top-k children
    (Chain(2), 1.0),  # children sampled from the draft
    (StaticTree([[0], [1], [0, 0], [0, 1], [1, 0]]), 0.8),  # sampled without replacement
    (Chain(2), None),  # the default: children sampled at the request's own temperature (one draw per node)
    (StaticTree([[0], [1], [0, 0], [0, 1], [1, 0]]), None),  # ... and without replacement where k > 1
])
def test_first_three_tokens_follow_the_vanilla_distribution(small, tree, draft_temperature):
    torch.manual_seed(0)
    head = DraftHead.for_target(small.model, "eagle3", draft_vocab_size=V).eval()
    proposer = EagleProposer(head, tree, draft_temperature=draft_temperature, seed=1)
    engine = Engine(small, proposer, max_batch_size=100)
    reqs = [Request(PROMPT, GenerationConfig(3, SamplingParams(PARAMS.temperature, PARAMS.top_p, PARAMS.top_k,
                                                               seed=i), ignore_eos=True))
            for i in range(N_SAMPLES)]
    with torch.inference_mode():
        outs = engine.generate(reqs)
    codes = torch.tensor([(o.token_ids[0] * V + o.token_ids[1]) * V + o.token_ids[2] for o in outs])
    counts = torch.bincount(codes, minlength=V**3)
    stat, dof, p_value = chi_square(counts, exact_joint(small))
    assert p_value > P_VALUE_MIN, f"chi-square {stat:.1f} on {dof} dof, p = {p_value:.2e}"
    # The speculative path was exercised: some draft tokens were accepted.
    assert sum(sum(o.stats.accepted_per_position) for o in outs) > N_SAMPLES // 20
