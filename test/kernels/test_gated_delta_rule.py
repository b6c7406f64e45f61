"""The gated delta rule's torch reference (layers/gated_delta_rule.py): the chunked form equals the
token-by-token recurrence and transformers' torch fallbacks, from a zero or a carried state and
across chunk boundaries; the decode conv step equals the prefill conv; the state a sequence
leaves after one part is the state its next part starts from."""

from __future__ import annotations

import inspect

import pytest
import torch

from sglang.srt.layers.gated_delta_rule import (
    causal_conv1d,
    causal_conv1d_step,
    chunked_gated_delta_rule,
    prepare_qk,
    recurrent_gated_delta_rule,
    recurrent_step,
)

HK, HV, DK, DV = 2, 4, 16, 8
ATOL = 1e-5


def _inputs(tokens: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(tokens, HK, DK, generator=g), torch.randn(tokens, HK, DK, generator=g)
    v = torch.randn(tokens, HV, DV, generator=g)
    decay = -torch.rand(tokens, HV, generator=g)  # log space, <= 0
    beta = torch.rand(tokens, HV, generator=g)
    state = 0.1 * torch.randn(HV, DK, DV, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("tokens", [1, 5, 64, 150])
def test_chunked_equals_recurrent(tokens: int) -> None:
    q, k, v, g, beta, state = _inputs(tokens)
    qn, kn = prepare_qk(q, k, HV)
    out_c, state_c = chunked_gated_delta_rule(qn, kn, v, g, beta, state)
    out_r, state_r = recurrent_gated_delta_rule(qn, kn, v, g, beta, state)
    torch.testing.assert_close(out_c, out_r, atol=ATOL, rtol=0)
    torch.testing.assert_close(state_c, state_r, atol=ATOL, rtol=0)


def test_small_chunks_equal_one_chunk() -> None:
    q, k, v, g, beta, state = _inputs(100, seed=1)
    qn, kn = prepare_qk(q, k, HV)
    whole = chunked_gated_delta_rule(qn, kn, v, g, beta, state)
    small = chunked_gated_delta_rule(qn, kn, v, g, beta, state, chunk_size=7)
    for a, b in zip(whole, small):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def _torch_fallback(function):
    """transformers' plain-torch function under its kernel decorator, which dispatches to
    flash-linear-attention where fla-core is installed (CUDA kernels, whatever the tensors' device)."""
    torch_function = inspect.unwrap(function)
    assert torch_function.__module__ == function.__module__ and torch_function is not function
    return torch_function


def test_matches_transformers_torch_fallbacks() -> None:
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    q, k, v, g, beta, state = _inputs(90, seed=2)
    args = (q[None], k[None], v[None], g[None], beta[None])
    kwargs = dict(initial_state=state[None], output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref_chunk, ref_state = _torch_fallback(modeling.torch_chunk_gated_delta_rule)(*args, **kwargs)
    ref_rec, ref_rec_state = _torch_fallback(modeling.torch_recurrent_gated_delta_rule)(*args, **kwargs)
    qn, kn = prepare_qk(q, k, HV)
    out, final = chunked_gated_delta_rule(qn, kn, v, g, beta, state)
    torch.testing.assert_close(out, ref_chunk[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(final, ref_state[0], atol=ATOL, rtol=0)
    out, final = recurrent_gated_delta_rule(qn, kn, v, g, beta, state)
    torch.testing.assert_close(out, ref_rec[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(final, ref_rec_state[0], atol=ATOL, rtol=0)


def test_state_carries_across_parts() -> None:
    """A prefill split in two (a chunked prefill) and then decode steps give the outputs of one pass."""
    q, k, v, g, beta, state = _inputs(40, seed=3)
    qn, kn = prepare_qk(q, k, HV)
    whole, _ = chunked_gated_delta_rule(qn, kn, v, g, beta, state)
    first, mid = chunked_gated_delta_rule(qn[:16], kn[:16], v[:16], g[:16], beta[:16], state)
    second, mid = chunked_gated_delta_rule(qn[16:30], kn[16:30], v[16:30], g[16:30], beta[16:30], mid)
    steps = []
    for t in range(30, 40):
        out, mid = recurrent_step(mid[None], qn[t : t + 1], kn[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1])
        mid = mid[0]
        steps.append(out)
    torch.testing.assert_close(torch.cat([first, second, *steps]), whole, atol=ATOL, rtol=0)


def test_batched_step_rows_independent() -> None:
    """A decode step of several rows equals each row alone."""
    q, k, v, g, beta, _ = _inputs(3, seed=4)
    qn, kn = prepare_qk(q, k, HV)
    states = 0.1 * torch.randn(3, HV, DK, DV, generator=torch.Generator().manual_seed(5))
    out, new = recurrent_step(states, qn, kn, v, g, beta)
    for i in range(3):
        out_i, new_i = recurrent_step(states[i], qn[i], kn[i], v[i], g[i], beta[i])
        torch.testing.assert_close(out[i], out_i, atol=0, rtol=0)
        torch.testing.assert_close(new[i], new_i, atol=0, rtol=0)


def test_conv_step_equals_prefill_conv() -> None:
    channels, kernel, tokens = 12, 4, 9
    gen = torch.Generator().manual_seed(6)
    x, weight = torch.randn(tokens, channels, generator=gen), torch.randn(channels, kernel, generator=gen)
    zero = torch.zeros(channels, kernel - 1)
    whole, whole_state = causal_conv1d(x, zero, weight)
    part, state = causal_conv1d(x[:2], zero, weight)  # shorter than the kernel: the state keeps zeros
    outs = [part]
    for t in range(2, tokens):
        out, state = causal_conv1d_step(x[t : t + 1], state[None], weight)
        state = state[0]
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs), whole, atol=ATOL, rtol=0)
    torch.testing.assert_close(state, whole_state, atol=0, rtol=0)


def _fake_fla(calls: list) -> object:
    """flash-linear-attention 0.6's two entry points by signature (gk and gv sit between g and beta
    in the recurrent one), computing with the torch reference; each call is recorded."""

    def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                         output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
        calls.append("recurrent")
        assert gk is None and gv is None and beta is not None and use_qk_l2norm_in_kernel
        qn, kn = prepare_qk(q[:, 0], k[:, 0], v.shape[2])
        out, state = recurrent_step(initial_state, qn, kn, v[:, 0].float(), g[:, 0], beta[:, 0].float())
        return out.unsqueeze(1), state

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
        calls.append("chunk")
        bounds = cu_seqlens_cpu.tolist()
        qn, kn = prepare_qk(q[0], k[0], v.shape[2])
        parts = [chunked_gated_delta_rule(qn[a:b], kn[a:b], v[0, a:b].float(), g[0, a:b], beta[0, a:b].float(),
                                          initial_state[i]) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        return torch.cat([o for o, _ in parts]).unsqueeze(0), torch.stack([s for _, s in parts])

    return type("FakeFla", (), {"fused_recurrent_gated_delta_rule": staticmethod(fused_recurrent_gated_delta_rule),
                                "chunk_gated_delta_rule": staticmethod(chunk_gated_delta_rule)})


@pytest.mark.parametrize("decode", [True, False])
def test_fla_calls_pass_beta_as_beta(decode: bool) -> None:
    """The layer calls flash-linear-attention by keyword: with 0.6's signatures a positional beta
    would land in gk (a per-key decay) and the decode step's logits turned NaN on the GPU."""
    from types import SimpleNamespace

    from sglang.srt.layers.gated_delta_net import _fla_delta_rule

    gen = torch.Generator().manual_seed(7)
    hk, hv, dk, dv = 2, 4, 8, 8
    lens = [1, 1] if decode else [3, 5]
    n = sum(lens)
    q, k = torch.randn(n, hk, dk, generator=gen), torch.randn(n, hk, dk, generator=gen)
    v, g, beta = torch.randn(n, hv, dv, generator=gen), -torch.rand(n, hv, generator=gen), torch.rand(n, hv, generator=gen)
    state = torch.randn(len(lens), hv, dk, dv, generator=gen) * 0.1
    batch = SimpleNamespace(extend_start_loc=torch.tensor([0, lens[0]]), extend_seq_lens_cpu=lens)
    calls: list = []
    out, final = _fla_delta_rule(_fake_fla(calls), q, k, v, g, beta, state, batch, decode)
    assert calls == (["recurrent"] if decode else ["chunk"])
    qn, kn = prepare_qk(q, k, hv)
    if decode:
        want_out, want_state = recurrent_step(state, qn, kn, v, g, beta)
    else:
        parts = [chunked_gated_delta_rule(qn[a:b], kn[a:b], v[a:b], g[a:b], beta[a:b], state[i])
                 for i, (a, b) in enumerate([(0, 3), (3, 8)])]
        want_out, want_state = torch.cat([o for o, _ in parts]), torch.stack([s for _, s in parts])
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(final, want_state)
