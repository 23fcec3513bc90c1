// rope_rotate_half (rope.h).

#include <immintrin.h>
#include <stdint.h>

#include "rope.h"

void rope_rotate_half(float* x, int64_t stride, int64_t T, int64_t n_heads, int64_t D,
                      int64_t R, const float* cos, const float* sin) {
    const int64_t half = R / 2;
    for (int64_t t = 0; t < T; t++) {
        const float* c = cos + t * R;
        const float* s = sin + t * R;
        for (int64_t h = 0; h < n_heads; h++) {
            float* lo = x + t * stride + h * D;
            float* hi = lo + half;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                const __m256 a = _mm256_loadu_ps(lo + i), b = _mm256_loadu_ps(hi + i);
                const __m256 a2 = _mm256_sub_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + i)),
                                                _mm256_mul_ps(b, _mm256_loadu_ps(s + i)));
                const __m256 b2 = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + half + i)),
                                                _mm256_mul_ps(a, _mm256_loadu_ps(s + half + i)));
                _mm256_storeu_ps(lo + i, a2);
                _mm256_storeu_ps(hi + i, b2);
            }
            for (; i < half; i++) {
                const float a = lo[i], b = hi[i];
                lo[i] = a * c[i] - b * s[i];
                hi[i] = b * c[half + i] + a * s[half + i];
            }
        }
    }
}
