/* The CPU sampler's per-row work on a descending top-W window, in two calls instead of ~60 small
 * torch ops (sgl_kernel_ext/sampling/support.py, whose torch code is the reference; these give
 * the same values (NaN payloads and the sign of a zero threshold aside, which torch's own
 * maximum sets differently with the batch size), so both CPU sampling paths keep drawing the
 * same tokens).
 *
 * window_thresholds_f32: the top-k / top-p / min-p threshold of each row (support.py's
 * _support_in): the k-th value; the top-p boundary, from the full-vocabulary mass of each window
 * column summed in double in column order, ties sharing the mass before their group; min-p's
 * max + log(min_p); the largest of them (NaN if any is). And whether the window holds the row's
 * k-th value and top-p boundary.
 *
 * window_draw_f32: an inverse-CDF draw among the kept columns (inverse_cdf_draw): the weights
 * exp(v - max) come from torch (its vectorised exp sets their bits), masked here by the threshold;
 * their running sum in double, rounded to float at each column as torch's CPU cumsum does; the
 * first column whose sum reaches u * total; a column of weight 0 there falls back to the first
 * largest weight.
 */
#include <math.h>
#include <stdint.h>

static inline float max_nan(float a, float b) { return (isnan(a) || isnan(b)) ? NAN : (a > b ? a : b); }

/* vals: [rows, width] descending; probs: [rows, width] full-softmax mass of each column, or NULL
 * (no top-p); top_ks: [rows] (>= vocab: none); top_ps: [rows] or NULL; log_min_ps: [rows] or NULL.
 * Writes threshold [rows], exact [rows]. */
void window_thresholds_f32(const float *vals, const float *probs, int64_t rows, int64_t width, int64_t vocab,
                           const int32_t *top_ks, const float *top_ps, const float *log_min_ps, float *threshold,
                           uint8_t *exact) {
    for (int64_t r = 0; r < rows; r++) {
        const float *v = vals + r * width;
        const int64_t top_k = top_ks[r];
        const int64_t k = top_k < 1 ? 1 : top_k > width ? width : top_k;
        float thr = top_k >= vocab ? -INFINITY : v[k - 1];
        int ex = top_k >= vocab || top_k <= width;
        if (top_ps != 0) {
            const float *p = probs + r * width;
            const double top_p = (double)top_ps[r];
            double cum = 0.0, group_before = 0.0;
            int64_t kept = 0;
            for (int64_t j = 0; j < width; j++) {
                cum += (double)p[j];
                const double before = cum - (double)p[j];
                if (j == 0 || v[j] != v[j - 1]) group_before = before;
                kept += group_before < top_p;
            }
            if (kept < 1) kept = 1;
            thr = max_nan(thr, top_ps[r] >= 1.0f ? -INFINITY : v[kept - 1]);
            ex = ex && (top_ps[r] >= 1.0f || kept < width);
        }
        if (log_min_ps != 0) thr = max_nan(thr, v[0] + log_min_ps[r]);
        threshold[r] = thr;
        exact[r] = (uint8_t)ex;
    }
}

/* vals, weights: [rows, width] (weights = exp(vals - row max)); threshold, u: [rows]. Writes col [rows]. */
void window_draw_f32(const float *vals, const float *weights, const float *threshold, const float *u, int64_t rows,
                     int64_t width, int64_t *col) {
    for (int64_t r = 0; r < rows; r++) {
        const float *v = vals + r * width, *w = weights + r * width;
        const float thr = threshold[r];
        double acc = 0.0;
        for (int64_t j = 0; j < width; j++) acc += v[j] >= thr ? (double)w[j] : 0.0;
        const float target = u[r] * (float)acc;
        int64_t pick = width - 1;
        acc = 0.0;
        for (int64_t j = 0; j < width; j++) {
            acc += v[j] >= thr ? (double)w[j] : 0.0;
            if ((float)acc >= target) {
                pick = j;
                break;
            }
        }
        if (!(v[pick] >= thr && w[pick] > 0.0f)) {
            /* The first largest kept weight (torch.argmax; NaN counts as the largest). */
            int64_t best = 0;
            float best_w = v[0] >= thr ? w[0] : 0.0f;
            for (int64_t j = 1; j < width && !isnan(best_w); j++) {
                const float wj = v[j] >= thr ? w[j] : 0.0f;
                if (isnan(wj) || wj > best_w) best = j, best_w = wj;
            }
            pick = best;
        }
        col[r] = pick;
    }
}
