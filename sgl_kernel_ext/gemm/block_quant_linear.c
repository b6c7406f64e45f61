/* y = x W^T (+ bias) for a weight stored as integer codes in blocks of 32 along the input dim,
 * W[n, k] = d[n, k / 32] * code[n, k] + m[n, k / 32], float32 activations and sums.
 *
 * These are the weights a GGUF Q4_1 (4-bit codes 0..15, d and m float16) or Q8_0 (8-bit codes
 * -128..127, m = 0) checkpoint dequantises to, exactly: d * code is exact in float32, so
 * fma(d, code, m) is the one rounding that dequantisation does too. Reading 4.5-8.5 bits per
 * weight instead of 32 is what makes a decode-sized batch (few rows) faster than a float32
 * matmul on a CPU whose weights stream from memory every step.
 *
 * Each output element sums over k in order, in one float32 chain, whatever the number of rows:
 * a row's result never depends on the other rows of the batch.
 *
 * Packed layout (block_quant_linear.py packs it): for each tile of 16 output columns, for each
 * block of 32 k: d[16] f32, m[16] f32, then the codes k-major, 16 columns per k (4-bit: two k
 * per byte row, k even in the low nibble; 8-bit: one signed byte each).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && !defined(PORTABLE_ONLY)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

#define TILE_N 16
#define BLOCK_K 32
#define ROWS 6 /* rows per register tile: 6 x 16 sums = 12 vector registers */
#define CHUNK_K 256 /* dequantised weights per tile and chunk: 16 KiB, stays in L1 */

static int64_t block_bytes(int bits) { return 2 * TILE_N * 4 + BLOCK_K * TILE_N * bits / 8; }

/* The weights of one tile for k in [k0, k0 + count), count a multiple of BLOCK_K, as w[k][16]. */
static void dequantize(const uint8_t *tile, int64_t k0, int64_t count, int bits, float *w) {
    const int64_t stride = block_bytes(bits);
    for (int64_t b = 0; b < count / BLOCK_K; b++) {
        const uint8_t *block = tile + (k0 / BLOCK_K + b) * stride;
        const float *d = (const float *)block, *m = d + TILE_N;
        const uint8_t *codes = block + 2 * TILE_N * 4;
        float *wb = w + b * BLOCK_K * TILE_N;
#ifdef HAVE_AVX2
        const __m256 d0 = _mm256_loadu_ps(d), d1 = _mm256_loadu_ps(d + 8);
        const __m256 m0 = _mm256_loadu_ps(m), m1 = _mm256_loadu_ps(m + 8);
        if (bits == 4) {
            const __m256i low = _mm256_set1_epi32(0x0F);
            for (int j = 0; j < BLOCK_K / 2; j++) {
                const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 16 * j)));
                const __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 16 * j + 8)));
                float *even = wb + 2 * j * TILE_N, *odd = even + TILE_N;
                _mm256_storeu_ps(even, _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(_mm256_and_si256(c0, low)), m0));
                _mm256_storeu_ps(even + 8, _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(_mm256_and_si256(c1, low)), m1));
                _mm256_storeu_ps(odd, _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 4)), m0));
                _mm256_storeu_ps(odd + 8, _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 4)), m1));
            }
        } else {
            for (int k = 0; k < BLOCK_K; k++) {
                const __m256i c0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 16 * k)));
                const __m256i c1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 16 * k + 8)));
                _mm256_storeu_ps(wb + k * TILE_N, _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(c0), m0));
                _mm256_storeu_ps(wb + k * TILE_N + 8, _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(c1), m1));
            }
        }
#else
        for (int k = 0; k < BLOCK_K; k++)
            for (int c = 0; c < TILE_N; c++) {
                const int code = bits == 4 ? (codes[(k / 2) * TILE_N + c] >> (4 * (k % 2))) & 0x0F
                                           : (int8_t)codes[k * TILE_N + c];
                wb[k * TILE_N + c] = fmaf(d[c], (float)code, m[c]);
            }
#endif
    }
}

/* acc[r][0:16] += sum over k < count of xt[k][r] * w[k][0:16] for ROWS rows; xt rows are
 * rows_padded apart. */
static void tile_rows(const float *xt, int64_t rows_padded, const float *w, int64_t count, float *acc) {
#ifdef HAVE_AVX2
    __m256 a[ROWS][2];
    for (int r = 0; r < ROWS; r++) a[r][0] = _mm256_loadu_ps(acc + r * TILE_N), a[r][1] = _mm256_loadu_ps(acc + r * TILE_N + 8);
    for (int64_t k = 0; k < count; k++, xt += rows_padded) {
        const __m256 w0 = _mm256_loadu_ps(w + k * TILE_N), w1 = _mm256_loadu_ps(w + k * TILE_N + 8);
        for (int r = 0; r < ROWS; r++) {
            const __m256 x = _mm256_broadcast_ss(xt + r);
            a[r][0] = _mm256_fmadd_ps(x, w0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(x, w1, a[r][1]);
        }
    }
    for (int r = 0; r < ROWS; r++) _mm256_storeu_ps(acc + r * TILE_N, a[r][0]), _mm256_storeu_ps(acc + r * TILE_N + 8, a[r][1]);
#else
    for (int64_t k = 0; k < count; k++, xt += rows_padded)
        for (int r = 0; r < ROWS; r++)
            for (int c = 0; c < TILE_N; c++) acc[r * TILE_N + c] = fmaf(xt[r], w[k * TILE_N + c], acc[r * TILE_N + c]);
#endif
}

/* ---- decode-sized batches (GEMV_MAX_ROWS rows at most) ----
 * Bound by reading the weights once: each block is dequantised in registers and multiplied into
 * every row at once, x is read where it lies, nothing is allocated. Every output is still one
 * fma chain over k in order from 0, exactly as tile_rows sums it, so a row's result is the same
 * bits as on the buffered path and independent of the batch. */
#define GEMV_MAX_ROWS 4

#ifdef HAVE_AVX2
/* acc[r][0:16] += x[r][k] * w[0:16] for ROWS_ rows, w = the two vectors of one k. */
#define GEMV_FMA(ROWS_, xk, w0, w1, acc)                                   \
    for (int r = 0; r < (ROWS_); r++) {                                    \
        const __m256 xr = _mm256_broadcast_ss((xk) + r * in);             \
        acc[r][0] = _mm256_fmadd_ps(xr, w0, acc[r][0]);                    \
        acc[r][1] = _mm256_fmadd_ps(xr, w1, acc[r][1]);                    \
    }

/* The 16 outputs of one tile for `rows_` rows; inlined per row count so acc stays in registers. */
static inline __attribute__((always_inline)) void gemv_tile(const uint8_t *tile, int bits, const float *x, int64_t in,
                                                            const int rows_, __m256 acc[GEMV_MAX_ROWS][2]) {
    const int64_t stride = block_bytes(bits);
    const __m256i low = _mm256_set1_epi32(0x0F);
    for (int r = 0; r < rows_; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < in / BLOCK_K; b++) {
        const uint8_t *block = tile + b * stride, *codes = block + 2 * TILE_N * 4;
        const float *d = (const float *)block, *m = d + TILE_N, *xb = x + b * BLOCK_K;
        const __m256 d0 = _mm256_loadu_ps(d), d1 = _mm256_loadu_ps(d + 8);
        const __m256 m0 = _mm256_loadu_ps(m), m1 = _mm256_loadu_ps(m + 8);
        if (bits == 4) {
            for (int j = 0; j < BLOCK_K / 2; j++) {
                const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 16 * j)));
                const __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 16 * j + 8)));
                const __m256 e0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(_mm256_and_si256(c0, low)), m0);
                const __m256 e1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(_mm256_and_si256(c1, low)), m1);
                const __m256 o0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 4)), m0);
                const __m256 o1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 4)), m1);
                GEMV_FMA(rows_, xb + 2 * j, e0, e1, acc)
                GEMV_FMA(rows_, xb + 2 * j + 1, o0, o1, acc)
            }
        } else {
            for (int k = 0; k < BLOCK_K; k++) {
                const __m256i c0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 16 * k)));
                const __m256i c1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 16 * k + 8)));
                const __m256 w0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(c0), m0);
                const __m256 w1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(c1), m1);
                GEMV_FMA(rows_, xb + k, w0, w1, acc)
            }
        }
    }
}

static void gemv_tile_rows(const uint8_t *tile, int bits, const float *x, int64_t rows, int64_t in, const float *bias,
                           float *out, int64_t out_features) {
    __m256 acc[GEMV_MAX_ROWS][2];
    switch (rows) {
    case 1: gemv_tile(tile, bits, x, in, 1, acc); break;
    case 2: gemv_tile(tile, bits, x, in, 2, acc); break;
    case 3: gemv_tile(tile, bits, x, in, 3, acc); break;
    default: gemv_tile(tile, bits, x, in, 4, acc); break;
    }
    /* + 0 without a bias, as the buffered path does (it turns -0 into +0). */
    const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps(), b1 = bias ? _mm256_loadu_ps(bias + 8) : b0;
    for (int64_t r = 0; r < rows; r++) {
        _mm256_storeu_ps(out + r * out_features, _mm256_add_ps(acc[r][0], b0));
        _mm256_storeu_ps(out + r * out_features + 8, _mm256_add_ps(acc[r][1], b1));
    }
}
#else
static void gemv_tile_rows(const uint8_t *tile, int bits, const float *x, int64_t rows, int64_t in, const float *bias,
                           float *out, int64_t out_features) {
    const int64_t stride = block_bytes(bits);
    float acc[GEMV_MAX_ROWS][TILE_N] = {{0.0f}};
    for (int64_t b = 0; b < in / BLOCK_K; b++) {
        const uint8_t *block = tile + b * stride, *codes = block + 2 * TILE_N * 4;
        const float *d = (const float *)block, *m = d + TILE_N;
        for (int k = 0; k < BLOCK_K; k++)
            for (int c = 0; c < TILE_N; c++) {
                const int code = bits == 4 ? (codes[(k / 2) * TILE_N + c] >> (4 * (k % 2))) & 0x0F
                                           : (int8_t)codes[k * TILE_N + c];
                const float w = fmaf(d[c], (float)code, m[c]);
                for (int64_t r = 0; r < rows; r++) acc[r][c] = fmaf(x[r * in + b * BLOCK_K + k], w, acc[r][c]);
            }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < TILE_N; c++) out[r * out_features + c] = acc[r][c] + (bias ? bias[c] : 0.0f);
}
#endif

static void gemv(const float *x, int64_t rows, int64_t in, const uint8_t *packed, int bits, int64_t out_features,
                 const float *bias, float *out, int num_threads) {
    const int64_t tiles = out_features / TILE_N, tile_bytes = in / BLOCK_K * block_bytes(bits);
    /* The two cores split the output tiles; one barrier, the region's end. */
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < tiles; t++)
        gemv_tile_rows(packed + t * tile_bytes, bits, x, rows, in, bias ? bias + t * TILE_N : NULL, out + t * TILE_N,
                       out_features);
}

/* x: [rows, in] contiguous; out: [rows, out] contiguous; bias: [out] or NULL. in a multiple of
 * 32, out of 16. Returns 0, or 1 if a buffer could not be allocated. */
int block_quant_linear_f32(const float *x, int64_t rows, int64_t in, const uint8_t *packed, int bits, int64_t out_features,
                           const float *bias, float *out, int num_threads) {
    if (rows <= GEMV_MAX_ROWS) {
        gemv(x, rows, in, packed, bits, out_features, bias, out, num_threads);
        return 0;
    }
    const int64_t rows_padded = (rows + ROWS - 1) / ROWS * ROWS, tiles = out_features / TILE_N;
    const int64_t tile_bytes = in / BLOCK_K * block_bytes(bits);
    /* x transposed to [in][rows_padded], zero rows padding the last register tile; on this
     * thread, so that the parallel region has a single barrier (its end): a barrier costs a
     * futex wake-up whenever the cores are oversubscribed. */
    float *xt = malloc(sizeof(float) * in * rows_padded);
    if (xt == NULL) return 1;
    for (int64_t k = 0; k < in; k++)
        for (int64_t r = 0; r < rows_padded; r++) xt[k * rows_padded + r] = r < rows ? x[r * in + k] : 0.0f;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(+ : failed)
    {
        float *w = malloc(sizeof(float) * CHUNK_K * TILE_N);
        float *acc = malloc(sizeof(float) * rows_padded * TILE_N);
        failed += w == NULL || acc == NULL;
#pragma omp for schedule(static) nowait
        for (int64_t t = 0; t < tiles; t++) {
            if (w == NULL || acc == NULL) continue;
            memset(acc, 0, sizeof(float) * rows_padded * TILE_N);
            for (int64_t k0 = 0; k0 < in; k0 += CHUNK_K) {
                const int64_t count = in - k0 < CHUNK_K ? in - k0 : CHUNK_K;
                dequantize(packed + t * tile_bytes, k0, count, bits, w);
                for (int64_t r0 = 0; r0 < rows_padded; r0 += ROWS)
                    tile_rows(xt + k0 * rows_padded + r0, rows_padded, w, count, acc + r0 * TILE_N);
            }
            for (int64_t r = 0; r < rows; r++)
                for (int c = 0; c < TILE_N; c++)
                    out[r * out_features + t * TILE_N + c] = acc[r * TILE_N + c] + (bias ? bias[t * TILE_N + c] : 0.0f);
        }
        free(w);
        free(acc);
    }
    free(xt);
    return failed ? 1 : 0;
}
