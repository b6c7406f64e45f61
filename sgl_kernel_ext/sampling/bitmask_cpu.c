/* A grammar's packed vocab bitmask applied to float32 logits on the CPU, in place:
 *   logits[r, t] = -inf where bit (t % 32) of bitmask[r, t / 32] is 0, and for every t >= 32 * words.
 * Whole words are tested first: an all-ones word (an unconstrained row, or an allowed stretch)
 * costs one compare and writes nothing, so the work is the masked tokens' writes. torch needs
 * several passes over a [B, V] intermediate for the same function.
 *
 * Built at run time by sgl_kernel_ext/cpu_build.py.
 */
#include <math.h>
#include <stdint.h>

/* Below this many logits the rows run on the calling thread. */
#define PARALLEL_MIN_ELEMENTS (1 << 16)

static void mask_row(float *row, const uint32_t *words, int64_t num_words, int64_t vocab) {
    for (int64_t w = 0; w * 32 < vocab; w++) {
        const uint32_t bits = w < num_words ? words[w] : 0u;
        if (bits == 0xFFFFFFFFu) continue;
        const int64_t base = w * 32;
        const int64_t n = vocab - base < 32 ? vocab - base : 32;
        for (int64_t j = 0; j < n; j++)
            if (!((bits >> j) & 1u)) row[base + j] = -INFINITY;
    }
}

/* logits: [rows, vocab] with row stride logits_stride; bitmask: [rows, num_words] int32, contiguous. */
void apply_token_bitmask_f32(float *logits, const int32_t *bitmask, int64_t rows, int64_t vocab,
                             int64_t logits_stride, int64_t num_words, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * vocab >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++)
        mask_row(logits + r * logits_stride, (const uint32_t *)(bitmask + r * num_words), num_words, vocab);
}
