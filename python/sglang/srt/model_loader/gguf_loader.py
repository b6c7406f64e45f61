"""GGUF checkpoints: a fast metadata reader, and dequantised tensors under HF parameter names."""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from sglang.srt.configs.model_config import ModelConfig

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types: id -> struct format (scalars only).
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# Arrays longer than this (token tables, merges) are skipped: nothing reads them from here.
_MAX_KEPT_ARRAY = 256

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


# Where a tensor's bytes start in the file when general.alignment is not set.
_DEFAULT_ALIGNMENT = 32


@dataclass
class _TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order
    qtype: int  # GGMLQuantizationType value
    offset: int  # absolute file offset of its bytes


def read_gguf_header(path: str) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """(metadata, tensor name -> numpy-order shape) without parsing the token tables into
    per-item arrays, which is what makes GGUFReader take seconds."""
    metadata, tensors = _read_header(path)
    return metadata, {t.name: t.shape for t in tensors}


def _read_header(path: str) -> tuple[dict[str, Any], list[_TensorInfo]]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        reader = _HeaderReader(buf)
        if buf[:4] != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file.")
        reader.pos = 4
        version, n_tensors, n_kv = reader.read("I"), reader.read("Q"), reader.read("Q")
        if version not in (2, 3):
            raise ValueError(f"Unsupported GGUF version {version} in {path} (big-endian files are not supported).")
        metadata = {}
        for _ in range(n_kv):
            key = reader.read_string()
            value = reader.read_value(reader.read("I"))
            if value is not _SKIPPED:
                metadata[key] = value
        tensors = []
        for _ in range(n_tensors):
            name = reader.read_string()
            dims = [reader.read("Q") for _ in range(reader.read("I"))]
            qtype, offset = reader.read("I"), reader.read("Q")
            # GGUF lists the innermost dimension first.
            tensors.append(_TensorInfo(name, tuple(reversed(dims)), qtype, offset))
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        data_start = -(-reader.pos // alignment) * alignment
        for t in tensors:
            t.offset += data_start
        return metadata, tensors


_SKIPPED = object()


class _HeaderReader:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def read(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def read_string(self) -> str:
        n = self.read("Q")
        value = self.buf[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return value

    def read_value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.read_string()
        if vtype != _ARRAY:
            return self.read(_SCALAR_FORMATS[vtype])
        etype, count = self.read("I"), self.read("Q")
        if count <= _MAX_KEPT_ARRAY:
            return [self.read_value(etype) for _ in range(count)]
        if etype == _STRING:
            for _ in range(count):
                length = self.read("Q")  # read before updating pos: read() advances it
                self.pos += length
        else:
            self.pos += count * struct.calcsize(_SCALAR_FORMATS[etype])
        return _SKIPPED


def iter_gguf_weights(path: str, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF parameter name, float32 tensor) for every tensor of the file.

    Tensors are located with our header reader (GGUFReader would first parse the token tables,
    seconds per process, paid again by every TP rank) and dequantised by the gguf package."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    _, tensors = _read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    for tensor in tensors:
        qtype = GGMLQuantizationType(tensor.qtype)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        *outer, inner = tensor.shape
        row_bytes = inner // block_size * type_size
        end = tensor.offset + int(np.prod(outer, dtype=np.int64)) * row_bytes
        # A plain array: dequantize slices row groups, which on a memmap costs more than the copy.
        raw = np.array(data[tensor.offset : end]).reshape(*outer, row_bytes)
        weight = torch.from_numpy(np.array(dequantize(raw, qtype), dtype=np.float32))
        name = hf_name(tensor.name)
        # llama.cpp permutes Llama's q/k rows for its interleaved RoPE; undo it for rotate-half.
        if config.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            weight = unpermute_rope_rows(weight, heads)
        yield name, weight


def hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        raise ValueError(f"Unsupported GGUF tensor {gguf_name!r}.")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Within each head, llama.cpp stores rows as (pair index, half) and HF as (half, pair index)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, -1).transpose(1, 2).reshape(weight.shape)
