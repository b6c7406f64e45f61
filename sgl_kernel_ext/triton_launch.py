"""Launching Triton kernels without the JIT's per-call Python work.

`kernel[grid](...)` binds arguments and computes a specialisation key in Python on every call,
tens of microseconds per launch: for an eager forward of a few hundred small kernels that is
milliseconds of host time (prefill, and any step that is not replayed from a CUDA graph). The
first launch of a specialisation goes through Triton and compiles; later ones call the compiled
kernel directly. The key mirrors what Triton specialises on: a tensor's dtype and 16-byte
alignment (the dtype alone for a do_not_specialize tensor); an int's == 1 / divisible-by-16 /
32-bit classes (nothing for the arguments the kernel does not specialise on); a constexpr's value.

Programmatic dependent launch (PDL, compute capability 9.0+): a kernel launched with `pdl=True`
may start while the kernel before it on the stream is still running; it must call
`pdl_sync(PDL)` before it reads anything an earlier kernel wrote or writes anything an earlier
kernel reads. What it does before that (a decode step's skinny matmul loads its first weight
tile) overlaps the earlier kernel's tail and its own launch, which at one row is most of a
small kernel's time (docs/gpu_engine.md).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

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


@functools.cache
def pdl_applies(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: CUDA devices of compute capability 9.0+."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def pdl_sync(PDL: tl.constexpr):
    """With PDL: wait until the kernels before this one on the stream have finished and their
    writes are visible, then let the next kernel's programs start (they wait here in turn)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def launch(
    kernel, grid: tuple, *args, num_warps: int = 4, num_stages: int = 3, pdl: bool = False, **kwargs
) -> None:
    """kernel[grid](*args, **kwargs, num_warps=..., num_stages=...), every argument given
    (constexprs by keyword or position); `grid` a tuple of ints. `pdl=True`: a kernel with a
    `PDL` constexpr that it hands to pdl_sync launches with PDL where the device has it
    (pdl_applies); launch sets that argument."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    if "PDL" in kernel.arg_names:
        pdl = kwargs["PDL"] = pdl and pdl_applies(device)
    elif pdl:
        raise TypeError(f"{kernel.fn.__name__} has no PDL argument: it cannot launch with PDL.")
    if device.type != "cuda":  # the interpreter: nothing is compiled
        kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **kwargs)
        return
    ordered = _bind(kernel, args, kwargs)
    specs = tuple(_spec(a, p) for a, p in zip(ordered, kernel.params))
    key = (kernel, device.index, num_warps, num_stages, pdl) + specs
    compiled = _COMPILED.get(key)
    if compiled is None:
        options = {"launch_pdl": True} if pdl else {}
        _COMPILED[key] = kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **options, **kwargs)
    else:
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*ordered)  # a compiled kernel takes three grid dims
