"""sgl_kernel_ext Triton kernels against their plain-torch references.

On a CPU they run under TRITON_INTERPRET=1 (set here before triton is imported) on tiny shapes;
on a CUDA machine without that variable they run natively (benchmark/gpu_check.sh). Skipped
only when triton cannot be imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sampling_utils import make_info  # noqa: E402
from sgl_kernel_ext.sampling import logprobs as lp_kernels  # noqa: E402
from sgl_kernel_ext.sampling import penalties as pen_kernels  # noqa: E402
from sgl_kernel_ext.sampling import sample as sample_kernels  # noqa: E402
from sgl_kernel_ext.sampling import sample_reference  # noqa: E402
from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402
from sglang.srt.layers.sampler import Sampler  # noqa: E402
from sglang.srt.layers.sampler_fused import FusedStep  # noqa: E402
from sglang.srt.sampling.fused_logits_bias import apply_logits_bias_fused, update_penalties_fused  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
NEG_INF = float("-inf")


def _rows(vocab: int, seed: int) -> torch.Tensor:
    """[8, V] logits with the hard cases: ties at the k-th value, a -inf row, a NaN row, a +inf
    row, masked tokens, a flat row (huge nucleus) and a one-finite-token row."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, vocab, generator=gen) * 3
    x[0, :6] = torch.tensor([9.0, 8.0, 8.0, 8.0, 7.0, 7.0])  # top_k 2 and 3 end inside the 8.0 tie
    x[1] = NEG_INF
    x[2, 5] = float("nan")
    x[3, 7] = float("inf")
    x[4, ::3] = NEG_INF
    x[5] = 0.25  # every token tied
    x[6] = NEG_INF
    x[6, vocab // 2] = -3.0
    return x


# temperature, top_k, top_p, min_p per row: every filter alone and combined, top_k > vocab, greedy.
_PARAMS = {
    "topk_tie": [(1.0, 2, 1.0, 0.0), (0.7, 3, 1.0, 0.0)],
    "topk_topp_minp": [(0.7, 50, 0.9, 0.05), (1.3, 5, 0.5, 0.1)],
    "topp_only": [(0.7, None, 0.9, 0.0), (1.0, None, 0.3, 0.0)],
    "minp_only": [(1.0, None, 1.0, 0.2), (0.5, None, 1.0, 0.01)],
    "no_filter": [(1.0, None, 1.0, 0.0), (0.8, 10**9, 1.0, 0.0)],
    "greedy_mix": [(1.0, 1, 1.0, 0.0), (0.6, 7, 0.95, 0.0)],
    # top_k past SMALL: the top-p bound is searched too
    "large_topk_topp": [(0.7, 500, 0.9, 0.0), (1.0, 1000, 0.95, 0.0)],
    # scaled gaps far beyond BOUND_RANGE: no bound, the full-row path
    "tiny_temperature": [(0.01, 50, 1.0, 0.0), (0.02, 300, 0.9, 0.0)],
}


def _params(name: str, rows: int, vocab: int):
    per_row = [_PARAMS[name][r % 2] for r in range(rows)]
    temps = torch.tensor([p[0] for p in per_row])
    ks = torch.tensor([vocab if p[1] is None else min(p[1], vocab) for p in per_row], dtype=torch.int32)
    ps = torch.tensor([p[2] for p in per_row])
    log_min_ps = torch.log(torch.tensor([p[3] for p in per_row]))
    return temps, ks, ps, log_min_ps


def _check_sample(logits, temps, ks, ps, log_min_ps, seed=0):
    rows = logits.shape[0]
    seeds = torch.arange(rows, dtype=torch.int64) * 7919 - 2**62 + seed  # negative and large seeds
    positions = torch.arange(rows, dtype=torch.int64) + 100
    args = [t.to(DEVICE) for t in (logits, temps, ks, ps, log_min_ps, seeds, positions)]
    got = sample_kernels.sample_triton(*args)
    want = sample_reference.sample_reference(logits, temps, ks, ps, log_min_ps, seeds, positions)
    assert torch.equal(got.invalid.cpu(), want.invalid)
    assert torch.equal(got.ids.cpu(), want.ids)
    ok = ~want.invalid
    assert torch.equal(got.threshold.cpu()[ok], want.threshold[ok])
    torch.testing.assert_close(got.lse.cpu()[ok], want.lse[ok], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.lse_kept.cpu()[ok], want.lse_kept[ok], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(_PARAMS))
@pytest.mark.parametrize("vocab", [300, 20000])  # one chunk; ten chunks of the chunk grid
def test_sample_matches_reference(name, vocab):
    logits = _rows(vocab, seed=vocab)
    _check_sample(logits, *_params(name, logits.shape[0], vocab))


def test_sample_full_row_path_matches_reference(monkeypatch):
    """Rows whose candidates overflow take the exact bisection path; same result."""
    monkeypatch.setattr(sample_kernels, "CAP", 4)
    monkeypatch.setattr(sample_kernels, "SMALL", 4)
    monkeypatch.setattr(sample_kernels, "MEDIUM", 4)
    vocab = 300
    logits = _rows(vocab, seed=1)
    for name in ("topk_topp_minp", "topp_only", "topk_tie"):
        _check_sample(logits, *_params(name, logits.shape[0], vocab), seed=5)


def test_sample_hot_block_tiles_and_overflow(monkeypatch):
    """Small blocks: rows re-read their hot blocks over several tiles (top_k 5, past SMALL
    candidates by bisection), rows with more hot blocks than MAX_HOT take the full-row path
    (top_k 50); same result."""
    monkeypatch.setattr(sample_kernels, "CHUNK", 128)
    monkeypatch.setattr(sample_kernels, "BLOCK_SIZE", 8)
    monkeypatch.setattr(sample_kernels, "HOT_TILE", 2)
    monkeypatch.setattr(sample_kernels, "MAX_HOT", 8)
    monkeypatch.setattr(sample_kernels, "SMALL", 4)
    vocab = 300
    logits = _rows(vocab, seed=2)
    _check_sample(logits, *_params("topk_topp_minp", logits.shape[0], vocab), seed=7)


def test_sample_near_flat_rows_take_the_candidate_path():
    """Logits within a few hundredths of each other (a random-weight model's, or a real one's at a
    high temperature): the bounds are searched at the row's own scale, so top-k rows gather
    candidates instead of bisecting over the whole row; the draw equals the reference. A top-p
    0.99 row keeps nearly every token: the full-row path, as before."""
    vocab, rows = 20000, 4
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(4)) * 0.01
    temps = torch.tensor([0.7, 1.0, 0.7, 1.0])
    ks = torch.tensor([50, 500, 50, vocab], dtype=torch.int32)
    ps = torch.tensor([0.9, 0.9, 1.0, 0.99])
    log_min_ps = torch.full((rows,), NEG_INF)
    _check_sample(logits, temps, ks, ps, log_min_ps)
    workspace = sample_kernels.new_workspace(rows, vocab, torch.device(DEVICE))
    args = [t.to(DEVICE) for t in (logits, temps, ks, ps, log_min_ps)]
    sample_kernels.sample_triton(*args, torch.zeros(rows, dtype=torch.int64, device=DEVICE),
                                 torch.zeros(rows, dtype=torch.int64, device=DEVICE), workspace=workspace)
    assert sample_kernels.full_row_flags(workspace, rows, vocab).tolist() == [0, 0, 0, 1]


def test_sample_top_p_that_rounds_to_zero_keeps_the_max():
    """top_p = 1e-46 passes validation (> 0) but is 0.0 in fp32: the max token is still kept."""
    logits = torch.arange(8, dtype=torch.float32).unsqueeze(0)
    temps, ks, ps, log_min_ps = (torch.ones(1), torch.tensor([5], dtype=torch.int32), torch.tensor([1e-46]),
                                 torch.full((1,), NEG_INF))
    _check_sample(logits, temps, ks, ps, log_min_ps)
    assert sample_kernels.sample_triton(*(t.to(DEVICE) for t in (logits, temps, ks, ps, log_min_ps)),
                                        torch.zeros(1, dtype=torch.int64, device=DEVICE),
                                        torch.zeros(1, dtype=torch.int64, device=DEVICE)).ids.item() == 7


def test_sample_new_seed_new_draw():
    logits = torch.zeros(1, 1000)
    args = _params("no_filter", 1, 1000)
    drawn = {
        sample_kernels.sample_triton(
            logits.to(DEVICE), *(t.to(DEVICE) for t in args),
            torch.tensor([seed], device=DEVICE), torch.tensor([3], device=DEVICE),
        ).ids.item()
        for seed in range(12)
    }
    assert len(drawn) > 6


def test_greedy_matches_reference():
    logits = _rows(20000, seed=3)
    logits[7, 10:13] = 1e4  # a tie at the maximum: lowest id
    ids, invalid = sample_kernels.greedy_triton(logits.to(DEVICE))
    want_ids, want_invalid = sample_reference.greedy_reference(logits)
    assert torch.equal(ids.cpu(), want_ids) and torch.equal(invalid.cpu(), want_invalid)
    assert ids[7].item() == 10


def _penalty_lists(rows: int, vocab: int, device: str) -> pen_kernels.PenaltyLists:
    """Overlapping lists (the same token in several), left-packed histories of different lengths
    with a free column each, a row still under min_new_tokens."""
    gen = torch.Generator().manual_seed(11)

    def history(width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = torch.stack([torch.randperm(vocab, generator=gen)[:width] for _ in range(rows)])  # [B, W]
        lengths = torch.tensor([[width - 1 - 2 * b] for b in range(rows)])  # [B, 1]; < W: room to record one
        ids = torch.where(torch.arange(width) < lengths, ids, -1)
        counts = torch.where(ids >= 0, torch.randint(1, 5, ids.shape, generator=gen), 0).float()
        return ids.to(device), counts.to(device), lengths.to(device)

    def distinct(width: int) -> torch.Tensor:
        ids = torch.stack([torch.randperm(vocab, generator=gen)[:width] for _ in range(rows)])  # [B, W]
        ids[:, -2:] = -1
        return ids.to(device)

    column = lambda values, dtype=torch.float32: torch.tensor(values, dtype=dtype, device=device).reshape(-1, 1)
    bias_ids = distinct(4).clamp(min=0)
    bias_values = torch.randn(bias_ids.shape, generator=gen).to(device)
    bias_values[:, -2:] = 0.0  # the info's pads: id 0, value 0.0
    freq, pres, rep = history(12), history(9), history(20)
    return pen_kernels.PenaltyLists(
        freq_ids=freq[0], freq_counts=freq[1], freq_lengths=freq[2], freq_penalty=column([0.5, -0.3, 0.0]),
        pres_ids=pres[0], pres_counts=pres[1], pres_lengths=pres[2], pres_penalty=column([0.2, 1.0, 0.0]),
        stop_ids=distinct(5), output_lens=column([1, 9, 0], torch.int64), min_new_tokens=column([4, 4, 0], torch.int64),
        rep_ids=rep[0], rep_counts=rep[1], rep_lengths=rep[2], rep_penalty=column([1.3, 0.7, 1.0]),
        bias_ids=bias_ids, bias_values=bias_values,
    )


def _apply_and_update(lists: pen_kernels.PenaltyLists, logits: torch.Tensor, tokens: torch.Tensor, n_rows: int):
    table = pen_kernels.PenaltyTable(logits.device)
    table.write(lists, n_rows)
    pen_kernels.apply_penalties_triton(logits, table)
    pen_kernels.update_penalties_triton(tokens, table)


def test_penalties_and_update_match_reference():
    vocab = 64  # small, so the lists overlap often
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(2)) * 4
    want_lists = _penalty_lists(3, vocab, "cpu")
    tokens = torch.tensor([int(want_lists.freq_ids[0, 0]), 63, -1])  # seen, maybe new, flagged
    got = logits.clone().to(DEVICE)
    got_lists = _penalty_lists(3, vocab, DEVICE)
    _apply_and_update(got_lists, got, tokens.to(DEVICE), 3)
    want = logits.clone()
    pen_kernels.apply_penalties_reference(want, want_lists)
    pen_kernels.update_penalties_reference(tokens, want_lists)
    assert torch.equal(got.cpu(), want)
    for name in ("freq_ids", "freq_counts", "freq_lengths", "pres_ids", "pres_counts", "rep_ids", "rep_lengths", "output_lens"):
        assert torch.equal(getattr(got_lists, name).cpu(), getattr(want_lists, name)), name
    assert want_lists.output_lens.flatten().tolist() == [2, 10, 0]


def test_penalty_table_rows_past_n_rows_are_untouched():
    """A graph replays over a padded batch: rows >= n_rows keep their logits and record nothing."""
    vocab = 64
    lists = _penalty_lists(3, vocab, DEVICE)
    lengths_before = lists.freq_lengths.clone()
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    got = logits.clone()
    _apply_and_update(lists, got, torch.tensor([60, 61, 62], device=DEVICE), 1)
    assert torch.equal(got[1:], logits[1:]) and not torch.equal(got[0], logits[0])
    assert torch.equal(lists.freq_lengths[1:], lengths_before[1:])


def test_penalty_table_uploads_only_changes():
    lists = _penalty_lists(3, 64, DEVICE)
    table = pen_kernels.PenaltyTable(torch.device(DEVICE))
    table.write(lists, 3)
    first = table.table.clone()
    assert first[pen_kernels.N_ROWS] == 3 and first[pen_kernels.FREQ] == lists.freq_lengths.data_ptr()
    table.write(pen_kernels.PenaltyLists(), 2)  # no lists: every list absent
    assert table.table[pen_kernels.N_ROWS] == 2 and not table.table[1:].any()
    table.write(lists, 3)
    table.clear()  # before a capture's warm-up: nothing to touch, whatever was written before
    assert not table.table.any()


def test_penalty_table_made_in_inference_mode_takes_writes_outside_it():
    """The process's one table may first be made while a graph is captured (inference mode) and
    written later by a step outside that mode."""
    with torch.inference_mode():
        table = pen_kernels.PenaltyTable(torch.device(DEVICE))
    table.write(_penalty_lists(2, 64, DEVICE), 2)
    assert table.table[pen_kernels.N_ROWS] == 2


def test_fused_logits_bias_equals_torch_path():
    vocab = 50
    params = [
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.2, repetition_penalty=1.2, min_new_tokens=3),
        SamplingParams(logit_bias={"3": 4.0, "7": -2.5}, repetition_penalty=0.8),
        SamplingParams(temperature=0.0),
    ]
    prompts = [[1, 2, 3, 3], [7, 8], [4]]
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(4)) * 2
    # A speculative verify records a column of its [B, K] draft matrix: a strided view.
    drafts = torch.tensor([[9, 3], [9, 7], [9, 4]])  # [B, 2]
    step_ids = drafts[:, 1]
    torch_info = make_info(params, vocab, prompts=prompts)
    fused_info = make_info(params, vocab, prompts=prompts, device=DEVICE)
    torch_info.update_penalties(step_ids)
    assert update_penalties_fused(fused_info, drafts.to(DEVICE)[:, 1])
    want = logits.clone()
    torch_info.apply_logits_bias(want)
    got = logits.clone().to(DEVICE)
    assert apply_logits_bias_fused(fused_info, got)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("processed", [False, True])
def test_token_logprobs_match_reference(processed):
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(6))
    temps = torch.tensor([0.5, 1.0, 2.0, 0.9])
    lse = torch.logsumexp(logits / temps.unsqueeze(1), dim=-1)
    threshold = torch.tensor([NEG_INF, 0.0, 0.1, 5.0])
    ids = torch.tensor([[0, 5, 9], [1, -1, 39], [2, 2, 2], [3, 4, 5]])
    args = (logits, temps, lse, threshold, ids)
    got = lp_kernels.token_logprobs_triton(*(t.to(DEVICE) for t in args), processed)
    assert torch.equal(got.cpu(), lp_kernels.token_logprobs_reference(*args, processed))


def test_sampler_triton_backend_seeded_rows_equal_pytorch():
    """Through the Sampler: seeded rows equal the pytorch backend's, greedy rows are the argmax,
    a NaN row is flagged, logprobs equal the pytorch backend's."""
    vocab = 40
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(8)) * 2
    logits[4, 3] = float("nan")
    params = [
        SamplingParams(temperature=0.8, top_k=5, top_p=0.9, sampling_seed=1),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.2, min_p=0.1, sampling_seed=2),
        SamplingParams(top_p=0.7, sampling_seed=3),
        SamplingParams(sampling_seed=4),
    ]
    positions = torch.arange(5) + 9
    outs = {}
    for backend, device in (("pytorch", "cpu"), ("triton", DEVICE)):
        info = make_info(params, vocab, device=device)
        out = LogitsProcessorOutput(next_token_logits=logits.clone().to(device))
        ids = Sampler(backend)(out, info, return_logprob=True, top_logprobs_nums=[3] * 5, positions=positions.to(device))
        outs[backend] = (ids.cpu(), out)
    (want, want_out), (got, got_out) = outs["pytorch"], outs["triton"]
    assert torch.equal(got, want) and got[4] == -1 and got[1] == logits[1].argmax()
    assert torch.equal(got_out.invalid_rows.cpu(), want_out.invalid_rows)
    torch.testing.assert_close(got_out.next_token_logprobs.cpu()[:4], want_out.next_token_logprobs[:4])
    torch.testing.assert_close(got_out.next_token_top_logprobs_val.cpu()[:4], want_out.next_token_top_logprobs_val[:4])


def test_sampling_kernels_never_import_sglang():
    """The kernels and their torch definitions take tensors; sglang imports them, never the reverse."""
    modules = ("support", "murmur_reference", "murmur", "sample", "logprobs", "penalties")
    code = "import sys\n" + "".join(f"import sgl_kernel_ext.sampling.{m}\n" for m in modules)
    code += "assert not [m for m in sys.modules if m.split('.')[0] == 'sglang'], 'sglang imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TRITON_INTERPRET": "1"})


def test_triton_sampler_takes_the_fused_step():
    sampler = Sampler("triton")
    assert sampler.step_name == "fused" and isinstance(sampler.step, FusedStep)


def test_triton_backend_sample_draws_inside_the_support():
    """The SamplingBackend API (`sample` on already scaled logits) keeps to sampling_ops' support."""
    from sglang.srt.layers.sampling_ops import compute_support
    from sglang.srt.layers.triton_sampling_backend import TritonBackend

    vocab = 40
    scaled = torch.randn(6, vocab, generator=torch.Generator().manual_seed(9)) * 2
    params = [SamplingParams(top_k=4, top_p=0.8), SamplingParams(min_p=0.3)] * 3
    info = make_info(params, vocab, device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    ids = TritonBackend().sample(scaled.to(DEVICE), info, gen).cpu()
    cpu_info = make_info(params, vocab)
    support = compute_support(
        scaled, cpu_info.top_ks, cpu_info.top_ps, cpu_info.min_ps, window=None, need_top_p=True, need_min_p=True
    )
    assert (scaled.gather(1, ids.unsqueeze(1)) >= support.threshold).all()


@pytest.mark.parametrize("width", [0, 3, 130])
def test_token_counts_add_matches_reference(width: int) -> None:
    from sgl_kernel_ext.sampling.token_counts import token_counts_add_triton
    from sgl_kernel_ext.sampling.token_counts_reference import token_counts_add_reference

    gen = torch.Generator().manual_seed(width)
    rows, capacity = 6, width + 4
    lengths = torch.randint(0, width + 1, (rows, 1), generator=gen)
    lengths[0] = width  # a full row
    ids = torch.full((rows, capacity), -1, dtype=torch.int64)
    counts = torch.zeros(rows, capacity)
    for b in range(rows):
        n = int(lengths[b])
        ids[b, :n] = torch.randperm(500, generator=gen)[:n]
        counts[b, :n] = torch.randint(1, 5, (n,), generator=gen).float()
    # Seen tokens, new tokens and a flagged row (-1).
    tokens = torch.tensor([int(ids[0, 0]) if width else 7, 999, -1, int(ids[3, int(lengths[3]) - 1]) if int(lengths[3]) else 5, 998, 999])
    want = [t.clone() for t in (ids, counts, lengths)]
    token_counts_add_reference(*want, tokens, width)
    got = [t.clone().to(DEVICE) for t in (ids, counts, lengths)]
    strided = torch.stack([torch.zeros_like(tokens), tokens], dim=1).to(DEVICE)[:, 1]  # [B] with stride 2
    token_counts_add_triton(*got, strided)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
    assert int(want[2][2]) == int(lengths[2]) and int(want[2][1]) == int(lengths[1]) + 1
