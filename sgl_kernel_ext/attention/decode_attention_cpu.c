/* Decode attention over the paged KV cache, read in place (no gather), float32.
 *
 * A task is one request and a range of its KV heads: each query head scores every position of
 * the request against the K row in that position's KV slot, takes a softmax over the request's
 * own length and sums the V rows. The order of every reduction depends only on the request,
 * never on its batch-mates.
 *
 * Built at run time by sgl_kernel_ext/cpu_build.py with the machine's C compiler: AVX2/FMA code
 * where the compiler targets it and head_dim is a multiple of 8, portable C otherwise (also
 * built by the tests with -DPORTABLE_ONLY).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && !defined(PORTABLE_ONLY)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

/* Slots are wherever the allocator put each token, so rows are fetched this many positions
 * ahead; without it every row costs a full memory latency. */
#define PREFETCH 8
/* Positions whose V rows one pass adds into a query head's running sums, held in registers. */
#define TOKEN_BLOCK 16

static inline void prefetch(const float *from, int64_t n) {
    for (int64_t i = 0; i < n; i += 64 / sizeof(float)) __builtin_prefetch(from + i);
}

/* ---- portable: 8 independent lanes, so the compiler may vectorise without reassociating ---- */

static float dot_portable(const float *a, const float *b, int64_t n) {
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7])) + tail;
}

static void weighted_rows_portable(float *acc, const float *p, const float *const *rows, int64_t count,
                                   int64_t offset, int64_t n) {
    for (int64_t r = 0; r < count; r++)
        for (int64_t i = 0; i < n; i++) acc[i] += p[r] * rows[r][offset + i];
}

/* ---- AVX2 + FMA ---- */

#ifdef HAVE_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* n a multiple of 8. */
static inline float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        even = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), even);
        odd = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), odd);
    }
    if (i < n) even = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), even);
    return hsum8(_mm256_add_ps(even, odd));
}

/* acc[0:64] += sum over rows r of p[r] * rows[r][offset:offset + 64], the sums in registers. */
static inline void weighted_rows64_avx2(float *acc, const float *p, const float *const *rows, int64_t count,
                                        int64_t offset) {
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8), a2 = _mm256_loadu_ps(acc + 16),
           a3 = _mm256_loadu_ps(acc + 24), a4 = _mm256_loadu_ps(acc + 32), a5 = _mm256_loadu_ps(acc + 40),
           a6 = _mm256_loadu_ps(acc + 48), a7 = _mm256_loadu_ps(acc + 56);
    for (int64_t r = 0; r < count; r++) {
        const __m256 w = _mm256_broadcast_ss(p + r);
        const float *x = rows[r] + offset;
        a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x), a0);
        a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 8), a1);
        a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 16), a2);
        a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 24), a3);
        a4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 32), a4);
        a5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 40), a5);
        a6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 48), a6);
        a7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 56), a7);
    }
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + 8, a1), _mm256_storeu_ps(acc + 16, a2);
    _mm256_storeu_ps(acc + 24, a3), _mm256_storeu_ps(acc + 32, a4), _mm256_storeu_ps(acc + 40, a5);
    _mm256_storeu_ps(acc + 48, a6), _mm256_storeu_ps(acc + 56, a7);
}

/* n a multiple of 8: 64 columns at a time, then 8 at a time. */
static void weighted_rows_avx2(float *acc, const float *p, const float *const *rows, int64_t count,
                               int64_t offset, int64_t n) {
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) weighted_rows64_avx2(acc + i, p, rows, count, offset + i);
    for (; i < n; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i);
        for (int64_t r = 0; r < count; r++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r), _mm256_loadu_ps(rows[r] + offset + i), a);
        _mm256_storeu_ps(acc + i, a);
    }
}
#endif

static inline float dot(const float *a, const float *b, int64_t n) {
#ifdef HAVE_AVX2
    if (n % 8 == 0) return dot_avx2(a, b, n);
#endif
    return dot_portable(a, b, n);
}

static inline void weighted_rows(float *acc, const float *p, const float *const *rows, int64_t count,
                                 int64_t offset, int64_t n) {
#ifdef HAVE_AVX2
    if (n % 8 == 0) {
        weighted_rows_avx2(acc, p, rows, count, offset, n);
        return;
    }
#endif
    weighted_rows_portable(acc, p, rows, count, offset, n);
}

/* Turns the scores of one query head into softmax weights, in place. */
static void softmax(float *s, int64_t len) {
    float m = -INFINITY;
    for (int64_t t = 0; t < len; t++) m = s[t] > m ? s[t] : m;
    float sum = 0.0f;
    for (int64_t t = 0; t < len; t++) {
        s[t] = expf(s[t] - m);
        sum += s[t];
    }
    const float inv = 1.0f / sum;
    for (int64_t t = 0; t < len; t++) s[t] *= inv;
}

/* What attend reports, as bits so that the tasks' reports combine with |. */
#define TASK_NO_MEMORY 1
#define TASK_BAD_SLOT 2

/* KV heads [h0, h1) of one request; q and out point at the request's row; slots and len are the
 * positions it attends to. They are checked against the cache's rows before any is read. With
 * cap > 0 every scaled score s becomes cap * tanh(s / cap) before the softmax. */
static int attend(const float *q, const float *k_buf, const float *v_buf, const int64_t *slots, int64_t len,
                  int64_t cache_rows, int64_t h0, int64_t h1, int64_t num_kv_heads, int64_t group, int64_t head_dim,
                  float scale, float cap, float *out) {
    int64_t outside = 0;
    for (int64_t t = 0; t < len; t++) outside |= (uint64_t)slots[t] >= (uint64_t)cache_rows;
    if (outside) return TASK_BAD_SLOT;
    const int64_t row = num_kv_heads * head_dim, first = h0 * head_dim, width = (h1 - h0) * head_dim;
    const int64_t kv_heads = h1 - h0, heads = kv_heads * group;
    float *s = malloc(sizeof(float) * heads * len); /* [heads, len] */
    if (s == NULL) return TASK_NO_MEMORY;
    q += h0 * group * head_dim;
    out += h0 * group * head_dim;
    for (int64_t t = 0; t < len; t++) {
        if (t + PREFETCH < len) prefetch(k_buf + slots[t + PREFETCH] * row + first, width);
        const float *k = k_buf + slots[t] * row + first;
        for (int64_t h = 0; h < kv_heads; h++)
            for (int64_t i = h * group; i < (h + 1) * group; i++)
                s[i * len + t] = dot(q + i * head_dim, k + h * head_dim, head_dim) * scale;
    }
    if (cap > 0.0f)
        for (int64_t i = 0; i < heads * len; i++) s[i] = cap * tanhf(s[i] / cap);
    for (int64_t i = 0; i < heads; i++) softmax(s + i * len, len);
    memset(out, 0, sizeof(float) * heads * head_dim);
    for (int64_t t0 = 0; t0 < len; t0 += TOKEN_BLOCK) {
        const int64_t count = t0 + TOKEN_BLOCK < len ? TOKEN_BLOCK : len - t0;
        const float *v[TOKEN_BLOCK];
        for (int64_t r = 0; r < count; r++) {
            if (t0 + r + PREFETCH + TOKEN_BLOCK < len) prefetch(v_buf + slots[t0 + r + PREFETCH + TOKEN_BLOCK] * row + first, width);
            v[r] = v_buf + slots[t0 + r] * row + first;
        }
        for (int64_t h = 0; h < kv_heads; h++)
            for (int64_t i = h * group; i < (h + 1) * group; i++)
                weighted_rows(out + i * head_dim, s + i * len + t0, v, count, h * head_dim, head_dim);
    }
    free(s);
    return 0;
}

/* q: [B, Hk * G, D] with row stride q_stride (heads and head_dim packed); out: [B, Hk * G, D]
 * contiguous; k_buf, v_buf: [cache_rows, Hk, D] contiguous; req_to_token: [table_rows,
 * table_stride] int64. Returns 0 on success; BAD_SEQ_LEN / BAD_REQ_INDEX, before touching
 * anything, when a row's length or table row lies outside the table (checked here, on B values,
 * rather than by two torch reductions per layer); BAD_KV_SLOT when a slot a row reads lies outside
 * the cache (each task checks its own slots before reading any, so no read leaves the cache);
 * NO_MEMORY_FOR_SCORES when a task could not allocate its scores. window > 0 keeps each row's last
 * `window` positions (its query sits at the last one); cap > 0 soft-caps the scores. */
#define BAD_SEQ_LEN (-1)
#define BAD_REQ_INDEX (-2)
#define BAD_KV_SLOT (-3)
#define NO_MEMORY_FOR_SCORES (-4)
int decode_attention_f32(const float *q, int64_t q_stride, const float *k_buf, const float *v_buf, int64_t cache_rows,
                         const int64_t *req_to_token, int64_t table_rows, int64_t table_stride,
                         const int64_t *req_pool_indices, const int64_t *seq_lens, int64_t batch, int64_t num_kv_heads,
                         int64_t group, int64_t head_dim, float scale, int64_t window, float cap, float *out,
                         int num_threads) {
    for (int64_t b = 0; b < batch; b++) {
        if (seq_lens[b] < 1 || seq_lens[b] > table_stride) return BAD_SEQ_LEN;
        if (req_pool_indices[b] < 0 || req_pool_indices[b] >= table_rows) return BAD_REQ_INDEX;
    }
    /* Whole rows per task read best (one contiguous row per slot); small batches split their
     * heads so that every thread gets work. */
    int64_t splits = (2 * (int64_t)num_threads + batch - 1) / (batch > 0 ? batch : 1);
    splits = splits < 1 ? 1 : (splits > num_kv_heads ? num_kv_heads : splits);
    const int64_t tasks = batch * splits;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) reduction(| : failed)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t b = task / splits, part = task % splits;
        const int64_t h0 = part * num_kv_heads / splits, h1 = (part + 1) * num_kv_heads / splits;
        const int64_t first = window > 0 && seq_lens[b] > window ? seq_lens[b] - window : 0;
        failed |= attend(q + b * q_stride, k_buf, v_buf, req_to_token + req_pool_indices[b] * table_stride + first,
                         seq_lens[b] - first, cache_rows, h0, h1, num_kv_heads, group, head_dim, scale, cap,
                         out + b * num_kv_heads * group * head_dim);
    }
    return failed & TASK_BAD_SLOT ? BAD_KV_SLOT : failed ? NO_MEMORY_FOR_SCORES : 0;
}
