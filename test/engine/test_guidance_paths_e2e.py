"""sampling_params.guidance on every serving path, on a tiny random Qwen3 checkpoint: the overlap
schedule off, TP=2 on the CPU, --dp-size 2 and sglang.Engine give the tokens of the default
server (TP=1, overlap on); the deterministic mode gives a guided seeded row the same tokens alone
and in a batch."""

from __future__ import annotations

import concurrent.futures

import pytest

import sglang as sgl
from engine_utils import generate_ok, running_server
from guidance_utils import save_guidance_tiny, tiny_flags

pytestmark = pytest.mark.e2e

MAIN = list(range(100, 124))
GUIDE = [5, 6, 7, 8, 9, 10, 11]
SAMPLED = dict(temperature=0.9, top_k=50, top_p=0.95, max_new_tokens=8, ignore_eos=True, frequency_penalty=0.4)
REQUESTS = [
    {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True, "guidance": {"method": "cfg", "input_ids": GUIDE, "weight": 2.5}},
    {**SAMPLED, "sampling_seed": 3, "guidance": {"method": "mixture", "input_ids": GUIDE, "alpha": "kl_symmetry"}},
    {**SAMPLED, "sampling_seed": 4},
    {**SAMPLED, "sampling_seed": 5, "guidance": {"method": "contrastive", "input_ids": GUIDE, "weight": 0.6}},
    {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True, "guidance": {"method": "mixture", "input_ids": MAIN[:5], "alpha": 0.2}},
]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return save_guidance_tiny(str(tmp_path_factory.mktemp("qwen3_tiny_guidance")))


def _run(server, items: list[dict]) -> list[tuple[list[int], list]]:
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        futures = [pool.submit(generate_ok, server, MAIN, sampling_params=p) for p in items]
        results = [f.result() for f in futures]
    return [(r["output_ids"], r["meta_info"].get("guidance_alpha")) for r in results]


def _same(got, want) -> None:
    for (ids, alphas), (want_ids, want_alphas) in zip(got, want):
        assert ids == want_ids
        assert (alphas is None) == (want_alphas is None)
        if alphas is not None:
            assert alphas == pytest.approx(want_alphas, abs=1e-4)


@pytest.fixture(scope="module")
def reference(tiny_path, gguf_path):
    with running_server(*tiny_flags(tiny_path, gguf_path)) as server:
        return _run(server, REQUESTS)


@pytest.mark.parametrize(
    "extra",
    [("--disable-overlap-schedule",), ("--tp-size", "2"), ("--dp-size", "2")],
    ids=["overlap-off", "tp2", "dp2"],
)
def test_guided_tokens_do_not_depend_on_the_serving_path(tiny_path, gguf_path, reference, extra):
    with running_server(*tiny_flags(tiny_path, gguf_path, *extra)) as server:
        _same(_run(server, REQUESTS), reference)


def test_engine_gives_the_server_tokens(tiny_path, gguf_path, reference):
    with sgl.Engine(model_path=tiny_path, tokenizer_path=gguf_path, max_running_requests=12, log_level="warning") as llm:
        outs = llm.generate(input_ids=[MAIN] * len(REQUESTS), sampling_params=REQUESTS)
    _same([(o["output_ids"], o["meta_info"].get("guidance_alpha")) for o in outs], reference)


def test_deterministic_mode_alone_equals_batched(tiny_path, gguf_path):
    with running_server(*tiny_flags(tiny_path, gguf_path, "--enable-deterministic-inference")) as server:
        solo = [_run(server, [p])[0] for p in REQUESTS]
        _same(_run(server, REQUESTS), solo)
