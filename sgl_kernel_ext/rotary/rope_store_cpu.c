/* Rotary embedding of q and k plus the KV-cache write, on CPU, float32, in one call per layer:
 * on a decode-sized batch torch's split / cat / multiply / index_copy ops cost far more in
 * dispatch than in arithmetic.
 *
 * Rotate-half layout: with x = [x1, x2] (halves of head_dim),
 *   rotated = x * cos + [x2, x1] * signed_sin, signed_sin = [-sin, sin].
 * q heads are rotated in place in the fused projection output; k heads are rotated into the
 * K cache at the token's slot and v heads copied into the V cache there.
 *
 * Built at run time by sgl_kernel_ext/cpu_build.py.
 */
#include <stdint.h>
#include <string.h>

#define PARALLEL_MIN_TOKENS 64
#define MAX_HEAD_DIM 1024

static void rotate(const float *x, const float *cos, const float *signed_sin, int64_t head_dim, float *out) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) out[i] = x[i] * cos[i] + x[i + half] * signed_sin[i];
    for (int64_t i = half; i < head_dim; i++) out[i] = x[i] * cos[i] + x[i - half] * signed_sin[i];
}

/* qkv: [tokens, row_stride] with q heads, k heads, v heads packed at the start of each row;
 * cos, signed_sin: [tokens, head_dim]; loc: [tokens] KV slots; k_buf, v_buf: [slots, kv_heads,
 * head_dim]. Returns 1 if head_dim is odd or too large, 2 if a slot lies outside [0, slots)
 * (nothing written then), else 0. */
int rope_store_f32(float *qkv, int64_t tokens, int64_t row_stride, int64_t q_heads, int64_t kv_heads,
                   int64_t head_dim, const float *cos, const float *signed_sin, const int64_t *loc, int64_t slots,
                   float *k_buf, float *v_buf, int num_threads) {
    if (head_dim % 2 || head_dim > MAX_HEAD_DIM) return 1;
    for (int64_t t = 0; t < tokens; t++)
        if (loc[t] < 0 || loc[t] >= slots) return 2;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (tokens >= PARALLEL_MIN_TOKENS)
    for (int64_t t = 0; t < tokens; t++) {
        float *row = qkv + t * row_stride;
        const float *c = cos + t * head_dim, *s = signed_sin + t * head_dim;
        float rotated[MAX_HEAD_DIM];
        for (int64_t h = 0; h < q_heads; h++) {
            rotate(row + h * head_dim, c, s, head_dim, rotated);
            memcpy(row + h * head_dim, rotated, sizeof(float) * head_dim);
        }
        float *k_dst = k_buf + loc[t] * kv_heads * head_dim, *v_dst = v_buf + loc[t] * kv_heads * head_dim;
        const float *k_src = row + q_heads * head_dim, *v_src = k_src + kv_heads * head_dim;
        for (int64_t h = 0; h < kv_heads; h++) rotate(k_src + h * head_dim, c, s, head_dim, k_dst + h * head_dim);
        memcpy(v_dst, v_src, sizeof(float) * kv_heads * head_dim);
    }
    return 0;
}
