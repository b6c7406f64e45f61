"""SamplingBatchInfo: flags, per-row tensors, logit transforms, filter/merge, overlap-mode penalties."""

from __future__ import annotations

import zlib

import torch

from sampling_utils import make_info
from sglang.srt.constrained.bitmask import bitmask_width
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import Sampler
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams

V = 30


def test_flags_and_tensors():
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
        SamplingParams(min_p=0.1, sampling_seed=-5),
    ]
    info = make_info(params, V)
    assert info.temperatures.shape == (3, 1) and info.temperatures[:, 0].tolist() == [1.0, 0.699999988079071, 1.0]
    assert info.top_ks.tolist() == [1, 20, V]  # no top-k is stored as the vocab size
    assert info.is_any_greedy and not info.is_all_greedy
    assert info.need_top_k_sampling and info.need_top_p_sampling and info.need_min_p_sampling
    assert info.max_top_k is None  # row 2 has no top-k
    assert info.greedy_mask.tolist() == [True, False, False]
    assert info.sampling_seed.tolist() == [0, 0, -5] and info.seeded_rows.tolist() == [2]
    assert info.penalizer_orchestrator is None and info.logit_bias_ids is None

    greedy_only = make_info([SamplingParams(top_k=1), SamplingParams(temperature=0.0)], V)
    assert greedy_only.is_all_greedy and not greedy_only.need_top_k_sampling
    bounded = make_info([SamplingParams(top_k=5), SamplingParams(top_k=9, top_p=0.5)], V)
    assert bounded.max_top_k == 9
    assert SamplingParams().top_k == TOP_K_ALL


def test_logit_bias_dedup_and_order_after_vocab_mask():
    params = [
        SamplingParams(logit_bias={"1": 5.0, "01": 2.0, "3": -100.0}),
        SamplingParams(),
        SamplingParams(logit_bias={"2": 100.0}),
    ]
    info = make_info(params, V)
    info.vocab_mask = torch.full((3, bitmask_width(V)), -1, dtype=torch.int32)  # packed, bit set = allowed
    info.vocab_mask[2, 0] &= ~(1 << 2)
    logits = torch.zeros(3, V)
    info.apply_logits_bias(logits)
    expected = torch.zeros(3, V)
    expected[0, 1] = 2.0  # "01" came last and names the same token as "1"
    expected[0, 3] = -100.0
    expected[2, 2] = float("-inf")  # a bias cannot re-enable a masked token
    assert torch.equal(logits, expected)


def test_logit_bias_forces_and_bans():
    torch.manual_seed(0)
    logits = torch.randn(2, V)
    logits[1, 4] = 10.0
    params = [SamplingParams(temperature=0.0, logit_bias={"17": 100}), SamplingParams(temperature=0.0, logit_bias={"4": -100})]
    info = make_info(params, V)
    info.apply_logits_bias(logits)
    ids = Sampler()(LogitsProcessorOutput(next_token_logits=logits), info)
    assert ids[0] == 17 and ids[1] != 4


def test_filter_and_merge_keep_rows():
    a = make_info([SamplingParams(top_k=3, sampling_seed=1), SamplingParams(temperature=0.0, logit_bias={"2": 1.0})], V)
    b = make_info([SamplingParams(top_p=0.5, sampling_seed=2)], V)
    a.merge_batch(b)
    assert len(a) == 3
    assert a.top_ks.tolist() == [3, 1, V] and a.top_ps.tolist() == [1.0, 1.0, 0.5]
    assert a.seeded_rows.tolist() == [0, 2] and a.sampling_seed.tolist() == [1, 0, 2]
    assert a.logit_bias_ids.tolist() == [[0], [2], [0]] and a.logit_bias_values.tolist() == [[0.0], [1.0], [0.0]]
    assert a.max_top_k is None and a.need_top_p_sampling
    a.filter_batch([1, 2])
    assert a.top_ks.tolist() == [1, V] and a.seeded_rows.tolist() == [1]
    a.filter_batch([0])
    assert a.is_all_greedy and a.seeded_rows is None


def test_cpu_sample_plan_follows_filter_and_merge():
    """The CPU sampler caches its row groups on the info; a filter or merge must drop them, so
    each row keeps its own parameters (a stale grouping would sample rows with a mate's)."""

    def params(i):
        return [
            SamplingParams(temperature=0.0),
            SamplingParams(top_k=2, sampling_seed=i),
            SamplingParams(min_p=0.5, sampling_seed=i),
            SamplingParams(top_p=0.3, sampling_seed=i),
        ][i % 4]

    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(4)) * 3.0
    positions = torch.arange(8)

    def sample(info, rows):
        out = LogitsProcessorOutput(next_token_logits=logits[rows].clone())
        return Sampler()(out, info, positions=positions[rows])

    info = make_info([params(i) for i in range(6)], V)
    sample(info, list(range(6)))
    assert info.cpu_sample_plan is not None
    info.filter_batch([5, 0, 2])
    assert info.cpu_sample_plan is None
    fresh = make_info([params(i) for i in (5, 0, 2)], V)
    assert torch.equal(sample(info, [5, 0, 2]), sample(fresh, [5, 0, 2]))
    info.merge_batch(make_info([params(i) for i in (3, 6, 7)], V))
    assert info.cpu_sample_plan is None
    rows = [5, 0, 2, 3, 6, 7]
    assert torch.equal(sample(info, rows), sample(make_info([params(i) for i in rows], V), rows))


# ----------------------------------------------------------------------------------------- overlap trace


def _step_logits(rid: str, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{rid}:{step}".encode()))
    return torch.randn(V, generator=gen) * 2.0


def _penalised_params(i: int) -> SamplingParams:
    kinds = [
        dict(frequency_penalty=0.7, sampling_seed=i),
        dict(presence_penalty=1.1, repetition_penalty=1.3, sampling_seed=i),
        dict(min_new_tokens=6, sampling_seed=i),
        dict(temperature=0.0, repetition_penalty=1.8),
        dict(frequency_penalty=-0.4, presence_penalty=0.5, top_k=8, sampling_seed=i),
    ]
    return SamplingParams(max_new_tokens=100, **kinds[i % len(kinds)])


class _Trace:
    """A 50-step decode loop with requests finishing (filter) and joining (merge) mid-way.

    overlap=True feeds each step's sampled ids into the penalty state on the device right
    after sampling and appends them to the host lists only after the next step's logits are
    processed, as the overlap schedule does. overlap=False feeds them from the host lists.
    """

    def __init__(self, overlap: bool):
        self.overlap = overlap
        self.batch = self._new_batch(range(6))
        self.info = SamplingBatchInfo.from_schedule_batch(self.batch, V)
        self.sampler = Sampler()
        self.pending = None  # (reqs, ids) of the step whose host update is still due
        self.processed: dict[tuple[str, int], torch.Tensor] = {}

    @staticmethod
    def _new_batch(indices) -> ScheduleBatch:
        reqs = []
        for i in indices:
            req = Req(f"r{i}", [i % V, (3 * i + 1) % V, 7], _penalised_params(i), eos_token_ids={0, 1})
            reqs.append(req)
        return ScheduleBatch(reqs=reqs, device="cpu")

    def _host_update(self) -> None:
        if self.pending is None:
            return
        reqs, ids = self.pending
        for req, token in zip(reqs, ids.tolist()):
            req.output_ids.append(token)
        if not self.overlap:
            self.info.update_penalties(torch.tensor([r.output_ids[-1] for r in reqs]))
        self.pending = None

    def run(self, steps: int = 50) -> dict:
        for step in range(steps):
            if step == 15:
                self._host_update()  # membership changes need the finished state on the host
                self._filter(keep=[0, 2, 3, 5])
            if step == 30:
                self._host_update()
                self._merge(range(6, 9))
            if step == 40:
                self._host_update()
                self._filter(keep=[1, 2, 4, 6])
            self._decode(step)
        return self.processed

    def _decode(self, step: int) -> None:
        reqs = list(self.batch.reqs)
        generated = [len(r.output_ids) + (1 if self.pending is not None else 0) for r in reqs]
        logits = torch.stack([_step_logits(r.rid, n) for r, n in zip(reqs, generated)])
        self.info.apply_logits_bias(logits)
        for r, n, row in zip(reqs, generated, logits):
            self.processed[(r.rid, n)] = row.clone()
        positions = torch.tensor([len(r.origin_input_ids) + n for r, n in zip(reqs, generated)])
        ids = self.sampler(LogitsProcessorOutput(next_token_logits=logits), self.info, positions=positions)
        if self.overlap:
            self.info.update_penalties(ids)  # device side, before the host sees the ids
            self._host_update()  # the previous step's results arrive one step late
            self.pending = (reqs, ids)
        else:
            self.pending = (reqs, ids)
            self._host_update()

    def _filter(self, keep: list[int]) -> None:
        self.batch.reqs = [self.batch.reqs[i] for i in keep]
        self.info.filter_batch(keep)

    def _merge(self, indices) -> None:
        new_batch = self._new_batch(indices)
        new_info = SamplingBatchInfo.from_schedule_batch(new_batch, V)
        self.info.merge_batch(new_info)
        self.batch.reqs = self.batch.reqs + new_batch.reqs


def test_overlap_penalties_equal_direct_path_every_step():
    direct = _Trace(overlap=False).run()
    overlap = _Trace(overlap=True).run()
    assert direct.keys() == overlap.keys() and len(direct) > 200
    for key in direct:
        assert torch.equal(direct[key], overlap[key]), key


def test_trace_penalties_act_without_lag():
    """At step n, a frequency-penalised row's logits already include the token of step n-1."""
    trace = _Trace(overlap=True)
    processed = trace.run(steps=12)
    req = next(r for r in trace.batch.reqs if r.rid == "r0")
    trace._host_update()
    for n in range(1, 11):
        history = req.output_ids[:n]
        raw = _step_logits("r0", n)
        expected = raw.clone()
        for token in set(history):
            expected[token] -= 0.7 * history.count(token)
        torch.testing.assert_close(processed[("r0", n)], expected, rtol=0, atol=1e-6)
