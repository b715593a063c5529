"""Patch the llama.cpp source that llama-cpp-python's sdist carries so that one position is computed alike in a
batch of one and in a batch of many, with float32 activations for float16 weights (the CPU build only).

Stock llama.cpp on the CPU rounds a float16 model's activations to float16 before every matrix product, and
multiplies a single token with `ggml_vec_dot_f16` but a batch of 2+ tokens with llamafile's tinyBLAS (another
summation order): a speculative verify pass then differs from plain decoding in the last bits, so specchat's
exact path had to run plain steps as padded two-row batches (1.3-1.6x the cost of a one-token step). It also
attends a single query row over >= 512 cached positions in KV chunks merged afterwards (another rounding).

The patch:
1. adds `ggml_vec_dot_f16_f32` (float16 weights x float32 activations, float32 accumulators) and makes it the
   float16 type's dot product, with float32 as its activation type, for every batch size; tinyBLAS has no
   float16 x float32 kernel on x86, so it steps aside for float16 weights by itself;
2. attends every query row of a small batch (under 64 rows, the tiled prefill path aside) over its visible keys
   in fixed chunks of 256 cache cells, merged in chunk order: a row is then computed alike at any batch size,
   thread count and cache view length, and a one-token decode at a long context shares the chunks of all heads
   among the threads. Stock llama.cpp splits a single row's keys by thread count and view length (another
   rounding than a batch row's), so the patch used to turn that split off, and a one-token decode over thousands
   of cached tokens then ran its heads unevenly on the threads (SmolLM2's 9 heads on 2 threads: 0.87x
   llama-server at 3.9k tokens); the split is now never reached for such rows;
3. keeps llama.cpp's own float16 dot (the query rounded to float16) for attention's key . query products over a
   float16 cache where the stock per-key kernel still runs (other caches); over a float16 cache with float32
   queries a chunk is a dense kernel of its own (every key . query, one softmax, then the values, prefetched);
4. makes tinyBLAS (a batch of 2+ rows) stream its weights: it prefetches the next weight rows, and a small
   batch's row blocks are one contiguous range per thread. A 2-row pass of the embedded model cost 1.8-2.4x a
   one-token step (short prefetcher streams of 4 rows at a time), 1.3x after; 5 rows 2.7x -> 1.7x.

Usage: python scripts/patch_llama_cpp.py <llama.cpp source folder> (`--key`: print the hash of the edits, the
wheel cache's key). Exits 1 with one line when a file does not
look as expected (another llama.cpp version): the Makefile then builds the stock bindings, and specchat's load
probe finds the kernels disagree and pads plain steps, as before. Idempotent.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARK = "specchat: float32 activations for float16 weights"

DOT = """
// __MARK__ (scripts/patch_llama_cpp.py): one token is multiplied exactly as a row of a batch is by
// tinyBLAS (llamafile/sgemm.cpp, float16 x float32): one accumulator of KN lanes, k in steps of KN, fused
// multiply-adds, then tinyBLAS's horizontal sum. Where tinyBLAS does not take a product (k not a multiple of KN,
// no FMA), every batch size comes here.
void ggml_vec_dot_f16_f32(int n, float * GGML_RESTRICT s, size_t bs, const ggml_fp16_t * GGML_RESTRICT x, size_t bx, const float * GGML_RESTRICT y, size_t by, int nrc) {
    assert(nrc == 1);
    GGML_UNUSED(nrc);
    GGML_UNUSED(bx);
    GGML_UNUSED(by);
    GGML_UNUSED(bs);
    int i = 0;
    float sumf = 0.0f;
#if defined(__AVX512F__) && defined(__FMA__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))), _mm512_loadu_ps(y + i), acc);
    }
    sumf = _mm512_reduce_add_ps(acc);
#elif (defined(__AVX__) || defined(__AVX2__)) && defined(__F16C__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), _mm256_loadu_ps(y + i), acc);
    }
    __m128 h = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    sumf = _mm_cvtss_f32(h);
#endif
    for (; i < n; ++i) {
        sumf += GGML_CPU_FP16_TO_FP32(x[i]) * y[i];
    }
    *s = sumf;
}
""".replace("__MARK__", MARK)


def _sgemm_f16_case(lanes: int, vector: str) -> tuple[str, str]:
    """(anchor, replacement) in llamafile_sgemm's float16 case for one x86 vector width: tinyBLAS also takes
    float16 weights against float32 activations (before its float16 x float16 case)."""
    anchor = f"""        if (Btype == GGML_TYPE_F16) {{
            tinyBLAS<{lanes}, {vector}, {vector}, ggml_fp16_t, ggml_fp16_t, float> tb{{ params, k,"""
    case = f"""#if defined(__FMA__) && defined(__F16C__) // {MARK}
        if (Btype == GGML_TYPE_F32) {{
            tinyBLAS<{lanes}, {vector}, {vector}, ggml_fp16_t, float, float> tb{{ params, k,
                (const ggml_fp16_t *)A, lda,
                (const float *)B, ldb,
                (float *)C, ldc}};
            return tb.matmul(m, n);
        }}
#endif
"""
    return anchor, case + anchor


SGEMM_512_OLD, SGEMM_512_NEW = _sgemm_f16_case(16, "__m512")
SGEMM_256_OLD, SGEMM_256_NEW = _sgemm_f16_case(8, "__m256")

# A small batch (one block of columns) gives each thread one contiguous range of row blocks instead of blocks handed
# out one at a time: a thread's next rows are then the ones it prefetched. Arithmetic unchanged. The x86 tinyBLAS
# and the RISC-V one share this text: both take it (the edits found twice).
SGEMM_JOBS_OLD = """        int64_t job = params->ith;
        while (job < nb_job) {
            const int64_t ii = (job % ytiles) * RM * BM;
"""
SGEMM_JOBS_NEW = f"""        const bool specchat_ranges = NB_BN == 1; // {MARK}: contiguous row blocks per thread
        const int64_t specchat_per = (nb_job + params->nth - 1) / params->nth;
        const int64_t specchat_end = specchat_ranges ? std::min(nb_job, (params->ith + 1) * specchat_per) : nb_job;
        int64_t job = specchat_ranges ? params->ith * specchat_per : params->ith;
        while (job < specchat_end) {{
            const int64_t ii = (job % ytiles) * RM * BM;
"""
SGEMM_NEXT_OLD = """            job = ggml_threadpool_chunk_add(params->threadpool, 1);
        }
"""
SGEMM_NEXT_NEW = """            job = specchat_ranges ? job + 1 : ggml_threadpool_chunk_add(params->threadpool, 1);
        }
"""

# tinyBLAS walks RM weight rows side by side, KN columns at a time: RM short streams (a row of a 576-wide float16
# matrix is 18 cache lines) that the hardware prefetcher must pick up anew every RM rows. The next RM rows lie
# right after (row-major weights), so each step asks for its share of them ahead of time. Arithmetic unchanged.
SGEMM_PF_OLD = """    inline void gemm_bloc(int64_t ii, int64_t jj) {
        D Cv[RN][RM] = {};
        for (int64_t l = 0; l < k; l += KN) {
"""
SGEMM_PF_NEW = f"""    inline void gemm_bloc(int64_t ii, int64_t jj) {{
        D Cv[RN][RM] = {{}};
        const char * specchat_next = (const char *) (A + lda * (ii + RM)); // {MARK}: the next rows, ahead
        for (int64_t l = 0; l < k; l += KN) {{
            for (int64_t b = 0; b < (int64_t) (RM * KN * sizeof(TA)); b += 64) {{
                __builtin_prefetch(specchat_next + l * RM * sizeof(TA) + b, 0, 0);
            }}
"""

DECL_AFTER = (
    "void ggml_vec_dot_f16(int n, float * GGML_RESTRICT s, size_t bs, ggml_fp16_t * GGML_RESTRICT x, size_t bx, "
    "ggml_fp16_t * GGML_RESTRICT y, size_t by, int nrc);\n"
)
DECL = (
    "void ggml_vec_dot_f16_f32(int n, float * GGML_RESTRICT s, size_t bs, const ggml_fp16_t * GGML_RESTRICT x, "
    "size_t bx, const float * GGML_RESTRICT y, size_t by, int nrc); // " + MARK + "\n"
    "// Where tinyBLAS has the float16 x float32 case (x86 with F16C and FMA), float16 weights take it; elsewhere\n"
    "// (ARM, ...) llama.cpp's own float16 kernels stay, and specchat's load probe decides as for a stock build.\n"
    "#if defined(__FMA__) && defined(__F16C__) && (defined(__AVX512F__) || defined(__AVX2__) || defined(__AVX__))\n"
    "#define SPECCHAT_F16_F32 1\n"
    "#else\n"
    "#define SPECCHAT_F16_F32 0\n"
    "#endif\n"
    "#define SPECCHAT_FA_CHUNK 256 // " + MARK + ": flash attention's fixed key chunk (cache cells)\n"
)

TRAIT_OLD = """    [GGML_TYPE_F16] = {
        .from_float               = (ggml_from_float_t) ggml_cpu_fp32_to_fp16,
        .vec_dot                  = (ggml_vec_dot_t) ggml_vec_dot_f16,
        .vec_dot_type             = GGML_TYPE_F16,
"""
TRAIT_NEW = f"""    [GGML_TYPE_F16] = {{
        .from_float               = (ggml_from_float_t) ggml_cpu_fp32_to_fp16,
#if SPECCHAT_F16_F32 // {MARK}
        .vec_dot                  = (ggml_vec_dot_t) ggml_vec_dot_f16_f32,
        .vec_dot_type             = GGML_TYPE_F32,
#else
        .vec_dot                  = (ggml_vec_dot_t) ggml_vec_dot_f16,
        .vec_dot_type             = GGML_TYPE_F16,
#endif
"""

CHUNKED_ANCHOR = "// Reduction function: combines partial results across KV chunks\n"
CHUNKED = """// __MARK__ (scripts/patch_llama_cpp.py): a query row of a small batch attends its
// visible keys in fixed chunks of SPECCHAT_FA_CHUNK cache cells, each a softmax of its own, merged in chunk order
// (a chunk with no visible key is skipped). Neither the batch size, nor the thread count, nor the cache view's
// length changes a row's arithmetic, so a row of a verify batch equals a one-token decode. Over a float16 cache
// (float32 queries, no attention sinks) work items are (chunk, row) pairs, chunk-major, a contiguous range per
// thread: a single row shares its chunks of every head among the threads (as llama.cpp's split-KV path does), and
// the rows of a batch read each chunk while it is in cache. A chunk is then a dense kernel (specchat_fa_chunk_f16):
// every key . query first (float16 keys x the float32 query, float32 accumulators), one vector softmax over the
// whole chunk, then the weighted values summed in float32, the next rows prefetched (a one-token step over
// thousands of keys waits on memory, not arithmetic). Stock llama.cpp steps key by key (an online softmax with a
// float16 value accumulator): a one-token step over 3.9k cached tokens took 30-33 ms with it, 25-27 ms with this,
// and a 17-row pass at 2k tokens 8.8 -> 7.5 one-token steps, on a Zen 4 EPYC. Other caches keep the stock per-key kernel (one_chunk) in
// the same chunks, each thread whole rows (then a view of one chunk is the stock path: VKQ*1, S*1, then VKQ/S).
// Returns false where the stock paths run: the reference path and the tiled prefill path (GGML_FA_TILE_Q+ rows).
static inline float specchat_dot_f16_f32(int64_t n, const ggml_fp16_t * GGML_RESTRICT x, const float * GGML_RESTRICT y) {
    int64_t i = 0;
    float sumf = 0.0f;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps();
    __m512 a1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))), _mm512_loadu_ps(y + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i + 16))), _mm512_loadu_ps(y + i + 16), a1);
    }
    for (; i + 16 <= n; i += 16) {
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))), _mm512_loadu_ps(y + i), a0);
    }
    sumf = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    __m256 a0 = _mm256_setzero_ps();
    __m256 a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8))), _mm256_loadu_ps(y + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) {
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), _mm256_loadu_ps(y + i), a0);
    }
    a0 = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_extractf128_ps(a0, 1), _mm256_castps256_ps128(a0));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    sumf = _mm_cvtss_f32(h);
#endif
    for (; i < n; ++i) {
        sumf += GGML_CPU_FP16_TO_FP32(x[i])*y[i];
    }
    return sumf;
}

static inline void specchat_mad_f16_f32(int64_t n, float * GGML_RESTRICT acc, const ggml_fp16_t * GGML_RESTRICT x, float w) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 vw = _mm512_set1_ps(w);
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))), vw, _mm512_loadu_ps(acc + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    const __m256 vw = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), vw, _mm256_loadu_ps(acc + i)));
    }
#endif
    for (; i < n; ++i) {
        acc[i] += GGML_CPU_FP16_TO_FP32(x[i])*w;
    }
}

static inline void specchat_prefetch(const char * p, int64_t bytes, bool near) {
    for (int64_t o = 0; o < bytes; o += 64) {
        if (near) {
            __builtin_prefetch(p + o, 0, 3);
        } else {
            __builtin_prefetch(p + o, 0, 2);
        }
    }
}

#define SPECCHAT_FA_AHEAD 8 // key/value rows prefetched ahead

// One item over a float16 cache: keys [c0, c1) of chunk c for query row ir = (iq3*neq2 + iq2)*neq1 + iq1; its
// partial [M, S, sum of exp(s - M)*v] at base + (ir*nch + c)*(2 + DV). sc: SPECCHAT_FA_CHUNK floats.
static void specchat_fa_chunk_f16(const ggml_tensor * dst, int64_t ir, int64_t c, int64_t c0, int64_t c1,
        float * base, int64_t nch, float * sc) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * k    = dst->src[1];
    const ggml_tensor * v    = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    const int64_t DK = k->ne[0];
    const int64_t DV = v->ne[0];
    const int64_t neq1 = q->ne[1];
    const int64_t neq2 = q->ne[2];
    const int64_t C = SPECCHAT_FA_CHUNK;
    const int64_t iq3 = ir/(neq2*neq1);
    const int64_t iq2 = (ir - iq3*neq2*neq1)/neq1;
    const int64_t iq1 = ir - iq3*neq2*neq1 - iq2*neq1;
    float scale         = 1.0f;
    float max_bias      = 0.0f;
    float logit_softcap = 0.0f;
    memcpy(&scale,         (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias,      (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&logit_softcap, (const float *) dst->op_params + 2, sizeof(float));
    if (logit_softcap != 0) {
        scale /= logit_softcap;
    }
    const uint32_t n_head      = neq2;
    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(n_head));
    const float m0 = powf(2.0f, -(max_bias       ) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);
    const uint32_t h = iq2;
    const float slope = (max_bias > 0.0f) ? h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2*(h - n_head_log2) + 1) : 1.0f;
    const float * pq = (const float *) ((const char *) q->data + iq1*q->nb[1] + iq2*q->nb[2] + iq3*q->nb[3]);
    const ggml_fp16_t * mp = mask ? (const ggml_fp16_t *)((const char *) mask->data + iq1*mask->nb[1] + (iq2%mask->ne[2])*mask->nb[2] + (iq3%mask->ne[3])*mask->nb[3]) : NULL;
    const int64_t ik2 = iq2/(neq2/k->ne[2]);
    const int64_t ik3 = iq3/(q->ne[3]/k->ne[3]);
    const int64_t iv2 = iq2/(neq2/v->ne[2]);
    const int64_t iv3 = iq3/(q->ne[3]/v->ne[3]);
    const char * kb = (const char *) k->data + ik2*k->nb[2] + ik3*k->nb[3] + c0*k->nb[1];
    const char * vb = (const char *) v->data + iv2*v->nb[2] + iv3*v->nb[3] + c0*v->nb[1];
    float * p = base + (ir*nch + c)*(2 + DV);
    const int64_t n = c1 - c0;
    float M = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
        if (j + SPECCHAT_FA_AHEAD < n) {
            specchat_prefetch(kb + (j + SPECCHAT_FA_AHEAD)*k->nb[1], DK*sizeof(ggml_fp16_t), true);
            specchat_prefetch(vb + (j + SPECCHAT_FA_AHEAD)*v->nb[1], DV*sizeof(ggml_fp16_t), false);
        }
        const float mj = mp ? GGML_CPU_FP16_TO_FP32(mp[c0 + j]) : 0.0f;
        if (mj == -INFINITY) {
            sc[j] = -INFINITY;
            continue;
        }
        float s = specchat_dot_f16_f32(DK, (const ggml_fp16_t *)(kb + j*k->nb[1]), pq)*scale;
        if (logit_softcap != 0.0f) {
            s = logit_softcap*tanhf(s);
        }
        s += slope*mj;
        sc[j] = s;
        M = M > s ? M : s;
    }
    memset(p + 2, 0, DV*sizeof(float));
    p[0] = M;
    p[1] = 0.0f;
    if (M == -INFINITY) {
        return;
    }
    for (int64_t j = n; j < C; ++j) {
        sc[j] = -INFINITY;  // a short last chunk sums as a whole one: the view's length changes nothing
    }
    p[1] = (float) ggml_vec_soft_max_f32((int) C, sc, sc, M);
    for (int64_t j = 0; j < n; ++j) {
        if (sc[j] != 0.0f) {
            specchat_mad_f16_f32(DV, p + 2, (const ggml_fp16_t *)(vb + j*v->nb[1]), sc[j]);
        }
    }
}

static bool specchat_fa_chunked(const ggml_compute_params * params, ggml_tensor * dst, bool tiled) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const int64_t DK = k->ne[0];
    const int64_t DV = v->ne[0];
    const int64_t nek1 = k->ne[1];
    const int64_t neq1 = q->ne[1];
    const int64_t neq2 = q->ne[2];
    const int64_t nr = q->ne[1]*q->ne[2]*q->ne[3];
    const int64_t C = SPECCHAT_FA_CHUNK;
    const bool dense = q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F16 && v->type == GGML_TYPE_F16 && dst->src[4] == nullptr;
    if (params->use_ref || tiled || (!dense && nek1 <= C)) {
        return false;
    }
    const int ith = params->ith;
    const int nth = params->nth;
    const int64_t nch = (nek1 + C - 1)/C;
    const int64_t psz = 2 + DV;
    const int64_t scratch = DK + 2*DV + CACHE_LINE_SIZE_F32;
    float * base = (float *) params->wdata + nth*scratch;
    float * out = (float *) params->wdata + ith*scratch;  // this thread's VKQ32 scratch (one_chunk's too)
    auto merge = [&](int64_t ir, const float * partials) {
        float M = -INFINITY;
        float S = 0.0f;
        memset(out, 0, DV*sizeof(float));
        for (int64_t c = 0; c < nch; ++c) {
            const float * p = partials + c*psz;
            if (p[1] == 0.0f) {
                continue;
            }
            const float Mn = fmaxf(M, p[0]);
            const float so = expf(M - Mn);
            const float sn = expf(p[0] - Mn);
            for (int64_t d = 0; d < DV; ++d) {
                out[d] = out[d]*so + p[2 + d]*sn;
            }
            S = S*so + p[1]*sn;
            M = Mn;
        }
        const float S_inv = S == 0.0f ? 0.0f : 1.0f/S;
        ggml_vec_scale_f32(DV, out, S_inv);
        const int64_t iq3 = ir/(neq2*neq1);
        const int64_t iq2 = (ir - iq3*neq2*neq1)/neq1;
        const int64_t iq1 = ir - iq3*neq2*neq1 - iq2*neq1;
        memcpy((char *) dst->data + (iq3*dst->ne[2]*dst->ne[1] + iq2 + iq1*dst->ne[1])*dst->nb[1], out, dst->nb[1]);
    };
    if (dense || neq1 == 1) {
        // partials [row][chunk]; items chunk-major (the query position innermost), a contiguous range per thread
        float * sc = base + nr*nch*psz + ith*(C + CACHE_LINE_SIZE_F32);
        const int64_t n_items = nch*nr;
        const int64_t per = (n_items + nth - 1)/nth;
        const int64_t end = std::min(n_items, (ith + 1)*per);
        for (int64_t it = ith*per; it < end; ++it) {
            const int64_t c = it/nr;
            const int64_t ir = it - c*nr;
            const int64_t c1 = std::min((c + 1)*C, nek1);
            if (dense) {
                specchat_fa_chunk_f16(dst, ir, c, c*C, c1, base, nch, sc);
            } else {
                ggml_compute_forward_flash_attn_ext_f16_one_chunk(params, dst, ir, ir + 1, c*C, c1, base + c*psz, nch*psz);
            }
        }
        ggml_barrier(params->threadpool);
        for (int64_t ir = ith; ir < nr; ir += nth) {
            merge(ir, base + ir*nch*psz);
        }
        return true;
    }
    // several rows over another cache type: each thread takes whole rows, their chunks in its own partials
    float * mine = base + ith*nch*psz;
    for (int64_t ir = ith; ir < nr; ir += nth) {
        for (int64_t c = 0; c < nch; ++c) {
            ggml_compute_forward_flash_attn_ext_f16_one_chunk(
                params, dst, ir, ir + 1, c*C, std::min((c + 1)*C, nek1), mine + c*psz, 0);
        }
        merge(ir, mine);
    }
    return true;
}

""".replace("__MARK__", MARK)

DISPATCH_OLD = "    if (use_split_kv_path) {\n"
DISPATCH_NEW = """    if (specchat_fa_chunked(params, dst, // __MARK__
            q->type == GGML_TYPE_F32 && kv_is_f32_or_f16 && k->type == v->type && neq1 >= GGML_FA_TILE_Q)) {
        return;
    }
    if (use_split_kv_path) {
""".replace("__MARK__", MARK)

PLAN_OLD = """                        size_t decode   = sizeof(float)*(neq2*n_chunks*(2+DV) + n_tasks*(DK + 2*DV));
"""
PLAN_NEW = """                        size_t decode   = sizeof(float)*(neq2*n_chunks*(2+DV) + n_tasks*(DK + 2*DV));
                        { // __MARK__: fixed key chunks, partials of every row of a small batch, a chunk's scores per thread
                            const int64_t nch = (node->src[1]->ne[1] + SPECCHAT_FA_CHUNK - 1)/SPECCHAT_FA_CHUNK;
                            const int64_t nq = node->src[0]->ne[1] < GGML_FA_TILE_Q ? node->src[0]->ne[1] : 1;
                            const int64_t rows = nq*neq2*node->src[0]->ne[3] + n_tasks;
                            const size_t chunked = sizeof(float)*(rows*nch*(2 + DV)
                                + n_tasks*(DK + 2*DV + SPECCHAT_FA_CHUNK + 2*CACHE_LINE_SIZE_F32));
                            decode = MAX(decode, chunked);
                        }
""".replace("__MARK__", MARK)

# Attention's key . query dot for a float16 cache: llama.cpp's own float16 dot, the query rounded to float16 once
# per row, as stock llama.cpp does (the float16 type's dot above is for weights; over a cache of thousands of keys
# of 64 lanes it cost a one-token decode at 3.9k cached tokens 1.3x llama-server's time on a Zen 4 EPYC). Every
# row of every batch size goes through this one function (one_chunk), so rows still agree with one-token decodes.
KQ_OLD = """    ggml_type         const k_vec_dot_type = ggml_get_type_traits_cpu(k->type)->vec_dot_type;
    ggml_from_float_t const q_to_vec_dot   = ggml_get_type_traits_cpu(k_vec_dot_type)->from_float;
    ggml_vec_dot_t    const kq_vec_dot     = ggml_get_type_traits_cpu(k->type)->vec_dot;
"""
KQ_NEW = """    // __MARK__: a float16 cache takes llama.cpp's float16 dot (the query rounded once), as stock llama.cpp
    const bool        specchat_kq_f16  = k->type == GGML_TYPE_F16;
    ggml_type         const k_vec_dot_type = specchat_kq_f16 ? GGML_TYPE_F16 : ggml_get_type_traits_cpu(k->type)->vec_dot_type;
    ggml_from_float_t const q_to_vec_dot   = ggml_get_type_traits_cpu(k_vec_dot_type)->from_float;
    ggml_vec_dot_t    const kq_vec_dot     = specchat_kq_f16 ? (ggml_vec_dot_t) ggml_vec_dot_f16 : ggml_get_type_traits_cpu(k->type)->vec_dot;
""".replace("__MARK__", MARK)


class PatchError(Exception):
    """A source file that does not look as the patch expects (another llama.cpp version)."""


def patched_text(path: Path, edits: list[tuple]) -> str | None:
    """`path`'s text with every (old, new[, times]) edit made, each `old` found exactly `times` (1) times; None if
    already patched."""
    text = path.read_text()
    if MARK in text:
        return None
    for old, new, *times in edits:
        if text.count(old) != (times[0] if times else 1):
            raise PatchError(
                f"patch_llama_cpp: {path} does not look as expected (another llama.cpp version?)"
            )
        text = text.replace(old, new)
    return text


def key() -> str:
    """A short hash of what the patch writes (not of this file's text): the wheel cache's key."""
    import hashlib

    edits = (
        DECL,
        DOT,
        TRAIT_OLD,
        TRAIT_NEW,
        KQ_OLD,
        KQ_NEW,
        SGEMM_512_NEW,
        SGEMM_256_NEW,
        SGEMM_PF_NEW,
        SGEMM_JOBS_NEW,
        SGEMM_NEXT_NEW,
        CHUNKED,
        DISPATCH_NEW,
        PLAN_NEW,
    )
    return hashlib.sha256("\0".join(edits).encode()).hexdigest()[:12]


def main(argv: list[str]) -> int:
    if argv[1:] == ["--key"]:
        print(key())
        return 0
    if len(argv) != 2:
        print("usage: patch_llama_cpp.py <llama.cpp source folder>", file=sys.stderr)
        return 2
    cpu = Path(argv[1]) / "ggml" / "src" / "ggml-cpu"
    anchor = "void ggml_vec_dot_f32("
    plan = {
        cpu / "vec.h": [(DECL_AFTER, DECL_AFTER + DECL)],
        cpu / "vec.cpp": [(anchor, DOT.lstrip("\n") + "\n" + anchor)],
        cpu / "ggml-cpu.c": [(TRAIT_OLD, TRAIT_NEW), (PLAN_OLD, PLAN_NEW)],
        cpu / "ops.cpp": [
            (KQ_OLD, KQ_NEW),
            (CHUNKED_ANCHOR, CHUNKED + CHUNKED_ANCHOR),
            (DISPATCH_OLD, DISPATCH_NEW),
        ],
        cpu / "llamafile" / "sgemm.cpp": [
            (SGEMM_512_OLD, SGEMM_512_NEW),
            (SGEMM_256_OLD, SGEMM_256_NEW),
            (SGEMM_PF_OLD, SGEMM_PF_NEW),
            (SGEMM_JOBS_OLD, SGEMM_JOBS_NEW, 2),
            (SGEMM_NEXT_OLD, SGEMM_NEXT_NEW, 2),
        ],
    }
    for path in plan:
        if not path.is_file():
            print(f"patch_llama_cpp: no {path}", file=sys.stderr)
            return 1
    try:  # every file checked before any is written: a refused tree is left as it was
        texts = {path: patched_text(path, edits) for path, edits in plan.items()}
    except PatchError as exc:
        print(exc, file=sys.stderr)
        return 1
    for path, text in texts.items():
        if text is not None:
            path.write_text(text)
    print(
        f"patched llama.cpp in {argv[1]}: float32 activations for float16 weights, one kernel per batch size, "
        "fixed key chunks in attention (a dense kernel over a float16 cache), tinyBLAS streaming its weights"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
