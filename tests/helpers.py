"""Shared test fixtures: a tiny byte-level BPE tokenizer and tiny random targets (built offline)."""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens and the target verifies them.",
    "Café, naïve, résumé: accents are multi-byte in UTF-8. 你好，世界！",
    "def add(a, b):\n    return a + b\n",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
] * 4
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.lru_cache(maxsize=None)
def tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer (multi-byte characters span several tokens) with ChatML specials.

    Special tokens: <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2 (the EOS).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_hf_model(family: str = "llama", vocab_size: int | None = None, seed: int = 0, **overrides):
    """A tiny random HF causal LM of the given family (no download), in eval mode, fp32."""
    import transformers

    vocab_size = vocab_size or len(tiny_tokenizer())
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    common.update(overrides)
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[family]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**common)).eval()
    # Random init gives near-uniform logits; sharpen them so greedy paths are not decided by float noise.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def tiny_target(family: str = "llama", dtype=torch.float32, seed: int = 0, **overrides):
    """(Target-like namespace, HF model) for a tiny random model with the tiny tokenizer."""
    from eaglespec.runtime.model import ModelArgs, Transformer

    hf = tiny_hf_model(family, seed=seed, **overrides)
    args = ModelArgs.from_hf_config(hf.config)
    model = Transformer.from_state_dict(args, hf.state_dict(), dtype, "cpu")
    target = SimpleNamespace(model=model, tokenizer=tiny_tokenizer(), eos_token_ids=[2], name=f"tiny-{family}",
                             hf_config=hf.config)
    return target, hf


def tiny_llama_transformer(vocab_size: int = 128, hidden_size: int = 64, num_layers: int = 4, seed: int = 0):
    """Our `Transformer` over a tiny random HF Llama (untied, unsharpened weights): the head-format tests' target."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from eaglespec.runtime.model import ModelArgs, Transformer

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden_size, intermediate_size=128, num_hidden_layers=num_layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=vocab_size,
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
    return Transformer.from_state_dict(ModelArgs.from_hf_config(cfg), LlamaForCausalLM(cfg).state_dict())


@contextlib.contextmanager
def quick_calibration(cache_dir):
    """`--tree auto` calibration in seconds on tiny models (batch sizes 1 and 2, 16-token prefix), cached under
    `cache_dir` instead of the user's cache."""
    import pytest

    from eaglespec.engine import calibrate as cal

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cal, "BATCHES", (1, 2))
        mp.setattr(cal, "VERIFY_TOKENS", (1, 2, 4, 8))
        mp.setattr(cal, "PREFIX", 16)
        mp.setenv("EAGLESPEC_CACHE_DIR", str(cache_dir))
        yield


def assert_block_equals_decodes(model, tokens, prefix: int, hidden_indices):
    """Verify tokens[:, prefix:] in one forward after a prompt of `prefix` tokens, decode the same tokens one
    by one on a second cache, and assert each token's activations and logits are bit-identical in both.
    Returns (block forward output, [block cache, decode cache])."""
    n_new = tokens.shape[1] - prefix
    caches = [model.new_cache(1, prefix + n_new + 1) for _ in range(2)]
    for c in caches:
        model(tokens[:, :prefix], torch.arange(prefix)[None], c, prefill=True)
        c.lengths[0] = prefix
    block = model(tokens[:, prefix:], torch.arange(prefix, prefix + n_new)[None], caches[0], logits_at="all",
                  hidden_indices=hidden_indices)
    for t in range(n_new):
        one = model(tokens[:, prefix + t: prefix + t + 1], torch.tensor([[prefix + t]]), caches[1],
                    logits_at="all", hidden_indices=hidden_indices)
        caches[1].lengths[0] += 1
        assert torch.equal(one.aux[0, 0], block.aux[0, t]), f"token {t}: activations differ"
        assert torch.equal(one.logits[0, 0], block.logits[0, t]), f"token {t}: logits differ"
    return block, caches


def count_kernel_calls(monkeypatch, name: str) -> list:
    """Count the calls of ``torch.ops.eaglespec.<name>`` for the rest of the test (every other op of ours as it
    is): returns the list that gets one entry a call."""
    calls: list = []
    ops = torch.ops.eaglespec

    class Ops:
        def __getattr__(self, attr):
            op = getattr(ops, attr)
            return (lambda *a: calls.append(1) or op(*a)) if attr == name else op

    monkeypatch.setattr(torch.ops, "eaglespec", Ops())
    return calls
