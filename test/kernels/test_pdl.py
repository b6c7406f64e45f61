"""Programmatic dependent launch (sgl_kernel_ext/triton_launch.py): kernels that may start before
the kernel ahead of them has finished must still see its writes.

On CPUs: launch hands a kernel's PDL argument False (the interpreter has no grid dependency
control) and refuses pdl=True for a kernel without one. On CUDA devices with PDL (compute
capability 9.0+): a decode layer's chain of PDL kernels (norm + qkv projection, rope + KV store,
split-KV attention, o projection, residual norm + gate/up + silu, down projection, a final norm),
each reading what the one before wrote at once, captured in a CUDA graph and replayed over new
inputs, gives the bits of the same chain launched without PDL; the compiled kernels carry the
launch attribute (so the comparison is not between two PDL-free runs)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from sgl_kernel_ext import triton_launch  # noqa: E402
from sgl_kernel_ext.attention.paged_decode import decode_workspace, paged_decode_attention  # noqa: E402
from sgl_kernel_ext.gemm.gemv_triton import gemv_triton  # noqa: E402
from sgl_kernel_ext.norm.rmsnorm_triton import rmsnorm_triton  # noqa: E402
from sgl_kernel_ext.rotary.rope_store_triton import rope_store_triton  # noqa: E402
from sgl_kernel_ext.triton_launch import pdl_sync  # noqa: E402

CUDA_PDL = torch.cuda.is_available() and triton_launch.pdl_applies(torch.device("cuda", torch.cuda.current_device()))


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, PDL: tl.constexpr):
    pdl_sync(PDL)
    tl.store(dst_ptr + tl.arange(0, 16), tl.load(src_ptr + tl.arange(0, 16)))


@triton.jit
def _plain_copy_kernel(src_ptr, dst_ptr):
    tl.store(dst_ptr + tl.arange(0, 16), tl.load(src_ptr + tl.arange(0, 16)))


def test_launch_sets_the_pdl_argument_and_refuses_kernels_without_one() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.arange(16, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    triton_launch.launch(_copy_kernel, (1,), src, dst, pdl=True)
    assert torch.equal(dst, src)
    assert not triton_launch.pdl_applies(torch.device("cpu"))
    with pytest.raises(TypeError, match="no PDL argument"):
        triton_launch.launch(_plain_copy_kernel, (1,), src, dst, pdl=True)


# Qwen3-0.6B's layer: hidden 1024, 16 query / 8 KV heads of 128, intermediate 3072.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, CONTEXT = 1024, 16, 8, 128, 3072, 300


def _layer_weights(gen: torch.Generator) -> dict[str, torch.Tensor]:
    def w(*shape: int, scale: float = 0.03) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16).cuda()

    qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    return {
        "norm1": 1 + w(HIDDEN, scale=0.1), "qkv": w(qkv_rows, HIDDEN), "q_norm": 1 + w(HEAD_DIM, scale=0.1),
        "k_norm": 1 + w(HEAD_DIM, scale=0.1), "o": w(HIDDEN, HEADS * HEAD_DIM), "norm2": 1 + w(HIDDEN, scale=0.1),
        "gate_up": w(2 * INTER, HIDDEN), "down": w(HIDDEN, INTER), "final": 1 + w(HIDDEN, scale=0.1),
    }


class _Layer:
    """One decode row through a Qwen3-shaped layer on static buffers (capturable)."""

    def __init__(self, gen: torch.Generator) -> None:
        self.w = _layer_weights(gen)
        slots = CONTEXT + 1
        self.k_buf = (torch.randn(slots, KV_HEADS, HEAD_DIM, generator=gen)).to(torch.bfloat16).cuda()
        self.v_buf = (torch.randn(slots, KV_HEADS, HEAD_DIM, generator=gen)).to(torch.bfloat16).cuda()
        self.req_to_token = torch.arange(slots, device="cuda").view(1, slots)
        self.pool = torch.zeros(1, dtype=torch.int64, device="cuda")
        self.seq_lens = torch.full((1,), CONTEXT + 1, dtype=torch.int64, device="cuda")
        self.loc = torch.full((1,), CONTEXT, dtype=torch.int64, device="cuda")
        self.positions = torch.full((1,), CONTEXT, dtype=torch.int64, device="cuda")
        freqs = torch.arange(CONTEXT + 1).double()[:, None] / 10000 ** (torch.arange(HEAD_DIM // 2) * 2 / HEAD_DIM)
        self.cos_sin = torch.cat([freqs.cos(), freqs.sin()], 1).float().cuda()  # [P, D]
        self.x = torch.zeros(1, HIDDEN, dtype=torch.bfloat16, device="cuda")
        self.residual = torch.zeros_like(self.x)
        self.workspace = decode_workspace(1, HEADS, 4, HEAD_DIM, "cuda")
        self.attn = torch.empty(1, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")

    def forward(self) -> torch.Tensor:
        w = self.w
        res1 = torch.empty_like(self.x)
        qkv = gemv_triton(self.x, w["qkv"], norm_weight=w["norm1"], residual=self.residual, residual_out=res1)
        q = rope_store_triton(qkv, HEADS, self.positions, self.cos_sin, self.loc, self.k_buf, self.v_buf,
                              w["q_norm"], w["k_norm"])
        paged_decode_attention(q, self.k_buf, self.v_buf, self.req_to_token, self.pool, self.seq_lens,
                               HEAD_DIM ** -0.5, out=self.attn, workspace=self.workspace)
        o = gemv_triton(self.attn.view(1, HEADS * HEAD_DIM), w["o"])
        res2 = torch.empty_like(self.x)
        act = gemv_triton(o, w["gate_up"], silu_mul=True, norm_weight=w["norm2"], residual=res1, residual_out=res2)
        down = gemv_triton(act, w["down"])
        return rmsnorm_triton(down, w["final"], 1e-6, residual=res2)


def _run(layer: _Layer, inputs: list[torch.Tensor], graph: bool) -> list[torch.Tensor]:
    outs = []
    if graph:
        layer.x.copy_(inputs[0])
        layer.forward()  # compile outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = layer.forward()
    for x in inputs:
        layer.x.copy_(x)
        layer.residual.copy_(x * 0.5)
        if graph:
            g.replay()
            outs.append(out.clone())
        else:
            outs.append(layer.forward().clone())
    torch.cuda.synchronize()
    return outs


@pytest.mark.skipif(not CUDA_PDL, reason="needs a CUDA device with programmatic dependent launch (sm90+)")
def test_a_decode_layer_of_pdl_kernels_in_a_graph_equals_it_without_pdl(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    layer = _Layer(gen)
    inputs = [torch.randn(1, HIDDEN, generator=gen).to(torch.bfloat16).cuda() for _ in range(20)]
    with_pdl = _run(layer, inputs, graph=True)
    launched_with_pdl = [k for key, k in triton_launch._COMPILED.items() if key[4]]
    assert len(launched_with_pdl) >= 5 and all(k.metadata.launch_pdl for k in launched_with_pdl)
    monkeypatch.setattr(triton_launch, "pdl_applies", lambda device: False)
    without = _run(layer, inputs, graph=False)
    for got, want in zip(with_pdl, without):
        assert torch.equal(got, want)
