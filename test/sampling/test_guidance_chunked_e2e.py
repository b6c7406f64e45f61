"""End to end: guided pairs under chunked prefill give the tokens of unchunked prefill. A server
with a small --chunked-prefill-size (each pair's prompts spread over several steps, some carrying
the guide's tokens alone) against one whose steps take every prompt whole, greedy and seeded,
with the guide context on the served model and on a guide model (--guide-model-path), all sent at
once so that pairs and plain requests share steps. The embedded SmolLM2 runs the served-model
case too, with text prompts."""

from __future__ import annotations

import concurrent.futures

import pytest

from engine_utils import generate_ok, running_server
from guidance_utils import save_guidance_tiny, tiny_flags

pytestmark = pytest.mark.e2e

CHUNKED = ("--chunked-prefill-size", "16")
WHOLE = ("--chunked-prefill-size", "4096")
MAIN = list(range(40, 77))  # 37 tokens
GUIDE = [7, 3, 250, 19, 88, 120, 5, 61] * 4  # 32 tokens
SEEDED = dict(temperature=0.9, top_p=0.95, max_new_tokens=8, ignore_eos=True, frequency_penalty=0.3)
GREEDY = dict(temperature=0.0, max_new_tokens=8, ignore_eos=True)


def _tiny_requests() -> list[tuple[list[int], dict]]:
    items = []
    for model in ("self", "guide"):
        items += [
            (MAIN, {**GREEDY, "guidance": {"method": "cfg", "input_ids": GUIDE, "weight": 2.5, "model": model}}),
            (MAIN[3:], {**SEEDED, "sampling_seed": 7, "guidance": {"method": "mixture", "input_ids": GUIDE[:20],
                                                                     "alpha": "kl_symmetry", "model": model}}),
            (MAIN[:9], {**SEEDED, "sampling_seed": 8, "guidance": {"method": "contrastive", "input_ids": GUIDE,
                                                                     "weight": 0.5, "model": model}}),
        ]
    return items + [(MAIN[5:], {**SEEDED, "sampling_seed": 9})]


def _run(server, items: list[tuple]) -> list[tuple[list[int], list]]:
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        futures = [pool.submit(generate_ok, server, prompt, sampling_params=params) for prompt, params in items]
        results = [f.result() for f in futures]
    return [(r["output_ids"], r["meta_info"].get("guidance_alpha")) for r in results]


def _same(got, want) -> None:
    for (ids, alphas), (want_ids, want_alphas) in zip(got, want):
        assert ids == want_ids
        assert (alphas is None) == (want_alphas is None)
        if alphas is not None:
            assert alphas == pytest.approx(want_alphas, abs=1e-4)


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory) -> tuple[str, str]:
    return (
        save_guidance_tiny(str(tmp_path_factory.mktemp("served")), seed=0),
        save_guidance_tiny(str(tmp_path_factory.mktemp("guide")), seed=1),
    )


def _tiny_outputs(paths: tuple[str, str], gguf_path: str, chunking: tuple[str, ...]) -> list[tuple]:
    flags = tiny_flags(paths[0], gguf_path, "--guide-model-path", paths[1], "--guide-max-total-tokens", "2048", *chunking)
    with running_server(*flags) as server:
        return _run(server, _tiny_requests())


def test_chunked_guided_prefill_equals_whole_prefill_on_both_models(tiny_paths, gguf_path):
    _same(_tiny_outputs(tiny_paths, gguf_path, CHUNKED), _tiny_outputs(tiny_paths, gguf_path, WHOLE))


@pytest.mark.slow
def test_chunked_guided_prefill_equals_whole_prefill_on_the_embedded_model(gguf_path):
    main = "Write a short story about a lighthouse keeper who finds a message in a bottle on the shore."
    guide = "Write a short story. Keep it gloomy, grey and cold, with rain and wind all day long."
    items = [
        (main, {**GREEDY, "guidance": {"method": "cfg", "text": guide, "weight": 2.0}}),
        (main, {**SEEDED, "sampling_seed": 3, "guidance": {"method": "mixture", "text": guide, "alpha": "kl_symmetry"}}),
        (main[:30], {**SEEDED, "sampling_seed": 4, "guidance": {"method": "contrastive", "text": guide, "weight": 0.5}}),
        (main[10:], {**SEEDED, "sampling_seed": 5}),
    ]
    outputs = []
    for chunking in (CHUNKED, WHOLE):
        with running_server("--model-path", gguf_path, "--max-running-requests", "12", *chunking) as server:
            outputs.append(_run(server, items))
    _same(*outputs)


def test_deterministic_chunked_guided_prefill_alone_equals_batched(tiny_paths, gguf_path):
    """Fixed chunks (multiples of --chunked-prefill-size) whatever shares the step: a guided
    seeded request gives the same tokens alone and among the others."""
    flags = tiny_flags(tiny_paths[0], gguf_path, "--guide-model-path", tiny_paths[1], "--guide-max-total-tokens", "2048",
                       "--enable-deterministic-inference", *CHUNKED)
    items = _tiny_requests()
    with running_server(*flags) as server:
        solo = [_run(server, [item])[0] for item in items]
        _same(_run(server, items), solo)
