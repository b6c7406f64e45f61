"""A decoder layer at decode in one C call, all but its SiLU (sgl_kernel_ext/layer): the same bits
as the separate kernels called one by one (AVX2 and portable builds), close to the plain-torch
reference, refusing what it cannot read, and in the embedded model the same logits as the
op-by-op path, at decode batches on both of the block kernel's paths."""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest
import torch

import sgl_kernel_ext.activation.silu_mul_cpu as cpu_silu
import sgl_kernel_ext.attention.decode_attention_cpu as cpu_attention
import sgl_kernel_ext.gemm.block_quant_linear as bq
import sgl_kernel_ext.layer.decode_layer_cpu as layer_kernel
import sgl_kernel_ext.norm.rmsnorm_cpu as cpu_norm
import sgl_kernel_ext.rotary.rope_store_cpu as cpu_rope
from runner_utils import Driver
from sgl_kernel_ext.attention.decode_attention_cpu import decode_attention_cpu
from sgl_kernel_ext.cpu_build import load_kernel
from sgl_kernel_ext.gemm.block_quant_linear import block_quant_linear, decompose_block_quant
from sgl_kernel_ext.activation.reference import silu_mul_reference
from sgl_kernel_ext.activation.silu_mul_cpu import silu_mul_cpu
from sgl_kernel_ext.layer.decode_layer_cpu import (
    DecodeLayers,
    decode_layer_cpu,
    decode_layer_reference,
    decode_layer_step,
    decode_layer_weights,
    decode_layers_cpu,
)
from sgl_kernel_ext.norm.rmsnorm_cpu import rmsnorm_cpu
from sgl_kernel_ext.rotary.rope_store_cpu import rope_store_cpu
from sglang.srt.layers.rotary import RotaryEmbedding
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.models import llama
from test_block_quant_linear import q4_1_weight, q8_0_weight

if not layer_kernel.decode_layer_kernel_available():
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 4, 2, 16, 96
SLOTS, TABLE_ROWS, CONTEXT, EPS, POST_EPS = 48, 6, 12, 1e-5, 1e-3  # two epsilons: each norm must use its own
SCALE = HEAD_DIM**-0.5


@pytest.fixture(params=["native", "portable"])
def kernel_variant(request, monkeypatch):
    """The fused kernel and the separate ones it is compared with, from the same kind of build."""
    if request.param == "portable":
        for module in (layer_kernel, bq, cpu_attention, cpu_norm, cpu_rope, cpu_silu):
            portable = load_kernel(*module._KERNEL, defines=("PORTABLE_ONLY",))
            monkeypatch.setattr(module, "_kernel", lambda portable=portable: portable)
        for module, name, kernel in ((layer_kernel, "_layers_kernel", layer_kernel._LAYERS_KERNEL),
                                     (bq, "_q8_kernel", bq._Q8_KERNEL)):
            portable = load_kernel(*kernel, defines=("PORTABLE_ONLY",))
            monkeypatch.setattr(module, name, lambda portable=portable: portable)
    return request.param


@pytest.fixture(params=[False, True], ids=["exact", "int8-activations"])
def int8(request) -> bool:
    """Projections packed for the exact kernel or for the one that rounds activations to 8 bits."""
    return request.param


def make_layer(seed: int, biases: bool, int8: bool = False) -> dict:
    gen = torch.Generator().manual_seed(seed)
    qkv_out = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM

    def blocks(weight: torch.Tensor):
        return decompose_block_quant(weight, int8_activations=int8)

    return dict(
        input_norm=torch.rand(HIDDEN, generator=gen) + 0.5,
        post_norm=torch.rand(HIDDEN, generator=gen) + 0.5,
        qkv=blocks(q4_1_weight(qkv_out, HIDDEN, seed)),
        o=blocks(q8_0_weight(HIDDEN, Q_HEADS * HEAD_DIM, seed + 1)),
        gate_up=blocks(q4_1_weight(2 * INTER, HIDDEN, seed + 2)),
        down=blocks(q4_1_weight(HIDDEN, INTER, seed + 3)),
        qkv_bias=torch.randn(qkv_out, generator=gen) if biases else None,
        o_bias=torch.randn(HIDDEN, generator=gen) if biases else None,
        down_bias=torch.randn(HIDDEN, generator=gen) if biases else None,
    )


def make_step(rows: int, seed: int) -> dict:
    """A decode batch: request b's new token is position seq_lens[b] - 1, already in the table;
    the cache holds random K/V for the earlier positions. rows <= TABLE_ROWS."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, CONTEXT + 1, (rows,), generator=gen)
    req_pool_indices = torch.randperm(TABLE_ROWS, generator=gen)[:rows]
    # Earlier positions in the first slots, new tokens in the last ones: no request reads another's new row.
    req_to_token = torch.randint(0, SLOTS - TABLE_ROWS, (TABLE_ROWS, CONTEXT), generator=gen)
    loc = SLOTS - TABLE_ROWS + torch.randperm(TABLE_ROWS, generator=gen)[:rows]
    req_to_token[req_pool_indices, seq_lens - 1] = loc
    cos, signed_sin = RotaryEmbedding(HEAD_DIM, 4096, 10000.0)(seq_lens - 1, torch.float32)
    return dict(
        residual=torch.randn(rows, HIDDEN, generator=gen), act=torch.randn(rows, INTER, generator=gen),
        k_buf=torch.randn(SLOTS, KV_HEADS, HEAD_DIM, generator=gen), v_buf=torch.randn(SLOTS, KV_HEADS, HEAD_DIM, generator=gen),
        cos=cos, signed_sin=signed_sin, loc=loc, req_to_token=req_to_token, req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
    )


def layer_weights(layer: dict):
    return decode_layer_weights(
        (layer["input_norm"], layer["post_norm"]), (EPS, POST_EPS),
        {name: layer[name] for name in ("qkv", "o", "gate_up", "down")},
        {name: layer[f"{name}_bias"] for name in ("qkv", "o", "down")}, (Q_HEADS, KV_HEADS, HEAD_DIM), SCALE,
    )


def shared_step(weights, step: dict):
    return decode_layer_step(
        weights, step["cos"], step["signed_sin"], step["loc"], SLOTS, step["req_to_token"], step["req_pool_indices"],
        step["seq_lens"],
    )


def run_fused(layer: dict, step: dict, prev: Optional[dict]) -> torch.Tensor:
    """prev None: the first layer (step's residual is the embedding); else prev's down of act first."""
    weights = layer_weights(layer)
    prev_weights = None if prev is None else layer_weights(prev)
    act = None if prev is None else step["act"]
    return decode_layer_cpu(
        weights, shared_step(weights, step), step["residual"], step["k_buf"], step["v_buf"], prev_weights, act
    ).clone()


def project(x: torch.Tensor, weight, bias) -> torch.Tensor:
    """RowParallelLinear's order: the projection, then its bias."""
    out = block_quant_linear(x, weight)
    return out if bias is None else out + bias


def run_unfused(layer: dict, step: dict, prev: Optional[dict]) -> torch.Tensor:
    """The model's op-by-op path: the separate C kernels, one call each."""
    rows, residual = step["residual"].shape[0], step["residual"]
    if prev is None:
        h = rmsnorm_cpu(residual, layer["input_norm"], EPS)
    else:
        h = rmsnorm_cpu(project(step["act"], prev["down"], prev["down_bias"]), layer["input_norm"], EPS, residual)
    qkv = block_quant_linear(h, layer["qkv"], layer["qkv_bias"])
    q = rope_store_cpu(qkv, Q_HEADS, step["cos"], step["signed_sin"], step["loc"], step["k_buf"], step["v_buf"])
    attn = decode_attention_cpu(q, step["k_buf"], step["v_buf"], step["req_to_token"], step["req_pool_indices"],
                                step["seq_lens"], SCALE)
    out = project(attn.reshape(rows, -1), layer["o"], layer["o_bias"])
    return block_quant_linear(rmsnorm_cpu(out, layer["post_norm"], POST_EPS, residual), layer["gate_up"])


def clone(step: dict) -> dict:
    return {k: v.clone() for k, v in step.items()}


@pytest.mark.parametrize("rows", [1, 3, 4, 6])  # 1-4: the GEMV path of the block kernel; 6: the buffered one
@pytest.mark.parametrize("first", [False, True], ids=["later-layer", "first-layer"])
@pytest.mark.parametrize("biases", [False, True], ids=["no-bias", "bias"])
def test_same_bits_as_the_separate_kernels(kernel_variant, int8, rows, first, biases) -> None:
    layer, step = make_layer(rows, biases, int8), make_step(rows, 10 + rows)
    prev = None if first else make_layer(50 + rows, biases, int8)
    fused_step, unfused_step = clone(step), clone(step)
    assert torch.equal(run_fused(layer, fused_step, prev), run_unfused(layer, unfused_step, prev))
    for name in ("residual", "k_buf", "v_buf"):
        assert torch.equal(fused_step[name], unfused_step[name]), name


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("first", [False, True], ids=["later-layer", "first-layer"])
def test_matches_the_reference(kernel_variant, int8, rows, first) -> None:
    layer, step = make_layer(7, biases=True, int8=int8), make_step(rows, rows)
    prev = None if first else make_layer(8, biases=True, int8=int8)
    fused_step, ref_step = clone(step), clone(step)
    fused = run_fused(layer, fused_step, prev)
    want = decode_layer_reference(layer, (EPS, POST_EPS), Q_HEADS, SCALE, ref_step["residual"], ref_step, prev, ref_step["act"])
    # With int8 activations a projection's input that differs in its last bit from the
    # reference's can round to the next 8-bit step: one step of x (max|x| / 127, ~0.03 here)
    # times a weight (~0.3), ~1e-2 on one output.
    tolerance = 2e-2 if int8 else 1e-4
    torch.testing.assert_close(fused, want, rtol=tolerance, atol=tolerance)
    for name in ("residual", "k_buf", "v_buf"):
        torch.testing.assert_close(fused_step[name], ref_step[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3])
def test_layers_in_turn_equal_the_separate_kernels(kernel_variant, int8, rows) -> None:
    """decode_layers_cpu: each layer's call fed the previous one's SiLU(gate) * up: torch's SiLU
    between Python-level calls for exact packing, the C SiLU inside one call for int8 activations."""
    layers, step = [make_layer(20 + i, biases=True, int8=int8) for i in range(3)], make_step(rows, seed=4)
    weights = [layer_weights(layer) for layer in layers]
    fused_step, unfused_step = clone(step), clone(step)
    kv = [(fused_step["k_buf"], fused_step["v_buf"])] * 3  # one cache for the three layers: each reads what the last wrote
    act, residual = decode_layers_cpu(weights, shared_step(weights[0], fused_step), fused_step["residual"], kv)
    prev = None
    for layer in layers:
        gate_up = run_unfused(layer, unfused_step, prev)
        unfused_step["act"], prev = silu_mul_cpu(gate_up) if int8 else silu_mul_reference(gate_up), layer
    assert torch.equal(act, unfused_step["act"]) and torch.equal(residual, unfused_step["residual"])
    assert residual is fused_step["residual"]


def test_layers_stay_close_to_the_reference_with_int8_activations() -> None:
    """The one int8 call over three layers against the plain-torch references (activations rounded
    as the kernel rounds them, torch's SiLU): within the rounding of activations to 8 bits."""
    layers, step = [make_layer(40 + i, biases=False, int8=True) for i in range(3)], make_step(2, seed=6)
    weights = [layer_weights(layer) for layer in layers]
    fused_step, ref_step = clone(step), clone(step)
    kv = [(fused_step["k_buf"], fused_step["v_buf"])] * 3
    act, _ = decode_layers_cpu(weights, shared_step(weights[0], fused_step), fused_step["residual"], kv)
    prev, want = None, None
    for layer in layers:
        gate_up = decode_layer_reference(
            layer, (EPS, POST_EPS), Q_HEADS, SCALE, ref_step["residual"], ref_step, prev, want
        )
        want, prev = silu_mul_reference(gate_up), layer
    assert (act - want).norm() / want.norm() < 0.05


def test_decode_layers_check_their_layers_once() -> None:
    """Layers of other shapes or packings are refused when the model's layers are gathered; the KV
    buffers are checked again whenever a step passes other tensors than the last one."""
    exact, other = make_layer(1, biases=False), make_layer(2, biases=False, int8=True)
    with pytest.raises(ValueError, match="packed for int8 activations, or none"):
        DecodeLayers([layer_weights(exact), layer_weights(other)])
    narrower = dataclasses.replace(layer_weights(exact), down_in=INTER // 2)
    with pytest.raises(ValueError, match="MLP width 96; one has"):
        DecodeLayers([layer_weights(exact), narrower])
    layers, step = DecodeLayers([layer_weights(exact)] * 2), make_step(2, seed=1)
    shared = shared_step(layers.weights[0], step)
    kv = [(step["k_buf"], step["v_buf"])] * 2
    layers.run(shared, step["residual"], kv)
    with pytest.raises(ValueError, match="2 KV buffer pairs for 3 layers"):
        DecodeLayers([layer_weights(exact)] * 3).run(shared, step["residual"], kv)
    short_v = step["v_buf"][: SLOTS - 1].clone()
    with pytest.raises(ValueError, match="v_buf must be a contiguous"):
        layers.run(shared, step["residual"], [kv[0], (step["k_buf"], short_v)])
    layers.run(shared, step["residual"], kv)
    step["k_buf"].set_(torch.empty(SLOTS - 1, KV_HEADS, HEAD_DIM))  # the same tensor object, new storage
    with pytest.raises(ValueError, match="k_buf must be a contiguous"):
        layers.run(shared, step["residual"], kv)


def test_rows_do_not_depend_on_the_batch() -> None:
    """6 rows take the block kernel's buffered path, each row alone its GEMV path."""
    layer, prev, step = make_layer(3, biases=False), make_layer(4, biases=False), make_step(6, seed=5)
    batched = run_fused(layer, clone(step), prev)
    for r in range(6):
        alone = {k: (v if k in ("k_buf", "v_buf", "req_to_token") else v[r : r + 1]).clone() for k, v in step.items()}
        assert torch.equal(run_fused(layer, alone, prev)[0], batched[r])


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda s: s["loc"].fill_(SLOTS), "out_cache_loc must lie inside the KV cache"),
        (lambda s: s["seq_lens"].fill_(CONTEXT + 1), "seq_lens must lie in"),
        (lambda s: s["req_to_token"][s["req_pool_indices"][1], 0].fill_(SLOTS),
         rf"req_to_token\[\d+, 0\] holds KV slot {SLOTS}, outside the KV cache of {SLOTS} slots"),
        (lambda s: s["req_pool_indices"].fill_(TABLE_ROWS), "req_pool_indices must lie inside req_to_token"),
        (lambda s: s.update(k_buf=s["k_buf"][:, :1].clone()), "k_buf must be a contiguous"),
        (lambda s: s.update(residual=s["residual"][:, :32].clone()), "residual must be a contiguous"),
        (lambda s: s.update(act=s["act"][:, :32].clone()), "act must be a contiguous"),
        (lambda s: s.update(loc=s["loc"].int()), "loc must be a contiguous torch.int64"),
    ],
    ids=["slot", "length", "table-slot", "table-row", "cache-shape", "residual-shape", "act-shape", "loc-dtype"],
)
def test_what_it_cannot_read_is_refused(change, message) -> None:
    layer, prev, step = make_layer(1, biases=False), make_layer(2, biases=False), make_step(2, seed=1)
    change(step)
    with pytest.raises(ValueError, match=message):
        run_fused(layer, step, prev)


def test_a_layer_mixing_exact_and_int8_packing_is_refused() -> None:
    layer = make_layer(1, biases=False)
    layer["o"] = make_layer(1, biases=False, int8=True)["o"]
    with pytest.raises(ValueError, match="must all be packed for int8 activations, or none"):
        layer_weights(layer)


def test_layers_of_other_widths_are_refused() -> None:
    layer, step = make_layer(1, biases=False), make_step(2, seed=1)
    weights = layer_weights(layer)
    shared = shared_step(weights, step)
    narrower = dataclasses.replace(weights, widths=(HIDDEN // 2, *weights.widths[1:]))
    with pytest.raises(ValueError, match="prev's down projection gives 32 values, this layer takes 64"):
        decode_layer_cpu(weights, shared, step["residual"], step["k_buf"], step["v_buf"], narrower, step["act"])
    other_heads = dataclasses.replace(weights, kv_shape=(KV_HEADS, HEAD_DIM // 2))
    with pytest.raises(ValueError, match="head_dim 8 differ"):
        decode_layer_cpu(other_heads, shared, step["residual"], step["k_buf"], step["v_buf"])


# ------------------------------------------------------------------ in the embedded model


def model_runners(gguf_path: str, int8_activations: bool) -> list[ModelRunner]:
    return [
        ModelRunner(gguf_path, max_total_tokens=2048, max_running_requests=8, cpu_int8_activations=int8_activations)
        for _ in range(2)
    ]


@pytest.fixture(scope="module")
def runners(gguf_path):
    return model_runners(gguf_path, False)


@pytest.fixture(scope="module")
def int8_runners(gguf_path):
    return model_runners(gguf_path, True)


@pytest.mark.parametrize(
    "batch,which",
    [(1, "runners"), (3, "runners"), (7, "runners"), (1, "int8_runners"), (7, "int8_runners")],
)  # 7 rows: the exact kernel's buffered path, two register groups of the int8 one, inside the fused call
def test_model_logits_equal_the_op_by_op_path(request, monkeypatch, batch, which) -> None:
    runners = request.getfixturevalue(which)
    calls = []
    fused_layers = llama.decode_layers_cpu

    def counting(*args):
        calls.append(1)
        return fused_layers(*args)

    monkeypatch.setattr(llama, "decode_layers_cpu", counting)
    op_by_op = llama.LlamaModel._cpu_decode_step
    drivers = [Driver(r) for r in runners]
    reqs = [[d.new_req() for _ in range(batch)] for d in drivers]
    prompts = [[1, 2, 3 + b, 4, 5 + 2 * b][: 2 + b % 4] for b in range(batch)]
    with torch.inference_mode():
        for d, rq in zip(drivers, reqs):
            d.extend(rq, prompts)
        for i in range(4):
            tokens = [100 + 7 * i + b for b in range(batch)]
            fused = drivers[0].decode(reqs[0], tokens)
            monkeypatch.setattr(llama.LlamaModel, "_cpu_decode_step", lambda *a: None)
            unfused = drivers[1].decode(reqs[1], tokens)
            monkeypatch.setattr(llama.LlamaModel, "_cpu_decode_step", op_by_op)
            assert torch.equal(fused, unfused), i
    for d in drivers:
        d.release()
    assert len(calls) == 4  # every decode step of the first runner took the fused path


def test_int8_activations_stay_close_to_the_exact_logits(runners, int8_runners) -> None:
    """The opt-in mode changes the numbers (it rounds every projection's input to 8 bits) but not
    the model: its logits stay within a few percent of the exact path's, step after step."""
    drivers = [Driver(runners[0]), Driver(int8_runners[0])]
    reqs = [[d.new_req() for _ in range(2)] for d in drivers]
    with torch.inference_mode():
        for d, rq in zip(drivers, reqs):
            d.extend(rq, [[1, 504, 3458, 282, 260], [1, 1830, 314, 253, 1345, 28]])
        steps = [[d.decode(rq, [300 + i, 700 + 3 * i]) for d, rq in zip(drivers, reqs)] for i in range(6)]
    for d in drivers:
        d.release()
    for exact, int8 in steps:
        assert not torch.equal(exact, int8)
        relative = (exact - int8).norm(dim=-1) / exact.norm(dim=-1)
        assert (relative < 0.05).all(), relative


def test_one_token_extend_is_served_as_a_decode_step(runners, monkeypatch) -> None:
    """A prompt cached but for its last token extends by one token: the one-call layer serves it,
    with the bits of the op-by-op decode of that token; several such requests batch together."""
    calls = []
    fused_layers = llama.decode_layers_cpu
    monkeypatch.setattr(llama, "decode_layers_cpu", lambda *args: calls.append(1) or fused_layers(*args))
    drivers = [Driver(r) for r in runners]
    reqs = [[d.new_req() for _ in range(2)] for d in drivers]
    prefixes, last = [[1, 504, 3458, 282], [1, 1830, 314, 253, 1345]], [260, 28]
    with torch.inference_mode():
        for d, rq in zip(drivers, reqs):
            d.extend(rq, prefixes)
        calls.clear()
        extended = drivers[0].extend(reqs[0], [[t] for t in last]).next_token_logits
        assert len(calls) == 1
        monkeypatch.setattr(llama.LlamaModel, "_cpu_decode_step", lambda *a: None)
        decoded = drivers[1].decode(reqs[1], last)
    for d in drivers:
        d.release()
    assert torch.equal(extended, decoded)


def test_batch_invariant_mode_keeps_one_token_extends_on_the_extend_path(runners, monkeypatch) -> None:
    """Deterministic mode: a prompt's cached and uncached runs must agree to the bit, so the
    extend path may not change with how much of the prompt was cached."""
    calls = []
    fused_layers = llama.decode_layers_cpu
    monkeypatch.setattr(llama, "decode_layers_cpu", lambda *args: calls.append(1) or fused_layers(*args))
    monkeypatch.setattr(runners[0], "deterministic", True)  # what --enable-deterministic-inference sets
    driver = Driver(runners[0])
    req = [driver.new_req()]
    with torch.inference_mode():
        driver.extend(req, [[1, 504, 3458]])
        driver.extend(req, [[282]])
        assert calls == []
        driver.decode(req, [260])
        assert calls == [1]  # decode steps still take it
    driver.release()
