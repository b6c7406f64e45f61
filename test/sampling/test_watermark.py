"""Watermarking: the README's hash (written here from its words) against ours bit for bit, the
selection rule, its distribution over keys, greedy / repeated / low-entropy rows, dual key, the
request policy and key redaction, and the detector's statistic."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from sgl_kernel_ext.sampling.murmur_reference import murmur_hash32
from sampling_utils import BASE, CASES, DRAWS, V, assert_matches_distribution, expected_distribution, make_info, sample
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.watermarking import WatermarkDetector, detect
from sglang.srt.sampling.watermarking import detector as det
from sglang.srt.sampling.watermarking.config import WatermarkSettings, parse_key, redact, resolve_request
from sglang.srt.sampling.watermarking.hashing import context_hashes, key_coins, log_uniform, token_hashes
from sglang.srt.sampling.watermarking.state import WatermarkState

M = 0xFFFFFFFF


# --------------------------------------------------------------- the README's hash, from its words


def rotl32(v, s):
    return ((v << s) | (v >> (32 - s))) & M


def mix(state, value):
    value = (value * 0xCC9E2D51) & M
    value = rotl32(value, 15)
    value = (value * 0x1B873593) & M
    state = rotl32(state ^ value, 13)
    return (state * 5 + 0xE6546B64) & M


def fmix32(value):
    value ^= value >> 16
    value = (value * 0x85EBCA6B) & M
    value ^= value >> 13
    value = (value * 0xC2B2AE35) & M
    return value ^ (value >> 16)


def ref_context_hash(context):
    state = 0
    for c in context:
        state = mix(state, c)
    return fmix32(state ^ (4 * len(context)))


def ref_token_hash(key, ctx, t):
    key &= (1 << 64) - 1
    return fmix32(mix(mix(mix(mix(0, key & M), key >> 32), ctx), t) ^ 16)


def ref_coin(a, b, ctx):
    a &= (1 << 64) - 1
    b &= (1 << 64) - 1
    return fmix32(mix(mix(mix(mix(mix(0, a & M), a >> 32), b & M), b >> 32), ctx) ^ 20)


KEYS = ["0", "1", "0123456789abcdef", "0xFFFFFFFFFFFFFFFF", "deadbeef", "8000000000000000"]
CONTEXTS = [[], [0], [49151], [1, 2, 3, 4], [7, 7, 7], list(range(100, 164))]


def test_fixed_vectors():
    """Pinned values: MurmurHash3 x86-32 of four zero bytes is the published 0x2362F9DE."""
    key_a, key_b = parse_key("0123456789abcdef"), parse_key("fedcba9876543210")
    assert ref_context_hash([]) == 0 and ref_context_hash([0]) == 0x2362F9DE
    ctx = ref_context_hash([1, 2, 3, 4])
    assert ctx == 0x4445AD00
    assert ref_token_hash(key_a, ctx, 42) == 0x467F4D5B and ref_token_hash(key_b, ctx, 0) == 0xD436EA5B
    assert ref_coin(key_a, key_b, ctx) == 0x75617683
    ours = context_hashes(torch.tensor([[0, 0, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4]]), torch.tensor([0, 1, 4]))
    assert ours.tolist() == [0, 0x2362F9DE, 0x4445AD00]
    hashed = token_hashes(torch.tensor([key_a, key_b]), torch.tensor([ctx, ctx]), 43)
    assert hashed[0, 42].item() == 0x467F4D5B and hashed[1, 0].item() == 0xD436EA5B
    assert key_coins(torch.tensor([key_a]), torch.tensor([key_b]), torch.tensor([ctx])).tolist() == [0x75617683]
    assert det.token_hash(key_a, ctx, 42) == 0x467F4D5B and det.key_coin(key_a, key_b, ctx) == 0x75617683


def test_hash_matches_reference_bit_for_bit():
    rng = random.Random(0)
    contexts = CONTEXTS + [[rng.randrange(2**32) for _ in range(rng.randrange(1, 9))] for _ in range(20)]
    width = max(len(c) for c in contexts)
    tails = torch.tensor([[0] * (width - len(c)) + c for c in contexts])
    lengths = torch.tensor([len(c) for c in contexts])
    ctx = context_hashes(tails, lengths)
    assert ctx.tolist() == [ref_context_hash(c) for c in contexts] == [det.context_hash(c) for c in contexts]
    keys = [parse_key(k) for k in KEYS] * 5
    keys = keys[: len(contexts)]
    hashed = token_hashes(torch.tensor(keys), ctx, 200)
    expected = [[ref_token_hash(k, c, t) for t in range(200)] for k, c in zip(keys, ctx.tolist())]
    assert hashed.tolist() == expected
    large = [49151, 151935, 2**31, M]  # the same hash the vocabulary-wide call uses, at large ids
    hashed = murmur_hash32(torch.tensor(keys), ctx, torch.tensor(large))
    assert hashed.tolist() == [[ref_token_hash(k, c, t) for t in large] for k, c in zip(keys, ctx.tolist())]
    coins = key_coins(torch.tensor(keys), torch.tensor(keys[::-1]), ctx)
    assert coins.tolist() == [ref_coin(a, b, c) for a, b, c in zip(keys, keys[::-1], ctx.tolist())]


def test_log_uniform_is_the_readme_float32_formula():
    hashes = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 129, 2**32 - 2, M])
    expected = []
    for h in hashes.tolist():
        if h < 2**31:
            expected.append(math.log(np.float32(np.float32(h) + np.float32(0.5)) / np.float32(2**32)))
        else:
            c = np.float32(np.float32(M - h) + np.float32(0.5))
            expected.append(math.log1p(-float(np.float32(c / np.float32(2**32)))))
    got = log_uniform(hashes)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)
    assert len(set(got[-3:].tolist())) == 3 and (got < 0).all()  # distinct below 0 near u = 1


# --------------------------------------------------------------- selection in the sampler


def _wm(key="0123456789abcdef", window=4):
    return {"key": key, "context_window": window}


def _sampler(settings=WatermarkSettings(), slots=8, context_len=64):
    sampler = Sampler("pytorch", generator=torch.Generator().manual_seed(0))
    sampler.watermark_state = WatermarkState(settings, slots, context_len, torch.device("cpu"))
    return sampler


def _start(sampler, info, slots, prompts):
    wm = info.watermark
    sampler.watermark_state.start(slots.index_select(0, wm.rows), [prompts[i] for i in wm.rows_host],
                                  [[] for _ in wm.rows_host], wm.windows_host)


def _reference_choice(logits, key, context, temperature=1.0):
    """argmax_t log(u_t) / p_t over the softmax, lowest id on ties (float32 like the README's selector)."""
    probs = torch.softmax(torch.tensor(logits, dtype=torch.float32) / temperature, dim=0)
    ctx = ref_context_hash(context)
    best, best_score = None, None
    for t, p in enumerate(probs.tolist()):
        if p <= 0:
            continue
        score = float(log_uniform(torch.tensor([ref_token_hash(parse_key(key), ctx, t)]))[0]) / np.float32(p)
        if best is None or score > best_score:
            best, best_score = t, score
    return best


def test_forced_token_is_the_readme_selection_and_rows_are_independent():
    rng = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 50, generator=rng)
    prompts = [[5, 6, 7, 8, 9], [1], [2, 3], [4, 4, 4]]
    keys = ["1", "abc", "ffffffffffffffff", "0x42"]
    params = [SamplingParams(temperature=0.9, watermark=_wm(k, 3)) for k in keys]
    sampler = _sampler()
    info = make_info(params, 50)
    slots = torch.tensor([0, 1, 2, 3])
    _start(sampler, info, slots, prompts)
    ids, _ = sample(sampler, logits, params, slots=slots)
    expected = [_reference_choice(logits[i].tolist(), keys[i], prompts[i][-3:], 0.9) for i in range(4)]
    assert ids.tolist() == expected
    # One row alone gives the same token as in the batch.
    solo = _sampler()
    info = make_info(params[2:3], 50)
    _start(solo, info, torch.tensor([5]), prompts[2:3])
    assert sample(solo, logits[2:3], params[2:3], slots=torch.tensor([5]))[0].tolist() == [expected[2]]


@pytest.mark.parametrize("name", ["temperature_0.7", "top_k_2_keeps_tie", "top_p_0.6", "top_k_top_p_min_p"])
def test_distribution_over_keys_matches_unwatermarked(name):
    """Over many keys (one row each, same context) the forced token follows the filtered distribution."""
    case = CASES[name]
    params = [SamplingParams(**case, watermark=_wm(format(i + 1, "x"))) for i in range(DRAWS)]
    sampler = _sampler(slots=DRAWS, context_len=4)
    info = make_info(params, V)
    slots = torch.arange(DRAWS)
    sampler.watermark_state.start(slots, [[11, 12]] * DRAWS, [[]] * DRAWS, [4] * DRAWS)
    logits = torch.tensor([BASE] * DRAWS, dtype=torch.float32)
    ids = sampler(logits_out(logits), info, positions=torch.zeros(DRAWS, dtype=torch.int64), slots=slots)
    assert_matches_distribution(ids, expected_distribution(case))


def logits_out(logits):
    return LogitsProcessorOutput(next_token_logits=logits.clone())


def test_greedy_rows_untouched_and_not_watermark_rows():
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0, watermark=_wm()), SamplingParams(watermark=_wm())]
    info = make_info(params, 30)
    assert info.watermark.rows_host == [1]
    sampler = _sampler()
    _start(sampler, info, torch.tensor([0, 1]), [[1, 2], [1, 2]])
    ids, _ = sample(sampler, logits, params, slots=torch.tensor([0, 1]))
    assert ids[0] == logits[0].argmax()
    assert make_info([SamplingParams(temperature=0, watermark=_wm())], 30).watermark is None


def _force_once(sampler, info, logits, slots):
    return sampler.watermark_state.force(logits.clone(), info, slots)


def test_repeated_context_samples_normally_and_history_is_per_request():
    params = [SamplingParams(watermark=_wm(window=2))]
    info = make_info(params, 20)
    sampler = _sampler()
    slot = torch.tensor([0])
    sampler.watermark_state.start(slot, [[3, 4]], [[]], [2])
    logits = torch.randn(1, 20, generator=torch.Generator().manual_seed(2))
    first = _force_once(sampler, info, logits, slot)
    assert first.item() >= 0
    assert _force_once(sampler, info, logits, slot).item() == -1  # same context again: ordinary draw
    sampler.watermark_state.append(info, slot, torch.tensor([9]))
    assert _force_once(sampler, info, logits, slot).item() >= 0  # context (4, 9) is new
    sampler.watermark_state.start(slot, [[3, 4]], [[]], [2])  # a new request in the slot forgets
    assert _force_once(sampler, info, logits, slot).item() == first.item()


def test_retracted_request_rebuilds_its_history():
    info = make_info([SamplingParams(watermark=_wm(window=2))], 20)
    sampler = _sampler()
    slot = torch.tensor([0])
    sampler.watermark_state.start(slot, [[3, 4]], [[5, 3, 4]], [2])  # contexts (3,4) (4,5) (5,3) seen
    assert sampler.watermark_state.counts[0].item() == 3
    logits = torch.randn(1, 20)
    assert _force_once(sampler, info, logits, slot).item() == -1  # tail (3, 4) was forced before


def test_entropy_gate():
    info = make_info([SamplingParams(watermark=_wm())], 10)
    peaked = torch.tensor([[10.0] + [0.0] * 9])
    flat = torch.zeros(1, 10)
    sampler = _sampler(WatermarkSettings(max_probability=0.5))
    slot = torch.tensor([0])
    sampler.watermark_state.start(slot, [[1]], [[]], [4])
    assert _force_once(sampler, info, peaked, slot).item() == -1
    assert _force_once(sampler, info, flat, slot).item() >= 0


def test_dual_key_uses_the_coin_and_the_detector_partitions():
    a, b = "0123456789abcdef", "fedcba9876543210"
    settings = WatermarkSettings(key=a, key_b=b, mixing_probability=0.3)
    sampler = _sampler(settings, slots=1, context_len=512)
    info = make_info([SamplingParams(watermark=_wm(a, 2))], 64)
    slot = torch.tensor([0])
    prompt = [1, 2]
    sampler.watermark_state.start(slot, [prompt], [[]], [2])
    gen = torch.Generator().manual_seed(5)
    tokens = []
    for _ in range(120):
        logits = torch.randn(1, 64, generator=gen)
        ids = sampler(logits_out(logits), info, positions=torch.zeros(1, dtype=torch.int64), slots=slot)
        context = (prompt + tokens)[-2:]
        ctx = ref_context_hash(context)
        key = a if ref_coin(parse_key(a), parse_key(b), ctx) < int(0.3 * 2**32) else b
        forced = _reference_choice(logits[0].tolist(), key, context)
        if (tuple(context)) not in {tuple((prompt + tokens)[max(0, i - 2) : i]) for i in range(2, len(prompt + tokens))}:
            assert ids.item() == forced
        tokens.append(ids.item())
    result = detect(tokens, key=a, key_b=b, mixing_probability=0.3, context_window=2, prompt_token_ids=prompt)
    assert result.key_a_partition.num_contexts + result.key_b_partition.num_contexts == result.combined.num_contexts
    assert result.combined.p_value < 1e-6


# --------------------------------------------------------------- policy, redaction


def test_request_resolution_table():
    off, on = None, WatermarkSettings(key="aa")
    default = WatermarkSettings(key="aa", default_enabled=True)
    enforce = WatermarkSettings(key="aa", enforce_all=True, context_window=6)
    assert resolve_request(None, off) is None and resolve_request({"enabled": False}, off) is None
    assert resolve_request(None, on) is None
    assert resolve_request({"enabled": True}, on) == {"key": "aa", "context_window": 4}
    assert resolve_request({"key": "bb", "context_window": 2}, on) == {"key": "bb", "context_window": 2}
    assert resolve_request(None, default) == {"key": "aa", "context_window": 4}
    assert resolve_request({"enabled": False}, default) is None
    assert resolve_request(None, enforce) == {"key": "aa", "context_window": 6}
    for value, settings, field in [
        ({"enabled": True}, off, "watermark"),
        ({"key": "bb"}, off, "watermark"),
        ({"enabled": True}, WatermarkSettings(), "watermark.enabled"),
        ({"enabled": False}, enforce, "watermark.enabled"),
        ({"enabled": False, "key": "bb"}, on, "watermark.key"),
        ({"key": "bb", "context_window": 5}, on, "watermark.context_window"),
        ({"context_window": 2}, on, "watermark"),
    ]:
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            resolve_request(value, settings)


@pytest.mark.parametrize("value, field", [
    ({"key": "xyz-secret"}, "watermark.key"), ({"key": "1" * 17}, "watermark.key"), ({"key": 5}, "watermark.key"),
    ({"enabled": "yes"}, "watermark.enabled"), ({"context_window": 0}, "watermark.context_window"),
    ({"colour": 1}, "watermark"), ("abc", "watermark"),
])
def test_bad_request_object_names_the_field_without_the_key(value, field):
    with pytest.raises(ValueError) as info:
        SamplingParams(watermark=value).verify(100)
    assert field in str(info.value) and "secret" not in str(info.value)


def test_server_config_checks_and_redaction():
    settings = WatermarkSettings.from_json('{"key": "0x0123", "key_b": "ff", "mixing_probability": 0.25}')
    assert "0123" not in repr(settings) and "<redacted>" in repr(settings)
    for bad in ['{"key_b": "ff"}', '{"mixing_probability": 0.3, "key": "a"}', '{"default_enabled": true}',
                '{"context_window": 65}', '{"max_probability": 0}', '{"nope": 1}', '[1]']:
        with pytest.raises(ValueError, match="watermark-config"):
            WatermarkSettings.from_json(bad)
    body = {"watermark_config": '{"key": "aa"}', "sampling_params": {"watermark": {"key": "aa", "context_window": 2}},
            "watermark": [{"key": "bb"}], "key": "not-a-watermark-field"}
    shown = redact(body)
    assert shown["watermark_config"] == "<redacted>" and shown["key"] == "not-a-watermark-field"
    assert shown["sampling_params"]["watermark"] == {"key": "<redacted>", "context_window": 2}
    assert shown["watermark"] == [{"key": "<redacted>"}]
    assert "aa" not in repr(SamplingParams(watermark={"key": "aa"}))


# --------------------------------------------------------------- detector


def test_gamma_tail_matches_the_closed_form():
    for n, s in [(1, 0.5), (1, 3.0), (5, 2.0), (30, 45.0)]:
        exact = math.exp(-s) * sum(s**k / math.factorial(k) for k in range(n))
        assert math.isclose(math.exp(det.gamma_log_survival(s, n)), exact, rel_tol=1e-9)
    stats = det.WatermarkStatistics.from_scores([5.0] * 400)
    assert stats.p_value == 0.0 and stats.log_p_value < -700 and stats.z_score == pytest.approx(80.0)


def test_detector_counts_contexts_like_the_readme():
    key = "0123456789abcdef"
    d = WatermarkDetector(key, context_window=2)
    tokens = [5, 6, 5, 6, 5, 6, 7]
    result = d.detect_tokens(tokens, prompt_token_ids=[1, 5, 6])
    # Contexts: (5,6) (6,5) (5,6)r (6,5)r (5,6)r (6,5)r (5,6)r -> tokens 5,6,5,6,5,6,7 ...
    assert result.combined.num_contexts == 2 and result.repeated_contexts == 5 and result.tokens_examined == 7
    expected = [-math.log1p(-(ref_token_hash(parse_key(key), ref_context_hash(c), t) + 0.5) / 2**32)
                for c, t in (((5, 6), 5), ((6, 5), 6))]
    assert result.combined.score == pytest.approx(math.fsum(expected), rel=1e-12)
    no_prompt = d.detect_tokens(tokens)
    assert no_prompt.skipped_initial_tokens == 2
    with pytest.raises(ValueError, match="key"):
        WatermarkDetector("not hex")
