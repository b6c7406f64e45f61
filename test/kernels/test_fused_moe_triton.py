"""The grouped-GEMM MoE kernels against their plain-torch reference, and the token -> expert
block alignment. TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.moe.align import align_to_blocks, padded_rows  # noqa: E402
from sgl_kernel_ext.moe.align_triton import align_to_blocks_triton, align_triton_fits  # noqa: E402
from sgl_kernel_ext.moe.fused_moe_gemv import GEMV_MAX_PAIRS, fused_experts_gemv  # noqa: E402
from sgl_kernel_ext.moe.fused_moe_triton import fused_experts_triton  # noqa: E402
from sgl_kernel_ext.moe.reference import fused_experts_reference  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _inputs(n: int, k: int, experts: int, hidden: int, inter: int, dtype: torch.dtype, low: int = 0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    ids = torch.stack([torch.randperm(experts - low, generator=g)[:k] + low for _ in range(n)]).to(torch.int32)
    weights = torch.rand(n, k, generator=g)
    return [t.to(DEVICE) for t in (x.to(dtype), w13.to(dtype), w2.to(dtype), weights, ids)]


# Decode-sized and prefill-sized batches; hidden and intermediate sizes off the 64-wide tiles.
@pytest.mark.parametrize(
    "n,k,experts,hidden,inter,dtype",
    [(1, 2, 4, 32, 24, torch.float32), (5, 3, 8, 48, 40, torch.float32), (37, 2, 4, 64, 80, torch.float32),
     (9, 2, 4, 32, 24, torch.bfloat16), (3, 2, 4, 32, 24, torch.float16)],
)
def test_fused_experts_match_reference(n, k, experts, hidden, inter, dtype) -> None:
    x, w13, w2, weights, ids = _inputs(n, k, experts, hidden, inter, dtype)
    got = fused_experts_triton(x, w13, w2, weights, ids)
    expected = fused_experts_reference(x, w13, w2, weights, ids)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.dtype == dtype and got.shape == (n, hidden)
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_foreign_experts_contribute_zero(batch_invariant) -> None:
    """EP: ids outside [0, E) (another rank's experts, shifted to negative or >= E) add nothing,
    on the GEMV path and the grouped GEMM."""
    x, w13, w2, weights, ids = _inputs(6, 3, 8, 32, 24, torch.float32)
    local = ids - 2  # this rank holds global experts 2..5 as local 0..3
    got = fused_experts_triton(x, w13[:4], w2[:4], weights, local, batch_invariant=batch_invariant)
    expected = fused_experts_reference(x, w13[:4], w2[:4], weights, local)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n,k,hidden,inter", [(1, 8, 160, 72), (7, 8, 64, 200), (3, 2, 32, 24)])
def test_gemv_path_equals_grouped_gemm(n, k, hidden, inter) -> None:
    """Decode-sized batches (at most GEMV_MAX_PAIRS pairs) take the GEMV kernels; in float32 they
    give the grouped GEMM's (batch-invariant path's) result."""
    assert n * k <= GEMV_MAX_PAIRS
    x, w13, w2, weights, ids = _inputs(n, k, 16, hidden, inter, torch.float32, seed=3)
    gemv = fused_experts_gemv(x, w13, w2, weights, ids)
    torch.testing.assert_close(fused_experts_triton(x, w13, w2, weights, ids), gemv, atol=0, rtol=0)
    grouped = fused_experts_triton(x, w13, w2, weights, ids, batch_invariant=True)
    torch.testing.assert_close(gemv, grouped, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gemv, fused_experts_reference(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


def test_alignment_groups_pairs_by_expert_in_padded_blocks() -> None:
    ids = torch.tensor([[2, 0], [2, 1], [5, 2]], dtype=torch.int32, device=DEVICE)  # 5: foreign with E=4
    blocks = align_to_blocks(ids, 4, 4)
    rows = padded_rows(6, 4, 4)
    assert blocks.sorted_pairs.shape == (rows,) and blocks.block_expert.shape == (rows // 4,)
    pairs, experts = blocks.sorted_pairs.tolist(), blocks.block_expert.tolist()
    # Experts 0, 1, 2 own one block each, in order; pair 4 (token 2, expert 5) is left out.
    assert experts[:3] == [0, 1, 2] and all(e == 4 for e in experts[3:])
    assert pairs[:4] == [1, 6, 6, 6] and pairs[4:8] == [3, 6, 6, 6] and pairs[8:12] == [0, 2, 5, 6]


def test_alignment_by_running_count_equals_the_stable_sort(monkeypatch) -> None:
    """The one-hot running count and the stable sort give a pair the same rank in its expert."""
    from sgl_kernel_ext.moe import align

    g = torch.Generator().manual_seed(0)
    for pairs, experts, block_m in ((6, 4, 4), (512, 128, 16), (300, 8, 32)):
        ids = torch.randint(-2, experts + 3, (pairs // 2, 2), generator=g).to(torch.int32).to(DEVICE)
        counted = align.align_to_blocks(ids, experts, block_m)
        monkeypatch.setattr(align, "ONE_HOT_MAX_ELEMENTS", 0)
        sorted_ = align.align_to_blocks(ids, experts, block_m)
        monkeypatch.undo()
        assert torch.equal(counted.sorted_pairs, sorted_.sorted_pairs)
        assert torch.equal(counted.block_expert, sorted_.block_expert)


@pytest.mark.parametrize(
    "pairs,experts,block_m", [(6, 4, 4), (512, 128, 16), (300, 8, 32), (2048, 128, 32), (40, 60, 16), (640, 512, 16)]
)
def test_triton_alignment_equals_torch_alignment(pairs, experts, block_m) -> None:
    """The two-launch Triton alignment gives align.py's layout: the same rows, padding marks and
    block experts, foreign ids (negative or >= E) left out, several chunks of pairs."""
    g = torch.Generator().manual_seed(pairs)
    ids = torch.randint(-2, experts + 3, (pairs // 2, 2), generator=g).to(torch.int32).to(DEVICE)
    want = align_to_blocks(ids, experts, block_m)
    got = align_to_blocks_triton(ids, experts, block_m)
    assert torch.equal(got.sorted_pairs, want.sorted_pairs)
    assert torch.equal(got.block_expert, want.block_expert)


def test_triton_alignment_serves_while_its_count_reads_stay_small() -> None:
    """chunks^2 x experts count reads <= 8M: 16k pairs at 128 experts, 2k at 512, not 4k at 512."""
    assert align_triton_fits(2048, 128) and align_triton_fits(16384, 128) and not align_triton_fits(16385, 128)
    assert align_triton_fits(2048, 512) and not align_triton_fits(4096, 512)


def test_gemv_path_with_a_large_top_k() -> None:
    """Top-10 of 64 experts (Qwen3-Next's k, padded to 16 slots: the down kernel's shorter K tile)."""
    x, w13, w2, weights, ids = _inputs(3, 10, 64, 64, 48, torch.float32, seed=5)
    gemv = fused_experts_gemv(x, w13, w2, weights, ids)
    torch.testing.assert_close(gemv, fused_experts_reference(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)
