"""--grammar-backend: the chosen backend, and the checks that run when a request arrives. Each
library is imported only when its backend is chosen."""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.constrained.base_grammar_backend import BaseGrammarBackend, GrammarKey
from sglang.srt.server_args import GRAMMAR_BACKEND_CHOICES


def create_grammar_backend(
    name: str, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], any_whitespace: bool = True
) -> Optional[BaseGrammarBackend]:
    """The backend of --grammar-backend; None for `none` or without a tokenizer (--skip-tokenizer-init)."""
    if name == "none" or tokenizer is None:
        return None
    if name == "xgrammar":
        from sglang.srt.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, stop_token_ids, any_whitespace)
    if name == "llguidance":
        from sglang.srt.constrained.llguidance_backend import GuidanceBackend

        return GuidanceBackend(tokenizer, vocab_size, stop_token_ids, any_whitespace)
    raise ValueError(f"--grammar-backend must be one of {', '.join(GRAMMAR_BACKEND_CHOICES)}, got {name!r}.")


def validate_grammar(backend_name: str, key: GrammarKey) -> None:
    """The checks that need no tokenizer, run when a request arrives so a bad grammar is a 400
    before anything is queued: JSON syntax, the library's own parse, unsupported schema keywords."""
    if backend_name == "xgrammar":
        from sglang.srt.constrained.xgrammar_backend import validate

        validate(key)
    elif backend_name == "llguidance":
        from sglang.srt.constrained.llguidance_backend import validate

        validate(key)
