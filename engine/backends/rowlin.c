/* A row-invariant linear for short passes on the CPU (engine/backends/rowlin.py compiles and loads it).

   out[m, n] = bias[n] + sum over k of x[m, k] * W[n, k]

   Every output is one vector lane summed over k in order, one fused multiply-add per step, whatever the number
   of rows M and whichever tile a row falls in: a row's result does not depend on how many rows share the call.
   So a verify pass of 1 + K tokens gives each token the bits a one-token step gives it, and speculative
   decoding is exact. The weight is streamed once per call for up to ROWS rows (more rows re-read a group of
   output blocks from L2), so a pass of several rows costs little more than one: the reason to draft at all
   on a CPU.

   W is packed as [N / LANES][K][LANES] (N padded to a multiple of LANES by the caller). */
#include <stddef.h>

#if defined(__AVX512F__)
#define LANES 16
#define ROWS 6 /* 6 rows x 4 blocks = 24 accumulators of 32 registers */
#elif defined(__AVX__) || defined(__ARM_NEON) || defined(__SSE2__)
#if defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
#define ROWS 3 /* 3 rows x 4 blocks = 12 accumulators of 16 registers */
#else
#define LANES 4
#define ROWS 3
#endif
#define BLOCKS 4

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));

typedef float uvec __attribute__((vector_size(LANES * sizeof(float)), aligned(4)));
static inline vec load(const float *p) { return *(const uvec *)p; }

static inline void store(float *p, vec v) { *(uvec *)p = v; }

static inline vec splat(float s) {
    vec v = {0};
    return v + s;
}

/* mt rows by bt blocks of LANES outputs. The accumulate step is the same expression for every tile shape:
   built with -ffp-contract=fast it is one fused multiply-add per lane (the loader checks row invariance). */
static inline __attribute__((always_inline)) void tile(const float *x, int K, int mt, int bt, const float *w,
                                                       float *out, int N, const float *bias) {
    vec acc[ROWS * BLOCKS];
    for (int i = 0; i < mt * bt; i++) acc[i] = splat(0.0f);
    for (int k = 0; k < K; k++) {
        for (int b = 0; b < bt; b++) {
            vec wk = load(w + ((size_t)b * K + k) * LANES);
            for (int m = 0; m < mt; m++) acc[b * mt + m] += splat(x[(size_t)m * K + k]) * wk;
        }
    }
    for (int b = 0; b < bt; b++) {
        for (int m = 0; m < mt; m++) {
            vec v = acc[b * mt + m];
            if (bias) v += load(bias + b * LANES);
            store(out + (size_t)m * N + b * LANES, v);
        }
    }
}

#define T(MT, BT) tile(xr, K, MT, BT, w, o, N, bb)
#define CASES(BT)                                                                                              \
    case 1 * 8 + BT: T(1, BT); break;                                                                          \
    case 2 * 8 + BT: T(2, BT); break;                                                                          \
    case 3 * 8 + BT: T(3, BT); break;                                                                          \
    case 4 * 8 + BT: T(4 < ROWS ? 4 : ROWS, BT); break;                                                        \
    case 5 * 8 + BT: T(5 < ROWS ? 5 : ROWS, BT); break;                                                        \
    case 6 * 8 + BT: T(6 < ROWS ? 6 : ROWS, BT); break;

int rowlin_lanes(void) { return LANES; }

/* x: [M, K] rows, Wp: packed weight of N outputs (N a multiple of LANES), out: [M, N]; bias may be NULL. */
void rowlin(const float *x, int M, int K, const float *Wp, int N, const float *bias, float *out, int threads) {
    int nblocks = N / LANES;
    int groups = (nblocks + BLOCKS - 1) / BLOCKS;
    int tiles = (M + ROWS - 1) / ROWS;
    int step = tiles ? (M + tiles - 1) / tiles : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int g = 0; g < groups; g++) {
        int end = g * BLOCKS + BLOCKS < nblocks ? g * BLOCKS + BLOCKS : nblocks;
        for (int m0 = 0; m0 < M; m0 += step) {
            int mt = M - m0 < step ? M - m0 : step;
            const float *xr = x + (size_t)m0 * K;
            for (int nb = g * BLOCKS; nb < end;) {
                int left = end - nb;
                int bt = left >= 4 ? 4 : left >= 2 ? 2 : 1;
                const float *w = Wp + (size_t)nb * K * LANES;
                float *o = out + (size_t)m0 * N + (size_t)nb * LANES;
                const float *bb = bias ? bias + (size_t)nb * LANES : NULL;
                switch (mt * 8 + bt) {
                    CASES(4)
                    CASES(2)
                    CASES(1)
                }
                nb += bt;
            }
        }
    }
}
