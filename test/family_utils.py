"""Model families against HF transformers: a tiny random checkpoint of a family, written by
transformers with SmolLM2's vocabulary (so the embedded tokenizer serves it), served by our
server in float32 and compared with transformers' own forward: greedy tokens and the first
token's top logprobs, every prompt sent at once so that the server batches them."""

from __future__ import annotations

import concurrent.futures
import contextlib
from typing import Any, Iterator

import torch
import transformers

from engine_utils import generate_ok, running_server
from sglang.test.server_process import ServerProcess

FULL_VOCAB = 49152
TOP_K = 5
LOGPROB_ATOL = 1e-4
# Prompt lengths: short ones, and ones past a 32-token sliding window and a 16-token chunk.
PROMPT_LENS = (3, 17, 33, 48, 75)


def save_tiny(folder: str, config_cls: str, model_cls: str, *, std: float = 0.2, seed: int = 0,
              **config: Any) -> transformers.PreTrainedModel:
    """Writes a random `model_cls` checkpoint of `config_cls(**config)` (SmolLM2's vocabulary
    unless given) to `folder`; returns the model, float32, eager attention, for reference."""
    cfg = getattr(transformers, config_cls)(**{"vocab_size": FULL_VOCAB, **config})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    # Default init leaves biases at 0 and norms at 1, which would hide loading mistakes.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def prompts(count: int = len(PROMPT_LENS), seed: int = 0) -> list[list[int]]:
    """Random token-id prompts of PROMPT_LENS lengths (ids past the special tokens)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, FULL_VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS[:count]]


@contextlib.contextmanager
def serving(folder: str, tokenizer_path: str, *flags: str) -> Iterator[ServerProcess]:
    """Our server on the checkpoint in float32."""
    with running_server("--model-path", folder, "--tokenizer-path", tokenizer_path, "--dtype", "float32",
                        "--max-running-requests", "16", "--max-total-tokens", "8192", *flags) as server:
        yield server


@torch.no_grad()
def hf_reference(model: transformers.PreTrainedModel, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation by full forwards (no HF cache, so no cache implementation is trusted)
    and the first new token's log-probabilities [V]."""
    ids, first = list(prompt), None
    for _ in range(new_tokens):
        logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()  # [V]
        if first is None:
            first = torch.log_softmax(logits, dim=-1)
        ids.append(int(logits.argmax()))
    return ids[len(prompt):], first


def served(server: ServerProcess, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    body = dict(
        sampling_params={"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True},
        return_logprob=True, top_logprobs_num=TOP_K,
    )
    return generate_ok(server, prompt, **body)


def assert_matches_hf(server: ServerProcess, model: transformers.PreTrainedModel, prompt_list: list[list[int]],
                      new_tokens: int = 8, atol: float = LOGPROB_ATOL) -> None:
    """Every prompt sent at once: the greedy tokens equal transformers', and the first token's
    top-K logprobs (ids and values) match within `atol`."""
    with concurrent.futures.ThreadPoolExecutor(len(prompt_list)) as pool:
        results = list(pool.map(lambda p: served(server, p, new_tokens), prompt_list))
    for prompt, result in zip(prompt_list, results):
        expected_ids, expected_logprobs = hf_reference(model, prompt, new_tokens)
        assert result["output_ids"] == expected_ids, f"prompt of {len(prompt)} tokens"
        top = result["meta_info"]["output_top_logprobs"][0]  # [[logprob, id, text], ...]
        values = torch.tensor([entry[0] for entry in top], dtype=torch.float64)
        ref_values, ref_ids = expected_logprobs.double().topk(TOP_K)
        assert [entry[1] for entry in top] == ref_ids.tolist(), f"prompt of {len(prompt)} tokens"
        torch.testing.assert_close(values, ref_values, atol=atol, rtol=0)
