import math
import random

import pytest
import torch

from sgl_kernel_ext.sampling import murmur_reference as hash_mod  # the one torch definition
from sglang.srt.layers.utils.hash import (
    hash_gumbel,
    hash_uniform,
    murmur_hash32,
    murmur_hash32_scalar,
)

MASK = 0xFFFFFFFF
KNOWN_ALL_ONES = [(7847, 12345, 1208), (6469398791980356130, 7371, 248146)]


def _tensors(seeds, positions, cols):
    return torch.tensor(seeds), torch.tensor(positions), torch.tensor(cols)


@pytest.mark.parametrize("seed,position,column", KNOWN_ALL_ONES)
def test_known_vectors_scalar(seed, position, column):
    assert murmur_hash32_scalar(seed, position, column) == 0xFFFFFFFF


@pytest.mark.parametrize("seed,position,column", KNOWN_ALL_ONES)
def test_known_vectors_tensor(seed, position, column):
    h = murmur_hash32(*_tensors([seed], [position], [column]))
    assert h.tolist() == [[0xFFFFFFFF]]


def test_matches_scalar_reference_on_random_inputs():
    rng = random.Random(1234)
    seeds = [rng.randint(-(2**63), 2**63 - 1) for _ in range(7)] + [-1, 0, 2**63 - 1, -(2**63)]
    positions = [rng.choice([rng.randint(0, 5000), rng.randint(2**32, 2**40)]) for _ in seeds]
    cols = list(range(40)) + [rng.randint(0, 2**40) for _ in range(40)] + [MASK, 2**32]
    h = murmur_hash32(*_tensors(seeds, positions, cols))
    expected = [[murmur_hash32_scalar(s, p, c) for c in cols] for s, p in zip(seeds, positions)]
    assert h.tolist() == expected


def test_negative_seed_is_its_uint64_bits():
    assert murmur_hash32_scalar(-1, 3, 4) == murmur_hash32_scalar(2**64 - 1, 3, 4)
    h = murmur_hash32(*_tensors([-1, -12345], [3, 3], [4]))
    assert h[:, 0].tolist() == [
        murmur_hash32_scalar(2**64 - 1, 3, 4),
        murmur_hash32_scalar(2**64 - 12345, 3, 4),
    ]


def test_positions_and_columns_wrap_mod_2_32():
    h = murmur_hash32(*_tensors([5, 5], [7, 7 + 2**32], [9, 9 + 2**32]))
    assert h[0, 0] == h[0, 1] == h[1, 0] == h[1, 1]


def test_shape_dtype_and_range():
    seed = torch.randint(-(2**62), 2**62, (5,))
    h = murmur_hash32(seed, torch.arange(5, dtype=torch.int32), torch.arange(1000))
    assert h.shape == (5, 1000) and h.dtype == torch.int64
    assert int(h.min()) >= 0 and int(h.max()) <= MASK
    for f in (hash_uniform, hash_gumbel):
        out = f(seed, torch.arange(5), torch.arange(1000))
        assert out.shape == (5, 1000) and out.dtype == torch.float64


def test_empty_inputs():
    assert murmur_hash32(*_tensors([], [], [1, 2])).shape == (0, 2)
    assert hash_gumbel(*_tensors([1], [2], [])).shape == (1, 0)


@pytest.mark.parametrize(
    "seed,positions,cols",
    [
        (torch.zeros(2, 2, dtype=torch.int64), torch.zeros(2, 2, dtype=torch.int64), torch.arange(3)),
        (torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), torch.arange(3)),
        (torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), torch.zeros(3, 2)),
        (torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), torch.zeros(2, 2, 2)),
    ],
)
def test_shape_assertions(seed, positions, cols):
    for f in (murmur_hash32, hash_uniform, hash_gumbel):
        with pytest.raises(AssertionError):
            f(seed, positions, cols)


def test_sglang_path_reexports_the_one_definition():
    import sglang.srt.layers.utils.hash as sglang_hash

    for name in ("murmur_hash32", "murmur_hash32_scalar", "hash_uniform", "hash_gumbel"):
        assert getattr(sglang_hash, name) is getattr(hash_mod, name)


def test_row_chunking_is_invisible(monkeypatch):
    seed = torch.randint(-(2**62), 2**62, (11,))
    positions = torch.randint(0, 10**6, (11,))
    cols = torch.arange(997)
    whole = (murmur_hash32(seed, positions, cols), hash_gumbel(seed, positions, cols))
    per_row = torch.randint(0, 2**40, (11, 50))
    whole_per_row = murmur_hash32(seed, positions, per_row)
    monkeypatch.setattr(hash_mod, "_CPU_CHUNK_ELEMENTS", 3 * 997)  # 4 chunks, last one short
    chunked = (murmur_hash32(seed, positions, cols), hash_gumbel(seed, positions, cols))
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])
    monkeypatch.setattr(hash_mod, "_CPU_CHUNK_ELEMENTS", 3 * 50)
    assert torch.equal(whole_per_row, murmur_hash32(seed, positions, per_row))


def test_per_row_columns_match_shared_columns():
    seed = torch.tensor([5, -6, 7])
    positions = torch.tensor([1, 2, 2**33])
    per_row = torch.tensor([[0, 9, 4], [2**32 + 1, 3, 3], [8, 7, 6]])  # [3, 3]
    h = murmur_hash32(seed, positions, per_row)
    shared = murmur_hash32(seed, positions, per_row.flatten())  # [3, 9]
    assert torch.equal(h, shared.gather(1, torch.arange(9).view(3, 3)))
    shared_gumbel = hash_gumbel(seed, positions, per_row.flatten()).gather(1, torch.arange(9).view(3, 3))
    assert torch.equal(hash_gumbel(seed, positions, per_row), shared_gumbel)


def test_rows_are_independent_of_batch_mates():
    seed, positions, cols = _tensors([11, 22, 33], [100, 200, 300], list(range(64)))
    batch = murmur_hash32(seed, positions, cols)
    alone = murmur_hash32(seed[1:2], positions[1:2], cols)
    assert torch.equal(batch[1:2], alone)


def test_uniform_is_hash_over_uint32_max():
    seed, positions, cols = _tensors([3, -4], [10, 20], list(range(100)))
    u = hash_uniform(seed, positions, cols)
    h = murmur_hash32(seed, positions, cols)
    assert torch.equal(u, h.to(torch.float64) / (2**32 - 1))
    assert hash_uniform(*_tensors([7847], [12345], [1208])).item() == 1.0


def test_gumbel_matches_formula():
    seed, positions, cols = _tensors([3, -4], [10, 20], list(range(100)))
    u = hash_uniform(seed, positions, cols)
    g = hash_gumbel(seed, positions, cols)
    expected = [-math.log(-math.log(x)) for x in u.flatten().tolist()]
    assert g.flatten().tolist() == pytest.approx(expected, rel=1e-12)


def test_gumbel_finite_at_u_equal_one():
    g = hash_gumbel(*_tensors([7847], [12345], [1208])).item()
    assert g == pytest.approx(32 * math.log(2))  # -log(2**-32) ~ 22.18


# The column whose hash is 0 for a given row, found by running MurmurHash3 backwards;
# it lets the test reach u = 0 through the public API.


def _rotl(x, r):
    return ((x << r) | (x >> (32 - r))) & MASK


def _rotr(x, r):
    return _rotl(x, 32 - r)


def _inv(c):
    return pow(c, -1, 2**32)


def _row_state(seed, position):
    seed &= 2**64 - 1
    h = 0
    for k in (seed & MASK, seed >> 32, position & MASK):
        k = (_rotl((k * 0xCC9E2D51) & MASK, 15) * 0x1B873593) & MASK
        h = (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & MASK
    return h


def _column_with_hash(seed, position, target):
    h = target
    h ^= h >> 16
    h = (h * _inv(0xC2B2AE35)) & MASK
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * _inv(0x85EBCA6B)) & MASK
    h ^= h >> 16
    h ^= 16
    k = _rotr(((h - 0xE6546B64) * _inv(5)) & MASK, 13) ^ _row_state(seed, position)
    return (_rotr((k * _inv(0x1B873593)) & MASK, 15) * _inv(0xCC9E2D51)) & MASK


def test_inverse_helper_reproduces_known_vector():
    assert _column_with_hash(7847, 12345, 0xFFFFFFFF) == 1208


def test_gumbel_finite_at_u_equal_zero():
    col = _column_with_hash(42, 7, 0)
    assert murmur_hash32_scalar(42, 7, col) == 0
    g = hash_gumbel(*_tensors([42], [7], [col])).item()
    assert math.isfinite(g)
    assert g == pytest.approx(-math.log(torch.finfo(torch.float64).max))  # ~ -709.78


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(0)
    seed = torch.randint(-(2**62), 2**62, (8,), generator=gen)
    positions = torch.randint(0, 2**40, (8,), generator=gen)
    cols = torch.arange(5000)
    cpu = murmur_hash32(seed, positions, cols)
    gpu = murmur_hash32(seed.cuda(), positions.cuda(), cols.cuda())
    assert torch.equal(cpu, gpu.cpu())
    gpu_gumbel = hash_gumbel(seed.cuda(), positions.cuda(), cols.cuda()).cpu()
    # -log(-log u) crosses 0: there a last-bit difference of the logs is large relative to g.
    assert torch.allclose(hash_gumbel(seed, positions, cols), gpu_gumbel, rtol=1e-12, atol=1e-12)
