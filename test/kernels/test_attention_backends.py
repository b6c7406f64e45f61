"""--attention-backend: the factory's choices and errors, and the CPU backends computing the same
decode and extend steps (the C decode kernel vs SDPA over gathered K/V)."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.layers.attention import ATTENTION_BACKEND_CHOICES, create_attention_backend, default_attention_backend
from sglang.srt.layers.attention.cpu_backend import CpuAttnBackend
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs

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
