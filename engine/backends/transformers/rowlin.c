/* A row-invariant linear for short passes on the CPU (engine/backends/transformers/rowlin.py compiles and loads it).

   out[m, n] = bias[n] + sum over k of x[m, k] * W[n, k]

   Every output is one vector lane summed over k in order, one fused multiply-add per step, whatever the number
   of rows M and whichever tile a row falls in: a row's result does not depend on how many rows share the call.
   So a verify pass of 1 + K tokens gives each token the bits a one-token step gives it, and speculative
   decoding is exact. The weight is streamed once per call for up to ROWS rows (more rows re-read a group of
   output blocks from L2), so a pass of several rows costs little more than one: the reason to draft at all
   on a CPU.

   W is packed as [N / LANES][K][LANES] (N padded to a multiple of LANES by the caller). */
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>

#if defined(__AVX512F__)
#define LANES 16
#define ROWS 7 /* 7 rows x 4 blocks = 28 accumulators of 32 registers: a verify pass of 1 + 6 in one tile */
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
    case 6 * 8 + BT: T(6 < ROWS ? 6 : ROWS, BT); break;                                                        \
    case 7 * 8 + BT: T(7 < ROWS ? 7 : ROWS, BT); break;

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

/* ---- attention over the q8 cache, one query row at a time, int8 keys and values read as they are stored ----

   Keys are stored in blocks of KBLOCK tokens, dimension-major within a block ([heads][blocks][D][KBLOCK] int8),
   so the scores of KBLOCK tokens are D fused multiply-adds with no horizontal sums; values token-major
   ([heads][capacity][D] int8); one float scale per (token, head) each. Every (row, query head) is computed on
   its own, in one fixed order, over exactly its visible prefix: a row's output does not depend on how many rows
   share the call. Masked lanes (past the row's prefix) are excluded by selects, never by arithmetic. */

#define KBLOCK 16
#define KVECS (KBLOCK / LANES)

typedef int32_t ivec __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef int8_t bvec __attribute__((vector_size(LANES), aligned(1)));

static inline vec select_vec(ivec mask, vec a, vec b) { return (vec)(((ivec)a & mask) | ((ivec)b & ~mask)); }

#if defined(__AVX512F__)
#include <immintrin.h>
static inline vec int8_vec(const int8_t *p) {
    return (vec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#elif defined(__AVX2__)
#include <immintrin.h>
static inline vec int8_vec(const int8_t *p) {
    return (vec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#else
static inline vec int8_vec(const int8_t *p) {
    vec v;
    for (int l = 0; l < LANES; l++) v[l] = (float)p[l];
    return v;
}
#endif

/* exp(x) for x <= 0 (Cephes' single-precision polynomial): deterministic, within 2 ulp. */
static inline vec vexp(vec x) {
    vec lo = splat(-87.0f);
    x = select_vec(x < lo, lo, x);
    vec fx = x * 1.44269504088896341f + 0.5f;
    ivec n = __builtin_convertvector(fx, ivec);
    vec nf = __builtin_convertvector(n, vec);
    n += (ivec)(nf > fx); /* truncation rounded up a negative value: one less (the mask is -1) */
    nf = __builtin_convertvector(n, vec);
    vec r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    vec y = splat(1.9875691500e-4f);
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    return y * (vec)((n + 127) << 23);
}

static inline vec float_vec(const float *p) { return load(p); }

/* q: query rows (q[row * q_row + head * q_head + d]); kb/ks/v/vs: one layer's cache (capacity `cap` tokens);
   row j sees `past + j + 1` tokens; out: [rows][hq][D]. D must be a multiple of LANES. ELEM is the stored type
   (int8 with per-(token, head) scales, or float without: ks/vs NULL, and no multiply by a scale). */
#define ATTENTION(NAME, ELEM, TO_VEC, SCALED)                                                                  \
    int NAME(const float *q, long q_row, long q_head, const ELEM *kb, const float *ks, const ELEM *v,          \
             const float *vs, long cap, int rows, int hq, int hkv, int D, int past, float scale, float *out,    \
             int threads) {                                                                                    \
        if (D % LANES || hq % hkv) return 1;                                                                   \
        int group = hq / hkv;                                                                                  \
        long units = (long)rows * hq;                                                                          \
        int failed = 0;                                                                                        \
        _Pragma("omp parallel for schedule(static) num_threads(threads) reduction(| : failed)")              \
        for (long u = 0; u < units; u++) {                                                                     \
            int j = (int)(u / hq), head = (int)(u % hq), h = head / group;                                     \
            long n = past + j + 1;                                                                             \
            long blocks = (n + KBLOCK - 1) / KBLOCK;                                                           \
            float *scores = malloc(sizeof(float) * blocks * KBLOCK);                                           \
            if (!scores) {                                                                                     \
                failed = 1;                                                                                    \
                continue;                                                                                      \
            }                                                                                                  \
            const float *qr = q + (long)j * q_row + (long)head * q_head;                                       \
            const ELEM *kh = kb + (long)h * (cap / KBLOCK) * D * KBLOCK;                                       \
            vec vmax = splat(-INFINITY);                                                                       \
            for (long b = 0; b < blocks; b++) {                                                                \
                vec acc[KVECS];                                                                                \
                for (int i = 0; i < KVECS; i++) acc[i] = splat(0.0f);                                          \
                const ELEM *kblock = kh + b * D * KBLOCK;                                                      \
                for (int d = 0; d < D; d++) {                                                                  \
                    vec qd = splat(qr[d]);                                                                     \
                    for (int i = 0; i < KVECS; i++) acc[i] += qd * TO_VEC(kblock + d * KBLOCK + i * LANES);    \
                }                                                                                              \
                for (int i = 0; i < KVECS; i++) {                                                              \
                    long t0 = b * KBLOCK + i * LANES;                                                          \
                    ivec lane;                                                                                 \
                    for (int l = 0; l < LANES; l++) lane[l] = (int32_t)(t0 + l < n ? -1 : 0);                  \
                    vec s = SCALED ? acc[i] * load(ks + (long)h * cap + t0) * scale : acc[i] * scale;          \
                    s = select_vec(lane, s, splat(-INFINITY));                                                 \
                    vmax = select_vec(s > vmax, s, vmax);                                                      \
                    store(scores + t0, s);                                                                     \
                }                                                                                              \
            }                                                                                                  \
            float m = vmax[0];                                                                                 \
            for (int l = 1; l < LANES; l++) m = vmax[l] > m ? vmax[l] : m;                                     \
            vec vsum = splat(0.0f);                                                                            \
            for (long b = 0; b < blocks * KVECS; b++) {                                                        \
                long t0 = b * LANES;                                                                           \
                ivec lane;                                                                                     \
                for (int l = 0; l < LANES; l++) lane[l] = (int32_t)(t0 + l < n ? -1 : 0);                      \
                vec p = select_vec(lane, vexp(load(scores + t0) - m), splat(0.0f));                            \
                vsum += p;                                                                                     \
                store(scores + t0, p);                                                                         \
            }                                                                                                  \
            float total = 0.0f;                                                                                \
            for (int l = 0; l < LANES; l++) total += vsum[l];                                                  \
            if (SCALED)                                                                                        \
                for (long t = 0; t < n; t++) scores[t] *= vs[(long)h * cap + t];                               \
            const ELEM *vh = v + (long)h * cap * D;                                                            \
            float *o = out + ((long)j * hq + head) * D;                                                        \
            for (int c = 0; c < D; c += LANES) {                                                               \
                vec acc = splat(0.0f);                                                                         \
                for (long t = 0; t < n; t++) acc += splat(scores[t]) * TO_VEC(vh + t * D + c);                 \
                store(o + c, acc / total);                                                                     \
            }                                                                                                  \
            free(scores);                                                                                      \
        }                                                                                                      \
        return failed;                                                                                         \
    }

ATTENTION(q8attn, int8_t, int8_vec, 1)
ATTENTION(f32attn, float, float_vec, 0)
