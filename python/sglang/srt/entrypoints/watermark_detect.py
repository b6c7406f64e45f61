"""POST /watermark/detect: the watermark detector over HTTP (SGLang has the detector only as a
function, sglang.srt.sampling.watermarking.detect; this route runs that function).

{"token_ids": [int] | "text": str, "prompt_token_ids": [int], "key": HEX, "key_b": HEX,
 "mixing_probability": float, "context_window": int}
-> WatermarkDetection as JSON (combined / key_a_all_positions / ... each {num_contexts, score,
   z_score, p_value, log_p_value}). `text` is encoded without special tokens; exact token ids are
   preferred. Any other field, or a bad value, is a ValueError naming it (400); keys are never echoed.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.sampling.watermarking.detector import detect

DETECT_FIELDS = frozenset({"token_ids", "text", "prompt_token_ids", "key", "key_b", "mixing_probability", "context_window"})


def detect_watermark(body: Any, tokenizer: Any) -> dict:
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    unknown = sorted(set(body) - DETECT_FIELDS)
    if unknown:
        raise ValueError(f"Unknown field(s) {', '.join(unknown)} in /watermark/detect; supported: {', '.join(sorted(DETECT_FIELDS))}.")
    if ("token_ids" in body) == ("text" in body):
        raise ValueError("/watermark/detect needs exactly one of token_ids or text.")
    if "key" not in body:
        raise ValueError("/watermark/detect needs key.")
    token_ids = body.get("token_ids")
    if "text" in body:
        if not isinstance(body["text"], str):
            raise ValueError("text must be a string.")
        if tokenizer is None:
            raise ValueError("text needs the tokenizer, which --skip-tokenizer-init leaves unloaded: send token_ids.")
        token_ids = tokenizer.encode(body["text"], add_special_tokens=False)
    for name, ids in (("token_ids", token_ids), ("prompt_token_ids", body.get("prompt_token_ids", []))):
        if not isinstance(ids, list):
            raise ValueError(f"{name} must be a list of token ids.")
    options = {name: body[name] for name in ("key_b", "mixing_probability", "context_window") if body.get(name) is not None}
    result = detect(token_ids, key=body["key"], prompt_token_ids=body.get("prompt_token_ids", []), **options)
    return result.to_dict()
