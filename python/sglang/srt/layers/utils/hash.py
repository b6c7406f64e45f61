"""Counter-based hash noise for seeded sampling: MurmurHash3 x86-32 of (seed, position, column).

Defined once, in plain torch, in sgl_kernel_ext.sampling.murmur_reference (the Triton kernels
hash the same bits in-kernel); this module keeps its documented public names importable here.
"""

from sgl_kernel_ext.sampling.murmur_reference import hash_gumbel, hash_uniform, murmur_hash32, murmur_hash32_scalar

__all__ = ["hash_gumbel", "hash_uniform", "murmur_hash32", "murmur_hash32_scalar"]
