"""`sampling_params.guidance`: the request field that samples each token from a mix of the main
context's distribution and a guide context's (classifier-free guidance, mixture, contrastive).

Wire shape (JSON object):
  method        "cfg" | "mixture" | "contrastive"                      required
  text | input_ids   the guide context's prompt (exactly one)           required
  weight        cfg: w >= 0; contrastive: beta >= 0                     required for those methods
  alpha         mixture: a number in [0, 1] or "kl_symmetry"            required for mixture
  plausibility  contrastive: (0, 1]                                     default 0.1
  model         "self" | "guide"                                        default "self"

`normalize_guidance` (tokenizer manager, with the tokenizer) turns `text` into `input_ids`;
`verify_guidance` checks every value. Each rejection is a ValueError naming `guidance.<field>`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

METHODS = ("cfg", "mixture", "contrastive")
MODELS = ("self", "guide")
KL_SYMMETRY = "kl_symmetry"
DEFAULT_PLAUSIBILITY = 0.1
FIELDS = ("method", "text", "input_ids", "weight", "alpha", "plausibility", "model")
# Which optional fields each method takes (the prompt and model apply to every method).
_METHOD_FIELDS = {"cfg": {"weight"}, "mixture": {"alpha"}, "contrastive": {"weight", "plausibility"}}


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_finite(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _error(name: str, message: str) -> ValueError:
    return ValueError(f"guidance.{name} {message}")


def normalize_guidance(guidance: Any, tokenizer: Any) -> Any:
    """`guidance` with its `text` replaced by the prompt's token ids (encoded like a main
    prompt); anything malformed is returned as it is, for verify_guidance to name."""
    if not isinstance(guidance, dict) or "text" not in guidance:
        return guidance
    text = guidance["text"]
    if not isinstance(text, str) or not text or "input_ids" in guidance:
        return guidance
    if tokenizer is None:
        raise _error("text", "cannot be tokenized: this server runs with --skip-tokenizer-init; send guidance.input_ids.")
    out = {k: v for k, v in guidance.items() if k != "text"}
    out["input_ids"] = list(tokenizer.encode(text))
    return out


def verify_guidance(guidance: Any, vocab_size: int) -> None:
    """Raise ValueError naming `guidance.<field>` for the first invalid value."""
    if not isinstance(guidance, dict):
        raise ValueError(f"guidance must be an object, got {type(guidance).__name__}.")
    for key in guidance:
        if key not in FIELDS:
            raise _error(str(key), f"is not a guidance field; expected one of {', '.join(FIELDS)}.")
    method = guidance.get("method")
    if method not in METHODS:
        raise _error("method", f"must be one of {', '.join(METHODS)}, got {method!r}.")
    _verify_context(guidance, vocab_size)
    for key in ("weight", "alpha", "plausibility"):
        if guidance.get(key) is not None and key not in _METHOD_FIELDS[method]:
            raise _error(key, f"does not apply to method {method!r}.")
    if method in ("cfg", "contrastive"):
        weight = guidance.get("weight")
        if not (_is_finite(weight) and weight >= 0):
            raise _error("weight", f"must be a finite number >= 0 for method {method!r}, got {weight!r}.")
    if method == "mixture":
        alpha = guidance.get("alpha")
        if alpha != KL_SYMMETRY and not (_is_finite(alpha) and 0 <= alpha <= 1):
            raise _error("alpha", f"must be a number in [0, 1] or {KL_SYMMETRY!r}, got {alpha!r}.")
    plausibility = guidance.get("plausibility")
    if plausibility is not None and not (_is_finite(plausibility) and 0 < plausibility <= 1):
        raise _error("plausibility", f"must be a number in (0, 1], got {plausibility!r}.")
    model = guidance.get("model", "self")
    if model not in MODELS:
        raise _error("model", f"must be one of {', '.join(MODELS)}, got {model!r}.")


def _verify_context(guidance: dict, vocab_size: int) -> None:
    has_text, has_ids = guidance.get("text") is not None, guidance.get("input_ids") is not None
    if has_text == has_ids:
        raise _error("input_ids", "or guidance.text is required: exactly one gives the guide context's prompt.")
    if has_text:
        if not isinstance(guidance["text"], str) or not guidance["text"]:
            raise _error("text", "must be a non-empty string.")
        return
    ids = guidance["input_ids"]
    if not isinstance(ids, list) or not ids or not all(_is_int(t) for t in ids):
        raise _error("input_ids", "must be a non-empty flat list of integer token ids.")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise _error("input_ids", f"contains out-of-vocabulary token id {bad}; valid range is [0, {vocab_size}).")


def guide_prompt(guidance: Optional[dict]) -> Optional[list[int]]:
    """The guide context's prompt ids of normalized guidance, or None without guidance."""
    return None if guidance is None else list(guidance["input_ids"])


def mixing_coefficients(guidance: dict) -> tuple[float, float, float, bool]:
    """(k, b, plausibility, kl) of one row: its mixed logits are
    main + k * (lg - lc) - b * lg, restricted to plausible tokens when plausibility > 0;
    `kl`: k = 1 - alpha is chosen per token by kl_symmetry."""
    method = guidance["method"]
    if method == "cfg":
        return 1.0 - float(guidance["weight"]), 0.0, 0.0, False
    if method == "contrastive":
        p = guidance.get("plausibility")
        return 0.0, float(guidance["weight"]), float(DEFAULT_PLAUSIBILITY if p is None else p), False
    alpha = guidance["alpha"]
    if alpha == KL_SYMMETRY:
        return 0.0, 0.0, 0.0, True
    return 1.0 - float(alpha), 0.0, 0.0, False


def check_guide_model(guidance: Optional[dict], guide_model_loaded: bool) -> None:
    """A guide context routed to the guide model needs one (--guide-model-path)."""
    if guidance is not None and guidance.get("model", "self") == "guide" and not guide_model_loaded:
        raise _error("model", "'guide' needs a guide model, and this server loads none (--guide-model-path).")
