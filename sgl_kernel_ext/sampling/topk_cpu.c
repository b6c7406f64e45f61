/* The k largest values of each row on CPU, float32, in descending order with their column
 * indices: the window the CPU sampler computes its top-k / top-p / min-p thresholds from
 * (sgl_kernel_ext/sampling/support.py). One pass over the row keeping the best k in a heap;
 * torch.topk costs ~3x more on a [1, 49152] row at k = 51.
 *
 * Order: NaN above every number (as torch's sorts put it), then larger values, then, among equal
 * values, the lower column. That is a total order, so the result is defined whatever the build:
 * the AVX2 and portable builds select the same elements (the AVX2 one only skips 8 columns at a
 * time when none of them can enter the heap).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__AVX2__) && !defined(PORTABLE_ONLY)
#include <immintrin.h>
#define TOPK_HAVE_AVX2 1
#endif

/* Whether (va, ia) ranks above (vb, ib). */
static inline int ranks_above(float va, int64_t ia, float vb, int64_t ib) {
    const int na = isnan(va), nb = isnan(vb);
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

/* The heap keeps the worst kept entry at its root. */
static void sift_down(float *vals, int64_t *idx, int64_t size, int64_t at) {
    for (;;) {
        int64_t worst = at;
        const int64_t left = 2 * at + 1, right = left + 1;
        if (left < size && ranks_above(vals[worst], idx[worst], vals[left], idx[left])) worst = left;
        if (right < size && ranks_above(vals[worst], idx[worst], vals[right], idx[right])) worst = right;
        if (worst == at) return;
        const float v = vals[at];
        const int64_t i = idx[at];
        vals[at] = vals[worst], idx[at] = idx[worst];
        vals[worst] = v, idx[worst] = i;
        at = worst;
    }
}

static inline void offer(float *vals, int64_t *idx, int64_t k, float v, int64_t i) {
    if (ranks_above(v, i, vals[0], idx[0])) {
        vals[0] = v, idx[0] = i;
        sift_down(vals, idx, k, 0);
    }
}

static void topk_row(const float *row, int64_t n, int64_t k, float *vals, int64_t *idx) {
    for (int64_t i = 0; i < k; i++) vals[i] = row[i], idx[i] = i;
    for (int64_t at = k / 2 - 1; at >= 0; at--) sift_down(vals, idx, k, at);
    int64_t i = k;
#ifdef TOPK_HAVE_AVX2
    /* A later column ties with the root only to rank below it: it must be strictly larger, or
     * NaN (when the root is not NaN), to enter. Blocks of 8 where none is are skipped. */
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(row + i);
        const __m256 enter = _mm256_or_ps(_mm256_cmp_ps(x, _mm256_set1_ps(vals[0]), _CMP_GT_OQ),
                                          _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        if (_mm256_movemask_ps(enter) == 0) continue;
        for (int j = 0; j < 8; j++) offer(vals, idx, k, row[i + j], i + j);
    }
#endif
    for (; i < n; i++) offer(vals, idx, k, row[i], i);
    /* Heap order to descending: take the worst off the end, k times. */
    for (int64_t size = k - 1; size > 0; size--) {
        const float v = vals[0];
        const int64_t j = idx[0];
        vals[0] = vals[size], idx[0] = idx[size];
        vals[size] = v, idx[size] = j;
        sift_down(vals, idx, size, 0);
    }
}

int topk_uses_avx2(void) {
#ifdef TOPK_HAVE_AVX2
    return 1;
#else
    return 0;
#endif
}

/* x: [rows, n] contiguous; vals: [rows, k] float32, idx: [rows, k] int64; 1 <= k <= n. */
void topk_f32(const float *x, int64_t rows, int64_t n, int64_t k, float *vals, int64_t *idx, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) topk_row(x + r * n, n, k, vals + r * k, idx + r * k);
}
