"""The sampling step of a CUDA graph (model_executor/sampling_graph.py) against the eager step.

`sample_in_graph` is what each bucket's sampling graph captures. On a CPU it runs eagerly under
TRITON_INTERPRET=1 (the same kernels, same inputs); on a CUDA machine it is captured once and
replayed. Either way, over padded batches, several steps, penalties whose lists grow and move,
a batch that loses a row, and fresh noise every step, it must give the eager Sampler's tokens and
leave the same penalty state.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sampling_utils import make_info  # noqa: E402
from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402
from sglang.srt.layers.sampler import Sampler, create_sampler  # noqa: E402
from sglang.srt.model_executor.step import Step  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.sampling_graph import (  # noqa: E402
    SamplingInputBuffers,
    finish_replay,
    graph_variant,
    needs_eager_sampling,
    prepare_capture,
    prepare_replay,
    sample_in_graph,
    sampling_graph_supported,
)
from sglang.srt.sampling.fused_logits_bias import penalty_lists  # noqa: E402
from sglang.srt.sampling.guidance import apply_guidance  # noqa: E402
from sglang.srt.sampling.guidance_graph import GuidanceGraphInputs  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.sampling.watermarking.config import WatermarkSettings  # noqa: E402
from sglang.srt.sampling.watermarking.graph import WatermarkGraphInputs  # noqa: E402
from sglang.srt.sampling.watermarking.state import WatermarkState  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
VOCAB = 96
PAD_ROW = 7  # the request pool's padding row in these tests
PARAMS = [
    SamplingParams(temperature=0.0, frequency_penalty=0.5),
    SamplingParams(temperature=0.8, top_k=12, top_p=0.9, sampling_seed=11, repetition_penalty=1.3),
    SamplingParams(temperature=1.1, min_p=0.05, presence_penalty=0.6, min_new_tokens=2, logit_bias={"4": 2.5}),
    SamplingParams(temperature=0.7, top_p=0.8),  # unseeded: keyed by the step's noise
    SamplingParams(temperature=1.0, sampling_seed=-3, frequency_penalty=-0.4, repetition_penalty=0.9),
]
PROMPTS = [[1, 2, 3, 4], [5, 6], [4, 4, 9], [10], [11, 12, 13]]


def _logits(step: int, rows: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + step)
    return (torch.randn(rows, VOCAB, generator=gen) * 3).to(DEVICE)  # [rows, V]


def _state(info) -> list[torch.Tensor]:
    """Every penalty list's live contents, in a fixed order."""
    lists = penalty_lists(info)
    names = ("freq_lengths", "pres_lengths", "rep_lengths", "output_lens")
    state = [getattr(lists, n).cpu() for n in names]
    for ids, counts, lengths in (
        (lists.freq_ids, lists.freq_counts, lists.freq_lengths),
        (lists.pres_ids, lists.pres_counts, lists.pres_lengths),
        (lists.rep_ids, lists.rep_counts, lists.rep_lengths),
    ):
        for row, n in enumerate(lengths.flatten().tolist()):
            order = ids[row, :n].argsort()
            state += [ids[row, :n][order].cpu(), counts[row, :n][order].cpu()]
    return state


class _GraphPath:
    """sample_in_graph over a padded bucket: captured once on CUDA, called directly on a CPU."""

    def __init__(self, bucket: int, variant: tuple = (None, False), watermark=None) -> None:
        self.bucket, self.variant, self.watermark = bucket, variant, watermark
        self.inputs = SamplingInputBuffers(bucket, VOCAB, torch.device(DEVICE))
        self.guidance = GuidanceGraphInputs(bucket, torch.device(DEVICE))
        self.logits = torch.zeros(bucket, VOCAB, device=DEVICE)  # [bucket, V] the decode graph's output
        self.positions = torch.zeros(bucket, dtype=torch.int64, device=DEVICE)
        self.pool_rows = torch.full((bucket,), PAD_ROW, dtype=torch.int64, device=DEVICE)
        self.future_tokens = torch.full((PAD_ROW + 1,), -7, dtype=torch.int64, device=DEVICE)
        self.graph = None
        if DEVICE == "cuda":
            prepare_capture(torch.device(DEVICE))
            self._run()  # compiles outside the capture
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.ids = self._run()

    def _run(self) -> torch.Tensor:
        return sample_in_graph(
            self.logits, self.inputs, self.positions, self.pool_rows, self.future_tokens, self.guidance, self.variant,
            self.watermark,
        )

    def step(
        self, info, logits: torch.Tensor, positions: torch.Tensor, generator: torch.Generator,
        guide_logits: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The sampled rows' ids; `guide_logits` ([G, V]) follow the sampled rows in the bucket."""
        rows = logits.shape[0]
        self.logits[:rows].copy_(logits)
        self.positions[:rows].copy_(positions)
        self.pool_rows[:rows].copy_(torch.arange(rows))
        if guide_logits is not None:
            self.logits[rows : rows + guide_logits.shape[0]].copy_(guide_logits)
        assert prepare_replay(self.inputs, info, generator, self.guidance, self.bucket, self.watermark)
        if self.graph is not None:
            self.graph.replay()
            ids = self.ids
        else:
            ids = self._run()
        finish_replay(info)
        return ids[:rows].clone()


def _eager_step(info, logits: torch.Tensor, positions: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    info.apply_logits_bias(logits)
    ids = Sampler("triton", generator=generator)(LogitsProcessorOutput(next_token_logits=logits), info, positions=positions)
    info.update_penalties(ids)
    return ids


def test_graph_step_equals_eager_step_over_steps_and_a_filtered_batch():
    eager_info = make_info(PARAMS, VOCAB, prompts=PROMPTS, device=DEVICE)
    graph_info = make_info(PARAMS, VOCAB, prompts=PROMPTS, device=DEVICE)
    graph = _GraphPath(bucket=8)
    eager_gen, graph_gen = (torch.Generator(device=DEVICE) for _ in range(2))
    for step in range(4):
        if step == 2:  # a request leaves: every list moves, the parameters are reloaded
            for info in (eager_info, graph_info):
                info.filter_batch([0, 2, 3, 4])
        rows = len(eager_info)
        logits, positions = _logits(step, rows), torch.arange(rows, device=DEVICE) + 20 + step
        eager_gen.manual_seed(1000 + step)
        graph_gen.manual_seed(1000 + step)
        want = _eager_step(eager_info, logits.clone(), positions, eager_gen)
        got = graph.step(graph_info, logits, positions, graph_gen)
        assert torch.equal(got.cpu(), want.cpu()), step
        assert torch.equal(graph.future_tokens[:rows].cpu(), want.cpu()), step
        for a, b in zip(_state(graph_info), _state(eager_info)):
            assert torch.equal(a, b), step
        assert graph_info.penalizer_orchestrator.penalizers  # the lists are live, not torn down


GUIDANCE = [
    {"method": "cfg", "input_ids": [1], "weight": 2.5},
    None,
    {"method": "mixture", "input_ids": [1], "alpha": "kl_symmetry"},
    {"method": "contrastive", "input_ids": [1], "weight": 0.7},
    {"method": "mixture", "input_ids": [1], "alpha": 0.4},
]


@pytest.mark.parametrize("with_kl", [True, False])
def test_guided_graph_step_equals_the_eager_mix_then_step(with_kl):
    guidance = [g if with_kl or g is None or g.get("alpha") != "kl_symmetry" else None for g in GUIDANCE]
    params = [dataclasses.replace(p, guidance=g) for p, g in zip(PARAMS, guidance)]
    eager_info = make_info(params, VOCAB, prompts=PROMPTS, device=DEVICE)
    graph_info = make_info(params, VOCAB, prompts=PROMPTS, device=DEVICE)
    assert graph_variant(graph_info) == (with_kl, False)
    graph = _GraphPath(bucket=12, variant=(with_kl, False))
    eager_gen, graph_gen = (torch.Generator(device=DEVICE) for _ in range(2))
    rows, guided = len(params), len(graph_info.guidance)
    for step in range(3):
        logits, positions = _logits(step, rows), torch.arange(rows, device=DEVICE) + 20 + step
        guide = _logits(50 + step, guided)
        eager_gen.manual_seed(1000 + step)
        graph_gen.manual_seed(1000 + step)
        mixed = logits.clone()
        want_alpha = apply_guidance(mixed, guide, eager_info.guidance)
        want = _eager_step(eager_info, mixed, positions, eager_gen)
        got = graph.step(graph_info, logits, positions, graph_gen, guide_logits=guide)
        assert torch.equal(got.cpu(), want.cpu()), step
        assert torch.equal(graph.guidance.alpha.index_select(0, graph_info.guidance.rows).cpu(), want_alpha.cpu()), step
        for a, b in zip(_state(graph_info), _state(eager_info)):
            assert torch.equal(a, b), step


def test_unseeded_rows_follow_the_noise():
    """A fresh noise per step, not a fixed seed: two steps with the same logits differ somewhere."""
    params = [SamplingParams(temperature=1.0)] * 6
    info = make_info(params, VOCAB, device=DEVICE)
    graph = _GraphPath(bucket=8)
    gen = torch.Generator(device=DEVICE)
    logits = torch.zeros(6, VOCAB, device=DEVICE)  # uniform: each row's draw is the noise's
    draws = []
    for step in range(2):
        gen.manual_seed(step)
        draws.append(graph.step(info, logits, torch.zeros(6, dtype=torch.int64, device=DEVICE), gen))
    assert not torch.equal(draws[0], draws[1])
    assert len(set(draws[0].tolist())) > 1  # rows get distinct seeds


def test_input_buffers_reload_when_the_batch_is_rebuilt():
    info = make_info([SamplingParams(top_k=5), SamplingParams(top_k=9, sampling_seed=4)], VOCAB, device=DEVICE)
    inputs = SamplingInputBuffers(4, VOCAB, torch.device(DEVICE))
    inputs.load(info)
    assert inputs.top_ks[:2].tolist() == [5, 9] and inputs.seeded[:2].tolist() == [False, True]
    info.filter_batch([1])
    inputs.load(info)
    assert inputs.top_ks[0] == 9 and inputs.seeded[0] and inputs.request_seeds[0] == 4


def _decode_step(params: list[SamplingParams], **info_kwargs) -> Step:
    info = make_info(params, VOCAB, **info_kwargs)
    batch = info._orchestrator_batch
    return Step(ForwardMode.DECODE, batch.reqs, None, list(range(len(params))), batch, torch.zeros(len(params)))


def test_steps_that_need_host_work_sample_eagerly():
    sampler = Sampler("triton")
    plain = _decode_step([SamplingParams(), SamplingParams(frequency_penalty=0.3)])
    assert not needs_eager_sampling(plain, sampler, check_token_agreement=False)
    assert needs_eager_sampling(plain, sampler, check_token_agreement=True)
    plain.reqs[1].logprob = object()  # any logprob request needs the eager logprob outputs
    assert needs_eager_sampling(plain, sampler, check_token_agreement=False)
    processor = _decode_step([SamplingParams()], processors=["{}"], enable_processors=True)
    assert needs_eager_sampling(processor, sampler, check_token_agreement=False)


def test_guided_rows_sample_in_the_graph_unless_a_guide_context_runs_on_the_guide_model():
    sampler = Sampler("triton")
    served = {"method": "cfg", "input_ids": [1], "weight": 2.0}
    guided = _decode_step([SamplingParams(guidance=served), SamplingParams()])
    assert not needs_eager_sampling(guided, sampler, check_token_agreement=False)
    on_guide_model = _decode_step([SamplingParams(guidance={**served, "model": "guide"}), SamplingParams(guidance=served)])
    assert needs_eager_sampling(on_guide_model, sampler, check_token_agreement=False)


def test_only_the_builtin_triton_sampler_is_captured():
    assert sampling_graph_supported(Sampler("triton"))
    assert not sampling_graph_supported(Sampler("pytorch"))
    assert not sampling_graph_supported(create_sampler("pytorch"))


def test_each_penalizer_writes_its_own_fused_lists():
    """penalty_lists asks every prepared penalizer for its part; one without a fused
    representation (a custom penalizer) sends the batch's penalties down the torch path."""
    from sglang.srt.sampling.penaltylib import (
        BatchedFrequencyPenalizer,
        BatchedPenalizerOrchestrator,
        BatchedPresencePenalizer,
    )
    from sglang.srt.sampling.penaltylib.base import _BatchedPenalizer

    info = make_info(PARAMS, VOCAB, prompts=PROMPTS)
    lists = penalty_lists(info)
    freq = info.penalizer_orchestrator.penalizers[BatchedFrequencyPenalizer]
    assert lists.freq_penalty is freq.penalties and lists.pres_penalty is not None
    assert lists.stop_ids is not None and lists.rep_penalty is not None and lists.bias_ids is info.logit_bias_ids

    class Custom(_BatchedPenalizer):
        def _is_required_for(self, sampling_params):
            return True

        def _prepare(self):
            pass

        def _teardown(self):
            pass

        def _cumulate_output_tokens(self, output_ids):
            pass

        def _apply(self, logits):
            pass

        def _filter(self, keep_indices):
            pass

        def _merge(self, their):
            pass

    batch = info._orchestrator_batch
    info.penalizer_orchestrator = BatchedPenalizerOrchestrator(VOCAB, batch, [BatchedPresencePenalizer, Custom])
    assert penalty_lists(info) is None


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA device names")
def test_one_penalty_table_per_cuda_device_whatever_its_name():
    from sglang.srt.sampling.fused_logits_bias import penalty_table

    current = torch.cuda.current_device()
    assert penalty_table(torch.device("cuda")) is penalty_table(torch.device("cuda", current))


WATERMARKED = [
    SamplingParams(temperature=1.0, presence_penalty=0.6, watermark={"key": "1", "context_window": 3}),
    SamplingParams(temperature=0.0, watermark={"key": "2", "context_window": 3}),  # greedy: never forced
    SamplingParams(temperature=0.8, top_k=12, top_p=0.9, sampling_seed=11, repetition_penalty=1.3,
                   watermark={"key": "abc", "context_window": 2}),
    SamplingParams(temperature=0.7, top_p=0.8),  # not watermarked
    SamplingParams(temperature=1.0, min_p=0.05, frequency_penalty=0.4, min_new_tokens=2,
                   watermark={"key": "ffffffffffffffff", "context_window": 4}),
]


def _watermark_state(info, slots: torch.Tensor):
    """A WatermarkState through the kernels (the interpreter on a CPU), the batch's contexts started."""
    settings = WatermarkSettings(key="5", key_b="fedcba9876543210", mixing_probability=0.4, max_probability=0.95)
    state = WatermarkState(settings, PAD_ROW + 1, 64, torch.device(DEVICE), kernels=True)
    wm = info.watermark
    state.start(slots.index_select(0, wm.rows), [PROMPTS[i] for i in wm.rows_host], [[] for _ in wm.rows_host], wm.windows_host)
    return state


def test_watermarked_graph_step_equals_the_eager_triton_step():
    """The watermarked variant forces what the eager triton step forces (both from the sampling
    kernel's support statistics) and leaves the same watermark and penalty state, over steps whose
    contexts are new, with greedy, unwatermarked and padding rows beside the watermarked ones."""
    eager_info = make_info(WATERMARKED, VOCAB, prompts=PROMPTS, device=DEVICE)
    graph_info = make_info(WATERMARKED, VOCAB, prompts=PROMPTS, device=DEVICE)
    assert graph_variant(graph_info) == (None, True)
    rows = len(WATERMARKED)
    slots = torch.arange(rows, device=DEVICE)  # the graph path's pool rows
    eager_state, graph_state = _watermark_state(eager_info, slots), _watermark_state(graph_info, slots)
    graph = _GraphPath(bucket=8, variant=(None, True), watermark=WatermarkGraphInputs(graph_state, 8, torch.device(DEVICE)))
    eager_gen, graph_gen = (torch.Generator(device=DEVICE) for _ in range(2))
    sampler = Sampler("triton", generator=eager_gen)
    sampler.watermark_state = eager_state
    for step in range(4):
        logits, positions = _logits(step, rows), torch.arange(rows, device=DEVICE) + 20 + step
        eager_gen.manual_seed(1000 + step)
        graph_gen.manual_seed(1000 + step)
        mixed = logits.clone()
        eager_info.apply_logits_bias(mixed)
        want = sampler(LogitsProcessorOutput(next_token_logits=mixed), eager_info, positions=positions, slots=slots)
        eager_info.update_penalties(want)
        got = graph.step(graph_info, logits, positions, graph_gen)
        assert torch.equal(got.cpu(), want.cpu()), step
        for a, b in zip(_state(graph_info), _state(eager_info)):
            assert torch.equal(a, b), step
        for name in ("tails", "lengths", "history", "counts"):
            assert torch.equal(getattr(graph_state, name).cpu(), getattr(eager_state, name).cpu()), (step, name)
    counts = graph_state.counts.cpu()
    assert (counts[[0, 2, 4]] > 0).all() and counts[1] == 0 and counts[3] == 0  # forced rows only
    assert (graph_state.lengths.cpu()[[1, 3]] == 0).all()  # unwatermarked rows' slots keep no context


def test_watermarked_rows_sample_in_the_graph_only_through_the_kernels():
    params = [SamplingParams(watermark={"key": "1", "context_window": 3}), SamplingParams()]
    step = _decode_step(params)
    sampler = Sampler("triton")
    sampler.watermark_state = WatermarkState(WatermarkSettings(key="5"), 4, 64, torch.device("cpu"), kernels=True)
    assert not needs_eager_sampling(step, sampler, check_token_agreement=False)
    sampler.watermark_state = WatermarkState(WatermarkSettings(key="5"), 4, 64, torch.device("cpu"), kernels=False)
    assert needs_eager_sampling(step, sampler, check_token_agreement=False)


def test_a_watermarked_row_with_nan_logits_fails_alone_eager_and_in_the_graph():
    """A row without a finite probability is never admitted: its id stays -1 (the request then
    fails) and its slot records no context, while its batch-mate is still forced."""
    params = [SamplingParams(temperature=1.0, watermark={"key": "1", "context_window": 3}),
              SamplingParams(temperature=1.0, watermark={"key": "2", "context_window": 3})]
    slots = torch.arange(2, device=DEVICE)
    logits = _logits(0, 2)
    logits[1] = float("nan")
    positions = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    eager_info, graph_info = (make_info(params, VOCAB, prompts=PROMPTS[:2], device=DEVICE) for _ in range(2))
    eager_state, graph_state = _watermark_state(eager_info, slots), _watermark_state(graph_info, slots)
    sampler = Sampler("triton", generator=torch.Generator(device=DEVICE).manual_seed(1))
    sampler.watermark_state = eager_state
    eager = sampler(LogitsProcessorOutput(next_token_logits=logits.clone()), eager_info, positions=positions, slots=slots)
    graph = _GraphPath(bucket=4, variant=(None, True), watermark=WatermarkGraphInputs(graph_state, 4, torch.device(DEVICE)))
    got = graph.step(graph_info, logits, positions, torch.Generator(device=DEVICE).manual_seed(1))
    for ids, state in ((eager, eager_state), (got, graph_state)):
        assert ids[1].item() == -1 and 0 <= ids[0].item() < VOCAB
        assert state.counts.cpu()[:2].tolist() == [1, 0]
