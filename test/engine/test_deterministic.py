"""--enable-deterministic-inference: a request's output does not depend on what else the server
is doing. SGLang's three checks (single, mixed, prefix) through the real server, plus the
batch-invariance of the model's rows underneath them."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch
import torch.nn.functional as F

from engine_utils import generate_ok, running_server
from test_model_runner import PROMPTS, Driver, _save_tiny
from sglang.srt.layers.batch_invariant import ROW_BLOCK, batch_invariant, pointwise, row_blocked
from sglang.srt.layers.linear import cpu_pack_supported, dense_matmul
from sglang.srt.model_executor.model_runner import ModelRunner

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FLAGS = (
    "--enable-deterministic-inference", "--chunked-prefill-size", "16", "--max-running-requests", "16",
    "--enable-custom-logit-processor",
)
SETTINGS = {
    "greedy": {"temperature": 0.0},
    "seeded": {
        "temperature": 0.8,
        "sampling_seed": 20261122,
        "min_p": 0.05,
        "top_p": 0.95,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.1,
    },
}
MAX_NEW_TOKENS = 12
DECODE_TOKENS = (42, 7, 250, 3, 99, 42)  # fed to the model rows' decode steps
PROMPT = "Write a short poem about the sea and the wind."
OTHERS = [
    "Hi",
    "List three colours.",
    "Explain in one paragraph why the sky looks blue during the day and red at sunset.",
    "What is 12 times 7?",
    "Tell me a story about a robot who learns to paint, with a happy ending and a moral.",
]
SHARED_PREFIX = (
    "You are a helpful assistant. Answer briefly and precisely. The user is curious about science, "
    "history and cooking, and likes examples. "
)
SUFFIXES = ["Why is salt added to pasta water?", "Who built the pyramids?", "What is a prime number?"]


# --- the model's rows -------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [torch.sigmoid, F.softplus, F.silu, torch.tanh], ids=lambda fn: fn.__name__)
@pytest.mark.parametrize("shape", [(8,), (1,), (3, 5), (40000,)], ids=str)
def test_pointwise_rows_do_not_depend_on_the_batch(fn, shape: tuple[int, ...]) -> None:
    """A router's [N, 8] scores or a [N, 1] gate: ATen's vector and scalar loops round some
    sigmoids differently, and which one a row meets depends on N outside the mode."""
    torch.manual_seed(0)
    x = torch.randn(70, *shape) * 4
    with batch_invariant(True):
        alone = [pointwise(fn, x[at : at + 1])[0] for at in range(x.shape[0])]
        for rows in (2, 5, 33, 70):
            batched = pointwise(fn, x[:rows])
            assert batched.shape == x[:rows].shape
            for at in range(rows):
                assert torch.equal(batched[at], alone[at]), (rows, at)
        assert pointwise(fn, x[:0]).shape == x[:0].shape
        assert pointwise(fn, x[:5]).is_contiguous()
    torch.testing.assert_close(torch.stack(alone), fn(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("packed", [False, True])
def test_row_blocked_matmul_rows_do_not_depend_on_the_batch(packed: bool) -> None:
    torch.manual_seed(0)
    weight = torch.randn(96, 64)
    if packed:
        if not cpu_pack_supported(weight):
            pytest.skip("no oneDNN on this build")
        weight = torch.ops.mkldnn._reorder_linear_weight(weight, ROW_BLOCK)
    x = torch.randn(3 * ROW_BLOCK + 5, 64)
    with batch_invariant(True):
        alone = dense_matmul(x[:1], weight)[0]
        for rows in range(1, x.shape[0] + 1):
            assert torch.equal(dense_matmul(x[:rows], weight)[0], alone), rows
        # And wherever the row sits in its batch.
        for at in range(x.shape[0]):
            mates = torch.randn_like(x)
            mates[at] = x[0]
            assert torch.equal(dense_matmul(mates, weight)[at], alone), at
    dense = weight.to_dense() if packed else weight
    assert torch.allclose(row_blocked(lambda rows: F.linear(rows, dense), x), x @ dense.T, atol=1e-5)


# The deterministic mode holds with the exact linears and with --cpu-int8-activations.
INT8_MODES = {"exact": False, "int8-activations": True}


@pytest.fixture(scope="module", params=list(INT8_MODES))
def deterministic_runner(gguf_path: str, request) -> ModelRunner:
    return ModelRunner(
        gguf_path, max_total_tokens=4096, max_running_requests=16, deterministic=True,
        cpu_int8_activations=INT8_MODES[request.param],
    )


def _assert_rows_do_not_depend_on_the_batch(
    runner: ModelRunner, target: list[int], batches: list[list[list[int]]]
) -> None:
    """target's prefill logits and its decode steps' logits are the same bits alone and in the
    middle of each of `batches` (its batch-mates' prompts). Several decode steps: a bit that
    differs in one step's K/V moves every later step, but not always that step's own logits."""
    driver = Driver(runner)
    try:
        solo = driver.new_req()
        prefill = driver.extend([solo], [target]).next_token_logits[0].clone()
        decode = [driver.decode([solo], [tok])[0].clone() for tok in DECODE_TOKENS]
        for mates in batches:
            driver.release()
            reqs = [driver.new_req() for _ in range(len(mates) + 1)]
            at = len(mates) // 2
            prompts = mates[:at] + [target] + mates[at:]
            assert torch.equal(driver.extend(reqs, prompts).next_token_logits[at], prefill), len(reqs)
            for step, tok in enumerate(DECODE_TOKENS):
                tokens = [tok if i == at else 100 + i for i in range(len(reqs))]
                assert torch.equal(driver.decode(reqs, tokens)[at], decode[step]), (len(reqs), step)
    finally:
        driver.release()


def test_model_rows_do_not_depend_on_the_batch(deterministic_runner: ModelRunner) -> None:
    """Prefill and decode logits of one prompt are the same bits alone and among other prompts."""
    _assert_rows_do_not_depend_on_the_batch(
        deterministic_runner, PROMPTS[0], [[PROMPTS[1]], [PROMPTS[2], PROMPTS[1], [5, 6, 7]]]
    )


@pytest.mark.parametrize("case", ["qwen3_head_dim_32_sharded", "llama", "qwen2_tied"])
def test_safetensors_model_rows_do_not_depend_on_the_batch(case: str, tmp_path) -> None:
    """The same on tiny random float32 safetensors checkpoints through the real loader: Qwen3's
    q/k norms (once batch-variant: their per-row kernel ran only at one row), Llama, a tied LM head;
    batches of 2 to 8."""
    _save_tiny(case, str(tmp_path))
    runner = ModelRunner(str(tmp_path), max_total_tokens=1024, max_running_requests=9, deterministic=True)
    gen = torch.Generator().manual_seed(0)
    lengths = (37, 3, 60, 11, 45, 1, 29, 8)
    prompts = [torch.randint(0, 300, (length,), generator=gen).tolist() for length in lengths]
    target, mates = prompts[0], prompts[1:]
    _assert_rows_do_not_depend_on_the_batch(runner, target, [mates[:size] for size in range(1, len(mates) + 1)])


# --- the server: SGLang's single / mixed / prefix checks --------------------------------------


@pytest.fixture(scope="module", params=list(INT8_MODES))
def server(request):
    int8 = ("--cpu-int8-activations",) if INT8_MODES[request.param] else ()
    with running_server(*FLAGS, *int8) as srv:
        yield srv


def _batch(server, prompts: list[str], params: dict) -> list[tuple]:
    """One /generate batch request (its prompts reach the scheduler together): per prompt, its
    tokens and their logprobs, which show any difference in the logits' bits, not only the
    rare one that flips a token."""
    results = generate_ok(
        server, prompts, sampling_params={**params, "max_new_tokens": MAX_NEW_TOKENS}, return_logprob=True
    )
    return [tuple(map(tuple, r["meta_info"]["output_token_logprobs"])) for r in results]


def _concurrently(server, batches: list[list[str]], params: dict) -> list[list[tuple]]:
    """Several batch requests at once, so their prompts also share steps with each other."""
    with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
        return list(pool.map(lambda prompts: _batch(server, prompts, params), batches))


@pytest.mark.parametrize("setting", SETTINGS)
def test_single(server, setting: str) -> None:
    """The same prompt sent as batches of 1 to 8 copies: one unique output."""
    params = SETTINGS[setting]
    outputs = set()
    for size in range(1, 9):
        outputs.update(ids for ids in _batch(server, [PROMPT] * size, params))
    assert len(outputs) == 1, outputs


@pytest.mark.parametrize("setting", SETTINGS)
def test_mixed(server, setting: str) -> None:
    """The prompt co-batched with prompts of other lengths, in different mixes and orders."""
    params = SETTINGS[setting]
    mixes = [[PROMPT], [PROMPT] + OTHERS[:2], OTHERS[2:] + [PROMPT], [OTHERS[4], PROMPT, OTHERS[0], PROMPT]]
    outputs = set()
    for order in (mixes, mixes[::-1]):
        for mix, results in zip(order, _concurrently(server, order, params)):
            outputs.update(ids for prompt, ids in zip(mix, results) if prompt == PROMPT)
    assert len(outputs) == 1, outputs


@pytest.mark.parametrize("setting", SETTINGS)
def test_prefix(server, setting: str) -> None:
    """Prompts sharing prefixes of different lengths, prefilled in 16-token chunks next to each
    other: each prompt has one unique output."""
    params = SETTINGS[setting]
    prompts = [SHARED_PREFIX[:cut] + suffix for cut in (40, 90, len(SHARED_PREFIX)) for suffix in SUFFIXES]
    by_prompt: dict[str, set] = {p: set() for p in prompts}
    batches = [prompts, prompts[::-1], prompts[::3], prompts[1::2]]
    for batch, results in zip(batches, _concurrently(server, batches, params)):
        for prompt, ids in zip(batch, results):
            by_prompt[prompt].add(ids)
    for prompt in prompts:
        by_prompt[prompt].update(ids for ids in _batch(server, [prompt], params))
    assert all(len(outs) == 1 for outs in by_prompt.values()), by_prompt


def test_unseeded_requests_get_fresh_reported_seeds(server) -> None:
    params = {"temperature": 1.0, "max_new_tokens": MAX_NEW_TOKENS}
    first, second = generate_ok(server, [PROMPT, PROMPT], sampling_params=params)
    seeds = [first["meta_info"]["sampling_seed"], second["meta_info"]["sampling_seed"]]
    assert seeds[0] != seeds[1]
    # The reported seed replays the output, alone or among other requests.
    replay = generate_ok(server, [OTHERS[3], PROMPT], sampling_params={**params, "sampling_seed": seeds[0]})[1]
    assert replay["output_ids"] == first["output_ids"]
    assert replay["meta_info"]["sampling_seed"] == seeds[0]


def test_logit_bias_and_custom_processor_work_in_the_mode(server) -> None:
    """Both change the output, and the changed output is still one per prompt whatever the batch."""
    first = _batch(server, [PROMPT], SETTINGS["seeded"])[0][0][1]
    biased = {**SETTINGS["seeded"], "logit_bias": {str(first): -100.0}}
    second = _batch(server, [PROMPT], biased)[0][0][1]
    params = {**biased, "custom_params": {"token_ids": [second]}}
    outputs = set()
    for prompts in ([PROMPT], [OTHERS[0], PROMPT, OTHERS[2], PROMPT]):
        results = generate_ok(
            server, prompts, sampling_params={**params, "max_new_tokens": MAX_NEW_TOKENS}, return_logprob=True,
            custom_logit_processor='{"name": "DisallowedTokensLogitsProcessor"}',
        )
        outputs.update(
            tuple(map(tuple, r["meta_info"]["output_token_logprobs"])) for p, r in zip(prompts, results) if p == PROMPT
        )
    assert len(outputs) == 1, outputs
    assert next(iter(outputs))[0][1] not in (first, second)

