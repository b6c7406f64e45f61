"""MLA attention units (no server): the absorbed form over the compressed paged cache against
transformers' DeepseekV3Attention, which decompresses K and V with kv_b_proj; prefill, a chunk
after a cached prefix, and decode steps, on the cpu (C decode kernel) and torch_native backends."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

from sglang.srt.configs.model_config import ModelConfig, _hf_rope_scaling
from sglang.srt.layers.attention import create_attention_backend
from sglang.srt.layers.attention.mla import MLAttention, per_head_matmul
from sglang.srt.layers.batch_invariant import batch_invariant
from sglang.srt.layers.rotary import RotaryEmbedding
from sglang.srt.mem_cache.memory_pool import KVCache, KVCacheLayout, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.models.deepseek_v3 import mla_shape, mla_softmax_scale

ATOL = 2e-5
SEQ = 24  # positions: a 10-token prefill, a 9-token chunk after it, then 5 decode steps
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "mscale": 1.0, "mscale_all_dim": 0.707}


def _hf_attention(q_lora_rank, rope_interleave: bool) -> DeepseekV3Attention:
    cfg = transformers.DeepseekV3Config(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank, kv_lora_rank=24,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, rope_interleave=rope_interleave,
        max_position_embeddings=64, rope_parameters=dict(YARN), attention_bias=True,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = DeepseekV3Attention(cfg, 0).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0.0, 0.3)
    return attn


def _ours(hf: DeepseekV3Attention) -> tuple[MLAttention, RotaryEmbedding]:
    cfg = hf.config.to_dict() | {"architectures": ["DeepseekV3ForCausalLM"]}
    scaling = _hf_rope_scaling(cfg)
    config = ModelConfig(
        model_path="", format="safetensors", arch="deepseek_v3", vocab_size=1, hidden_size=cfg["hidden_size"],
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, head_dim=8, intermediate_size=1,
        rope_theta=10000.0, rms_norm_eps=1e-6, context_len=64, tie_word_embeddings=False, attention_bias=True,
        eos_token_ids=[], rope_scaling=scaling, hf_config=cfg,
    )
    shape = mla_shape(config)
    ours = MLAttention(shape, 0, mla_softmax_scale(shape, scaling), torch.float32, 0, 1)
    params = dict(ours.named_parameters())
    for name, tensor in hf.state_dict().items():
        if name == "kv_b_proj.weight":
            ours.load_kv_b_proj(tensor)
        else:
            param = params[name]
            param.weight_loader(param, ours.rope_row_order("self_attn." + name, tensor))
    assert ours.attn.scaling == pytest.approx(hf.scaling, rel=1e-12)
    return ours, RotaryEmbedding(8, 64, 10000.0, scaling)


def _hf_outputs(hf: DeepseekV3Attention, x: torch.Tensor) -> torch.Tensor:
    """x [S, hidden] -> [S, hidden]: causal attention over the whole sequence, decompressed."""
    positions = torch.arange(x.shape[0])[None]
    cos_sin = DeepseekV3RotaryEmbedding(hf.config)(x[None], positions)
    mask = torch.full((x.shape[0], x.shape[0]), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        return hf(x[None], cos_sin, mask)[0][0]


def _step(ours, rotary, backend, cache, pool, x, start, n, mode) -> torch.Tensor:
    loc = torch.arange(1 + start, 1 + start + n)
    pool.assign([0], [start], [n], loc)
    batch = ForwardBatch.init_new(mode, None, [0], [start], [n], loc, "cpu")
    batch.kv_cache, batch.attn_backend = cache, backend
    backend.init_forward_metadata(batch)
    with torch.no_grad():
        return ours(rotary(batch.positions, torch.float32), x[start : start + n], batch)


@pytest.mark.parametrize("backend_name", ["cpu", "torch_native"])
@pytest.mark.parametrize(("q_lora_rank", "rope_interleave"), [(16, True), (None, False)])
def test_absorbed_attention_matches_decompressed(backend_name, q_lora_rank, rope_interleave) -> None:
    hf = _hf_attention(q_lora_rank, rope_interleave)
    ours, rotary = _ours(hf)
    torch.manual_seed(1)
    x = torch.randn(SEQ, 48)
    expected = _hf_outputs(hf, x)  # [S, hidden]
    layout = KVCacheLayout(1, 1, ours.shape.latent_dim, 0)
    cache = KVCache.from_layout(64, layout, torch.float32, "cpu")
    assert cache.get_kv(0)[0] is cache.get_kv(0)[1] and cache.mem_bytes() == layout.bytes_per_token(4) * 66
    pool = ReqToTokenPool(2, 64, "cpu")
    backend = create_attention_backend(backend_name, pool.req_to_token, 4, 1, layout.head_dim, torch.float32)
    got = [_step(ours, rotary, backend, cache, pool, x, 0, 10, ForwardMode.EXTEND),
           _step(ours, rotary, backend, cache, pool, x, 10, 9, ForwardMode.EXTEND)]
    got += [_step(ours, rotary, backend, cache, pool, x, p, 1, ForwardMode.DECODE) for p in range(19, SEQ)]
    torch.testing.assert_close(torch.cat(got), expected, atol=ATOL, rtol=0)


def test_per_head_matmul_rows_do_not_depend_on_the_batch() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(37, 4, 24), torch.randn(4, 24, 40)
    torch.testing.assert_close(per_head_matmul(x, w), torch.einsum("nha,hab->nhb", x, w), atol=1e-5, rtol=0)
    with batch_invariant(True):
        full = per_head_matmul(x, w)
        for rows in (1, 5, 16, 17):
            assert torch.equal(per_head_matmul(x[:rows], w), full[:rows])
