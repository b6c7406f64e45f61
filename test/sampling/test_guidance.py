"""sampling_params.guidance: validation (each bad field named), and the batched mix of
sampling/guidance.py against the formulas computed row by row in float64."""

from __future__ import annotations

import math

import pytest
import torch

from sgl_kernel_ext.sampling.kl_alpha_reference import KL_BISECTION_TOL
from sglang.srt.sampling.guidance import GuidanceBatch, apply_guidance
from sglang.srt.sampling.guidance_params import check_guide_model, normalize_guidance
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 64


def _verified(guidance) -> SamplingParams:
    params = SamplingParams.from_dict({"guidance": guidance})
    params.normalize(None)
    params.verify(VOCAB)
    return params


@pytest.mark.parametrize(
    ("guidance", "field"),
    [
        ({"method": "cfgx", "input_ids": [1], "weight": 1}, "guidance.method"),
        ({"input_ids": [1], "weight": 1}, "guidance.method"),
        ({"method": "cfg", "weight": 1}, "guidance.input_ids"),
        ({"method": "cfg", "input_ids": [1], "text": "a", "weight": 1}, "guidance.input_ids"),
        ({"method": "cfg", "input_ids": [], "weight": 1}, "guidance.input_ids"),
        ({"method": "cfg", "input_ids": [VOCAB], "weight": 1}, "guidance.input_ids"),
        ({"method": "cfg", "input_ids": [1], "weight": -0.5}, "guidance.weight"),
        ({"method": "cfg", "input_ids": [1]}, "guidance.weight"),
        ({"method": "contrastive", "input_ids": [1], "weight": float("nan")}, "guidance.weight"),
        ({"method": "mixture", "input_ids": [1], "alpha": 1.5}, "guidance.alpha"),
        ({"method": "mixture", "input_ids": [1], "alpha": "kl"}, "guidance.alpha"),
        ({"method": "mixture", "input_ids": [1]}, "guidance.alpha"),
        ({"method": "contrastive", "input_ids": [1], "weight": 1, "plausibility": 0}, "guidance.plausibility"),
        ({"method": "contrastive", "input_ids": [1], "weight": 1, "plausibility": 1.5}, "guidance.plausibility"),
        ({"method": "cfg", "input_ids": [1], "weight": 1, "alpha": 0.5}, "guidance.alpha"),
        ({"method": "cfg", "input_ids": [1], "weight": 1, "model": "other"}, "guidance.model"),
        ({"method": "cfg", "input_ids": [1], "weight": 1, "temperature": 1}, "guidance.temperature"),
        ({"method": "cfg", "text": "", "weight": 1}, "guidance.text"),
    ],
)
def test_bad_guidance_is_rejected_naming_the_field(guidance, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        _verified(guidance)


def test_guidance_must_be_an_object():
    with pytest.raises(ValueError, match="guidance"):
        _verified([1, 2])


def test_valid_guidance_survives_the_scheduler_message():
    params = _verified({"method": "mixture", "input_ids": [3, 4], "alpha": "kl_symmetry", "model": "self"})
    again = SamplingParams.from_message(params.to_message())
    assert again.guidance == {"method": "mixture", "input_ids": [3, 4], "alpha": "kl_symmetry", "model": "self"}


def test_text_is_tokenized_like_a_prompt_and_needs_a_tokenizer():
    class Tok:
        def encode(self, text):
            return [1] + [ord(c) % VOCAB for c in text]

    assert normalize_guidance({"method": "cfg", "text": "ab", "weight": 2}, Tok()) == {
        "method": "cfg", "weight": 2, "input_ids": [1, ord("a") % VOCAB, ord("b") % VOCAB]
    }
    with pytest.raises(ValueError, match=r"guidance\.text"):
        normalize_guidance({"method": "cfg", "text": "ab", "weight": 2}, None)


def test_guide_model_without_one_loaded_is_rejected():
    check_guide_model({"method": "cfg", "input_ids": [1], "weight": 1}, guide_model_loaded=False)
    with pytest.raises(ValueError, match=r"guidance\.model"):
        check_guide_model({"method": "cfg", "input_ids": [1], "weight": 1, "model": "guide"}, guide_model_loaded=False)


# --- the mix -----------------------------------------------------------------------------------


def _reference_row(main: torch.Tensor, guide: torch.Tensor, guidance: dict) -> torch.Tensor:
    """The issue's formula in float64, in the main context's logit frame (+ logsumexp(main))."""
    lc, lg = torch.log_softmax(main.double(), -1), torch.log_softmax(guide.double(), -1)
    method = guidance["method"]
    if method == "cfg":
        mixed = lg + guidance["weight"] * (lc - lg)
    elif method == "mixture":
        mixed = guidance["alpha"] * lc + (1 - guidance["alpha"]) * lg
    else:
        mixed = lc - guidance["weight"] * lg
        keep = lc.exp() >= guidance.get("plausibility", 0.1) * lc.exp().max()
        mixed = torch.where(keep, mixed, torch.tensor(-math.inf, dtype=torch.float64))
    return mixed + torch.logsumexp(main.double(), -1)


GUIDED = [
    {"method": "cfg", "input_ids": [1], "weight": 2.5},
    None,
    {"method": "mixture", "input_ids": [1], "alpha": 0.3},
    {"method": "contrastive", "input_ids": [1], "weight": 0.7, "plausibility": 0.2},
    None,
    {"method": "contrastive", "input_ids": [1], "weight": 1.0},
]


def test_batched_mix_matches_the_formulas_and_leaves_unguided_rows_alone():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(GUIDED), VOCAB, generator=gen) * 3
    rows = [i for i, g in enumerate(GUIDED) if g is not None]
    guide = torch.randn(len(rows), VOCAB, generator=gen) * 3
    original = logits.clone()
    alpha = apply_guidance(logits, guide, GuidanceBatch.build(GUIDED, torch.device("cpu")))
    for j, i in enumerate(rows):
        want = _reference_row(original[i], guide[j], GUIDED[i])
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(logits[i]))
        assert torch.allclose(logits[i][finite].double(), want[finite], atol=1e-4)
    for i in (1, 4):
        assert torch.equal(logits[i], original[i])  # bit for bit
    assert alpha[rows.index(2)].item() == pytest.approx(0.3)


def test_cfg_weight_one_and_mixture_alpha_one_keep_the_main_logits_bit_for_bit():
    guidance = [{"method": "cfg", "input_ids": [1], "weight": 1.0}, {"method": "mixture", "input_ids": [1], "alpha": 1}]
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1))
    original = logits.clone()
    apply_guidance(logits, torch.randn(2, VOCAB), GuidanceBatch.build(guidance, torch.device("cpu")))
    assert torch.equal(logits, original)


def test_kl_symmetry_alpha_equalises_the_two_kls():
    gen = torch.Generator().manual_seed(2)
    guidance = [{"method": "mixture", "input_ids": [1], "alpha": "kl_symmetry"}] * 5
    logits = torch.randn(5, VOCAB, generator=gen) * 2
    guide = torch.randn(5, VOCAB, generator=gen) * 2
    original = logits.clone()
    alpha = apply_guidance(logits, guide, GuidanceBatch.build(guidance, torch.device("cpu")))
    for i in range(5):
        lc, lg = torch.log_softmax(original[i].double(), -1), torch.log_softmax(guide[i].double(), -1)
        a = alpha[i].double()
        q = torch.softmax(a * lc + (1 - a) * lg, -1)
        kl_c, kl_g = (q * (q.log() - lc)).sum(), (q * (q.log() - lg)).sum()
        # |d(KL_c - KL_g)/da| = Var_q(lg - lc), so an alpha within the tolerance leaves this gap.
        slope = (q * (lg - lc) ** 2).sum() - (q * (lg - lc)).sum() ** 2
        assert abs(kl_c - kl_g) <= slope * KL_BISECTION_TOL + 1e-9
        assert 0 < a < 1
        want = _reference_row(original[i], guide[i], {"method": "mixture", "alpha": a.item()})
        assert torch.allclose(logits[i].double(), want, atol=1e-4)


def test_tokens_ruled_out_by_both_contexts_stay_minus_inf_on_every_method():
    guidance = [
        {"method": "cfg", "input_ids": [1], "weight": 2.5},
        {"method": "cfg", "input_ids": [1], "weight": 0.5},
        {"method": "cfg", "input_ids": [1], "weight": 1.0},
        {"method": "mixture", "input_ids": [1], "alpha": 0.3},
        {"method": "mixture", "input_ids": [1], "alpha": "kl_symmetry"},
        {"method": "contrastive", "input_ids": [1], "weight": 0.7},
    ]
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(len(guidance), VOCAB, generator=gen) * 3
    guide = torch.randn(len(guidance), VOCAB, generator=gen) * 3
    masked = [3, 17, 40]  # e.g. grammar-masked in both contexts
    logits[:, masked] = -math.inf
    guide[:, masked] = -math.inf
    original = logits.clone()
    alpha = apply_guidance(logits, guide, GuidanceBatch.build(guidance, torch.device("cpu")))
    assert not logits.isnan().any()
    assert (logits[:, masked] == -math.inf).all()
    open_tokens = [t for t in range(VOCAB) if t not in masked]
    for i, g in enumerate(guidance):
        spec = dict(g, alpha=alpha[i].item()) if g["method"] == "mixture" else g
        want = _reference_row(original[i, open_tokens], guide[i, open_tokens], spec)
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(logits[i, open_tokens]))
        assert torch.allclose(logits[i, open_tokens][finite].double(), want[finite], atol=1e-4)
    assert torch.equal(logits[2], original[2])  # cfg w = 1: still the main logits bit for bit


def test_a_token_only_the_main_context_rules_out_is_minus_inf_unless_the_guide_alone_decides():
    guidance = [
        {"method": "cfg", "input_ids": [1], "weight": 0.5},
        {"method": "contrastive", "input_ids": [1], "weight": 0.5},
        {"method": "cfg", "input_ids": [1], "weight": 0.0},
    ]
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, VOCAB, generator=gen)
    guide = torch.randn(3, VOCAB, generator=gen)
    logits[:, 7] = -math.inf
    original = logits.clone()
    apply_guidance(logits, guide, GuidanceBatch.build(guidance, torch.device("cpu")))
    assert logits[0, 7] == -math.inf and logits[1, 7] == -math.inf
    # w = 0 is the guide context alone: token 7 gets the guide's log-probability (main frame).
    want = torch.log_softmax(guide[2].double(), -1) + torch.logsumexp(original[2].double(), -1)
    assert torch.allclose(logits[2].double(), want, atol=1e-4)


# --- the Sampler: the mix is its first stage -----------------------------------------------------


def _sampler_step(mode: str, guidance: list, logits: torch.Tensor, guide: torch.Tensor, **params):
    from types import SimpleNamespace

    from sglang.srt.layers.sampler import Sampler, SamplerInput
    from sglang.srt.sampling.sampling_batch_info import RowSpec, SamplingBatchInfo

    rows = [RowSpec(params=SamplingParams(guidance=g, **params)) for g in guidance]
    info = SamplingBatchInfo(rows=rows, vocab_size=VOCAB, device=torch.device("cpu"))
    asks = [SimpleNamespace(rid=str(i), origin_input_ids=[1], output_ids=[], grammar=None, sampling_report=None,
                            logprob=SimpleNamespace(top_logprobs_num=3, token_ids_logprob=[0, 5]))
            for i in range(len(guidance))]
    sampler = Sampler("pytorch", logprobs_mode=mode, device="cpu")
    inp = SamplerInput(logits=logits.clone(), info=info, positions=torch.zeros(len(guidance), dtype=torch.int64),
                       rows=asks, guide_logits=guide)
    return sampler.sample_step(inp)


def test_sampler_mixes_first_and_raw_logprobs_are_the_main_contexts():
    guidance = [{"method": "cfg", "input_ids": [1], "weight": 4.0}, None]
    gen = torch.Generator().manual_seed(3)
    logits, guide = torch.randn(2, VOCAB, generator=gen) * 3, torch.randn(1, VOCAB, generator=gen) * 3
    want = _reference_row(logits[0], guide[0], guidance[0])
    for mode in ("raw", "scaled"):
        out = _sampler_step(mode, guidance, logits, guide, temperature=0.0)
        assert out.next_ids.tolist() == [int(want.argmax()), int(logits[1].argmax())]
        lp = out.logprobs
        source = torch.log_softmax(logits[0] if mode == "raw" else want.float(), -1)
        assert lp.next_token_logprobs[0].item() == pytest.approx(source[out.next_ids[0]].item(), abs=1e-4)
        assert lp.next_token_token_ids_logprobs_val[0].tolist() == pytest.approx(source[[0, 5]].tolist(), abs=1e-4)
        assert lp.next_token_top_logprobs_idx[0].tolist() == source.topk(3).indices.tolist()
        unguided = torch.log_softmax(logits[1], -1)
        assert lp.next_token_top_logprobs_val[1].tolist() == pytest.approx(unguided.topk(3).values.tolist(), abs=1e-5)
