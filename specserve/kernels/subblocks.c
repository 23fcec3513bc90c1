// The scalar reading of GGUF blocks (subblocks.h's form) and the fp16 table every reader uses.

#include "subblocks.h"

float half_table[1 << 16];

__attribute__((constructor)) static void fill_half_table(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) half_table[h] = _cvtsh_ss((uint16_t)h);
}

void unpack_scalar(int kind, const uint8_t* row, int64_t sb, subblock* o) {
    int s;
    const uint8_t* b = sub_block(kind, row, sb, &s);
    sub_scales(kind, b, s, o->dv, &o->m);
    for (int j = 0; j < QK; j++) {
        const int lo = j < 16 ? j : j - 16, shift = j < 16 ? 0 : 4;  // 32-value kinds' nibbles
        uint32_t qh;
        int q;
        switch (kind) {
            case KIND_Q8_0: q = (int8_t)b[2 + j]; break;
            case KIND_Q4_1: q = (b[4 + lo] >> shift) & 15; break;
            case KIND_Q4_0: q = ((b[2 + lo] >> shift) & 15) - 8; break;
            case KIND_Q5_0:
            case KIND_Q5_1: {
                const int at = kind == KIND_Q5_0 ? 2 : 4;  // qh, then the nibbles
                __builtin_memcpy(&qh, b + at, 4);
                q = ((b[at + 4 + lo] >> shift) & 15) | (int)((qh >> j) & 1) << 4;
                if (kind == KIND_Q5_0) q -= 16;
                break;
            }
            case KIND_Q4_K: q = (b[16 + 32 * (s / 2) + j] >> (4 * (s & 1))) & 15; break;
            case KIND_Q5_K:
                q = ((b[48 + 32 * (s / 2) + j] >> (4 * (s & 1))) & 15) | ((b[16 + j] >> s) & 1) << 4;
                break;
            default: {  // Q6_K: 128 values per 64 bytes of ql and 32 of qh
                const int c = s / 4, t = s % 4;
                const int low = (b[64 * c + 32 * (t & 1) + j] >> (4 * (t >> 1))) & 15;
                q = (low | ((b[128 + 32 * c + j] >> (2 * t)) & 3) << 4) - 32;
            }
        }
        o->q[j] = (int8_t)q;
    }
}
