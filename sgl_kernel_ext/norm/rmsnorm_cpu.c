/* RMSNorm on CPU, float32, optionally after the residual add that precedes it:
 *   residual += x (in place), out = residual / sqrt(mean(residual^2) + eps) * weight.
 * One call instead of the ~8 small ops torch runs for it, which on a decode-sized batch cost
 * far more in dispatch than in arithmetic.
 *
 * Built at run time by sgl_kernel_ext/cpu_build.py; the sum of squares runs in 8 independent
 * lanes so that the compiler vectorises it without reassociating (no -ffast-math).
 */
#include <math.h>
#include <stdint.h>

/* Below this many elements the batch is normalised on the calling thread: starting the
 * OpenMP team would cost more than the work. */
#define PARALLEL_MIN_ELEMENTS (1 << 16)

static void norm_row(float *x, const float *residual, float *residual_out, const float *weight, float eps,
                     int64_t hidden, float *out) {
    const float *src = x;
    if (residual != 0) {
        for (int64_t i = 0; i < hidden; i++) residual_out[i] = x[i] + residual[i];
        src = residual_out;
    }
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= hidden; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += src[i + j] * src[i + j];
    float tail = 0.0f;
    for (; i < hidden; i++) tail += src[i] * src[i];
    const float sum = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7])) + tail;
    const float scale = 1.0f / sqrtf(sum / (float)hidden + eps);
    for (i = 0; i < hidden; i++) out[i] = (src[i] * scale) * weight[i];
}

/* x, out: [rows, hidden]; residual (may be NULL) and residual_out: [rows, hidden], all rows
 * contiguous. residual_out may be residual itself. */
void rmsnorm_f32(float *x, const float *residual, float *residual_out, const float *weight, float eps, int64_t rows,
                 int64_t hidden, float *out, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * hidden >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * hidden, residual ? residual + r * hidden : 0, residual ? residual_out + r * hidden : 0, weight,
                 eps, hidden, out + r * hidden);
}
