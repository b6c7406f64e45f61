"""A tiny random Qwen3-style checkpoint for the reasoning-parser tests: a byte-level tokenizer with
`<think>` / `</think>` as ordinary added tokens (as in Qwen3, they stay in the text) and a chat
template that opens `<think>` after the generation prompt, or writes the closed empty section
when `enable_thinking` is false. Its output is random; thinking_token_budget makes it close the
section, so the split into reasoning and answer does not depend on the weights."""

from __future__ import annotations

import os
import sys

from fake_scheduler import build_test_tokenizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmark"))
from random_checkpoint import write_qwen3_checkpoint  # noqa: E402

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}"
)


def write_reasoning_model(folder: str) -> None:
    """The tokenizer, template and random weights, written to `folder` (an HF model folder)."""
    from transformers import PreTrainedTokenizerFast

    build_test_tokenizer(folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    write_qwen3_checkpoint(
        folder, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=len(tokenizer), max_position_embeddings=2048,
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
