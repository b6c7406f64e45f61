"""The CPU rotary + KV-write kernel (C) against its plain-torch reference, and against the model's
own apply_rotary_emb; the rotated q comes back as a view of the projection output."""

from __future__ import annotations

import pytest
import torch

from sgl_kernel_ext.rotary.rope_store_cpu import rope_store_cpu, rope_store_cpu_applies, rope_store_reference
from sglang.srt.layers.rotary import RotaryEmbedding, apply_rotary_emb

if not rope_store_cpu_applies(torch.zeros(1, 8), torch.zeros(1, 1, 8)):
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)


def inputs(tokens: int, heads: int, kv_heads: int, head_dim: int, extra: int = 0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim + extra, generator=gen)
    rope = RotaryEmbedding(head_dim, 4096, 10000.0)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    cos, signed_sin = rope(positions, torch.float32)
    slots = tokens + 5
    loc = torch.randperm(slots, generator=gen)[:tokens]
    k_buf = torch.zeros(slots, kv_heads, head_dim)
    return qkv, cos, signed_sin, loc, k_buf, torch.zeros_like(k_buf)


@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim,extra", [(16, 9, 3, 64, 0), (1, 4, 4, 6, 0), (100, 8, 2, 128, 32)])
def test_matches_reference(tokens, heads, kv_heads, head_dim, extra) -> None:
    qkv, cos, signed_sin, loc, k_buf, v_buf = inputs(tokens, heads, kv_heads, head_dim, extra)
    ref_qkv, ref_k, ref_v = qkv.clone(), k_buf.clone(), v_buf.clone()
    want_q = rope_store_reference(ref_qkv, heads, cos, signed_sin, loc, ref_k, ref_v)
    got_q = rope_store_cpu(qkv, heads, cos, signed_sin, loc, k_buf, v_buf)
    assert got_q.data_ptr() == qkv.data_ptr()  # a view: rotated in place
    torch.testing.assert_close(got_q, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_buf, ref_k, rtol=1e-6, atol=1e-6)
    assert torch.equal(v_buf, ref_v)


def test_same_rotation_as_the_model_applies() -> None:
    qkv, cos, signed_sin, loc, k_buf, v_buf = inputs(8, 9, 3, 64)
    heads_qk = qkv[:, : 12 * 64].reshape(8, 12, 64).clone()
    want = apply_rotary_emb(heads_qk, cos, signed_sin)
    q = rope_store_cpu(qkv, 9, cos, signed_sin, loc, k_buf, v_buf)
    torch.testing.assert_close(q, want[:, :9], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_buf[loc], want[:, 9:], rtol=1e-6, atol=1e-6)


def test_bad_inputs_are_refused() -> None:
    qkv, cos, signed_sin, loc, k_buf, v_buf = inputs(4, 9, 3, 64)
    with pytest.raises(ValueError, match="loc must lie"):
        rope_store_cpu(qkv, 9, cos, signed_sin, loc + 100, k_buf, v_buf)
    with pytest.raises(ValueError, match="fewer than"):
        rope_store_cpu(qkv[:, :700], 9, cos, signed_sin, loc, k_buf, v_buf)
    with pytest.raises(ValueError, match="loc must be int64"):
        rope_store_cpu(qkv, 9, cos, signed_sin, loc.int(), k_buf, v_buf)
