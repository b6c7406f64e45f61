/* y = x W^T (+ bias) with x quantised to 8 bits per block of 32 (opt-in: --cpu-int8-activations).
 *
 * W is the same integer blocks as block_quant_linear.c reads (GGUF Q4_1: 4-bit codes c with
 * W = d c + m; Q8_0: signed 8-bit codes, m = 0), d and m float16. Each row of x is cut into blocks
 * of 32 and quantised as llama.cpp does for its integer dot products: dx = max|x| / 127,
 * q = round(x / dx) (to even), sx = dx * sum(q). A block's contribution to one output is then
 *     (d dx) * sum(c q) + m sx,
 * the integer sum exact in int32, i.e. x rounded to 8 bits times the exact weights. The integer
 * sums are what makes this ~2x cheaper than dequantising every weight to float32; the price is
 * the activations' rounding (docs/cpu_kernels.md measures it against the exact kernel).
 *
 * Each output is one float32 chain over the blocks in order, the same arithmetic in the AVX2 and
 * the portable build, so both give the same bits, and a row's result never depends on its batch.
 *
 * Packed layout (block_quant_linear.py packs it): for each tile of 8 output columns, for each
 * block of 32 k: d[8] float16, (4-bit only) m[8] float16, then the codes by group of 4 k
 * (k = 4g .. 4g + 3), each group column-major, a column's 4 k together: 8-bit, 32 signed bytes
 * (byte 4c + i: column c, k = 4g + i); 4-bit, 16 bytes whose low nibbles are columns 0-3 and
 * high nibbles columns 4-7 (byte 4c + i: columns c and c + 4, k = 4g + i).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(PORTABLE_ONLY)
#include <immintrin.h>
#define Q8_HAVE_AVX2 1
#endif

#define Q8_TILE_N 8
#define Q8_BLOCK_K 32
#define Q8_ROWS 4 /* rows whose sums stay in registers while a tile's blocks stream by */

static int64_t q8_block_bytes(int bits) {
    return Q8_TILE_N * 2 * (bits == 4 ? 2 : 1) + Q8_TILE_N * Q8_BLOCK_K * bits / 8;
}

/* Activations of one row, quantised per block: q [in], dx and sx [in / 32]. Both builds give the
 * same values: max and the integer sum are exact, x / d rounds once, the conversion rounds to even
 * as nearbyintf does, and q is clamped to [-127, 127] (x / d can pass 127 when d rounded down, as
 * it does for subnormal blocks). A block holding NaN or +-inf gets dx = NaN, so that the outputs
 * it feeds are NaN as the exact kernel's would be, and the sampler flags the row. */
static void quantize_row(const float *x, int64_t in, int8_t *q, float *dx, float *sx) {
    for (int64_t b = 0; b < in / Q8_BLOCK_K; b++) {
        const float *xb = x + b * Q8_BLOCK_K;
        int8_t *qb = q + b * Q8_BLOCK_K;
        int sum = 0;
#ifdef Q8_HAVE_AVX2
        const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
        const __m256 inf = _mm256_set1_ps(INFINITY);
        __m256 v[4], m = _mm256_setzero_ps();
        int not_finite = 0;
        for (int i = 0; i < 4; i++) {
            const __m256 a = _mm256_and_ps(v[i] = _mm256_loadu_ps(xb + 8 * i), magnitude);
            not_finite |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); /* |x| >= inf, or NaN */
            m = _mm256_max_ps(m, a);
        }
        m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
        m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4E));
        m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xB1));
        const float d = not_finite ? NAN : _mm256_cvtss_f32(m) / 127.0f;
        if (d > 0.0f) {
            const __m256 dv = _mm256_set1_ps(d);
            const __m256i high = _mm256_set1_epi32(127), low = _mm256_set1_epi32(-127);
            __m256i i32[4];
            for (int i = 0; i < 4; i++)
                i32[i] = _mm256_max_epi32(low, _mm256_min_epi32(high, _mm256_cvtps_epi32(_mm256_div_ps(v[i], dv))));
            /* pack to bytes: the packs interleave 128-bit lanes, the permute restores k order */
            const __m256i i16 = _mm256_packs_epi32(i32[0], i32[1]), j16 = _mm256_packs_epi32(i32[2], i32[3]);
            const __m256i i8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16, j16), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)qb, i8);
            const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
            const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
        } else {
            memset(qb, 0, Q8_BLOCK_K);
        }
#else
        float amax = 0.0f;
        int not_finite = 0;
        for (int k = 0; k < Q8_BLOCK_K; k++) {
            const float a = fabsf(xb[k]);
            not_finite |= !(a < INFINITY);
            amax = a > amax ? a : amax;
        }
        const float d = not_finite ? NAN : amax / 127.0f;
        for (int k = 0; k < Q8_BLOCK_K; k++) {
            float v = d > 0.0f ? nearbyintf(xb[k] / d) : 0.0f;
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            qb[k] = (int8_t)v;
            sum += (int)v;
        }
#endif
        dx[b] = d;
        sx[b] = d * (float)sum;
    }
}

/* 1 where this build multiplies with AVX2 (the tests check that the native build does). */
int block_quant_linear_q8_uses_avx2(void) {
#ifdef Q8_HAVE_AVX2
    return 1;
#else
    return 0;
#endif
}

/* Code of column c (0..7), k (0..31) in a block's codes (see the layout above). */
static inline int q8_code(const uint8_t *codes, int bits, int c, int k) {
    const int group = k / 4, at = k % 4;
    if (bits == 8) return (int8_t)codes[32 * group + 4 * c + at];
    const uint8_t byte = codes[16 * group + 4 * (c % 4) + at];
    return c < 4 ? byte & 0x0F : byte >> 4;
}

#ifdef Q8_HAVE_AVX2
/* x's 4 bytes at p in every 32-bit lane. */
static inline __m256i q8_broadcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* acc[r] (the 8 columns) += this tile's blocks against rows_ rows of quantised x. Lane c of every
 * integer vector is column c: each byte quad holds one column's 4 consecutive k, against x's 4 k
 * broadcast, so a block's 8 sums come out in one vector with no horizontal adds. */
static inline __attribute__((always_inline)) void q8_tile(const uint8_t *tile, int bits, const int8_t *q,
                                                          const float *dx, const float *sx, int64_t in,
                                                          const int rows_, __m256 acc[Q8_ROWS]) {
    const int64_t stride = q8_block_bytes(bits), blocks = in / Q8_BLOCK_K;
    const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
    const __m256i nibble_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4); /* lane 1: columns 4..7's high nibbles */
    for (int r = 0; r < rows_; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = tile + b * stride;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)block));
        __m256i w[Q8_BLOCK_K / 4]; /* per group of 4 k: unsigned magnitudes of the codes */
        __m256i sign[Q8_BLOCK_K / 4]; /* 8-bit: the codes themselves, whose signs go onto x */
        if (bits == 4) {
            const uint8_t *codes = block + 2 * Q8_TILE_N * 2;
            for (int g = 0; g < Q8_BLOCK_K / 4; g++) {
                const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(codes + 16 * g)));
                w[g] = _mm256_and_si256(_mm256_srlv_epi32(v, nibble_shift), low);
            }
        } else {
            const uint8_t *codes = block + Q8_TILE_N * 2;
            for (int g = 0; g < Q8_BLOCK_K / 4; g++) {
                sign[g] = _mm256_loadu_si256((const __m256i *)(codes + 32 * g));
                w[g] = _mm256_sign_epi8(sign[g], sign[g]);
            }
        }
        const __m256 m = bits == 4 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 16))) : d;
        for (int r = 0; r < rows_; r++) {
            const int8_t *x = q + r * in + b * Q8_BLOCK_K;
            __m256i dots;
            if (bits == 4) {
                /* 15 x 127 x 2 per product pair, 8 groups: 30480 fits int16. */
                __m256i pairs = _mm256_setzero_si256();
                for (int g = 0; g < Q8_BLOCK_K / 4; g++) {
                    const __m256i xg = q8_broadcast4(x + 4 * g);
                    pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[g], xg));
                }
                dots = _mm256_madd_epi16(pairs, ones);
            } else {
                dots = _mm256_setzero_si256();
                for (int g = 0; g < Q8_BLOCK_K / 4; g++) {
                    const __m256i xg = _mm256_sign_epi8(q8_broadcast4(x + 4 * g), sign[g]);
                    dots = _mm256_add_epi32(dots, _mm256_madd_epi16(_mm256_maddubs_epi16(w[g], xg), ones));
                }
            }
            const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(dx[r * blocks + b]));
            acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dots), acc[r]);
            if (bits == 4) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx[r * blocks + b]), acc[r]);
        }
    }
}

static void q8_tile_rows(const uint8_t *tile, int bits, const int8_t *q, const float *dx, const float *sx,
                         int64_t rows, int64_t in, const float *bias, float *out, int64_t out_features) {
    __m256 acc[Q8_ROWS];
    switch (rows) {
    case 1: q8_tile(tile, bits, q, dx, sx, in, 1, acc); break;
    case 2: q8_tile(tile, bits, q, dx, sx, in, 2, acc); break;
    case 3: q8_tile(tile, bits, q, dx, sx, in, 3, acc); break;
    default: q8_tile(tile, bits, q, dx, sx, in, 4, acc); break;
    }
    const __m256 add = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; r++) _mm256_storeu_ps(out + r * out_features, _mm256_add_ps(acc[r], add));
}
#else
/* float16 -> float32, exactly (as F16C's conversion). */
static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    float magnitude;
    if (exponent == 0) {
        magnitude = ldexpf((float)mantissa, -24);
    } else if (exponent == 31) {
        magnitude = mantissa ? NAN : INFINITY;
    } else {
        magnitude = ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
    }
    uint32_t bits;
    memcpy(&bits, &magnitude, 4);
    bits |= sign;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

static void q8_tile_rows(const uint8_t *tile, int bits, const int8_t *q, const float *dx, const float *sx,
                         int64_t rows, int64_t in, const float *bias, float *out, int64_t out_features) {
    const int64_t stride = q8_block_bytes(bits), blocks = in / Q8_BLOCK_K;
    float acc[Q8_ROWS][Q8_TILE_N] = {{0.0f}};
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = tile + b * stride;
        const uint8_t *codes = block + Q8_TILE_N * 2 * (bits == 4 ? 2 : 1);
        for (int c = 0; c < Q8_TILE_N; c++) {
            uint16_t d_half, m_half = 0;
            memcpy(&d_half, block + 2 * c, 2);
            if (bits == 4) memcpy(&m_half, block + 16 + 2 * c, 2);
            const float d = half_to_float(d_half), m = half_to_float(m_half);
            for (int64_t r = 0; r < rows; r++) {
                const int8_t *x = q + r * in + b * Q8_BLOCK_K;
                int32_t dot = 0;
                for (int k = 0; k < Q8_BLOCK_K; k++) dot += q8_code(codes, bits, c, k) * x[k];
                acc[r][c] = fmaf(d * dx[r * blocks + b], (float)dot, acc[r][c]);
                if (bits == 4) acc[r][c] = fmaf(m, sx[r * blocks + b], acc[r][c]);
            }
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < Q8_TILE_N; c++) out[r * out_features + c] = acc[r][c] + (bias ? bias[c] : 0.0f);
}
#endif

/* x: [rows, in] contiguous; out: [rows, out] contiguous; bias: [out] or NULL. in a multiple of
 * 32, out of 8. Returns 0, or 1 if the quantised activations could not be allocated. */
int block_quant_linear_q8_f32(const float *x, int64_t rows, int64_t in, const uint8_t *packed, int bits,
                              int64_t out_features, const float *bias, float *out, int num_threads) {
    const int64_t blocks = in / Q8_BLOCK_K, tiles = out_features / Q8_TILE_N;
    const int64_t tile_bytes = blocks * q8_block_bytes(bits);
    /* Quantised once on this thread: a few KB, read by every tile. */
    int8_t *q = malloc((size_t)(rows * in));
    float *scales = malloc(sizeof(float) * 2 * rows * blocks);
    if (q == NULL || scales == NULL) {
        free(q);
        free(scales);
        return 1;
    }
    float *dx = scales, *sx = scales + rows * blocks;
    for (int64_t r = 0; r < rows; r++) quantize_row(x + r * in, in, q + r * in, dx + r * blocks, sx + r * blocks);
    /* The cores split the output tiles; a tile's weights (a few KB) stay in L1 while its row
     * groups take turns. One barrier: the region's end. */
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t r0 = 0; r0 < rows; r0 += Q8_ROWS)
            q8_tile_rows(packed + t * tile_bytes, bits, q + r0 * in, dx + r0 * blocks, sx + r0 * blocks,
                         rows - r0 < Q8_ROWS ? rows - r0 : Q8_ROWS, in, bias ? bias + t * Q8_TILE_N : NULL,
                         out + r0 * out_features + t * Q8_TILE_N, out_features);
    free(q);
    free(scales);
    return 0;
}
