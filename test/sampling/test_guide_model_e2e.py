"""End to end: --guide-model-path. Two tiny random Qwen3 checkpoints (guidance_utils.py): the served
one and a guide model; guidance with "model": "guide" mixes the served model's main context with
the guide model's guide context. The reference takes the main distributions from the server
and the guide distributions from a server of the guide model alone, and mixes them."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from engine_utils import generate_ok, running_server
from guidance_utils import TINY, VOCAB, save_guidance_tiny, tiny_flags
from family_utils import save_tiny
from sglang.test.server_process import ServerProcess, free_port

pytestmark = pytest.mark.e2e

MAIN = list(range(40, 60))
GUIDE = [7, 3, 250, 19, 88, 120, 5, 61]
N_TOKENS = 8


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> tuple[str, str]:
    return (
        save_guidance_tiny(str(tmp_path_factory.mktemp("served")), seed=0),
        save_guidance_tiny(str(tmp_path_factory.mktemp("guide")), seed=1),
    )


@pytest.fixture(scope="module")
def server(paths, gguf_path):
    with running_server(*tiny_flags(paths[0], gguf_path, "--guide-model-path", paths[1], "--guide-max-total-tokens", "2048")) as srv:
        yield srv


@pytest.fixture(scope="module")
def guide_alone(paths, gguf_path):
    with running_server(*tiny_flags(paths[1], gguf_path)) as srv:
        yield srv


def _distributions(server, context: list[int], output: list[int]) -> np.ndarray:
    result = generate_ok(
        server, context + output, sampling_params={"max_new_tokens": 1, "temperature": 0},
        return_logprob=True, logprob_start_len=len(context), token_ids_logprob=list(range(VOCAB)),
    )
    return np.array([[e[0] for e in row] for row in result["meta_info"]["input_token_ids_logprobs"]], dtype=np.float64)


def _guided(server, guidance: dict, **params) -> dict:
    params = {"temperature": 0.0, "max_new_tokens": N_TOKENS, "ignore_eos": True, "guidance": guidance, **params}
    return generate_ok(server, MAIN, sampling_params=params)


@pytest.mark.parametrize("alpha", [0.3, "kl_symmetry"])
def test_mixture_with_the_guide_model_equals_the_two_model_reference(server, guide_alone, alpha):
    result = _guided(server, {"method": "mixture", "input_ids": GUIDE, "alpha": alpha, "model": "guide"})
    output, alphas = result["output_ids"], np.array(result["meta_info"]["guidance_alpha"])[:, None]
    lc = _distributions(server, MAIN, output)
    lg = _distributions(guide_alone, GUIDE, output)
    assert list((alphas * lc + (1 - alphas) * lg).argmax(axis=-1)) == output
    if alpha != "kl_symmetry":
        assert np.allclose(alphas, alpha)
    # The guide model makes the difference: its own context on the served model mixes otherwise.
    assert output != _guided(server, {"method": "mixture", "input_ids": GUIDE, "alpha": alpha})["output_ids"]


def test_cfg_with_the_guide_model_equals_the_reference(server, guide_alone):
    result = _guided(server, {"method": "cfg", "input_ids": GUIDE, "weight": 2.0, "model": "guide"})
    output = result["output_ids"]
    lc = _distributions(server, MAIN, output)
    lg = _distributions(guide_alone, GUIDE, output)
    assert list((lg + 2.0 * (lc - lg)).argmax(axis=-1)) == output


SAMPLED = dict(temperature=0.8, top_k=40, max_new_tokens=N_TOKENS, ignore_eos=True)
BATCH = [
    {**SAMPLED, "sampling_seed": 1, "guidance": {"method": "cfg", "input_ids": GUIDE, "weight": 1.5, "model": "guide"}},
    {**SAMPLED, "sampling_seed": 2, "guidance": {"method": "cfg", "input_ids": GUIDE, "weight": 1.5}},
    {**SAMPLED, "sampling_seed": 3},
    {**SAMPLED, "sampling_seed": 4, "guidance": {"method": "mixture", "input_ids": MAIN[:6], "alpha": "kl_symmetry", "model": "guide"}},
    {"temperature": 0.0, "max_new_tokens": N_TOKENS, "ignore_eos": True,
     "guidance": {"method": "contrastive", "input_ids": GUIDE, "weight": 0.5, "model": "guide"}},
]


def _batched(server) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(len(BATCH)) as pool:
        return list(pool.map(lambda p: generate_ok(server, MAIN, sampling_params=p)["output_ids"], BATCH))


def test_guide_model_and_served_model_guides_in_one_batch_equal_their_solo_runs(server):
    solo = [generate_ok(server, MAIN, sampling_params=p)["output_ids"] for p in BATCH]
    assert _batched(server) == solo


def test_guide_model_tp2_equals_tp1(server, paths, gguf_path):
    flags = tiny_flags(paths[0], gguf_path, "--guide-model-path", paths[1], "--guide-max-total-tokens", "2048", "--tp-size", "2")
    with running_server(*flags) as tp2:
        assert _batched(tp2) == _batched(server)


def test_a_guide_model_of_another_vocabulary_size_is_refused_at_start_up(paths, gguf_path, tmp_path):
    other = str(tmp_path / "other_vocab")
    save_tiny(other, "Qwen3Config", "Qwen3ForCausalLM", **{**TINY, "vocab_size": VOCAB + 20})
    port = free_port()
    server = ServerProcess(["--port", str(port), *tiny_flags(paths[0], gguf_path, "--guide-model-path", other)], port,
                           startup_timeout=300)
    with pytest.raises(RuntimeError, match="server exited"):
        server.wait_healthy()
    server.stop()
    assert "the guide model's vocabulary has 320 tokens, the served model's 300" in server.output
