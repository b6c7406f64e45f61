"""The extend attention kernel's default tiles fit Hopper's shared memory: compiled for sm_90 on
any machine (Triton's own compiler and ptxas, no GPU needed) and checked against the 227 KiB a
block may take. The interpreter never allocates shared memory, so the CPU tests cannot show an
overflow otherwise. The compile runs in a subprocess without TRITON_INTERPRET (other test modules
set it, and under it @triton.jit gives functions the compiler cannot take)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HOPPER_SHARED_BYTES = 227 * 1024  # dynamic shared memory one block may use on sm_90
POINTERS = ("q_ptr", "k_ptr", "v_ptr", "out_ptr")
INDEX_POINTERS = ("req_to_token_ptr", "req_pool_indices_ptr", "q_starts_ptr", "prefix_lens_ptr", "extend_lens_ptr")
STRIDES = tuple(f"stride_{t}_{d}" for t, dims in (("q", "nhd"), ("k", "shd"), ("v", "shd"), ("o", "nhd")) for d in dims)


def shared_bytes(dtype_name: str, head_dim: int) -> int:
    """Shared memory of _extend_kernel compiled for sm_90 at the default tiles."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sgl_kernel_ext.attention.paged_decode import dot_flags
    from sgl_kernel_ext.attention.paged_extend import _extend_kernel, extend_tiles

    dtype = getattr(torch, dtype_name)
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m, block_n, stages = extend_tiles(block_d, dtype.itemsize)
    pointer = {torch.float32: "*fp32", torch.bfloat16: "*bf16"}[dtype]
    signature = {**{n: pointer for n in POINTERS}, **{n: "*i64" for n in INDEX_POINTERS}, "qk_scale": "fp32",
                 **{n: "i32" for n in STRIDES}, "stride_r2t": "i32"}
    constants = dict(GROUP=1, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, WINDOW=0,
                     CAP=0.0, **dot_flags(dtype), PDL=True)
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    source = ASTSource(fn=_extend_kernel, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": stages})
    return compiled.metadata.shared


@pytest.mark.parametrize("dtype_name,head_dim", [("float32", 576), ("bfloat16", 576)])
def test_wide_head_extend_tiles_fit_hopper_shared_memory(dtype_name, head_dim) -> None:
    """MLA's 576-wide latent rows: float32 asked for 260 KiB with the bf16 tiles."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run([sys.executable, __file__, dtype_name, str(head_dim)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) <= HOPPER_SHARED_BYTES


if __name__ == "__main__":
    print(shared_bytes(sys.argv[1], int(sys.argv[2])))
