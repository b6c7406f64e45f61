"""Builds a C kernel of this package with the machine's C compiler and loads it with ctypes.

The CPU kernels are plain C with OpenMP, compiled on first use for the machine they run on
(-march=native) and cached by a hash of the source, the flags, the compiler and the CPU. Where
no compiler works the loader returns None and callers keep their plain-torch path.

OpenMP: the library asks for libgomp.so.1 by its soname, and the dynamic loader hands it the copy
torch has already loaded, so the kernels run on the calling thread's OpenMP team like torch's own
ops do (a second runtime would double the threads on the cores).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

# ctypes types of the kernels' pointer and int64 arguments.
PTR, I64 = ctypes.c_void_p, ctypes.c_int64

BASE_FLAGS = ("-O3", "-fno-math-errno", "-shared", "-fPIC")
# Tried in order: a compiler without OpenMP (Apple clang) or -march=native still gets a build.
FLAG_SETS = (("-march=native", "-fopenmp"), ("-fopenmp",), ("-march=native",), ())
COMPILE_TIMEOUT_S = 120


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "sgl_kernel_ext"


@functools.cache
def load_kernel_library(source_name: str, defines: tuple[str, ...] = ()) -> Optional[ctypes.CDLL]:
    """The compiled `source_name` (a .c file under this package), or None with a warning.
    defines: extra -D macros (the tests build a kernel's portable variant with them)."""
    source = Path(__file__).resolve().parent / source_name
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        logger.warning("No C compiler found: %s is not built; the plain-torch path is used.", source_name)
        return None
    errors = []
    for extra in FLAG_SETS:
        flags = (*BASE_FLAGS, *extra, *(f"-D{name}" for name in defines))
        try:
            return ctypes.CDLL(str(_build(compiler, source, flags)))
        except (OSError, subprocess.SubprocessError) as err:
            errors.append(f"{' '.join(extra) or 'plain'}: {_describe(err)}")
    logger.warning("Could not build %s; the plain-torch path is used. %s", source_name, " | ".join(errors))
    return None


@functools.cache
def load_kernel(
    source_name: str, function: str, argtypes: tuple, restype: Optional[type], defines: tuple[str, ...] = ()
) -> Optional[ctypes._CFuncPtr]:
    """The C function `function` of the compiled `source_name`, typed for ctypes, or None where
    the source could not be built (the caller keeps its plain-torch path)."""
    lib = load_kernel_library(source_name, defines)
    if lib is None:
        return None
    fn = getattr(lib, function)
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn


def _build(compiler: str, source: Path, flags: tuple[str, ...]) -> Path:
    key = hashlib.sha256()
    for part in (*_source_bytes(source), " ".join(flags).encode(), _compiler_version(compiler), _cpu_signature()):
        key.update(part)
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:20]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built under a private name and renamed: processes starting together (TP ranks) never load
    # a half-written library.
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    subprocess.run(
        [compiler, *flags, str(source), "-o", str(partial), "-lm"],
        check=True, capture_output=True, timeout=COMPILE_TIMEOUT_S,
    )
    os.replace(partial, target)
    return target


def _source_bytes(source: Path) -> list[bytes]:
    """The source and the sibling sources it includes ("../dir/file.c", one level): a fused
    kernel is rebuilt when a kernel it compiles in changes."""
    text = source.read_bytes()
    included = re.findall(rb'^#include "([^"]+)"', text, flags=re.MULTILINE)
    return [text, *((source.parent / name.decode()).read_bytes() for name in included)]


def _compiler_version(compiler: str) -> bytes:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return b""


def _cpu_signature() -> bytes:
    """What -march=native depends on: the CPU's feature flags where Linux lists them."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {platform.processor()} {flags}".encode()


def _describe(err: Exception) -> str:
    """The compiler's last line of complaint, or the error itself."""
    stderr = getattr(err, "stderr", None)
    lines = stderr.decode(errors="replace").strip().splitlines() if stderr else []
    return lines[-1] if lines else str(err)
