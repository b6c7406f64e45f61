"""The watermark selection's CPU paths (select.py: the support window's hash, the int32 hash of the
vocabulary) against the plain int64 reference, token for token, and through WatermarkState.force
over decode steps with the sampler's filters."""

from __future__ import annotations

import pytest
import torch

from sampling_utils import make_info
from sgl_kernel_ext.sampling.support import compute_support
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.watermarking import select as select_mod
from sglang.srt.sampling.watermarking import state as state_mod
from sglang.srt.sampling.watermarking.config import WatermarkSettings, parse_key
from sglang.srt.sampling.watermarking.hashing import context_hashes
from sglang.srt.sampling.watermarking.select import row_keys, select_full_cpu, select_reference, select_window
from watermark_utils import tied_pair

KEYS = ["0", "1", "0123456789abcdef", "ffffffffffffffff", "8000000000000000", "deadbeef", "7fffffffffffffff"]


def _rows(rows: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys, context hashes (with 0 and 2**32 - 1) and logits [rows, V] with a one-hot row, a peaked
    row and a flat row."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.tensor([parse_key(KEYS[r % len(KEYS)]) for r in range(rows)])
    ctx = torch.randint(0, 1 << 32, (rows,), generator=gen)
    ctx[0], ctx[-1] = 0, (1 << 32) - 1
    logits = torch.randn(rows, vocab, generator=gen) * 2
    logits[1 % rows] = float("-inf")
    logits[1 % rows, vocab // 2] = 0.0
    logits[2 % rows, 0] = 25.0
    logits[3 % rows] = 0.0
    return keys, ctx, logits


@pytest.mark.parametrize("rows, vocab", [(5, 7), (6, 1000), (3, 40000), (40, 3001)])  # chunks of one row, of several, a partial chunk
def test_int32_vocabulary_path_equals_the_reference(rows, vocab, monkeypatch):
    monkeypatch.setattr(select_mod, "_CPU_CHUNK_ELEMENTS", 1 << 14)
    keys, ctx, logits = _rows(rows, vocab, rows * vocab)
    probs = torch.softmax(logits, dim=1)
    expected = select_reference(probs, keys, ctx)
    assert torch.equal(select_full_cpu(probs, keys, ctx), expected)
    assert expected[1 % rows].item() == vocab // 2


@pytest.mark.parametrize("top_k, top_p", [(1, 1.0), (5, 1.0), (50, 0.9), (400, 0.5)])
def test_window_path_equals_the_reference(top_k, top_p):
    rows, vocab = 6, 5000
    keys, ctx, logits = _rows(rows, vocab, top_k)
    logits[3] = torch.arange(vocab) / vocab  # distinct values: the flat row's ties would run past the window
    support = compute_support(logits, torch.full((rows,), top_k), torch.full((rows,), top_p), torch.zeros(rows),
                              window=top_k, need_top_p=top_p < 1.0, need_min_p=False)
    probs = torch.softmax(torch.where(support.keeps(logits), logits, torch.full_like(logits, float("-inf"))), dim=1)
    done = support.window_complete()  # the one-hot row's -inf ties run past a window wider than 1
    assert done.sum() >= rows - 1
    keys, ctx, probs = keys[done], ctx[done], probs[done]
    assert torch.equal(select_window(probs, keys, ctx, support.idx[done]), select_reference(probs, keys, ctx))


def test_ties_go_to_the_lowest_id_on_every_path():
    """Equal log u (distinct hashes rounding to one float32) and equal p: a window listing the higher
    id first and the int32 path both return the lower id, as the reference does."""
    vocab = 30000
    key, i, j = tied_pair(vocab, 77, lambda i, j: True)
    probs = torch.zeros(1, vocab)
    probs[0, [i, j]] = 0.5
    keys, ctx = torch.tensor([key]), torch.tensor([77])
    assert select_reference(probs, keys, ctx).item() == i
    assert select_full_cpu(probs, keys, ctx).item() == i
    assert select_window(probs, keys, ctx, torch.tensor([[j, 3, i]])).item() == i


def _reference_select(probs, support, slots, tails, state_lengths, windows, keys, key_b, threshold, kernel):
    ctx = context_hashes(tails.index_select(0, slots), torch.minimum(state_lengths.index_select(0, slots), windows))
    return select_reference(probs, row_keys(keys, key_b, threshold, ctx), ctx), ctx, probs.amax(dim=1)


def _forced(monkeypatch, select, params, steps, settings):
    monkeypatch.setattr(state_mod, "select_tokens", select)
    state = state_mod.WatermarkState(settings, len(params), 64, torch.device("cpu"))
    info = make_info(params, steps[0].shape[1])
    slots = torch.arange(len(params))
    wm = info.watermark
    state.start(slots.index_select(0, wm.rows), [[r, 2, 3] for r in wm.rows_host], [[] for _ in wm.rows_host], wm.windows_host)
    forced = []
    for logits in steps:
        forced.append(state.force(logits.clone(), info, slots))
        state.append(info, slots, torch.where(forced[-1] >= 0, forced[-1], torch.zeros_like(forced[-1])))
    return torch.stack(forced)  # [steps, B]


MIXED = [
    SamplingParams(temperature=1.0, watermark={"key": "1", "context_window": 3}),
    SamplingParams(temperature=0.7, top_k=30, watermark={"key": "abc", "context_window": 2}),
    SamplingParams(temperature=1.0, top_p=0.7, watermark={"key": "ffffffffffffffff", "context_window": 4}),
    SamplingParams(temperature=1.0, min_p=0.05, watermark={"key": "42", "context_window": 1}),
    SamplingParams(temperature=0.0, watermark={"key": "9", "context_window": 3}),
]
TOP_K = [
    SamplingParams(temperature=1.0, top_k=40, watermark={"key": "1", "context_window": 3}),
    SamplingParams(temperature=0.7, top_k=8, top_p=0.9, watermark={"key": "abc", "context_window": 2}),
    SamplingParams(temperature=1.3, top_k=64, min_p=0.01, watermark={"key": "ffffffffffffffff", "context_window": 4}),
    SamplingParams(temperature=1.0, top_k=2, watermark={"key": "42", "context_window": 1}),
    SamplingParams(temperature=0.0, watermark={"key": "9", "context_window": 3}),
]


@pytest.mark.parametrize("batch, window_path", [(MIXED, False), (TOP_K, True)])
@pytest.mark.parametrize("key_b", [None, "fedcba9876543210"])
def test_force_on_the_cpu_paths_equals_the_reference(monkeypatch, key_b, batch, window_path):
    """Over decode steps, a batch whose rows are not all top-k bounded (int32 path) and one whose
    rows are (window path), each with a greedy row: the forced tokens are the reference's."""
    vocab = 3000
    gen = torch.Generator().manual_seed(4)
    steps = [torch.randn(len(batch), vocab, generator=gen) * 3 for _ in range(4)]
    settings = WatermarkSettings(key_b=key_b, mixing_probability=0.3) if key_b else WatermarkSettings()
    paths = []
    for name in ("select_window", "select_full_cpu"):
        real = getattr(select_mod, name)
        monkeypatch.setattr(select_mod, name, lambda *a, _real=real, _name=name: paths.append(_name) or _real(*a))
    forced = _forced(monkeypatch, select_mod.select_tokens, batch, steps, settings)
    assert paths == ["select_window" if window_path else "select_full_cpu"] * len(steps)
    assert torch.equal(forced, _forced(monkeypatch, _reference_select, batch, steps, settings))
    assert (forced[:, :4] >= 0).any(dim=0).all() and (forced[:, 4] == -1).all()
