"""The speculative-decoding launch flags (SGLang 0.5.23's names) and their start-up checks.

NGRAM drafts from the request's own prompt and output; STANDALONE drafts with a smaller model of
the same tokenizer. Both propose one chain of drafts (--speculative-eagle-topk 1) that the target
verifies in one extend step (docs/speculative.md). SGLang's other algorithms parse and are
refused at start-up, naming the flag and the value.
"""

from __future__ import annotations

import argparse
from typing import Any

IMPLEMENTED = ("NGRAM", "STANDALONE")
# SGLang 0.5.23's built-in algorithms that need draft heads this server does not have.
REFUSED = ("EAGLE", "EAGLE3", "NEXTN", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP", "MTP")
# SGLang's NGRAM verify width when none is given (CUDA).
NGRAM_DEFAULT_DRAFT_TOKENS = 12
# On the CPU a verify costs about one decode row per token, so wide verifies pay only for long
# accepted runs: 3 drafts measured best (docs/speculative.md).
NGRAM_CPU_DEFAULT_DRAFT_TOKENS = 4
# A draft model's steps when none are given.
STANDALONE_DEFAULT_STEPS = 3
# Running requests above which the server decodes without speculation, when none is given.
DEFAULT_DISABLE_BATCH_SIZE = 16
NGRAM_MAX_TRIE_DEPTH = 18  # SGLang's default window
# The shortest suffix match that drafts. On CUDA a rejected verify costs about a decode step, so
# one matching token drafts (SGLang's rule); on the CPU a verify pays per token and stops the
# overlap schedule, and one-token matches in free text are mostly rejected (docs/speculative.md).
NGRAM_MIN_MATCH = 1
NGRAM_CPU_MIN_MATCH = 2


def add_speculative_args(parser: argparse.ArgumentParser, defaults: Any) -> None:
    group = parser.add_argument_group("Speculative decoding")
    add = group.add_argument
    add("--speculative-algorithm", default=defaults.speculative_algorithm,
        help="NGRAM (drafts looked up in the request's prompt and output) or STANDALONE (a draft model, "
        "--speculative-draft-model-path). SGLang's EAGLE, EAGLE3, NEXTN and the others are refused at start-up.")
    add("--speculative-draft-model-path", "--speculative-draft-model", default=defaults.speculative_draft_model_path,
        help="STANDALONE: the draft model (HF folder or GGUF file) sharing the target's tokenizer and vocabulary.")
    add("--speculative-num-steps", type=int, default=defaults.speculative_num_steps,
        help=f"Draft tokens proposed per verify step (STANDALONE: greedy draft steps; default "
        f"{STANDALONE_DEFAULT_STEPS}); NGRAM: --speculative-num-draft-tokens - 1.")
    add("--speculative-eagle-topk", type=int, default=defaults.speculative_eagle_topk,
        help="Drafts per step: only 1 (one chain) is implemented.")
    add("--speculative-num-draft-tokens", type=int, default=defaults.speculative_num_draft_tokens,
        help=f"Verify width: the last token plus the drafts (= --speculative-num-steps + 1; NGRAM default "
        f"{NGRAM_DEFAULT_DRAFT_TOKENS}, on the CPU {NGRAM_CPU_DEFAULT_DRAFT_TOKENS}).")
    add("--speculative-ngram-max-trie-depth", type=int, default=defaults.speculative_ngram_max_trie_depth,
        help="NGRAM: the longest suffix of the request's tokens matched against its earlier tokens.")
    add("--speculative-ngram-min-match-window-size", type=int, default=defaults.speculative_ngram_min_match_window_size,
        help=f"NGRAM: the shortest suffix match that drafts (SGLang's name from older releases; default "
        f"{NGRAM_MIN_MATCH}, on the CPU {NGRAM_CPU_MIN_MATCH}).")
    add("--speculative-disable-batch-size", type=int, default=defaults.speculative_disable_batch_size,
        help=f"Above this many running requests a step decodes without speculation (default "
        f"{DEFAULT_DISABLE_BATCH_SIZE}).")


def resolve_speculative_args(args: Any) -> None:
    """Check the flags and fill the defaults that depend on the algorithm; raises ValueError."""
    algorithm = args.speculative_algorithm
    if algorithm is None:
        return
    if algorithm in REFUSED or algorithm not in IMPLEMENTED:
        raise ValueError(
            f"--speculative-algorithm {algorithm} is not implemented here (its draft heads do not exist in this "
            f"server); supported: {', '.join(IMPLEMENTED)}."
        )
    if args.speculative_eagle_topk not in (None, 1):
        raise ValueError(f"--speculative-eagle-topk {args.speculative_eagle_topk}: only 1 (a single draft chain) is supported.")
    args.speculative_eagle_topk = 1
    if algorithm == "STANDALONE" and not args.speculative_draft_model_path:
        raise ValueError("--speculative-algorithm STANDALONE needs --speculative-draft-model-path.")
    if algorithm == "STANDALONE" and args.tp_size > 1:
        _check_draft_tp_size(args.speculative_draft_model_path, args.tp_size)
    if algorithm == "NGRAM" and args.speculative_draft_model_path:
        raise ValueError("--speculative-algorithm NGRAM takes no --speculative-draft-model-path.")
    _resolve_widths(args, algorithm)
    if args.speculative_disable_batch_size is None:
        args.speculative_disable_batch_size = DEFAULT_DISABLE_BATCH_SIZE
    for name in ("speculative_num_steps", "speculative_ngram_max_trie_depth", "speculative_disable_batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    if algorithm == "NGRAM":
        _resolve_min_match(args)


def _resolve_min_match(args: Any) -> None:
    """NGRAM's shortest drafting match: the device's default within the window, or the flag's value."""
    depth, min_match = args.speculative_ngram_max_trie_depth, args.speculative_ngram_min_match_window_size
    if min_match is None:
        args.speculative_ngram_min_match_window_size = min(NGRAM_CPU_MIN_MATCH if args.device == "cpu" else NGRAM_MIN_MATCH, depth)
    elif not 1 <= min_match <= depth:
        raise ValueError(
            f"--speculative-ngram-min-match-window-size {min_match} must be from 1 to "
            f"--speculative-ngram-max-trie-depth {depth}."
        )


def _resolve_widths(args: Any, algorithm: str) -> None:
    """With one chain the verify width is the drafts plus one (SGLang's rule for topk 1)."""
    steps, width = args.speculative_num_steps, args.speculative_num_draft_tokens
    if steps is None and width is None:
        ngram_width = NGRAM_CPU_DEFAULT_DRAFT_TOKENS if args.device == "cpu" else NGRAM_DEFAULT_DRAFT_TOKENS
        steps = STANDALONE_DEFAULT_STEPS if algorithm == "STANDALONE" else ngram_width - 1
    if steps is None:
        steps = width - 1
    if width is not None and width != steps + 1:
        raise ValueError(
            f"--speculative-num-draft-tokens {width} must be --speculative-num-steps + 1 = {steps + 1} "
            "with --speculative-eagle-topk 1."
        )
    args.speculative_num_steps, args.speculative_num_draft_tokens = steps, steps + 1


def _check_draft_tp_size(draft_path: str, tp_size: int) -> None:
    """The draft model is sharded like the target (every rank runs its shard): refuse a TP size
    its heads or MLP cannot split, naming the draft flag."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.tp_sizes import check_tp_size

    try:
        check_tp_size(ModelConfig.from_path(draft_path), tp_size)
    except ValueError as err:
        raise ValueError(f"--speculative-draft-model-path {draft_path}: {err}") from err
