"""Sampler.forward: distributions, support sets, greedy, seeds, NaN guard, logprobs, TP sync, registry."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from sampling_utils import BASE, CASES, DRAWS, V, assert_matches_distribution, expected_distribution, make_info, sample
from sglang.srt.layers import sampler as sampler_module
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import (
    SAMPLING_BACKEND_CHOICES,
    Sampler,
    create_sampler,
    register_sampler_backend,
)
from sglang.srt.layers.sampler_cpu import CpuGroupedStep
from sglang.srt.layers.sampler_torch import TorchStep
from sglang.srt.layers.sampling_backends import FusedSamplingBackend, SamplingBackend
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor, register_custom_logit_processor
from sglang.srt.sampling.sampling_params import SamplingParams

CPU_BACKENDS = ["pytorch", "ascend"]


def _params(**kw) -> SamplingParams:
    return SamplingParams(**kw)


def _logits(rows: int, values=BASE) -> torch.Tensor:
    return torch.tensor([values] * rows, dtype=torch.float32)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_unseeded_distribution(backend, name):
    case = CASES[name]
    sampler = Sampler(backend, generator=torch.Generator().manual_seed(1234))
    ids, _ = sample(sampler, _logits(DRAWS), [_params(**case) for _ in range(DRAWS)])
    assert_matches_distribution(ids, expected_distribution(case))


@pytest.mark.parametrize("name", sorted(CASES))
def test_seeded_distribution(name):
    """Hash-Gumbel over distinct seeds follows the same filtered softmax."""
    case = CASES[name]
    params = [_params(sampling_seed=s, **case) for s in range(DRAWS)]
    ids, _ = sample(Sampler("pytorch"), _logits(DRAWS), params, positions=torch.full((DRAWS,), 7))
    assert_matches_distribution(ids, expected_distribution(case))


@pytest.mark.parametrize("name", sorted(CASES))
def test_window_and_sort_paths_share_support(name):
    """A batch-mate without top-k moves the batch from the top-k window to the full sort; the
    seeded row must not notice."""
    case = CASES[name]
    n = 400
    seeded = [_params(sampling_seed=1000 + s, **case) for s in range(n)]
    positions = torch.arange(n)
    alone, _ = sample(Sampler(), _logits(n), seeded, positions=positions)
    mates = seeded + [_params(temperature=0.9)]
    together, _ = sample(Sampler(), _logits(n + 1), mates, positions=torch.cat([positions, torch.tensor([3])]))
    assert torch.equal(alone, together[:n])


def test_backends_identical_support_sets():
    """Every CPU backend draws from exactly the reference support in every case (many draws)."""
    for backend in CPU_BACKENDS:
        for case in CASES.values():
            sampler = Sampler(backend, generator=torch.Generator().manual_seed(5))
            ids, _ = sample(sampler, _logits(4000), [_params(**case) for _ in range(4000)])
            assert set(ids.tolist()) == set(np.nonzero(expected_distribution(case))[0].tolist()), (backend, case)


def test_greedy_is_argmax_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    for params in (_params(temperature=0.0), _params(top_k=1, temperature=0.7)):
        ids, _ = sample(Sampler(), logits, [params, params])
        assert ids.tolist() == [1, 0]


def test_greedy_rows_in_mixed_batch_equal_solo():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = [
        _params(temperature=0.0),
        _params(temperature=0.9, top_p=0.8),
        _params(top_k=1, temperature=0.5),
        _params(temperature=1.0, min_p=0.1, sampling_seed=3),
        _params(temperature=0.0, sampling_seed=9),
        _params(top_k=10**6),
    ]
    ids, _ = sample(Sampler(), logits, params, positions=torch.arange(6))
    for row in (0, 2, 4):
        solo, _ = sample(Sampler(), logits[row : row + 1], [params[row]])
        assert ids[row] == solo[0] == logits[row].argmax()


def test_top_k_one_with_temperature_is_greedy():
    ids, _ = sample(Sampler(), _logits(200), [_params(top_k=1, temperature=2.0)] * 200)
    assert set(ids.tolist()) == {0}


# ----------------------------------------------------------------------------------------- seeds


def _seeded_token(params, logits_row, position, mates=(), mate_logits=None, row_at=0):
    rows = list(mates)
    rows.insert(row_at, params)
    logits = [mate_logits if mate_logits is not None else logits_row] * len(rows)
    logits[row_at] = logits_row
    positions = torch.full((len(rows),), 11)
    positions[row_at] = position
    ids, _ = sample(Sampler(generator=torch.Generator().manual_seed(len(rows))), torch.stack(logits), rows, positions=positions)
    return ids[row_at].item()


@pytest.mark.parametrize("case", [dict(temperature=1.0), dict(top_k=20, top_p=0.9), dict(min_p=0.05, top_p=0.95)])
def test_seeded_row_independent_of_batch(case):
    torch.manual_seed(1)
    row = torch.randn(64)
    mate_logits = torch.randn(64)
    params = _params(sampling_seed=123456789, **case)
    solo = [_seeded_token(params, row, pos) for pos in range(20)]
    mate_sets = [
        [_params(temperature=0.0)],
        [_params(temperature=0.7), _params(top_k=3), _params(sampling_seed=5, min_p=0.2)],
        [_params(top_p=0.5)] * 6,
    ]
    for mates in mate_sets:
        for row_at in (0, len(mates)):
            got = [_seeded_token(params, row, pos, mates, mate_logits, row_at) for pos in range(20)]
            assert got == solo, (mates, row_at)


def test_seeds_one_and_two_differ_and_positions_matter():
    logits = torch.zeros(1, 1000)
    seq = {}
    for seed in (1, 2):
        seq[seed] = [
            sample(Sampler(), logits, [_params(sampling_seed=seed)], positions=torch.tensor([p]))[0].item()
            for p in range(30)
        ]
    assert seq[1] != seq[2]
    assert len(set(seq[1])) > 20  # a flat distribution: positions give fresh noise


def test_seed_needs_positions():
    info = make_info([_params(sampling_seed=1)], V)
    with pytest.raises(ValueError, match="positions"):
        Sampler()(LogitsProcessorOutput(next_token_logits=_logits(1)), info)


# ----------------------------------------------------------------------------------------- mixed batch, NaN


def test_mixed_batch_with_nan_row():
    torch.manual_seed(3)
    vocab = 40
    logits = torch.randn(8, vocab)
    params = [
        _params(temperature=0.0),
        _params(top_k=1),
        _params(top_k=10**6, sampling_seed=1),
        _params(top_p=0.8, sampling_seed=2),
        _params(min_p=0.1, sampling_seed=3),
        _params(frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.2, sampling_seed=4),
        _params(logit_bias={"7": 100.0}, sampling_seed=5),
        _params(sampling_seed=6),
    ]
    logits[7, 5] = float("nan")
    positions = torch.arange(8)

    def run(rows):
        info = make_info([params[r] for r in rows], vocab, prompts=[[1, 2, 3, 4]] * len(rows))
        batch_logits = logits[rows].clone()
        info.apply_logits_bias(batch_logits)
        out = LogitsProcessorOutput(next_token_logits=batch_logits)
        ids = Sampler()(out, info, return_logprob=True, top_logprobs_nums=[2] * len(rows), positions=positions[rows])
        return ids, out

    ids, out = run(list(range(8)))
    assert out.invalid_rows.tolist() == [False] * 7 + [True]
    assert ids[7] == -1
    assert ids[6] == 7  # +100 bias forces the token
    without_nan, _ = run(list(range(7)))
    assert torch.equal(ids[:7], without_nan)
    for row in (0, 1):
        solo, _ = run([row])
        assert ids[row] == solo[0]


def test_all_minus_inf_and_posinf_rows_are_flagged():
    logits = torch.zeros(3, 5)
    logits[0] = float("-inf")
    logits[1, 2] = float("inf")
    ids, out = sample(Sampler(), logits, [_params(temperature=0.7)] * 3)
    assert out.invalid_rows.tolist() == [True, True, False]
    assert ids[:2].tolist() == [-1, -1] and 0 <= ids[2] < 5


# ----------------------------------------------------------------------------------------- logprobs


def test_scaled_logprobs_are_per_row_temperature_and_batch_independent():
    torch.manual_seed(4)
    logits = torch.randn(3, 30)
    params = [_params(top_k=1, temperature=0.7), _params(temperature=1.3, top_p=0.9), _params(temperature=0.0)]
    ids, out = sample(Sampler(logprobs_mode="scaled"), logits, params, return_logprob=True, top_logprobs_nums=[3, 0, 1])
    temps = torch.tensor([[0.7], [1.3], [1.0]])
    expected = torch.log_softmax(logits / temps, dim=-1)
    assert torch.allclose(out.next_token_logprobs, expected.gather(1, ids.unsqueeze(1)).squeeze(1))
    top_vals, top_idx = expected.topk(3)
    assert torch.allclose(out.next_token_top_logprobs_val, top_vals)
    assert torch.equal(out.next_token_top_logprobs_idx, top_idx)
    _, solo = sample(Sampler(logprobs_mode="scaled"), logits[:1], params[:1], return_logprob=True)
    assert torch.equal(solo.next_token_logprobs[0], out.next_token_logprobs[0])


def test_raw_logprobs_ignore_temperature(monkeypatch):
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    sampler = Sampler()
    assert sampler.logprobs_mode == "raw"
    logits = torch.randn(2, 20)
    ids, out = sample(sampler, logits, [_params(temperature=0.5)] * 2, return_logprob=True, token_ids_logprobs=[[1, 4], None])
    expected = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(out.next_token_logprobs, expected.gather(1, ids.unsqueeze(1)).squeeze(1))
    assert torch.allclose(out.next_token_token_ids_logprobs_val[0], expected[0, [1, 4]])
    assert out.next_token_token_ids_logprobs_idx == [[1, 4], []]


def test_processed_logprobs_renormalise_over_support():
    case = dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05)
    ids, out = sample(Sampler(logprobs_mode="processed"), _logits(50), [_params(**case)] * 50, return_logprob=True, top_logprobs_nums=[V] * 50)
    expected = expected_distribution(case)
    got = torch.zeros(V, dtype=torch.float64)
    got[out.next_token_top_logprobs_idx[0]] = out.next_token_top_logprobs_val[0].double().exp()
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-6)
    lp_sampled = out.next_token_logprobs.double().exp().numpy()
    np.testing.assert_allclose(lp_sampled, expected[ids.numpy()], atol=1e-6)


def test_logprobs_never_minus_inf():
    _, out = sample(Sampler(logprobs_mode="processed"), _logits(2), [_params(top_k=2)] * 2, return_logprob=True, top_logprobs_nums=[V, V])
    assert torch.isfinite(out.next_token_top_logprobs_val).all()


def test_bad_logprobs_mode_env(monkeypatch):
    monkeypatch.setenv("SGLANG_LOGPROBS_MODE", "weird")
    with pytest.raises(ValueError, match="SGLANG_LOGPROBS_MODE"):
        Sampler()


def test_compute_logprobs_only():
    logits = torch.randn(2, 10)
    info = make_info([_params(temperature=0.3)] * 2, 10)
    out = LogitsProcessorOutput(next_token_logits=logits.clone())
    assert Sampler().compute_logprobs_only(out, info, [0, 0], None) is None
    res = Sampler().compute_logprobs_only(out, info, [2, 0], [None, [3]])
    expected = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(res.next_token_top_logprobs_val, expected.topk(2).values)
    assert torch.allclose(res.next_token_token_ids_logprobs_val[1, :1], expected[1, [3]])


# ----------------------------------------------------------------------------------------- custom processors


class _Raising(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        raise RuntimeError("boom")


class _BanZero(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        logits[:, 0] = float("-inf")
        return logits


def test_processor_error_fails_only_its_rows():
    register_custom_logit_processor("test_raising", _Raising)
    register_custom_logit_processor("test_ban_zero", _BanZero)
    params = [_params(temperature=0.0, custom_params={"a": 1}) for _ in range(3)]
    processors = ['{"name": "test_raising"}', None, '{"name": "test_ban_zero"}']
    info = make_info(params, V, processors=processors, enable_processors=True)
    out = LogitsProcessorOutput(next_token_logits=_logits(3))
    ids = Sampler()(out, info)
    assert out.invalid_rows.tolist() == [True, False, False]
    assert "boom" in out.row_errors[0] and set(out.row_errors) == {0}
    assert ids.tolist() == [-1, 0, 1]  # row 2: token 0 banned, then the lowest id of the 1.5 tie


def test_processors_ignored_when_server_flag_off():
    register_custom_logit_processor("test_raising", _Raising)
    info = make_info([_params(temperature=0.0)], V, processors=['{"name": "test_raising"}'], enable_processors=False)
    out = LogitsProcessorOutput(next_token_logits=_logits(1))
    assert Sampler()(out, info).tolist() == [0]
    assert not out.invalid_rows.any()


# ----------------------------------------------------------------------------------------- TP sync


class _FakeDist:
    def __init__(self, world_size):
        self.world_size = world_size
        self.calls = []

    def get_world_size(self, group=None):
        return self.world_size

    def all_reduce(self, tensor, op=None, group=None):
        self.calls.append((op, group))


@pytest.mark.parametrize("env", ["SYNC_TOKEN_IDS_ACROSS_TP", "SGLANG_SYNC_TOKEN_IDS_ACROSS_TP"])
def test_tp_sync_all_reduce_min(monkeypatch, env):
    monkeypatch.setenv(env, "true")
    group = object()
    for world_size, expected_calls in ((1, 0), (2, 1)):
        fake = _FakeDist(world_size)
        monkeypatch.setattr(sampler_module.dist, "get_world_size", fake.get_world_size)
        monkeypatch.setattr(sampler_module.dist, "all_reduce", fake.all_reduce)
        ids, _ = sample(Sampler(tp_group=group), _logits(2), [_params(temperature=0.0)] * 2)
        assert ids.tolist() == [0, 0]
        assert fake.calls == [(torch.distributed.ReduceOp.MIN, group)] * expected_calls


def test_tp_sync_off_without_env_or_grammar(monkeypatch):
    monkeypatch.delenv("SYNC_TOKEN_IDS_ACROSS_TP", raising=False)
    monkeypatch.delenv("SGLANG_SYNC_TOKEN_IDS_ACROSS_TP", raising=False)
    fake = _FakeDist(2)
    monkeypatch.setattr(sampler_module.dist, "get_world_size", fake.get_world_size)
    monkeypatch.setattr(sampler_module.dist, "all_reduce", fake.all_reduce)
    info = make_info([_params(temperature=0.0)], V)
    Sampler(tp_group=object())(LogitsProcessorOutput(next_token_logits=_logits(1)), info)
    assert fake.calls == []
    info.grammars = [object()]
    Sampler(tp_group=object())(LogitsProcessorOutput(next_token_logits=_logits(1)), info)
    assert len(fake.calls) == 1


# ----------------------------------------------------------------------------------------- registry, backends


def test_registry():
    class MySampler(Sampler):
        pass

    register_sampler_backend("mine", lambda: MySampler())
    assert "mine" in SAMPLING_BACKEND_CHOICES
    assert isinstance(create_sampler("mine"), MySampler)
    register_sampler_backend("broken", lambda: object())
    with pytest.raises(TypeError, match="must return a Sampler"):
        create_sampler("broken")
    with pytest.raises(ValueError, match="non-empty"):
        register_sampler_backend("", lambda: Sampler())
    with pytest.raises(ValueError, match="Unknown sampling backend 'nope'"):
        create_sampler("nope")
    assert create_sampler().backend.name == "pytorch"
    assert create_sampler("ascend").backend.name == "ascend"


class _ArgmaxBackend(SamplingBackend):
    """A custom plain backend: the unseeded rows take their argmax."""

    name = "test_argmax"

    def sample(self, scaled, info, generator):
        return scaled.argmax(dim=-1)


class _FakeFused(FusedSamplingBackend):
    """Records which of the fused interface's methods the sampler calls."""

    name = "test_fused"

    def __init__(self):
        self.calls = []

    def sample(self, scaled, info, generator):
        raise AssertionError("a fused backend's step never calls sample")

    def greedy(self, logits):
        self.calls.append("greedy")
        return logits.argmax(dim=-1), torch.zeros(logits.shape[0], dtype=torch.bool)

    def sample_step(self, logits, info, positions, generator):
        self.calls.append("sample_step")
        return types.SimpleNamespace(ids=logits.argmin(dim=-1), invalid=torch.zeros(logits.shape[0], dtype=torch.bool))

    def fill_logprobs(self, output, logits, info, result, mode, next_ids, top_logprobs_nums, token_ids_logprobs):
        self.calls.append(("fill_logprobs", mode))


def test_step_is_chosen_at_construction():
    """The device (given, or the generator's) fixes the step once; without either the first
    call's logits fix it."""
    assert Sampler("pytorch", device="cpu").step_name == "cpu_grouped"
    assert Sampler("pytorch", generator=torch.Generator()).step_name == "cpu_grouped"
    assert Sampler("pytorch", device="cuda").step_name == "torch"  # no CUDA needed to decide
    assert Sampler("ascend", device="cpu").step_name == "torch"
    assert Sampler(_FakeFused()).step_name == "fused"
    cpu = Sampler("pytorch", device="cpu")
    assert isinstance(cpu.step, CpuGroupedStep)
    lazy = Sampler("pytorch")
    assert lazy.step_name == "undecided" and lazy.device is None
    ids, _ = sample(lazy, _logits(3), [_params(temperature=0.0)] * 3)
    assert ids.tolist() == [0, 0, 0]
    assert lazy.step_name == "cpu_grouped" and lazy.device == torch.device("cpu")


def test_fused_backend_runs_through_its_interface():
    backend = _FakeFused()
    sampler = Sampler(backend, logprobs_mode="scaled")
    ids, _ = sample(sampler, _logits(2), [_params(temperature=0.0)] * 2)
    assert ids.tolist() == [0, 0] and backend.calls == ["greedy"]
    backend.calls.clear()
    ids, out = sample(sampler, _logits(2), [_params(temperature=0.7)] * 2, return_logprob=True)
    assert ids.tolist() == [V - 1] * 2 and backend.calls == ["sample_step", ("fill_logprobs", "scaled")]
    assert not out.invalid_rows.any()


def test_registered_backend_class_builds_a_sampler():
    register_sampler_backend(_ArgmaxBackend.name, _ArgmaxBackend)
    assert _ArgmaxBackend.name in SAMPLING_BACKEND_CHOICES
    sampler = create_sampler(_ArgmaxBackend.name, device="cpu")
    assert isinstance(sampler.backend, _ArgmaxBackend) and sampler.step_name == "torch"
    ids, _ = sample(sampler, _logits(2), [_params(temperature=0.7)] * 2)
    assert ids.tolist() == [0, 0]


def test_registering_a_backend_missing_a_declared_method_fails():
    class NoFill(FusedSamplingBackend):
        name = "test_no_fill"

        def sample(self, scaled, info, generator):
            return scaled.argmax(dim=-1)

        def greedy(self, logits):
            return logits.argmax(dim=-1), torch.zeros(logits.shape[0], dtype=torch.bool)

    with pytest.raises(TypeError, match="NoFill does not implement fill_logprobs, sample_step, declared by FusedSamplingBackend"):
        register_sampler_backend("test_no_fill", NoFill)

    class NotABackend:
        def sample(self, scaled, info, generator):
            return scaled.argmax(dim=-1)

    with pytest.raises(TypeError, match="must be a subclass of SamplingBackend"):
        register_sampler_backend("test_not_a_backend", NotABackend)
    assert not {"test_no_fill", "test_not_a_backend"} & SAMPLING_BACKEND_CHOICES
    with pytest.raises(ValueError, match="sampling_backend must be one of"):
        Sampler("test_no_fill")


def test_flashinfer_missing_is_a_clear_startup_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(RuntimeError, match="flashinfer"):
        Sampler("flashinfer")


def _fake_flashinfer(calls):
    """A stand-in for flashinfer.sampling implementing the documented semantics by inverse CDF."""

    def draw(probs, generator=None):
        u = torch.rand(probs.shape[0], 1, generator=generator)
        cdf = probs.cumsum(-1)
        return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp(max=probs.shape[1] - 1).squeeze(1).int()

    def sampling_from_probs(probs, generator=None):
        calls.append("sampling_from_probs")
        return draw(probs, generator)

    def top_k_top_p_sampling_from_probs(probs, top_k, top_p, filter_apply_order="top_k_first", generator=None):
        calls.append(("top_k_top_p", filter_apply_order))
        keep = torch.zeros_like(probs, dtype=torch.bool)
        for r in range(probs.shape[0]):
            p = probs[r]
            greater_count = (p.unsqueeze(0) > p.unsqueeze(1)).sum(1)
            greater_mass = ((p.unsqueeze(0) > p.unsqueeze(1)) * p.unsqueeze(0)).sum(1)
            keep[r] = (greater_count < top_k[r]) & (greater_mass < top_p[r])
        return draw(torch.where(keep, probs, 0.0), generator)

    module = types.ModuleType("flashinfer.sampling")
    module.sampling_from_probs = sampling_from_probs
    module.top_k_top_p_sampling_from_probs = top_k_top_p_sampling_from_probs
    package = types.ModuleType("flashinfer")
    package.sampling = module
    return package, module


@pytest.mark.parametrize("name", ["top_k_top_p", "top_k_top_p_min_p", "temperature_0.7", "top_k_2_keeps_tie"])
def test_flashinfer_backend_wiring(monkeypatch, name):
    calls = []
    package, module = _fake_flashinfer(calls)
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", module)
    case = CASES[name]
    n = 4000
    ids, _ = sample(Sampler("flashinfer", generator=torch.Generator().manual_seed(2)), _logits(n), [_params(**case)] * n)
    assert set(ids.tolist()) == set(np.nonzero(expected_distribution(case))[0].tolist())
    if case.get("min_p"):
        assert calls == ["sampling_from_probs"]
    elif "top_k" in case or "top_p" in case:
        assert calls == [("top_k_top_p", "joint")]


@pytest.mark.parametrize("scale", [6.0, 1.5, 0.05])  # nucleus inside 512, inside 4096, most of the vocab
@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_top_p_support_on_a_large_vocab(scale, top_p):
    """Top-p without top-k takes a top-k window on the CPU when the nucleus fits; the support
    must equal a sort-based reference whichever window (or the full sort) was used."""
    vocab = 10_000
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(7)) * scale
    params = [_params(top_p=top_p)] * 4
    info = make_info(params, vocab)
    logprobs = TorchStep(Sampler(logprobs_mode="processed")).logprobs(logits.clone(), info)
    got = logprobs > torch.finfo(torch.float32).min
    probs = torch.softmax(logits.double(), dim=-1)
    order = probs.argsort(dim=-1, descending=True)
    sorted_probs = probs.gather(1, order)
    before = sorted_probs.cumsum(-1) - sorted_probs
    expected = torch.zeros_like(got)
    expected.scatter_(1, order, before < top_p)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("scale", [6.0, 1.0, 0.02])  # kept set inside 512, beyond 512, most of the vocab
def test_min_p_support_on_a_large_vocab(scale):
    """Min-p without top-p takes a window as wide as the largest kept set on the CPU (a row with a
    top_k beyond it sends the batch to the growing windows); the support must equal the definition."""
    vocab = 10_000
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(8)) * scale
    for params in ([_params(min_p=0.05)] * 4, [_params(min_p=0.05)] * 3 + [_params(min_p=0.2, top_k=3000)]):
        info = make_info(params, vocab)
        logprobs = TorchStep(Sampler(logprobs_mode="processed")).logprobs(logits.clone(), info)
        got = logprobs > torch.finfo(torch.float32).min
        floor = logits.amax(dim=-1, keepdim=True) + torch.log(info.min_ps).unsqueeze(1)
        expected = logits >= torch.maximum(floor, logits.topk(3000, dim=-1).values[:, -1:].where(info.top_ks.unsqueeze(1) < vocab, float("-inf")))
        assert torch.equal(got, expected)
        ids, _ = sample(Sampler(generator=torch.Generator().manual_seed(1)), logits, params)
        assert expected.gather(1, ids.unsqueeze(1)).all()


# ----------------------------------------------------------------------------------------- CPU row groups

# benchmark/bench_serving.py's mix: a B=16 batch has 4 greedy, 4 seeded and 8 unseeded sampled rows.
SERVING_MIX = [
    dict(temperature=0.7, top_p=0.9, top_k=50, repetition_penalty=1.1),
    dict(temperature=0.0),
    dict(temperature=0.8, min_p=0.05, frequency_penalty=0.3, presence_penalty=0.2),
    dict(temperature=0.7, top_p=0.9, top_k=50, sampling_seed=1234),
]


class _BatchWideSampler(Sampler):
    """The path every backend shares: one support over the whole batch (greedy rows included),
    then a second one over the seeded rows. The CPU pytorch path must give the same tokens."""

    def _choose_step(self, device):
        return TorchStep(self)


def _run(sampler, logits, params, positions, prompts=None):
    info = make_info(params, logits.shape[1], prompts=prompts)
    batch_logits = logits.clone()
    info.apply_logits_bias(batch_logits)
    return sampler(LogitsProcessorOutput(next_token_logits=batch_logits), info, positions=positions)


def test_serving_mix_equals_batch_wide_path():
    """Every row of the serving mix, unseeded ones included (the same uniforms meet the same
    supports), equals the batch-wide path; seeded rows equal the row sampled alone."""
    vocab, rows = 8192, 16
    params = [_params(**SERVING_MIX[i % 4]) for i in range(rows)]
    prompts = [[(7 * i + j) % vocab for j in range(12)] for i in range(rows)]
    gen = torch.Generator().manual_seed(11)
    grouped, batch_wide = Sampler(generator=torch.Generator().manual_seed(3)), _BatchWideSampler(generator=torch.Generator().manual_seed(3))
    for step in range(6):
        logits = torch.randn(rows, vocab, generator=gen) * 3.0
        positions = torch.arange(rows) + 40 + step
        ids = _run(grouped, logits, params, positions, prompts)
        assert torch.equal(ids, _run(batch_wide, logits, params, positions, prompts))
        for row in range(3, rows, 4):
            solo = _run(Sampler(), logits[row : row + 1], params[row : row + 1], positions[row : row + 1], prompts[row : row + 1])
            assert ids[row] == solo[0], (step, row)
        for row in range(1, rows, 4):
            assert ids[row] == _run(Sampler(), logits[row : row + 1], params[row : row + 1], positions[row : row + 1], prompts[row : row + 1])[0]


_MIX_POOL = [
    dict(temperature=0.0),
    dict(top_k=1, temperature=0.6),
    dict(temperature=1.3),
    dict(top_k=5),
    dict(top_k=200, top_p=0.9),
    dict(top_k=40, min_p=0.1),
    dict(top_p=0.7),
    dict(min_p=0.05),
    dict(min_p=0.3, top_p=0.95),
    dict(temperature=0.8, top_k=20, top_p=0.8, min_p=0.02),
]


@pytest.mark.parametrize("scale", [3.0, 0.05])  # windows hold the supports / most of the vocab is kept
def test_random_mixes_keep_greedy_and_seeded_tokens(scale):
    """Random mixes of every kind of row, seeded or not: greedy and seeded rows equal the batch-wide
    path and the row sampled alone, whichever groups, windows and fallbacks the batch takes."""
    vocab = 3000
    rng = np.random.default_rng(5)
    gen = torch.Generator().manual_seed(6)
    for trial in range(12):
        rows = int(rng.integers(2, 12))
        kinds = rng.integers(0, len(_MIX_POOL), rows)
        seeded = rng.random(rows) < 0.5
        params = [
            _params(**_MIX_POOL[k], **({"sampling_seed": int(1000 * trial + r)} if s else {}))
            for r, (k, s) in enumerate(zip(kinds, seeded))
        ]
        logits = torch.randn(rows, vocab, generator=gen) * scale
        positions = torch.arange(rows) + trial
        ids = _run(Sampler(generator=torch.Generator().manual_seed(trial)), logits, params, positions)
        batch_wide = _run(_BatchWideSampler(generator=torch.Generator().manual_seed(trial)), logits, params, positions)
        for r, p in enumerate(params):
            if p.top_k <= 1 or p.sampling_seed is not None:
                assert ids[r] == batch_wide[r], (trial, r, _MIX_POOL[kinds[r]])
                assert ids[r] == _run(Sampler(), logits[r : r + 1], [p], positions[r : r + 1])[0], (trial, r)


@pytest.mark.parametrize("name", ["top_k_top_p_min_p", "top_p_min_p", "min_p_0.2", "temperature_0.7"])
def test_distribution_of_rows_in_a_mixed_batch(name):
    """Unseeded and seeded rows drawn next to greedy rows and rows of other groups keep their
    filtered softmax (the CPU path selects each group's rows and draws its parts apart)."""
    case = CASES[name]
    mates = [_params(temperature=0.0), _params(top_k=3, sampling_seed=7), _params(temperature=1.3)]
    params = []
    for i in range(DRAWS):
        params += [_params(**case), mates[i % 3], _params(sampling_seed=i, **case)]
    ids, _ = sample(Sampler(generator=torch.Generator().manual_seed(9)), _logits(len(params)), params, positions=torch.full((len(params),), 5))
    assert_matches_distribution(ids[0::3], expected_distribution(case))
    assert_matches_distribution(ids[2::3], expected_distribution(case))
    mate_ids = ids[1::3]
    assert set(mate_ids[0::3].tolist()) == {0} and set(mate_ids[1::3].tolist()) <= {0, 1, 2}
