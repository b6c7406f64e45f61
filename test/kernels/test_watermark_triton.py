"""The watermark selection kernel (sgl_kernel_ext/sampling/watermark_triton.py) against its
plain-torch reference (sglang.srt.sampling.watermarking.select.select_reference with
hashing.context_hashes): TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on
CUDA. Integers (context hashes, chosen ids) must be equal; the kernel's float32 scores use the
functions torch's kernels use, so the selected token is the reference's."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sampling_utils import make_info  # noqa: E402
from watermark_utils import tied_pair  # noqa: E402
from sgl_kernel_ext.sampling.sample import sample_triton  # noqa: E402
from sgl_kernel_ext.sampling.watermark_triton import (  # noqa: E402
    BLOCK,
    SPLIT_BLOCKS,
    watermark_admit_triton,
    watermark_append_triton,
    SupportStats,
    watermark_select_triton,
)
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.sampling.watermarking import state as state_mod  # noqa: E402
from sglang.srt.sampling.watermarking.config import WatermarkSettings, parse_key  # noqa: E402
from sglang.srt.sampling.watermarking.hashing import context_hashes  # noqa: E402
from sglang.srt.sampling.watermarking.select import row_keys, select_reference  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
KEYS = ["0", "1", "0123456789abcdef", "ffffffffffffffff", "8000000000000000", "deadbeef"]


def _probs(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """[rows, V] float32: full-support rows, a top-k row, a one-hot row, a low-entropy row, a row with
    support only past the first split, a uniform row."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 2  # [rows, V]
    kinds = ["full", "top_k", "one_hot", "peaked", "tail", "uniform"]
    for i in range(rows):
        kind = kinds[i % len(kinds)]
        if kind == "top_k":
            logits[i, logits[i].topk(vocab - 40).indices] = float("-inf")  # 40 survivors
        elif kind == "one_hot":
            logits[i] = float("-inf")
            logits[i, vocab - 1] = 0.0
        elif kind == "peaked":
            logits[i, 3] = 30.0
        elif kind == "tail":
            logits[i, : vocab - 5] = float("-inf")
        elif kind == "uniform":
            logits[i] = 0.0
    return torch.softmax(logits, dim=1)


def _state(rows: int, width: int, seed: int):
    """Slots, tails [R, H], per-slot lengths, per-row windows: empty, partial and full contexts, and
    two rows sharing a slot (the same context)."""
    gen = torch.Generator().manual_seed(seed)
    slots_total = rows + 2
    tails = torch.randint(0, 200000, (slots_total, width), generator=gen)  # [R, H] int64
    lengths = torch.tensor([(3 * s) % (width + 1) for s in range(slots_total)])  # [R]: 0 .. width
    slots = torch.tensor([(s + 1) % slots_total for s in range(rows)])
    slots[-1] = slots[0]  # a repeated context
    windows = torch.tensor([1 + (5 * r) % width for r in range(rows)])  # [W]
    return slots, tails, lengths, windows


def _reference(probs, slots, tails, lengths, windows, keys, key_b, threshold):
    used = torch.minimum(lengths.index_select(0, slots), windows)
    ctx = context_hashes(tails.index_select(0, slots), used)
    return select_reference(probs, row_keys(keys, key_b, threshold, ctx), ctx), ctx


@pytest.mark.parametrize("vocab", [50, BLOCK + 7, 2 * BLOCK * SPLIT_BLOCKS + 300])  # one block, two blocks, three splits
@pytest.mark.parametrize("key_b", [None, "fedcba9876543210", "5"])  # single key; dual, B wide or 32-bit
def test_kernel_matches_reference(vocab, key_b):
    rows, width = 12, 6
    probs = _probs(rows, vocab, vocab)
    slots, tails, lengths, windows = _state(rows, width, vocab + 1)
    keys = torch.tensor([parse_key(KEYS[r % len(KEYS)]) for r in range(rows)])
    key_b, threshold = (None, 1 << 32) if key_b is None else (parse_key(key_b), 1 << 31)
    expected, expected_ctx = _reference(probs, slots, tails, lengths, windows, keys, key_b, threshold)
    args = [t.to(DEVICE) for t in (probs, slots, tails, lengths, windows, keys)]
    chosen, ctx, row_max = watermark_select_triton(*args, key_b, threshold)
    assert torch.equal(row_max.cpu(), probs.amax(dim=1))
    assert torch.equal(ctx.cpu(), expected_ctx)
    assert torch.equal(chosen.cpu(), expected)
    assert chosen[2].item() == vocab - 1  # the one-hot row
    if key_b is not None:  # the coin gives some rows key B and some key A
        uses_b = row_keys(keys, key_b, threshold, expected_ctx) != keys
        assert uses_b.any() and not uses_b.all()


def test_kernel_equals_the_reference_on_the_same_device():
    """On CUDA the reference's torch kernels run there too: the same float32 scores, the same token."""
    rows, vocab, width = 6, 3 * BLOCK * SPLIT_BLOCKS // 2, 4
    probs = _probs(rows, vocab, 5).to(DEVICE)
    slots, tails, lengths, windows = (t.to(DEVICE) for t in _state(rows, width, 6))
    keys = torch.tensor([parse_key(k) for k in KEYS[:rows]], device=DEVICE)
    expected, expected_ctx = _reference(probs, slots, tails, lengths, windows, keys, None, 0)
    chosen, ctx, _ = watermark_select_triton(probs, slots, tails, lengths, windows, keys, None, 0)
    assert torch.equal(ctx, expected_ctx) and torch.equal(chosen, expected)


SPLIT = BLOCK * SPLIT_BLOCKS
TIES = {
    "one_block": lambda i, j: i // BLOCK == j // BLOCK,
    "two_blocks_of_a_split": lambda i, j: i // BLOCK != j // BLOCK and i // SPLIT == j // SPLIT,
    "two_splits": lambda i, j: i // SPLIT != j // SPLIT,
}


@pytest.mark.parametrize("where", list(TIES))
def test_exact_tie_goes_to_the_lowest_id(where):
    """Two tokens with equal log u and equal p tie exactly: the lower id wins, within a block,
    across a program's blocks and across splits."""
    vocab = 3 * SPLIT
    empty = torch.zeros(1, 1, dtype=torch.int64)  # [1, H]: a slot with no context tokens
    zero, one = torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    ctx = context_hashes(empty, zero)
    key, i, j = tied_pair(vocab, ctx.item(), TIES[where])
    probs = torch.zeros(1, vocab)
    probs[0, [i, j]] = 0.5
    assert select_reference(probs, torch.tensor([key]), ctx).item() == i
    args = [t.to(DEVICE) for t in (probs, zero, empty, zero, one, torch.tensor([key]))]
    chosen, got_ctx, _ = watermark_select_triton(*args, None, 0)
    assert got_ctx.item() == ctx.item() and chosen.item() == i


def _run_steps(kernels, params, logits_steps, prompts, outputs):
    """WatermarkState.force and .append over decode steps (forced ids, else token 0, appended);
    returns the forced ids [steps, B] and the final state tensors."""
    vocab = logits_steps[0].shape[1]
    settings = WatermarkSettings(key="5", key_b="fedcba9876543210", mixing_probability=0.4, max_probability=0.9)
    state = state_mod.WatermarkState(settings, len(params) + 3, 64, torch.device(DEVICE), kernels=kernels)
    info = make_info(params, vocab, device=DEVICE)
    slots = torch.arange(len(params), device=DEVICE) + 2  # [B]: rows live in slots 2 ..
    wm = info.watermark
    state.start(slots.index_select(0, wm.rows), [prompts[i] for i in wm.rows_host],
                [outputs[i] for i in wm.rows_host], wm.windows_host)
    forced = []
    for logits in logits_steps:
        forced.append(state.force(logits.clone(), info, slots))
        state.append(info, slots, torch.where(forced[-1] >= 0, forced[-1], torch.zeros_like(forced[-1])))
    return torch.stack(forced), (state.tails, state.lengths, state.history, state.counts)


def test_force_and_append_through_the_kernels_equal_the_torch_state_update():
    """Over decode steps: greedy rows are not watermark rows; a peaked row is gated by
    max_probability; a window-1 row over two tokens meets a context again and samples normally; a retracted row starts with a history; the dual key's coin picks the key. The
    forced tokens and the whole state equal the torch path's."""
    vocab = BLOCK + 100
    gen = torch.Generator().manual_seed(11)
    params = [
        SamplingParams(temperature=1.0, watermark={"key": "1", "context_window": 3}),
        SamplingParams(temperature=0.0, watermark={"key": "2", "context_window": 3}),  # greedy
        SamplingParams(temperature=0.8, top_k=20, watermark={"key": "abc", "context_window": 2}),
        SamplingParams(temperature=1.0, watermark={"key": "ffffffffffffffff", "context_window": 3}),  # peaked
        SamplingParams(temperature=1.0, top_k=2, watermark={"key": "42", "context_window": 1}),  # 2 contexts
        SamplingParams(temperature=1.0, top_p=0.8, watermark={"key": "7", "context_window": 4}),  # retracted
    ]
    steps = []
    for step in range(6):
        logits = torch.randn(len(params), vocab, generator=gen)
        logits[3, 7] = 40.0  # p > 0.9: the entropy gate
        logits[4, :2] = 10.0  # row 4 only ever has context [0] or [1]: a context repeats by step 3
        steps.append(logits.to(DEVICE))
    prompts = [[5, 6, 7], [1, 2], [9, 9, 9], [3], [0], [8, 8]]
    outputs = [[], [], [], [], [], [4, 5, 6, 4, 5, 6]]
    forced, state = _run_steps(True, params, steps, prompts, outputs)
    expected, expected_state = _run_steps(False, params, steps, prompts, outputs)
    assert torch.equal(forced, expected)
    for got, want in zip(state, expected_state):
        assert torch.equal(got, want)
    assert (forced[:, 1] == -1).all() and (forced[:, 3] == -1).all()  # greedy, gated
    assert (forced[0, [0, 2, 4, 5]] >= 0).all()
    assert (forced[:, 4] == -1).any()  # a repeated context samples normally


def _support_stats(logits: torch.Tensor, temps: torch.Tensor, top_ks, top_ps, min_ps):
    """The sampling kernel's result over `logits` ([B, V]) and the probabilities its statistics
    define in torch: [B, V] float32 exp(logits / T - lse_kept) where logits / T >= threshold, else 0."""
    rows = logits.shape[0]
    result = sample_triton(
        logits, temps, torch.tensor(top_ks, dtype=torch.int32, device=DEVICE), torch.tensor(top_ps, device=DEVICE),
        torch.tensor(min_ps, device=DEVICE).log(), torch.arange(rows, device=DEVICE), torch.zeros(rows, dtype=torch.int64, device=DEVICE),
    )
    scaled = logits / temps[:, None]  # [B, V]
    probs = torch.where(scaled >= result.threshold[:, None], torch.exp(scaled - result.lse_kept[:, None]), 0.0)
    return result, probs


def test_stats_kernel_selects_from_the_samplers_support():
    """The selection over the probabilities the sampling kernel's statistics define (never
    materialised) equals the reference over those probabilities built in torch, for a subset of
    the batch's rows; an inactive row picks nothing."""
    vocab, width = BLOCK * SPLIT_BLOCKS + 300, 5
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(6, vocab, generator=gen) * 2).to(DEVICE)  # [B, V]
    logits[3, : vocab // 2] = float("-inf")  # a masked half
    temps = torch.tensor([1.0, 0.7, 1.3, 1.0, 0.9, 1.0], device=DEVICE)
    result, probs = _support_stats(logits, temps, [vocab, 40, vocab, vocab, 7, vocab], [1.0, 0.9, 0.8, 1.0, 1.0, 1.0],
                                   [0.0, 0.0, 0.0, 0.05, 0.0, 0.0])
    assert torch.allclose(probs.sum(dim=1).cpu(), torch.ones(6), atol=1e-4)  # the statistics define a distribution
    rows = torch.tensor([5, 0, 1, 2, 3, 4], device=DEVICE)  # [W]
    slots, tails, lengths, windows = (t.to(DEVICE) for t in _state(6, width, vocab + 1))
    keys = torch.tensor([parse_key(KEYS[r]) for r in range(6)], device=DEVICE)
    active = torch.tensor([True, True, False, True, True, True], device=DEVICE)
    stats = SupportStats(rows, temps, result.threshold, result.lse_kept)
    chosen, ctx, row_max = watermark_select_triton(
        logits, slots, tails, lengths, windows, keys, None, 0, stats=stats, active=active
    )
    wanted_probs = probs.index_select(0, rows)
    expected, expected_ctx = _reference(wanted_probs.cpu(), *(t.cpu() for t in (slots, tails, lengths, windows, keys)), None, 0)
    live = active.cpu()
    assert torch.equal(chosen.cpu()[live], expected[live]) and torch.equal(ctx.cpu()[live], expected_ctx[live])
    assert torch.equal(row_max.cpu()[live], wanted_probs.amax(dim=1).cpu()[live])
    assert chosen[2].item() == 0 and row_max[2].item() == 0.0  # inactive
    assert (probs[1] > 0).sum().item() <= 40 and (probs[4] > 0).sum().item() == 7  # the top-k rows' support


def test_inactive_rows_are_never_admitted_and_keep_their_tails():
    width = 3
    tails = torch.arange(12, dtype=torch.int64, device=DEVICE).reshape(4, width)  # [R, H]
    lengths = torch.full((4,), width, dtype=torch.int64, device=DEVICE)
    history = torch.zeros(4, 8, dtype=torch.int32, device=DEVICE)
    counts = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    rows, slots = torch.arange(3, device=DEVICE), torch.tensor([0, 1, 3], device=DEVICE)  # inactive rows stand in slot 0
    active = torch.tensor([True, False, True], device=DEVICE)
    chosen = torch.tensor([7, 8, 9], device=DEVICE)
    ctx = torch.tensor([11, 12, 13], device=DEVICE)
    forced = watermark_admit_triton(rows, slots, chosen, ctx, torch.full((3,), 0.5, device=DEVICE), lengths,
                                    torch.full((3,), width, device=DEVICE), history, counts, 3, 0.9, active)
    assert forced.tolist() == [7, -1, 9] and counts.tolist() == [1, 0, 0, 1]
    before = tails.clone()
    watermark_append_triton(rows, slots, torch.tensor([20, 21, 22], device=DEVICE), tails, lengths, active)
    assert tails[1].tolist() == before[1].tolist() and tails[2].tolist() == before[2].tolist()
    assert tails[0].tolist() == [1, 2, 20] and tails[3].tolist() == [10, 11, 22]
