// mask_logits (mask.h).

#include <math.h>
#include <stdint.h>

#include "mask.h"

int64_t mask_logits(float* logits, const uint32_t* bits, int64_t n) {
    const int64_t words = (n + 31) / 32;
    int64_t allowed = 0;
    for (int64_t w = 0; w < words; w++) {
        const uint32_t word = w + 1 < words || n % 32 == 0 ? bits[w] : bits[w] & ((1u << (n % 32)) - 1);
        allowed += __builtin_popcount(word);
    }
    if (allowed == 0) return 0;
    for (int64_t w = 0; w < words; w++) {
        const uint32_t word = bits[w];
        float* row = logits + 32 * w;
        if (word == 0xFFFFFFFFu) continue;
        if (32 * w + 32 <= n) {
            for (int k = 0; k < 32; k++) row[k] = (word >> k) & 1u ? row[k] : -INFINITY;
        } else {
            for (int k = 0; 32 * w + k < n; k++) row[k] = (word >> k) & 1u ? row[k] : -INFINITY;
        }
    }
    return allowed;
}
