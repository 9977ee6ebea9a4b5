"""Host reads (GPU syncs) in one decode step, counted on CPU by wrapping the tensor methods that read back.

Budget per step: the one read of the accepted counts and tokens in the engine, nothing else (a paused step,
tree `none`, only records its pair for the draft cache's later catch-up). The engine keeps every row's
committed length on the host and passes it down (`HostRows`), so no forward's `plan_attention` reads the
attended length; the proposer re-encodes a number of pairs known from those counts; verification
sizes its outputs from the tree's depth bound (`DraftTree.max_depth`). Only `--draft-alignment last` reads
more: how many drafted pairs it keeps is data on the device.
"""

import collections
import sys

import pytest
import torch

from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.heads import DraftHead
from eaglespec.spec.proposer import EagleProposer
from eaglespec.spec.strategies import Chain, DynamicTree, NoDraft, StaticTree
from helpers import tiny_target, tiny_tokenizer

READS = ("tolist", "item", "__int__", "__bool__", "__float__", "__index__")


@pytest.fixture(scope="module")
def tiny():
    return tiny_target("llama")[0]


def count_reads(fn) -> collections.Counter:
    """Calls of tensor read-back methods made while fn() runs, keyed by the calling function's name."""
    counts: collections.Counter = collections.Counter()
    originals = {n: getattr(torch.Tensor, n) for n in READS}

    def wrap(name):
        def read(self, *args, **kwargs):
            counts[sys._getframe(1).f_code.co_name] += 1
            return originals[name](self, *args, **kwargs)
        return read

    for n in READS:
        setattr(torch.Tensor, n, wrap(n))
    try:
        fn()
    finally:
        for n, f in originals.items():
            setattr(torch.Tensor, n, f)
    return counts


def step_reads(tiny, tree, alignment="stable") -> dict:
    proposer = None
    if tree is not None:
        torch.manual_seed(0)
        head = DraftHead.for_target(tiny.model, "eagle1", num_layers=1).eval()
        cfg = {"none": NoDraft(), "chain": Chain(3), "static": StaticTree(),
               "dynamic": DynamicTree(topk=3, depth=4, tree_tokens=10)}[tree]
        proposer = EagleProposer(head, cfg, alignment=alignment)
    engine = Engine(tiny, proposer, max_batch_size=2)
    ids = tiny_tokenizer().encode("The quick brown fox")
    with torch.inference_mode():
        engine.submit(0, Request(ids, GenerationConfig(20, ignore_eos=True)))
        engine.submit(1, Request(ids[:3], GenerationConfig(20, ignore_eos=True)))
        engine.step()  # prefill
        engine.step()
        return dict(count_reads(engine.step))


@pytest.mark.parametrize("tree", [None, "none", "chain", "static", "dynamic"])
def test_a_decode_step_reads_back_only_the_accepted_tokens(tiny, tree):
    assert step_reads(tiny, tree) == {"_step": 1}


def test_last_alignment_reads_its_kept_pairs(tiny):
    """The documented exception: the commit reads how many pairs to re-encode, and its forward then plans
    its attention from the device lengths."""
    assert step_reads(tiny, "chain", alignment="last") == {"_step": 1, "_commit_tree": 1, "plan_attention": 1}
