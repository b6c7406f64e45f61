"""Parts of a Scheduler made from the server arguments and its model runner: the prefix cache
and the grammar queue."""

from __future__ import annotations

import logging
from typing import Any, Optional

from sglang.srt.constrained.grammar_backends import create_grammar_backend
from sglang.srt.constrained.grammar_queue import GrammarQueue
from sglang.srt.distributed.parallel_state import tp_cpu_group
from sglang.srt.managers.reasoning_tokens import think_end_ids
from sglang.srt.managers.schedule_batch import eos_ids
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def make_tree_cache(server_args: ServerArgs, model_runner: Any, deterministic: bool, tp_rank: int) -> RadixCache:
    """The radix cache over the runner's KV pool; disabled with --disable-radix-cache and for
    models that keep a per-request recurrent state."""
    hybrid = model_runner.state_pool is not None
    if hybrid and not server_args.disable_radix_cache and tp_rank == 0:
        # A cached KV prefix lacks the recurrent state at its end, so every prompt runs from its start.
        logger.info("Prefix reuse off: %s keeps a per-request recurrent state (radix cache disabled).",
                    model_runner.model_config.arch)
    return RadixCache(
        model_runner.req_to_token_pool,
        model_runner.token_to_kv_pool_allocator,
        disable=server_args.disable_radix_cache or hybrid,
        # Deterministic mode: only whole aligned prefill chunks, whose bits every run shares.
        align=server_args.chunked_prefill_size if deterministic else 1,
    )


def make_grammar_queue(server_args: ServerArgs, tokenizer: Any, vocab_size: int, eos_token_ids: set[int]) -> Optional[GrammarQueue]:
    """The queue compiling requests' grammars (None without a grammar backend); with
    --reasoning-parser it gates the grammars of reasoning requests behind the think-end marker."""
    backend = create_grammar_backend(
        server_args.grammar_backend, tokenizer, vocab_size, sorted(eos_ids(eos_token_ids, tokenizer)),
        any_whitespace=not server_args.constrained_json_disable_any_whitespace,
    )
    if backend is None:
        return None
    return GrammarQueue(
        backend, tp_cpu_group() if server_args.tp_size > 1 else None, think_end_ids(tokenizer, server_args.reasoning_parser)
    )
