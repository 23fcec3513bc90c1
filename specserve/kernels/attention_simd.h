// Vector building blocks of the paged attention kernel: scores of a query row against 8 keys,
// the p-weighted sum of value rows, and fp16 rows widened to float32. Static inline: they are
// the kernel's innermost loops, inlined into its per-chunk update.
#pragma once

#include <immintrin.h>
#include <stdint.h>

// Eight partial-sum vectors -> their eight totals, in order.
static inline __m256 sum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                          __m256 a6, __m256 a7) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// Scores of one query row against 8 keys (pointers ks[0..8)), scaled.
static inline __m256 dot8(const float* q, const float* const* ks, int64_t D, __m256 scale) {
    __m256 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(ks[j] + d), a[j]);
    }
    return _mm256_mul_ps(sum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), scale);
}

// acc [D] += sum_{j<n} p[j] v_j. Sixty-four dimensions at a time in eight registers, so the
// FMA chains run side by side; each p[j] is broadcast once per 64 dimensions.
static inline void accumulate_pv(float* acc, const float* p, const float* const* vp, int64_t n,
                                 int64_t D) {
    int64_t d = 0;
    for (; d + 64 <= D; d += 64) {
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_loadu_ps(acc + d + 8 * u);
        for (int64_t j = 0; j < n; j++) {
            const __m256 pj = _mm256_broadcast_ss(p + j);
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp[j] + d + 8 * u), a[u]);
        }
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(acc + d + 8 * u, a[u]);
    }
    for (; d < D; d += 8) {
        __m256 a = _mm256_loadu_ps(acc + d);
        for (int64_t j = 0; j < n; j++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(vp[j] + d), a);
        _mm256_storeu_ps(acc + d, a);
    }
}

// dst [D] = src [D] fp16 widened to float32 (exact).
static inline void widen(const uint16_t* src, float* dst, int64_t D) {
    for (int64_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + d))));
}
