"""The GGUF file header: metadata and tensor table, read without parsing token tables."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types: id -> struct format (scalars only).
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# Arrays longer than this (token tables, merges) are skipped: nothing reads them from here.
_MAX_KEPT_ARRAY = 256


# Where a tensor's bytes start in the file when general.alignment is not set.
_DEFAULT_ALIGNMENT = 32


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order
    qtype: int  # GGMLQuantizationType value
    offset: int  # absolute file offset of its bytes


def read_gguf_header(path: str) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """(metadata, tensor name -> numpy-order shape) without parsing the token tables into
    per-item arrays, which is what makes GGUFReader take seconds."""
    metadata, tensors = read_tensor_infos(path)
    return metadata, {t.name: t.shape for t in tensors}


def read_tensor_infos(path: str) -> tuple[dict[str, Any], list[TensorInfo]]:
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
            tensors.append(TensorInfo(name, tuple(reversed(dims)), qtype, offset))
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
