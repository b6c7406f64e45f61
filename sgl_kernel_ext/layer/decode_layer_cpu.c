/* A Llama decoder layer at decode, in one call on CPU, float32, all but its SiLU:
 *   [x = act Wdown^T (+ b) of the previous layer], residual += x (the first layer's residual is the
 *   embedding itself), h = RMSNorm(residual), qkv = h Wqkv^T (+ b), RoPE on q/k, k/v into the
 *   cache, attention over the paged cache, residual += attn Wo^T (+ b), h = RMSNorm(residual),
 *   gate_up = h Wgu^T.
 * On the exact path the caller computes act = SiLU(gate) * up with torch and passes it to the next
 * layer's call (a C SiLU would round differently from torch's). At a decode-sized batch these steps cost more in
 * Python, ctypes and torch dispatch than in arithmetic; here they are the same C functions the
 * separate kernels run, called in the same order on the same values, so every value is the same
 * bits as on the op-by-op path.
 *
 * decode_layers_f32 runs every layer of a step in one call, SiLU included (silu_mul_cpu.c): the
 * int8-activation mode's, whose SiLU is that kernel on every path.
 *
 * The kernels are compiled into this one translation unit (sgl_kernel_ext/cpu_build.py hashes
 * the included sources into the library's cache key).
 */
#include "../norm/rmsnorm_cpu.c"
#include "../gemm/block_quant_linear.c"
#include "../gemm/block_quant_linear_q8.c"
#include "../rotary/rope_store_cpu.c"
#include "../attention/decode_attention_cpu.c"
#include "../activation/silu_mul_cpu.c"

/* A layer's weights, fixed once loaded (decode_layer_cpu.py builds it). */
typedef struct {
    const float *input_norm, *post_norm; /* [hidden] */
    float input_eps, post_eps, scale;
    int64_t hidden, q_heads, kv_heads, head_dim;
    const uint8_t *qkv;
    const float *qkv_bias; /* [qkv_out] or NULL */
    int64_t qkv_out, qkv_bits;
    const uint8_t *o;
    const float *o_bias; /* [hidden] or NULL */
    int64_t o_bits;
    const uint8_t *gate_up;
    int64_t gate_up_out, gate_up_bits;
    const uint8_t *down;
    const float *down_bias; /* [hidden] or NULL */
    int64_t down_in, down_bits;
    int64_t int8_activations; /* every projection packed for block_quant_linear_q8.c */
} layer_weights;

/* What every layer of one decode step shares. */
typedef struct {
    int64_t rows;
    const float *cos, *signed_sin; /* [rows, head_dim] */
    const int64_t *loc;            /* [rows] KV slots of the new tokens */
    int64_t slots;                 /* KV cache rows */
    const int64_t *req_to_token;   /* [table_rows, table_stride] */
    int64_t table_rows, table_stride;
    const int64_t *req_pool_indices, *seq_lens; /* [rows] */
    float *qkv, *attn, *o, *normed;             /* scratch: [rows, qkv_out], [rows, Hq D], [rows, hidden] x 2 */
    float *gate_up;                             /* out: [rows, gate_up_out] */
    int64_t num_threads;
} decode_step;

/* Codes for the wrapper's errors. */
#define BAD_HEAD_DIM 1
#define BAD_SLOT 2
#define BAD_LENGTH 3
#define BAD_TABLE_ROW 4
#define NO_MEMORY 5
#define BAD_TABLE_SLOT 6

/* out = x W^T (+ bias inside the kernel's sums, as QKVParallelLinear adds it). */
static int linear(const layer_weights *w, const float *x, int64_t rows, int64_t in, const uint8_t *packed, int64_t bits,
                  int64_t out_features, const float *bias, float *out, int64_t threads) {
    const int failed = w->int8_activations
                           ? block_quant_linear_q8_f32(x, rows, in, packed, (int)bits, out_features, bias, out, (int)threads)
                           : block_quant_linear_f32(x, rows, in, packed, (int)bits, out_features, bias, out, (int)threads);
    return failed ? NO_MEMORY : 0;
}

/* out[r] = x[r] W^T, then + bias: RowParallelLinear adds its bias after the projection. */
static int project(const layer_weights *w, const float *x, int64_t rows, int64_t in, const uint8_t *packed, int64_t bits,
                   int64_t out_features, const float *bias, float *out, int64_t threads) {
    if (linear(w, x, rows, in, packed, bits, out_features, NULL, out, threads)) return NO_MEMORY;
    if (bias != NULL)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < out_features; i++) out[r * out_features + i] += bias[i];
    return 0;
}

/* residual: [rows, hidden], the embedding when prev is NULL (the first layer), else the residual
 * stream, to which prev's down projection of act ([rows, prev->down_in]) is added; updated in
 * place. k_buf, v_buf: this layer's cache [slots, kv_heads, head_dim]. Writes s->gate_up. */
int decode_layer_f32(const layer_weights *w, const decode_step *s, const layer_weights *prev, const float *act,
                     float *residual, float *k_buf, float *v_buf) {
    const int64_t rows = s->rows, threads = s->num_threads, q_width = w->q_heads * w->head_dim;
    int failed;
    if (prev == NULL) {
        rmsnorm_f32(residual, NULL, NULL, w->input_norm, w->input_eps, rows, w->hidden, s->normed, (int)threads);
    } else {
        if ((failed = project(prev, act, rows, prev->down_in, prev->down, prev->down_bits, w->hidden, prev->down_bias, s->o,
                              threads)))
            return failed;
        rmsnorm_f32(s->o, residual, residual, w->input_norm, w->input_eps, rows, w->hidden, s->normed, (int)threads);
    }
    if ((failed = linear(w, s->normed, rows, w->hidden, w->qkv, w->qkv_bits, w->qkv_out, w->qkv_bias, s->qkv, threads)))
        return failed;
    const int rope = rope_store_f32(s->qkv, rows, w->qkv_out, w->q_heads, w->kv_heads, w->head_dim, s->cos,
                                    s->signed_sin, s->loc, s->slots, k_buf, v_buf, (int)threads);
    if (rope) return rope == 2 ? BAD_SLOT : BAD_HEAD_DIM;
    const int attn = decode_attention_f32(s->qkv, w->qkv_out, k_buf, v_buf, s->slots, s->req_to_token, s->table_rows,
                                          s->table_stride, s->req_pool_indices, s->seq_lens, rows, w->kv_heads,
                                          w->q_heads / w->kv_heads, w->head_dim, w->scale, 0, 0.0f, s->attn,
                                          (int)threads);
    if (attn == BAD_SEQ_LEN) return BAD_LENGTH;
    if (attn == BAD_REQ_INDEX) return BAD_TABLE_ROW;
    if (attn == BAD_KV_SLOT) return BAD_TABLE_SLOT;
    if (attn) return NO_MEMORY;
    if ((failed = project(w, s->attn, rows, q_width, w->o, w->o_bits, w->hidden, w->o_bias, s->o, threads))) return failed;
    rmsnorm_f32(s->o, residual, residual, w->post_norm, w->post_eps, rows, w->hidden, s->normed, (int)threads);
    return project(w, s->normed, rows, w->hidden, w->gate_up, w->gate_up_bits, w->gate_up_out, NULL, s->gate_up, threads);
}

/* Every layer of a decode step in turn, act = SiLU(gate) * up (silu_mul_f32) after each: layers[l]
 * reads k_bufs[l], v_bufs[l]. residual as for decode_layer_f32 (the embedding in, the residual
 * stream before the last down projection out); act: [rows, down_in], the last layer's activation. */
int decode_layers_f32(const layer_weights *const *layers, int64_t count, const decode_step *s, float *residual,
                      float *const *k_bufs, float *const *v_bufs, float *act) {
    for (int64_t l = 0; l < count; l++) {
        const int failed = decode_layer_f32(layers[l], s, l ? layers[l - 1] : NULL, l ? act : NULL, residual, k_bufs[l],
                                            v_bufs[l]);
        if (failed) return failed;
        silu_mul_f32(s->gate_up, s->rows, layers[l]->down_in, act, (int)s->num_threads);
    }
    return 0;
}
