"""Launching Triton kernels without the JIT's per-call Python work.

`kernel[grid](...)` binds arguments and computes a specialisation key in Python on every call,
tens of microseconds per launch: for an eager forward of a few hundred small kernels that is
milliseconds of host time (prefill, and any step that is not replayed from a CUDA graph). The
first launch of a specialisation goes through Triton and compiles; later ones call the compiled
kernel directly. The key mirrors what Triton specialises on: a tensor's dtype and 16-byte
alignment (the dtype alone for a do_not_specialize tensor); an int's == 1 / divisible-by-16 /
32-bit classes (nothing for the arguments the kernel does not specialise on); a constexpr's value.
"""

from __future__ import annotations

import torch

_COMPILED: dict[tuple, object] = {}
_INT32 = 2**31


def _int_class(value: int, specialise: bool) -> tuple:
    fits = -_INT32 <= value < _INT32
    return (fits, value == 1, value % 16 == 0) if specialise else (fits,)


def _spec(arg: object, param) -> object:
    if isinstance(arg, torch.Tensor):
        return arg.dtype if param.do_not_specialize else (arg.dtype, arg.data_ptr() % 16 == 0)
    if param.is_constexpr or isinstance(arg, bool):
        return arg
    if isinstance(arg, int):
        return _int_class(arg, not param.do_not_specialize)
    if isinstance(arg, float):
        return float
    return arg


def _bind(kernel, args: tuple, kwargs: dict) -> list:
    names = kernel.arg_names
    ordered = list(args) + [kwargs[name] for name in names[len(args):]]
    if len(ordered) != len(names):
        raise TypeError(f"{kernel.fn.__name__} takes {len(names)} arguments, got {len(ordered)}")
    return ordered


def launch(kernel, grid: tuple, *args, num_warps: int = 4, num_stages: int = 3, **kwargs) -> None:
    """kernel[grid](*args, **kwargs, num_warps=..., num_stages=...), every argument given
    (constexprs by keyword or position); `grid` a tuple of ints."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    if device.type != "cuda":  # the interpreter: nothing is compiled
        kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **kwargs)
        return
    ordered = _bind(kernel, args, kwargs)
    key = (kernel, device.index, num_warps, num_stages) + tuple(_spec(a, p) for a, p in zip(ordered, kernel.params))
    compiled = _COMPILED.get(key)
    if compiled is None:
        _COMPILED[key] = kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **kwargs)
    else:
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*ordered)  # a compiled kernel takes three grid dims
