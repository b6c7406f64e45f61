"""GLM-4 (post-attention and post-MLP norms, q/k/v biases, fused gate_up, interleaved RoPE over
half of each head), a tiny random checkpoint written by transformers, served in float32 and
compared with transformers: batched and chunked, from the radix cache, and in the deterministic
mode; and its load-time q/k row permutation against transformers' interleaved rotation."""

from __future__ import annotations

import pytest
import torch

from family_utils import assert_matches_hf, prompts, save_tiny, serving

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, head_dim=32, pad_token_id=0)


@pytest.fixture(scope="module")
def glm4(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("glm4"))
    return folder, save_tiny(folder, "Glm4Config", "Glm4ForCausalLM", **SHAPE)


def test_glm4_matches_transformers_batched_chunked_and_cached(glm4, gguf_path: str) -> None:
    folder, model = glm4
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        assert_matches_hf(server, model, prompts())
        assert_matches_hf(server, model, prompts())  # every prompt's prefix now in the radix cache


def test_glm4_deterministic_matches_transformers(glm4, gguf_path: str) -> None:
    folder, model = glm4
    with serving(folder, gguf_path, "--enable-deterministic-inference", "--chunked-prefill-size", "16") as server:
        assert_matches_hf(server, model, prompts())


@pytest.mark.parametrize("rotary_dim", [16, 32])
def test_permuted_rotate_half_scores_equal_interleaved(rotary_dim: int) -> None:
    """q . k after transformers' interleaved rotation equals it after our rotate-half rotation of
    the rows as loading permutes them."""
    from transformers.models.glm4.modeling_glm4 import apply_rotary_pos_emb

    from sglang.srt.layers.rotary import RotaryEmbedding, apply_rotary_emb
    from sglang.srt.models.glm4 import _rotate_half_layout

    head_dim, tokens = 32, 7
    q, k = torch.randn(tokens, head_dim), torch.randn(tokens, head_dim)
    rope = RotaryEmbedding(rotary_dim, 64, 10000.0)
    rows = rope.rows(torch.arange(tokens))  # [T, R] = [cos | sin] of R/2 frequencies
    cos = torch.cat([rows[:, : rotary_dim // 2]] * 2, dim=-1)
    sin = torch.cat([rows[:, rotary_dim // 2 :]] * 2, dim=-1)
    hf_q, hf_k = apply_rotary_pos_emb(q[None, None], k[None, None], cos[None], sin[None])
    (_, pq), (_, pk) = _rotate_half_layout([("x.q_proj.w", q.T), ("x.k_proj.w", k.T)], head_dim, rotary_dim)
    ours_cos, ours_sin = rope(torch.arange(tokens), torch.float32)
    our_q = apply_rotary_emb(pq.T.unsqueeze(1).contiguous(), ours_cos, ours_sin)[:, 0]
    our_k = apply_rotary_emb(pk.T.unsqueeze(1).contiguous(), ours_cos, ours_sin)[:, 0]
    torch.testing.assert_close(our_q @ our_k.T, hf_q[0, 0] @ hf_k[0, 0].T, atol=1e-5, rtol=1e-5)
