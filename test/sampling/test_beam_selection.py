"""Beam selection and the beam fork of the paged cache, without a server: the batched
joint_select equals a candidate-by-candidate walk; the finished pool ranks by length-normalised
score; a fork shares K/V slots per slot and frees exactly the slots no row uses any more."""

from __future__ import annotations

import torch

from beam_reference import beam_search
from sglang.srt.beam_search.group import BeamGroup, FinishedBeam
from sglang.srt.beam_search.selection import joint_select, row_candidates
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache


def _walk(cum, logprobs, tokens, stops, width, final):
    """One request's selection, one candidate at a time (the module docstring's definition)."""
    cands = sorted(
        ((cum[r] + logprobs[r][c], r, tokens[r][c]) for r in range(len(cum)) for c in range(len(tokens[r]))),
        key=lambda x: -x[0],
    )[: 2 * width]
    if final:
        return [], [(r, t) for _, r, t in cands[:width]]
    survivors, finished = [], []
    for _, r, t in cands:
        if len(survivors) == width:
            break
        (finished if t in stops else survivors).append((r, t))
    return survivors, finished


def test_joint_select_equals_the_walk() -> None:
    g = torch.Generator().manual_seed(0)
    width, vocab, groups = 3, 12, 6
    logits = torch.randn(groups * width, vocab, generator=g, dtype=torch.float64).float()
    cand = row_candidates(logits, 2 * width)
    cum = torch.randn(groups, width, generator=g) * 2
    stops = torch.tensor([[1, 2, -1], [3, -1, -1], [0, 1, 2], [-1, -1, -1], [5, 6, 7], [4, 8, 9]])
    final = torch.tensor([False, False, False, False, True, False])
    sel = joint_select(cum, cand.logprobs.view(groups, width, -1), cand.token_ids.view(groups, width, -1), stops,
                       width, final)
    for gi in range(groups):
        lp = cand.logprobs.view(groups, width, -1)[gi].tolist()
        tk = cand.token_ids.view(groups, width, -1)[gi].tolist()
        surv, fin = _walk(cum[gi].tolist(), lp, tk, set(stops[gi].tolist()) - {-1}, width, bool(final[gi]))
        got_surv = [(int(sel.parents[gi, j]), int(sel.token_ids[gi, j])) for j in torch.nonzero(sel.survives[gi]).flatten()]
        got_fin = [(int(sel.parents[gi, j]), int(sel.token_ids[gi, j])) for j in torch.nonzero(sel.finishes[gi]).flatten()]
        assert got_surv == surv
        assert got_fin == fin


def test_row_candidates_are_the_top_logprobs() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    cand = row_candidates(logits, 6)
    values, ids = torch.log_softmax(logits, -1).topk(6)
    torch.testing.assert_close(cand.logprobs, values)
    assert torch.equal(cand.token_ids, ids)


def test_masked_tokens_are_never_candidates() -> None:
    logits = torch.full((1, 10), float("-inf"))
    logits[0, [2, 5]] = torch.tensor([1.0, 0.5])
    cand = row_candidates(logits, 4)
    sel = joint_select(torch.zeros(1, 1), cand.logprobs.view(1, 1, 4), cand.token_ids.view(1, 1, 4),
                       torch.full((1, 1), -1), 2, torch.tensor([False]))
    assert sel.survives[0].sum() == 2 and not sel.finishes[0].any()
    assert sorted(sel.token_ids[0][sel.survives[0]].tolist()) == [2, 5]


def test_group_results_rank_by_normalised_score() -> None:
    group = BeamGroup(width=2, num_return=2, length_penalty=1.0, max_new_tokens=4, stop_ids=[0])
    group.finished = [FinishedBeam([1, 2, 3, 4], -4.0, None), FinishedBeam([1, 0], -1.8, 0), FinishedBeam([2], -1.5, None)]
    results = group.results()
    assert [r.output_ids for r in results] == [[1, 0], [1, 2, 3, 4]]
    assert results[0].finish_reason == {"type": "stop", "matched": 0}
    assert results[1].finish_reason == {"type": "length", "length": 4}
    assert results[0].sequence_score == -0.9


def test_reference_beam_search_with_full_width_is_exhaustive() -> None:
    """The reference the e2e tests trust: at full width over a 3-token vocabulary it returns the
    best sequences of all 9 (a fixed table of next-token distributions)."""
    table = torch.log_softmax(torch.randn(13, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64), -1)
    mask = torch.full((6,), float("-inf"), dtype=torch.float64)
    mask[:3] = 0

    def step(history):
        key = 0 if not history else 1 + history[0] * 3 + (history[1] if len(history) > 1 else 0)
        return torch.log_softmax(table[key % 13] + mask, -1)

    best = beam_search(step, width=3, max_new_tokens=2, stop_ids=set(), n=3)
    everything = sorted(((a, b) for a in range(3) for b in range(3)),
                        key=lambda s: -(float(step([])[s[0]]) + float(step([s[0]])[s[1]])))
    assert [ids for ids, _, _ in best] == [list(s) for s in everything[:3]]


def test_fork_shares_slots_and_frees_the_dropped_tail() -> None:
    pool = ReqToTokenPool(4, 16, "cpu")
    allocator = TokenToKVPoolAllocator(64)
    cache = RadixCache(pool, allocator, disable=True)
    rows = [pool.alloc() for _ in range(3)]
    prompt = cache.alloc(4)
    pool.assign([rows[0]], [0], [4], prompt)
    for r in rows[1:]:
        cache.share_prefix(r, rows[0], 4)
    tails = cache.alloc(6)  # two generated tokens per row
    pool.assign(rows, [4, 4, 4], [2, 2, 2], tails)
    free_before = allocator.available_size()
    # Rows 0 and 1 continue beam 0, row 2 continues beam 1: row 2's own tail is dropped.
    cache.fork_rows([rows[1], rows[2]], [rows[0], rows[1]], [4, 4], [6, 6])
    assert torch.equal(pool.slots_of(rows[1], 6), pool.slots_of(rows[0], 6))
    assert torch.equal(pool.slots_of(rows[2], 6)[4:], tails[2:4])
    # Row 1's tail (slots 2:4) lives on in row 2, row 2's (4:6) is used by nobody.
    assert allocator.available_size() == free_before + 2
    assert cache.slot_refs[tails[0:2]].tolist() == [2, 2] and cache.slot_refs[prompt].tolist() == [3] * 4
    for r in rows:
        cache.discard(_Row(r, 6))
    assert allocator.available_size() == 64


class _Row:
    """What RadixCache.discard reads of a request."""

    def __init__(self, row: int, kv_len: int) -> None:
        self.req_pool_idx, self.kv_len, self.last_node = row, kv_len, None


def test_copy_spans_moves_every_rows_span_at_once_swaps_included():
    """Spans of different lengths and starts in one call; rows 0 and 1 swap their spans; the
    device table (a separate tensor here, as on CUDA) gets what the host table gets."""
    pool = ReqToTokenPool(4, 8, "cpu")
    pool.req_to_token_cpu.copy_(torch.arange(5 * 8).reshape(5, 8))
    pool.req_to_token = pool.req_to_token_cpu.clone()  # the device's copy
    before = pool.req_to_token_cpu.clone()
    old, new = pool.copy_spans([0, 1, 3], [1, 0, 2], [2, 2, 5], [4, 4, 8])
    want = before.clone()
    want[0, 2:4], want[1, 2:4], want[3, 5:8] = before[1, 2:4], before[0, 2:4], before[2, 5:8]
    assert torch.equal(pool.req_to_token_cpu, want) and torch.equal(pool.req_to_token, want)
    assert old.tolist() == before[0, 2:4].tolist() + before[1, 2:4].tolist() + before[3, 5:8].tolist()
    assert new.tolist() == want[0, 2:4].tolist() + want[1, 2:4].tolist() + want[3, 5:8].tolist()
