"""Shared by the guidance tests: a tiny random Qwen3 checkpoint with a 300-token vocabulary (served
with the embedded SmolLM2 tokenizer, prompts given as ids), so that a reference can fetch every
vocabulary id's logprob at every position cheaply."""

from __future__ import annotations

from family_utils import save_tiny

VOCAB = 300
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False)


def save_guidance_tiny(folder: str, seed: int = 0) -> str:
    save_tiny(folder, "Qwen3Config", "Qwen3ForCausalLM", seed=seed, **TINY)
    return folder


def tiny_flags(model_path: str, tokenizer_path: str, *extra: str) -> list[str]:
    return ["--model-path", model_path, "--tokenizer-path", tokenizer_path, "--max-running-requests", "12", *extra]
