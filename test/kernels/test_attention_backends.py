"""--attention-backend: the factory's choices and errors, the CPU backends computing the same
decode and extend steps (the C decode kernel vs SDPA over gathered K/V), and both honouring a
layer's sliding window and logit cap."""

from __future__ import annotations

import pytest
import torch

from sgl_kernel_ext.attention.reference import decode_attention_reference, extend_attention_reference
from sglang.srt.layers.attention import (
    ATTENTION_BACKEND_CHOICES,
    Attention,
    create_attention_backend,
    default_attention_backend,
    torch_native_backend,
)
from sglang.srt.layers.attention.cpu_backend import CpuAttnBackend
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs

from paged_kv_utils import paged_kv_cache
from runner_utils import Driver


def test_defaults_and_choices() -> None:
    assert default_attention_backend("cuda") == "triton" and default_attention_backend("cpu") == "cpu"
    assert set(ATTENTION_BACKEND_CHOICES) == {"triton", "torch_native", "cpu", "flashinfer"}
    table = torch.zeros(2, 8, dtype=torch.int64)
    assert isinstance(create_attention_backend("cpu", table, 4, 2, 8, torch.float32), CpuAttnBackend)
    assert type(create_attention_backend("torch_native", table, 4, 2, 8, torch.float32)) is TorchNativeAttnBackend


@pytest.mark.parametrize(
    "name,message", [("triton", "needs a CUDA device"), ("flashinfer", "not available"), ("paged", "must be one of")]
)
def test_unusable_backends_are_refused_by_name(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_attention_backend(name, torch.zeros(2, 8, dtype=torch.int64), 4, 2, 8, torch.float32)


def test_server_args_validate_attention_and_graph_flags() -> None:
    with pytest.raises(ValueError, match="--attention-backend"):
        ServerArgs(attention_backend="paged").validate()
    with pytest.raises(ValueError, match="--cuda-graph-max-bs"):
        ServerArgs(cuda_graph_max_bs=0).validate()
    with pytest.raises(ValueError, match="--cuda-graph-bs"):
        ServerArgs(cuda_graph_bs=[4, 0]).validate()
    assert ServerArgs(device="cpu").resolve().attention_backend == "cpu"


def _steps(runner: ModelRunner) -> list[torch.Tensor]:
    """Prefill two prompts (the second after a cached prefix), then decode both twice."""
    driver = Driver(runner)
    a, b = driver.new_req(), driver.new_req()
    logits = [driver.extend([a, b], [[1, 2, 3, 4, 5], [9, 8, 7]]).next_token_logits]
    logits.append(driver.extend([b], [[6, 5, 4, 3]]).next_token_logits)
    logits.append(driver.decode([a, b], [11, 12]))
    logits.append(driver.decode([a, b], [13, 14]))
    driver.release()
    return logits


def test_cpu_and_torch_native_backends_agree(gguf_path: str) -> None:
    kernel = ModelRunner(gguf_path, max_total_tokens=256, max_running_requests=4, attention_backend="cpu")
    if not kernel.attn_backend.use_kernel:
        pytest.skip("the C decode kernel could not be built here")
    native = ModelRunner(gguf_path, max_total_tokens=256, max_running_requests=4, attention_backend="torch_native")
    for got, want in zip(_steps(kernel), _steps(native)):
        # The same weights and K/V; only the order of the attention sums differs.
        torch.testing.assert_close(got, want, atol=1e-3, rtol=0)


class _Cache:
    """The one layer's K/V buffers a backend reads (KVCache.get_kv)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k, self.v


def _batch(mode: ForwardMode, pool: torch.Tensor, prefix_lens: list[int], extend_lens: list[int], cache) -> ForwardBatch:
    batch = ForwardBatch.init_new(
        mode, None, pool.tolist(), prefix_lens, extend_lens, torch.zeros(sum(extend_lens), dtype=torch.int64), "cpu"
    )
    batch.kv_cache = cache
    return batch


# Windows of one position, shorter than some requests, past every length; with and without a cap.
WINDOW_CAP = [(1, None), (6, None), (6, 0.5), (None, 0.5), (1000, 0.5)]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("backend_cls", [CpuAttnBackend, TorchNativeAttnBackend])
@pytest.mark.parametrize("window,cap", WINDOW_CAP)
def test_cpu_backends_window_and_cap_match_reference(backend_cls, window, cap, deterministic, monkeypatch) -> None:
    """Decode and extend (after a cached prefix, as chunked prefill runs it) with a sliding window
    and a logit cap equal the plain-torch references."""
    monkeypatch.setattr(torch_native_backend, "is_batch_invariant", lambda: deterministic)
    lens = [1, 9, 20]
    heads, kv_heads, head_dim = 6, 2, 16
    k, v, r2t, pool, seq_lens = paged_kv_cache(kv_heads, head_dim, lens)
    backend = backend_cls(r2t, kv_heads, head_dim, torch.float32)
    layer = Attention(0, heads, kv_heads, head_dim, 0.25, sliding_window=window, logit_cap=cap)
    opts = dict(sliding_window=window, logit_cap=cap)
    gen = torch.Generator().manual_seed(3)

    q = torch.randn(len(lens), heads, head_dim, generator=gen) * 4
    decode = _batch(ForwardMode.DECODE, pool, [n - 1 for n in lens], [1] * len(lens), _Cache(k, v))
    backend.init_forward_metadata(decode)
    want = decode_attention_reference(q, k, v, r2t, pool, seq_lens, 0.25, **opts)
    torch.testing.assert_close(backend.forward(q, layer, decode), want, atol=1e-5, rtol=1e-5)

    prefix_lens, extend_lens = [0, 4, 13], [1, 5, 7]
    q = torch.randn(sum(extend_lens), heads, head_dim, generator=gen) * 4
    extend = _batch(ForwardMode.EXTEND, pool, prefix_lens, extend_lens, _Cache(k, v))
    backend.init_forward_metadata(extend)
    want = extend_attention_reference(
        q, k, v, r2t, pool, extend.extend_start_loc, extend.extend_prefix_lens, extend.extend_seq_lens, 0.25, **opts
    )
    torch.testing.assert_close(backend.forward(q, layer, extend), want, atol=1e-5, rtol=1e-5)
