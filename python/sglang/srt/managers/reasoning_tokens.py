"""meta_info.reasoning_tokens (SGLang's `require_reasoning`): how many output tokens belong to the
reasoning section, counted for a request that starts inside it. The section ends with the think-end
marker of --reasoning-parser, whose tokens count as reasoning; while it has not ended every output
token so far does. Without a reasoning parser the count is 0; a request that does not ask gets no
count (meta_info has no reasoning_tokens)."""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.parser.reasoning_parser import THINK_END


def think_end_ids(tokenizer: Any, reasoning_parser: Optional[str]) -> Optional[list[int]]:
    """The token ids of the think-end marker (None without a parser or a tokenizer)."""
    if reasoning_parser is None or tokenizer is None:
        return None
    ids = tokenizer.encode(THINK_END, add_special_tokens=False)
    return ids or None


def count_reasoning_tokens(output_ids: list[int], end_ids: Optional[list[int]]) -> int:
    """Output tokens up to and including the first think-end marker; all of them before it comes."""
    if not end_ids:
        return 0
    width = len(end_ids)
    for start in range(len(output_ids) - width + 1):
        if output_ids[start : start + width] == end_ids:
            return start + width
    return len(output_ids)
