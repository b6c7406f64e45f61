"""The wire form of a custom logit processor reference, and its safe decoding.

A reference is a JSON object with one key: `{"name": "<registered name>"}` or
`{"callable": "<hex of dill.dumps(cls)>"}`. Unpickling runs arbitrary code, so with an
allowlist the pickle is inspected statically first and only a by-reference pickle of an
allowlisted class is unpickled, by an unpickler that resolves nothing else.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any, Optional

import dill
import orjson


class CustomLogitProcessorError(ValueError):
    """A processor string that cannot be loaded; the message says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"custom_logit_processor: {reason}")


def encode_callable(cls: type) -> str:
    """`cls` (a class, not an instance) as `{"callable": "<hex of dill.dumps(cls)>"}`."""
    return orjson.dumps({"callable": dill.dumps(cls).hex()}).decode()


def parse_reference(s: str) -> tuple[str, str]:
    """Return ("name" | "callable", value) from the JSON reference."""
    try:
        data = orjson.loads(s)
    except (orjson.JSONDecodeError, TypeError) as e:
        raise CustomLogitProcessorError(f"not valid JSON ({e})") from None
    if not isinstance(data, dict) or len(data) != 1 or not ({"name", "callable"} & data.keys()):
        raise CustomLogitProcessorError(
            'expected a JSON object with exactly one key, "name" or "callable"'
        )
    (kind, value), = data.items()
    if not isinstance(value, str):
        raise CustomLogitProcessorError(f'"{kind}" must be a string')
    return kind, value


def check_allowed(name: str, allowlist: Optional[frozenset[str]]) -> None:
    if allowlist is not None and name not in allowlist:
        raise CustomLogitProcessorError(
            f"class {name!r} is not in the server's allowlist (--custom-logit-processor-allowlist)"
        )


def decode_callable(value: str, allowlist: Optional[frozenset[str]]) -> Any:
    """The object a `"callable"` value unpickles to; with an allowlist, only an allowlisted class."""
    payload = _decode_hex(value)
    if allowlist is None:
        return _unpickle(dill.loads, payload)
    check_allowed(_referenced_class_name(payload), allowlist)
    return _unpickle(lambda p: _AllowlistUnpickler(p, allowlist).load(), payload)


def _decode_hex(value: str) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise CustomLogitProcessorError('"callable" is not a hex string') from None


def _unpickle(load: Any, payload: bytes) -> Any:
    try:
        return load(payload)
    except Exception as e:  # any failure inside unpickling is the payload's fault
        raise CustomLogitProcessorError(
            f"cannot deserialize the callable ({type(e).__name__}: {e})"
        ) from None


# Opcodes a by-reference class pickle is made of (dill emits exactly these for an
# importable class): framing, string pushes for module and qualname, memo writes.
_NEUTRAL_OPS = frozenset({"PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"})
_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"})


def _referenced_class_name(payload: bytes) -> str:
    """`module.QualName` of the single global a by-reference pickle loads, without loading it.

    Anything that could run code on load (REDUCE, BUILD, NEWOBJ, INST, extension codes, a
    second global, by-value classes) is refused; only a lone global followed by STOP passes.
    """
    try:
        ops = list(pickletools.genops(payload))
    except ValueError as e:  # pickletools reports malformed data as ValueError
        raise CustomLogitProcessorError(f"the callable is not a valid pickle ({e})") from None
    strings: list[str] = []
    name: Optional[str] = None
    for op, arg, pos in ops:
        if op.name in _NEUTRAL_OPS:
            continue
        if op.name in _STRING_OPS:
            strings.append(arg)
        elif op.name == "STACK_GLOBAL" and name is None and len(strings) == 2:
            name = ".".join(strings)
            strings.clear()
        elif op.name == "GLOBAL" and name is None and not strings:
            name = ".".join(arg.split(" ", 1))
        elif op.name == "STOP" and name is not None and not strings and pos == len(payload) - 1:
            return name
        else:
            raise CustomLogitProcessorError(
                "with an allowlist only a by-reference pickle of an importable class is "
                f"accepted (the callable pickle has {op.name} at byte {pos})"
            )
    raise CustomLogitProcessorError("the callable is not a valid pickle (no STOP)")


class _AllowlistUnpickler(pickle.Unpickler):
    """Second line of defence: resolves only allowlisted globals."""

    def __init__(self, payload: bytes, allowlist: frozenset[str]) -> None:
        super().__init__(io.BytesIO(payload))
        self._allowlist = allowlist

    def find_class(self, module: str, name: str) -> Any:
        if f"{module}.{name}" not in self._allowlist:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowlisted")
        return super().find_class(module, name)
