import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny random Llama saved as an HF model directory with the tiny tokenizer."""
    from helpers import tiny_hf_model, tiny_tokenizer

    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_hf_model("llama").save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def head_dir(model_dir, tmp_path_factory):
    """A random EAGLE-3 head for `model_dir`, saved in the engine layout."""
    from eaglespec.spec.heads import DraftHead, save_head
    from eaglespec.runtime.loading import load_target

    target = load_target(str(model_dir))
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("head")
    save_head(DraftHead.for_target(target.model, "eagle3", draft_vocab_size=64), d)
    return d
