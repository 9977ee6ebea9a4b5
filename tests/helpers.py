"""Shared test fixtures: a tiny byte-level BPE tokenizer and tiny random targets (built offline)."""

from __future__ import annotations

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
