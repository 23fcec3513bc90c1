// RMSNorms outside a projection (norms.h).

#include <stdint.h>

#include "ggml_blocks.h"
#include "norms.h"

void rms_norm_heads(float* x, int64_t stride, int64_t T, int64_t first, int64_t n, int64_t D,
                    const float* w, float eps) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = first; h < first + n; h++) {
            float* head = x + t * stride + h * D;
            prepare_row(head, head, D, w, eps, GLU_NONE);
        }
}

void rms_norm_add(const float* y, const float* x, float* out, int64_t T, int64_t K,
                  const float* w, float eps) {
    for (int64_t t = 0; t < T; t++) {
        const float* yr = y + t * K;
        const float inv = rms_scale(yr, K, eps);
        for (int64_t k = 0; k < K; k++) out[t * K + k] = x[t * K + k] + (yr[k] * inv) * w[k];
    }
}
