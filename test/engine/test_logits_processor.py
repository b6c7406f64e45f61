"""LogitsHead: lm_head projection, TP all-gather hook, padding cut, logit scale, soft-capping."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.layers.logits_processor import LogitsHead
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(3, 8, generator=gen), torch.randn(10, 8, generator=gen)


def test_projection_and_scale_and_softcap():
    hidden, weight = _inputs()
    plain = LogitsHead(10)(hidden, weight).next_token_logits
    torch.testing.assert_close(plain, hidden @ weight.T)
    scaled = LogitsHead(10, logit_scale=0.5)(hidden, weight).next_token_logits
    torch.testing.assert_close(scaled, 0.5 * (hidden @ weight.T))
    capped = LogitsHead(10, final_logit_softcapping=2.0)(hidden, weight).next_token_logits
    torch.testing.assert_close(capped, torch.tanh((hidden @ weight.T) / 2.0) * 2.0)
    assert capped.abs().max() < 2.0


def test_tp_all_gather_hook_and_padding_cut():
    hidden, weight = _inputs()
    shards = weight.chunk(2)  # two ranks of 5 rows; the hook stands in for the all-gather

    def gather(local):
        other = hidden @ shards[1].T
        padding = torch.full((local.shape[0], 2), 99.0)  # shards padded to a multiple of the TP size
        return torch.cat([local, other, padding], dim=1)

    out = LogitsHead(10, tp_all_gather=gather)(hidden, shards[0]).next_token_logits
    torch.testing.assert_close(out, hidden @ weight.T)


def test_lm_head_module_with_packed_weight_matches_dense():
    hidden, weight = _inputs()
    head = ParallelLMHead(10, 8)
    head.weight_loader(head.weight, weight)
    head.process_weights_after_loading()
    torch.testing.assert_close(LogitsHead(10)(hidden, head).next_token_logits, hidden @ weight.T, rtol=1e-5, atol=1e-5)


def _gather_two_shards(hidden: torch.Tensor, weight: torch.Tensor):
    other = hidden @ weight.chunk(2)[1].T

    def gather(local: torch.Tensor) -> torch.Tensor:
        return torch.cat([local, other, torch.full((local.shape[0], 2), 99.0)], dim=1)  # [B, V_padded]

    return gather


@pytest.mark.parametrize("case", ["plain", "bf16", "scale", "softcap", "tp"])
def test_out_buffer_receives_the_same_logits(case: str) -> None:
    """`out` (a decode graph's static output) holds what the head returns without it, and is
    what it returns; a bf16 projection is converted into it."""
    hidden, weight = _inputs()
    shard, options = weight, {}
    if case == "bf16":
        hidden, shard = hidden.bfloat16(), weight.bfloat16()
    elif case == "scale":
        options = dict(logit_scale=0.5)
    elif case == "softcap":
        options = dict(final_logit_softcapping=2.0)
    elif case == "tp":
        shard, options = weight.chunk(2)[0], dict(tp_all_gather=_gather_two_shards(hidden, weight))
    head = LogitsHead(10, **options)
    want = head(hidden, shard).next_token_logits
    buffer = torch.full((5, 10), float("nan"))  # [max_bs, V] float32, a graph runner's shared buffer
    got = head(hidden, shard, out=buffer[:3]).next_token_logits
    assert got.data_ptr() == buffer.data_ptr() and got.dtype == torch.float32
    assert torch.equal(got, want) and torch.equal(buffer[:3], want) and buffer[3:].isnan().all()


def test_bad_softcap_rejected():
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        LogitsHead(10, final_logit_softcapping=0.0)
