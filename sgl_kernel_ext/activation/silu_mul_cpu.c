/* act = SiLU(gate) * up on CPU, float32, for the int8-activation mode (--cpu-int8-activations):
 *   act[r, i] = g / (1 + exp(-g)) * u,  g = gate_up[r, i], u = gate_up[r, I + i].
 * The exact mode keeps torch's SiLU, whose bits come from its own vectorised exp; this mode already
 * rounds every projection's input to 8 bits, so its SiLU may be ours, and then the whole decode
 * step runs in C (decode_layers_f32). Within 2.3 ulp of SiLU for g >= -87.
 *
 * exp(t), t = -g: t clamped to [-87, 89] (NaN gates stay NaN through g / ...), n = round(t log2 e),
 * r = t - n ln2 in two parts, exp(r) by its degree-7 Taylor polynomial (|r| <= 0.347: truncation
 * below 1e-8), times 2^n from the exponent bits. From t >= 88.4, n = 128 and 2^n is +inf: SiLU is
 * -0 there (torch's from t > 88.72, where its exp overflows; between, it is under 1e-36), and -inf
 * gives NaN as torch's does; n never passes 128, so the bits never reach the sign. Every
 * multiply-add is an explicit fma and nothing else could be contracted, so the AVX2 and portable
 * builds give the same bits.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && !defined(PORTABLE_ONLY)
#include <immintrin.h>
#define SILU_HAVE_AVX2 1
#endif

#define EXP_MIN (-87.0f)
#define EXP_MAX 89.0f
#define LOG2E 1.44269504f
#define ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer, to nearest even */
#define LN2_HI 0.693359375f     /* few bits: n * LN2_HI is exact */
#define LN2_LO (-2.12194440e-4f)
/* 1/k!, k = 7 .. 2 */
#define C7 1.98412698e-4f
#define C6 1.38888889e-3f
#define C5 8.33333333e-3f
#define C4 4.16666667e-2f
#define C3 1.66666667e-1f
#define C2 0.5f

static inline float silu_mul_one(float g, float u) {
    const float t = fminf(fmaxf(-g, EXP_MIN), EXP_MAX);
    const float n = fmaf(t, LOG2E, ROUND_MAGIC) - ROUND_MAGIC;
    float r = fmaf(-n, LN2_HI, t);
    r = fmaf(-n, LN2_LO, r);
    float p = fmaf(C7, r, C6);
    p = fmaf(p, r, C5);
    p = fmaf(p, r, C4);
    p = fmaf(p, r, C3);
    p = fmaf(p, r, C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return g / fmaf(p, scale, 1.0f) * u;
}

#ifdef SILU_HAVE_AVX2
static inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 neg_g = _mm256_xor_ps(g, _mm256_set1_ps(-0.0f));
    /* max/min return their second operand on NaN, as fmaxf/fminf return the non-NaN one. */
    const __m256 t = _mm256_min_ps(_mm256_max_ps(neg_g, _mm256_set1_ps(EXP_MIN)), _mm256_set1_ps(EXP_MAX));
    const __m256 magic = _mm256_set1_ps(ROUND_MAGIC);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(t, _mm256_set1_ps(LOG2E), magic), magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), t);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(C7), r, _mm256_set1_ps(C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 denom = _mm256_fmadd_ps(p, _mm256_castsi256_ps(bits), _mm256_set1_ps(1.0f));
    return _mm256_mul_ps(_mm256_div_ps(g, denom), u);
}
#endif

int silu_mul_uses_avx2(void) {
#ifdef SILU_HAVE_AVX2
    return 1;
#else
    return 0;
#endif
}

/* Below this many values one thread does it all (a decode step's few thousand). */
#define SILU_PARALLEL_MIN (1 << 16)

/* gate_up: [rows, 2 inter] contiguous (gate | up); act: [rows, inter] contiguous. */
void silu_mul_f32(const float *gate_up, int64_t rows, int64_t inter, float *act, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * inter >= SILU_PARALLEL_MIN)
    for (int64_t row = 0; row < rows; row++) {
        const float *g = gate_up + row * 2 * inter, *u = g + inter;
        float *out = act + row * inter;
        int64_t i = 0;
#ifdef SILU_HAVE_AVX2
        for (; i + 8 <= inter; i += 8)
            _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
#endif
        for (; i < inter; i++) out[i] = silu_mul_one(g[i], u[i]);
    }
}
