"""--load-format: dummy builds the model from config.json alone with small random weights;
formats that do not match the path, and SGLang's formats we do not implement, are refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_loader import DUMMY_RANGE
from sglang.srt.server_args import ServerArgs

from runner_utils import Driver

CONFIG = dict(
    architectures=["Qwen3ForCausalLM"], vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-6,
    torch_dtype="float32",
)


@pytest.fixture
def config_only(tmp_path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return str(tmp_path)


def test_dummy_weights_need_only_config_json(config_only: str) -> None:
    runner = ModelRunner(config_only, load_format="dummy", max_total_tokens=256, max_running_requests=2)
    # CPU linears may be packed for oneDNN after loading.
    params = [p.to_dense() if p.is_mkldnn else p for p in runner.model.parameters()]
    assert all(p.abs().max() <= DUMMY_RANGE for p in params)
    assert all(p.abs().max() > 0 for p in params)  # every parameter was filled
    driver = Driver(runner)
    out = driver.extend([driver.new_req()], [[1, 2, 3, 4]])
    assert out.next_token_logits.shape == (1, 300) and torch.isfinite(out.next_token_logits).all()


def test_dummy_weights_are_reproducible(config_only: str) -> None:
    a, b = (ModelRunner(config_only, load_format="dummy", max_total_tokens=64, max_running_requests=1) for _ in range(2))
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa.to_dense() if pa.is_mkldnn else pa, pb.to_dense() if pb.is_mkldnn else pb)


def test_load_format_must_match_the_path(config_only: str) -> None:
    with pytest.raises(ValueError, match="--load-format gguf does not match"):
        ModelRunner(config_only, load_format="gguf", max_total_tokens=64, max_running_requests=1)


@pytest.mark.parametrize("value, known", [("bitsandbytes", "SGLang's"), ("nonsense", "an unknown")])
def test_unimplemented_load_formats_are_refused_by_name(value: str, known: str) -> None:
    with pytest.raises(ValueError, match=f"--load-format '{value}' is {known} format"):
        ServerArgs(model_path="x", load_format=value).validate()
