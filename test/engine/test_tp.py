"""Tensor parallelism on the CPU (gloo): TP=2 (and TP=4, KV heads replicated) on a tiny random
Qwen3 checkpoint, TP=3 on the embedded SmolLM2 (9 heads, 3 KV heads).

Sharded forward passes give the TP=1 logits. Through the real server, with the rank agreement
check on, greedy and seeded (penalised) requests give the TP=1 tokens with the overlap schedule
on and off; a rank-dependent processor is caught by the check, or reconciled by
SYNC_TOKEN_IDS_ACROSS_TP; a killed rank stops the server with the reason."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal

import pytest
import requests
import torch
import torch.multiprocessing as mp

from engine_utils import generate, generate_ok, processor_shipped_by_value, running_server
from scaling_utils import EXIT_WAIT_S, wait_exit
from sglang import launch_server
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.communication import CHECK_TOKEN_AGREEMENT_ENV
from sglang.srt.distributed.tp_sizes import supported_tp_sizes, tp_split_problems
from sglang.test.server_process import ServerProcess, free_port
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs
from test_model_runner import LOGIT_ATOL, _save_tiny
from tp_workers import PROMPTS, collectives_worker, forward_logits, invariant_reduce_worker, logits_worker

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TINY_CASE = "qwen3_head_dim_32_sharded"  # 4 heads, 2 KV heads, vocab 300, 14 safetensors shards
TINY_TP_ATOL = 1e-4  # logits of |x| ~ 10: only the all-reduce's summation order differs
FAVOURED = 10  # the token RankDependentProcessor pushes rank r towards: FAVOURED + r


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("qwen3_tiny"))
    _save_tiny(TINY_CASE, folder)
    return folder


# --- which TP sizes a model takes, refused before any rank starts ------------------------------


def test_supported_tp_sizes(gguf_path: str, tiny_path: str) -> None:
    smol, tiny = ModelConfig.from_path(gguf_path), ModelConfig.from_path(tiny_path)
    assert supported_tp_sizes(smol) == [1, 3]  # 9 heads, 3 KV heads, intermediate 1536
    assert supported_tp_sizes(tiny) == [1, 2, 4]  # 4 heads, 2 KV heads (replicated at 4)
    assert tp_split_problems(smol, 2) == [
        "the 9 attention heads are not divisible by 2",
        "the 3 KV heads are neither divisible by 2 (to split them) nor a divisor of it (to replicate them)",
    ]
    assert tp_split_problems(smol, 9) == ["the MLP intermediate size 1536 is not divisible by 9"]


def test_launch_refuses_a_tp_size_the_heads_cannot_split(gguf_path: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        launch_server.main(["--model-path", gguf_path, "--tp-size", "2", "--device", "cpu"])
    message = str(exit_info.value.code)
    assert "--tp-size 2" in message and "9 attention heads" in message
    assert "TP sizes that work for it: 1, 3" in message
    with pytest.raises(ValueError, match="TP sizes that work for it: 1, 3"):
        ServerArgs(model_path=gguf_path, tp_size=4, device="cpu").resolve()


# --- the scheduler's collectives ---------------------------------------------------------------


def test_request_broadcast_and_token_agreement_check(tmp_path) -> None:
    mp.spawn(collectives_worker, args=(f"tcp://127.0.0.1:{free_port()}", str(tmp_path)), nprocs=2)
    for rank in range(2):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        assert result["frames"] == ["616263", "", "00ff"] and result["empty"] == []
        diverged, resized, verify_diverged, widened = result["errors"]
        assert diverged == (
            "TP ranks sampled different tokens at step 4: first diverging row 1 (request 'b'), "
            "tokens by rank [7, 8]; 2 of 3 rows differ."
        )
        assert resized == "TP ranks scheduled different batches at step 5: batch sizes by rank [1, 2]."
        assert verify_diverged == (
            "TP ranks sampled different tokens at step 7: first diverging row 1 (request 'b'), "
            "tokens by rank [[7, -1, -1], [7, 8, -1]]; 1 of 2 rows differ."
        )
        assert widened == "TP ranks verified different widths at step 8: widths by rank [2, 3]."


def test_batch_invariant_reduction_adds_ranks_in_order(tmp_path) -> None:
    """--enable-deterministic-inference under TP=3: a row's reduced sum is the same bits at every
    batch size (a ring all-reduce's order moves with the chunk bounds)."""
    mp.spawn(invariant_reduce_worker, args=(f"tcp://127.0.0.1:{free_port()}", str(tmp_path)), nprocs=3)
    assert json.loads((tmp_path / "result.json").read_text()) == {"same": True}


# --- sharded forward passes: the TP=1 logits ---------------------------------------------------


@pytest.mark.parametrize(("model", "tp_size"), [("qwen3-tiny", 2), ("qwen3-tiny", 4), ("smollm2", 3)])
def test_sharded_logits_match_tp1(model: str, tp_size: int, request, tmp_path) -> None:
    path = request.getfixturevalue("tiny_path" if model == "qwen3-tiny" else "gguf_path")
    out_path = str(tmp_path / "logits.pt")
    mp.spawn(logits_worker, args=(tp_size, path, f"tcp://127.0.0.1:{free_port()}", out_path), nprocs=tp_size)
    sharded = torch.load(out_path)
    reference = forward_logits(ModelRunner(path, max_total_tokens=128, max_running_requests=2))
    diffs = [(a - b).abs().max().item() for a, b in zip(sharded, reference)]
    print(f"{model} TP={tp_size}: max |logits - TP=1 logits| per step {diffs}")
    assert [a.shape for a in sharded] == [b.shape for b in reference]
    assert max(diffs) < (TINY_TP_ATOL if model == "qwen3-tiny" else LOGIT_ATOL)


# --- through the server ------------------------------------------------------------------------

SMOL_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
TINY_PROMPTS = PROMPTS + [list(range(100, 140))]
SEEDED = dict(temperature=0.8, top_p=0.9, top_k=50, min_p=0.02, frequency_penalty=0.5, presence_penalty=0.3,
              repetition_penalty=1.2, min_new_tokens=2)


def _comparable_requests(prompts: list) -> list[tuple]:
    """Greedy and seeded-with-penalties requests: their tokens must not depend on the TP size."""
    greedy = [(p, {"temperature": 0.0, "max_new_tokens": 10}) for p in prompts]
    seeded = [(p, {**SEEDED, "sampling_seed": 100 + i, "max_new_tokens": 10}) for i, p in enumerate(prompts)]
    # Batch-level logits processors: every rank runs them on the same rows with the same state.
    processed = [
        (prompts[0], {"temperature": 0.0, "max_new_tokens": 10, "no_repeat_ngram_size": 1}),
        (prompts[1], {**SEEDED, "sampling_seed": 7, "max_new_tokens": 10, "allowed_token_ids": list(range(20, 200, 7))}),
    ]
    # Watermarked: the forced tokens are a function of (key, context, logits) on every rank.
    processed.append((prompts[0], {"temperature": 1.0, "max_new_tokens": 10, "sampling_seed": 21,
                                   "watermark": {"key": "0123456789abcdef"}}))
    return greedy + seeded + processed


def _run_concurrently(server: ServerProcess, reqs: list[tuple]) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
        futures = [pool.submit(generate_ok, server, prompt, sampling_params=params) for prompt, params in reqs]
        return [f.result()["output_ids"] for f in futures]


def _model_flags(model_path: str, tokenizer_path: str) -> list[str]:
    return ["--model-path", model_path, "--tokenizer-path", tokenizer_path, "--max-running-requests", "8",
            "--enable-watermark"]


@pytest.fixture(scope="module")
def tiny_tp1_tokens(tiny_path: str, gguf_path: str) -> list[list[int]]:
    with running_server(*_model_flags(tiny_path, gguf_path)) as server:
        return _run_concurrently(server, _comparable_requests(TINY_PROMPTS))


@pytest.fixture(scope="module")
def smol_tp1_tokens(gguf_path: str) -> list[list[int]]:
    with running_server(*_model_flags(gguf_path, gguf_path)) as server:
        return _run_concurrently(server, _comparable_requests(SMOL_PROMPTS))


def rank_dependent_processor() -> str:
    """A processor that pushes TP rank r towards token FAVOURED + r: a processor reading
    rank-local state, which is how real deployments diverge."""
    body = f"import torch.distributed as dist; logits[:, {FAVOURED} + dist.get_rank()] = 1e4; return logits"
    return processor_shipped_by_value(body).to_str()


@contextlib.contextmanager
def tp_server(flags: list[str], env_overrides: dict[str, str]):
    port = free_port()
    server = ServerProcess(["--port", str(port), *flags], port, env={**os.environ, **env_overrides}, startup_timeout=600)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def _check_tp_tokens(server: ServerProcess, prompts: list, reference: list[list[int]]) -> None:
    reqs = _comparable_requests(prompts) + [(prompts[0], {"temperature": 1.0, "max_new_tokens": 10})]
    tokens = _run_concurrently(server, reqs)
    assert len(tokens[-1]) > 0  # unseeded: drawn with the same noise on every rank (the check is on)
    for i, (got, want) in enumerate(zip(tokens, reference)):
        assert got == want, f"request {i} ({reqs[i][1]}): TP {got} != TP=1 {want}"


def _rank_pid(server: ServerProcess, rank: int) -> int:
    return int(re.search(rf"TP rank {rank} of \d+: pid (\d+)", server.output).group(1))


def test_qwen3_tp2_overlap_matches_tp1_and_a_divergence_stops_the_server(tiny_path, gguf_path, tiny_tp1_tokens):
    flags = [*_model_flags(tiny_path, gguf_path), "--tp-size", "2", "--enable-custom-logit-processor"]
    with tp_server(flags, {CHECK_TOKEN_AGREEMENT_ENV: "1"}) as server:
        _check_tp_tokens(server, TINY_PROMPTS, tiny_tp1_tokens)
        params = {"temperature": 0.0, "max_new_tokens": 4}
        with contextlib.suppress(requests.RequestException):  # the server may go down while answering
            generate(server, PROMPTS[0], sampling_params=params, custom_logit_processor=rank_dependent_processor(),
                     rid="diverging", timeout=EXIT_WAIT_S)
        assert wait_exit(server) != 0
    assert re.search(
        r"scheduler rank \d exited with code 1: scheduler rank \d failed: TokenDivergenceError: TP ranks sampled "
        rf"different tokens at step \d+: first diverging row 0 \(request 'diverging'\), tokens by rank "
        rf"\[{FAVOURED}, {FAVOURED + 1}\]",
        server.output,
    ), server.output


def test_qwen3_tp2_without_overlap_matches_tp1_with_token_sync_and_a_killed_rank_stops_the_server(
    tiny_path, gguf_path, tiny_tp1_tokens
):
    flags = [*_model_flags(tiny_path, gguf_path), "--tp-size", "2", "--disable-overlap-schedule",
             "--enable-custom-logit-processor"]
    with tp_server(flags, {CHECK_TOKEN_AGREEMENT_ENV: "1", "SYNC_TOKEN_IDS_ACROSS_TP": "1"}) as server:
        _check_tp_tokens(server, TINY_PROMPTS, tiny_tp1_tokens)
        # all_reduce(MIN) reconciles the ranks: both keep the smaller of their favourites.
        result = generate_ok(server, PROMPTS[0], sampling_params={"temperature": 0.0, "max_new_tokens": 4},
                             custom_logit_processor=rank_dependent_processor())
        assert result["output_ids"] == [FAVOURED] * 4
        os.kill(_rank_pid(server, 1), signal.SIGKILL)
        assert wait_exit(server) != 0
    assert "scheduler rank 1 exited with code -9" in server.output, server.output


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_smollm2_tp3_matches_tp1(gguf_path: str, smol_tp1_tokens, overlap: bool) -> None:
    flags = [*_model_flags(gguf_path, gguf_path), "--tp-size", "3", *([] if overlap else ["--disable-overlap-schedule"])]
    with tp_server(flags, {CHECK_TOKEN_AGREEMENT_ENV: "1"}) as server:
        _check_tp_tokens(server, SMOL_PROMPTS, smol_tp1_tokens)
