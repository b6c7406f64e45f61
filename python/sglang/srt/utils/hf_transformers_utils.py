"""Tokenizer loading for HF folders and GGUF files, with the GGUF conversion cached on disk."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from typing import Any, Optional

CACHE_ENV = "SGLANG_CACHE_DIR"

logger = logging.getLogger(__name__)


def get_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    """The HF fast tokenizer of a model folder, or of a GGUF file (chat template included).
    `trust_remote_code` (--trust-remote-code) lets a folder's own tokenizer code run."""
    from transformers import AutoTokenizer

    if not (os.path.isfile(path) and path.endswith(".gguf")):
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    cached = gguf_tokenizer_cache_dir(path)
    if os.path.isdir(cached):
        return AutoTokenizer.from_pretrained(cached)
    folder, name = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)  # the slow conversion
    try:
        _save_atomically(tokenizer, cached)
    except OSError as err:
        logger.warning("Could not cache the converted GGUF tokenizer in %s: %s", cached, err)
    return tokenizer


def hf_tokenizer_folder(path: str) -> str:
    """Where an HF-format tokenizer of `path` lies: the path itself, or for a GGUF file its cached
    conversion once one exists (sglang-router reads tokenizers, but not from GGUF files)."""
    if os.path.isfile(path) and path.endswith(".gguf") and os.path.isdir(cached := gguf_tokenizer_cache_dir(path)):
        return cached
    return path


def load_chat_template(tokenizer: Any, path: Optional[str]) -> Any:
    """--chat-template: the Jinja file at `path` replaces the tokenizer's own template (None: keep it)."""
    if path is not None:
        with open(path, encoding="utf-8") as f:
            tokenizer.chat_template = f.read()
    return tokenizer


def gguf_tokenizer_cache_dir(path: str) -> str:
    """Keyed by the file's identity and the converter's version, so a changed file or a new
    transformers converts again."""
    import transformers

    path = os.path.abspath(path)
    stat = os.stat(path)
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    root = os.environ.get(CACHE_ENV)
    root = os.path.join(root, "tokenizers") if root else os.path.expanduser("~/.cache/sglang/tokenizers")
    return os.path.join(root, digest)


def _save_atomically(tokenizer: Any, cached: str) -> None:
    """Save into a private temp dir, then rename it into place: of concurrent processes one
    rename wins, and readers never see a partial directory."""
    parent = os.path.dirname(cached)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        tokenizer.save_pretrained(tmp)
        os.rename(tmp, cached)
    except OSError:
        if not os.path.isdir(cached):  # losing the race is fine; anything else is a real error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
