"""Speculative decoding under tensor parallelism on the CPU (gloo), deterministic mode: a tiny
random Qwen3 (4 heads, 2 KV heads, 300-token vocabulary) served at TP=2 with STANDALONE, its
draft sharded over the same two ranks, gives the tokens of TP=1 with the same draft and of
TP=1 without speculation, for greedy, seeded, penalised and min_new_tokens / logit_bias rows in
one batch; NGRAM at TP=2 too. The rank agreement check is on, so every verify's emitted ids are compared across
ranks. The draft is the target itself: at greedy every draft is accepted, which holds only if
the sharded draft computes the target's argmax (docs/speculative.md)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from typing import Iterator

import pytest

from engine_utils import generate_ok
from family_utils import save_tiny
from guidance_utils import TINY, save_guidance_tiny, tiny_flags
from sglang.srt.distributed.communication import CHECK_TOKEN_AGREEMENT_ENV
from sglang.srt.server_args import prepare_server_args
from sglang.test.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_NEW = 16
# Token-id prompts of the tiny vocabulary; the last one repeats itself.
PROMPTS = [[3, 141, 59, 26, 53, 58, 97, 93, 23, 84, 62, 64, 33], [271, 82, 8, 28, 18], list(range(100, 130)) * 2]
PENALISED = dict(temperature=0.8, top_p=0.9, top_k=50, min_p=0.02, frequency_penalty=0.5, presence_penalty=0.3,
                 repetition_penalty=1.2)
REQUESTS = [
    (PROMPTS[0], {"temperature": 0.0}),
    (PROMPTS[1], {"temperature": 0.0}),
    (PROMPTS[2], {"temperature": 0.0}),
    (PROMPTS[0], {"temperature": 0.9, "top_k": 40, "sampling_seed": 7}),
    (PROMPTS[1], {**PENALISED, "sampling_seed": 3}),
    (PROMPTS[2], {**PENALISED, "sampling_seed": 11}),
    (PROMPTS[0], {"temperature": 0.0, "frequency_penalty": 1.0, "repetition_penalty": 1.3}),
    (PROMPTS[1], {"temperature": 0.0, "min_new_tokens": 10, "logit_bias": {"7": 3.0}}),
    # Unseeded: a fresh seed per request, so only the rank agreement check compares it.
    (PROMPTS[2], {"temperature": 1.0}),
]
COMPARED = range(len(REQUESTS) - 1)
GREEDY_PLAIN = range(3)  # rows whose target argmax is the self-draft's: every draft accepted


@pytest.fixture(scope="module")
def target_path(tmp_path_factory) -> str:
    return save_guidance_tiny(str(tmp_path_factory.mktemp("target")), seed=0)


@contextlib.contextmanager
def _server(target: str, tokenizer: str, *flags: str) -> Iterator[ServerProcess]:
    port = free_port()
    argv = ["--port", str(port), *tiny_flags(target, tokenizer, "--enable-deterministic-inference",
                                             "--dtype", "float32", *flags)]
    server = ServerProcess(argv, port, env={**os.environ, CHECK_TOKEN_AGREEMENT_ENV: "1"}, startup_timeout=600)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def _batch(server: ServerProcess) -> list[dict]:
    """Every request at once, so the verify steps batch them."""
    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
        futures = [pool.submit(generate_ok, server, prompt, sampling_params={"max_new_tokens": MAX_NEW, "ignore_eos": True,
                                                                              **params})
                   for prompt, params in REQUESTS]
        return [f.result() for f in futures]


@pytest.fixture(scope="module")
def answers(target_path: str, gguf_path: str) -> dict[str, list[dict]]:
    standalone = ("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", target_path,
                  "--speculative-num-steps", "3")
    ngram = ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6", "--tp-size", "2")
    runs = {"off": (), "tp1": standalone, "tp2": (*standalone, "--tp-size", "2"), "ngram_tp2": ngram}
    out = {}
    for name, flags in runs.items():
        with _server(target_path, gguf_path, *flags) as server:
            out[name] = _batch(server)
    return out


@pytest.mark.parametrize("run", ["tp1", "tp2", "ngram_tp2"])
def test_speculative_tokens_equal_decoding_without_speculation(answers, run):
    for i in COMPARED:
        want, got = answers["off"][i], answers[run][i]
        assert got["output_ids"] == want["output_ids"], f"request {i} {REQUESTS[i][1]}"
    assert all(len(a["output_ids"]) == MAX_NEW for a in answers[run])


def test_standalone_tp2_speculates_with_the_sharded_draft(answers):
    """The verify steps ran with drafts, and the sharded self-draft proposed the target's own
    greedy tokens (all accepted); penalised rows reject some."""
    metas = [a["meta_info"] for a in answers["tp2"]]
    assert all(m["spec_verify_ct"] < MAX_NEW for m in (metas[i] for i in GREEDY_PLAIN))
    for i in GREEDY_PLAIN:
        assert metas[i]["spec_draft_token_num"] > 0
        assert metas[i]["spec_accept_token_num"] == metas[i]["spec_draft_token_num"], metas[i]
    assert sum(m["spec_draft_token_num"] - m["spec_accept_token_num"] for m in metas) > 0
    # TP=1 with the same draft makes the same proposals and acceptances.
    keys = ("spec_verify_ct", "spec_accept_token_num", "spec_draft_token_num")
    counts = [[answers[run][i]["meta_info"][k] for k in keys] for i in COMPARED for run in ("tp1", "tp2")]
    assert counts[0::2] == counts[1::2]


def test_ngram_tp2_found_drafts(answers):
    """The repeating prompt's greedy row speculated under NGRAM at TP=2."""
    meta = answers["ngram_tp2"][2]["meta_info"]
    assert meta["spec_accept_token_num"] > 0 and meta["spec_verify_ct"] < MAX_NEW


def test_a_draft_the_tp_size_cannot_split_is_refused_naming_the_draft_flag(target_path, tmp_path):
    draft = str(tmp_path / "draft")
    save_tiny(draft, "Qwen3Config", "Qwen3ForCausalLM", **{**TINY, "num_attention_heads": 3, "num_key_value_heads": 3})
    args = prepare_server_args(["--model-path", target_path, "--tp-size", "2", "--speculative-algorithm", "STANDALONE",
                                "--speculative-draft-model-path", draft])
    with pytest.raises(ValueError, match=r"--speculative-draft-model-path .*--tp-size 2 cannot split this model: "
                                         r"the 3 attention heads are not divisible by 2"):
        args.resolve()
