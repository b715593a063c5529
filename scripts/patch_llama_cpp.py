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
5. computes quantized weights exactly too, for a batch of up to SPECCHAT_EXACT_ROWS (64) rows (x86): Q4_K weights
   repacked (llama.cpp's default, `use_extra_bufts`) take one kernel for every batch size, each row quantized
   alone and multiplied with the float arithmetic of the stock one-row kernel (ggml_gemv_q4_K_8x8_q8_K; stock
   llama.cpp's 4-row gemm rounds four times a block where the gemv rounds once), each weight block unpacked once
   for 8 rows with AVX-512 VNNI or 4 with AVX2; Q6_K weights (not repacked on x86) take a 4-row kernel with the arithmetic
   of ggml_vec_dot_q6_K_q8_K (the one-row kernel); and no batch of up to 64 rows takes ggml's tiled K-quant
   kernel (another rounding, from 8 rows), so every other K-quant (Q5_K, Q4_K unpacked, ...) runs its vec_dot per
   row; attention's fixed chunks (2.) reach 64 rows too. Prefill batches of more rows keep the tiled kernels.
   Mixture-of-experts weights likewise: stock llama.cpp gives an expert the tiled kernel from 8 routed rows
   (which rows of a verify pass round otherwise depends on the routing); a pass of up to 64 tokens never does.
   Float32, bfloat16 and IQ4_NL weights (the small float32 tensors of a quantized file, a MoE's router among them;
   bfloat16 files; unpacked IQ4_NL) take vec_dot per row within such a batch rather than tinyBLAS.
   Elsewhere (ARM) the stock kernels stay and specchat's load probe decides.
6. makes a Gated DeltaNet layer with native rollback (Qwen3.5's) write the conv-state snapshots of its pass's own
   tokens only, as the recurrent state's are written: it wrote all N + 1 every step (7% of a plain step).

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
    "#define SPECCHAT_EXACT_ROWS 64 // " + MARK + ": a batch of up to this many rows is computed row by row\n"
    "int specchat_exact_rows(void); // exported: SPECCHAT_EXACT_ROWS (quantized weights exact up to that batch)\n"
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
// the same chunks, each thread whole rows, a view of one chunk included (which merges as the stock path ends: VKQ*1,
// S*1, then VKQ/S): stock llama.cpp's tiled kernel took a pass of 64 rows over <= 256 cells of a float16 cache with
// attention sinks (gpt-oss), and a quantized cache's rows took the stock path up to 256 cells and chunks above.
// Returns false where the stock paths run: the reference path and the tiled prefill path (over 64 rows).
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
    if (params->use_ref || tiled) {
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
            q->type == GGML_TYPE_F32 && kv_is_f32_or_f16 && k->type == v->type && neq1 > SPECCHAT_EXACT_ROWS)) {
        return;
    }
    if (use_split_kv_path) {
""".replace("__MARK__", MARK)

PLAN_OLD = """                        size_t decode   = sizeof(float)*(neq2*n_chunks*(2+DV) + n_tasks*(DK + 2*DV));
"""
PLAN_NEW = """                        size_t decode   = sizeof(float)*(neq2*n_chunks*(2+DV) + n_tasks*(DK + 2*DV));
                        { // __MARK__: fixed key chunks, partials of every row of a small batch, a chunk's scores per thread
                            const int64_t nch = (node->src[1]->ne[1] + SPECCHAT_FA_CHUNK - 1)/SPECCHAT_FA_CHUNK;
                            const int64_t nq = node->src[0]->ne[1] <= SPECCHAT_EXACT_ROWS ? node->src[0]->ne[1] : 1;
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


# Quantized weights (x86). Q4_K repacked: the kernel and its predicate go before the repack tensor traits.
Q4K_KERNEL = """
// __MARK__ (scripts/patch_llama_cpp.py): Q4_K weights repacked 8 columns at a time (block_q4_Kx8) times any
// number of Q8_K activation rows, every row quantized alone (quantize_row_q8_K) and computed with the float
// arithmetic of one row in ggml_gemv_q4_K_8x8_q8_K: per super block, in order, for each column c
//     acc[c]  = fma(float(isum[c]), d[c]*d_row,    acc[c])    isum: the block's scale-weighted dot (an exact int)
//     accm[c] = fma(float(imin[c]), dmin[c]*d_row, accm[c])   imin: its mins times the row's sums (an exact int)
// and out[c] = acc[c] - accm[c]. Stock llama.cpp multiplies 4-row groups with ggml_gemm_q4_K_8x8_q8_K, which
// rounds into the float accumulators after every pair of sub-blocks (4 times a block): a row of a batch then
// differs from the same row alone. Here one kernel takes 1..N rows, each weight block loaded and unpacked once
// for up to SPECCHAT_Q4_K_R rows (8 with AVX-512, 4 with AVX2); the integer parts are exact in any order (AVX-512 VNNI or AVX2 below).
static inline void specchat_q4_K_scales(const uint8_t * sc12, uint32_t * u) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(u, sc12, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = uaux;
    u[0] &= kmask1;  // bytes 0-7: the 8 columns' scales of one sub-block, bytes 8-15 their mins
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#define SPECCHAT_Q4_K_ROWS 1
#define SPECCHAT_Q4_K_R 8
template <int R>
static void specchat_q4_K_x8(int n, float * s, size_t bs, const block_q4_Kx8 * w, const block_q8_K * a, size_t as, int nc) {
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int x = 0; x < nc / 8; x++) {
        const block_q4_Kx8 * bp = w + (size_t) x * nb;
        __m256 acc[R], accm[R];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_setzero_ps();
            accm[r] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; b++) {
            uint32_t u[8][4];
            for (int k = 0; k < 8; k++) {
                specchat_q4_K_scales(bp[b].scales + 12 * k, u[k]);
            }
            // int32 lanes (column c, half h): bytes 8c+4h..8c+4h+3 of a 64-byte chunk (8 columns x 8 values)
            __m512i iacc[R];
            for (int r = 0; r < R; r++) {
                iacc[r] = _mm512_setzero_si512();
            }
            for (int sb = 0; sb < 4; sb++) {
                const __m512i s0 = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *) u[2 * sb]), dup));
                const __m512i s1 = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *) u[2 * sb + 1]), dup));
                __m512i lo[4], hi[4];
                for (int j = 0; j < 4; j++) {
                    const __m512i raw = _mm512_loadu_si512((const void *) (bp[b].qs + sb * 256 + j * 64));
                    lo[j] = _mm512_and_si512(raw, m4);                        // sub-block 2sb, values 8j..8j+7
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);  // sub-block 2sb+1
                }
                for (int r = 0; r < R; r++) {
                    const int8_t * q8 = a[r * as + b].qs + sb * 64;
                    __m512i alo = _mm512_setzero_si512();
                    __m512i ahi = _mm512_setzero_si512();
                    for (int j = 0; j < 4; j++) {
                        int64_t vlo;
                        int64_t vhi;
                        memcpy(&vlo, q8 + 8 * j, 8);
                        memcpy(&vhi, q8 + 32 + 8 * j, 8);
                        alo = _mm512_dpbusd_epi32(alo, lo[j], _mm512_set1_epi64(vlo));
                        ahi = _mm512_dpbusd_epi32(ahi, hi[j], _mm512_set1_epi64(vhi));
                    }
                    iacc[r] = _mm512_add_epi32(iacc[r], _mm512_add_epi32(_mm512_mullo_epi32(alo, s0), _mm512_mullo_epi32(ahi, s1)));
                }
            }
            __m256i mins[4];  // int16 pairs (min of sub-block 2t, of 2t+1) per column
            for (int t = 0; t < 4; t++) {
                mins[t] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *) (u[2 * t] + 2)),
                                                                 _mm_loadl_epi64((const __m128i *) (u[2 * t + 1] + 2))));
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) bp[b].d));
            const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) bp[b].dmin));
            for (int r = 0; r < R; r++) {
                const block_q8_K * ar = a + r * as + b;
                const __m256i q8s = _mm256_loadu_si256((const __m256i *) ar->bsums);
                const __m128i p = _mm_hadd_epi16(_mm256_castsi256_si128(q8s), _mm256_extracti128_si256(q8s, 1));
                __m256i imin = _mm256_setzero_si256();
                imin = _mm256_dpwssd_epi32(imin, mins[0], _mm256_set1_epi32(_mm_extract_epi32(p, 0)));
                imin = _mm256_dpwssd_epi32(imin, mins[1], _mm256_set1_epi32(_mm_extract_epi32(p, 1)));
                imin = _mm256_dpwssd_epi32(imin, mins[2], _mm256_set1_epi32(_mm_extract_epi32(p, 2)));
                imin = _mm256_dpwssd_epi32(imin, mins[3], _mm256_set1_epi32(_mm_extract_epi32(p, 3)));
                // the two halves of each column summed: low 32 bits of each 64-bit lane
                const __m256i isum = _mm512_cvtepi64_epi32(_mm512_add_epi64(iacc[r], _mm512_srli_epi64(iacc[r], 32)));
                const __m256 da = _mm256_set1_ps(ar->d);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), acc[r]);
                accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dm, da), accm[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(s + r * bs + x * 8, _mm256_sub_ps(acc[r], accm[r]));
        }
    }
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECCHAT_Q4_K_ROWS 1
#define SPECCHAT_Q4_K_R 4
#define SPECCHAT_Q4_K_GEMV1 1  // one row: the stock gemv itself (the same arithmetic; faster with 16 registers)
template <int R>
static void specchat_q4_K_x8(int n, float * s, size_t bs, const block_q4_Kx8 * w, const block_q8_K * a, size_t as, int nc) {
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m128i dup4 = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    for (int x = 0; x < nc / 8; x++) {
        const block_q4_Kx8 * bp = w + (size_t) x * nb;
        __m256 acc[R], accm[R];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_setzero_ps();
            accm[r] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; b++) {
            uint32_t u[8][4];
            for (int k = 0; k < 8; k++) {
                specchat_q4_K_scales(bp[b].scales + 12 * k, u[k]);
            }
            // int32 lanes (column c, half h) in two registers: columns 0-3, columns 4-7
            __m256i iacc[R][2];
            for (int r = 0; r < R; r++) {
                iacc[r][0] = _mm256_setzero_si256();
                iacc[r][1] = _mm256_setzero_si256();
            }
            for (int sb = 0; sb < 4; sb++) {
                __m256i sc[2][2];  // [sub-block 2sb, 2sb+1][columns 0-3, 4-7]: int16 scale per column, 4 lanes each
                for (int h = 0; h < 2; h++) {
                    const __m128i v = _mm_loadl_epi64((const __m128i *) u[2 * sb + h]);
                    sc[h][0] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(v, dup4));
                    sc[h][1] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_srli_si128(v, 4), dup4));
                }
                __m256i lo[4][2], hi[4][2];
                for (int j = 0; j < 4; j++) {
                    for (int g = 0; g < 2; g++) {
                        const __m256i raw = _mm256_loadu_si256((const __m256i *) (bp[b].qs + sb * 256 + j * 64 + g * 32));
                        lo[j][g] = _mm256_and_si256(raw, m4);
                        hi[j][g] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                    }
                }
                for (int r = 0; r < R; r++) {
                    const int8_t * q8 = a[r * as + b].qs + sb * 64;
                    __m256i alo[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
                    __m256i ahi[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
                    for (int j = 0; j < 4; j++) {  // int16 sums of at most 8 products of 15*127: exact
                        int64_t vlo;
                        int64_t vhi;
                        memcpy(&vlo, q8 + 8 * j, 8);
                        memcpy(&vhi, q8 + 32 + 8 * j, 8);
                        const __m256i blo = _mm256_set1_epi64x(vlo);
                        const __m256i bhi = _mm256_set1_epi64x(vhi);
                        for (int g = 0; g < 2; g++) {
                            alo[g] = _mm256_add_epi16(alo[g], _mm256_maddubs_epi16(lo[j][g], blo));
                            ahi[g] = _mm256_add_epi16(ahi[g], _mm256_maddubs_epi16(hi[j][g], bhi));
                        }
                    }
                    for (int g = 0; g < 2; g++) {
                        iacc[r][g] = _mm256_add_epi32(iacc[r][g], _mm256_add_epi32(_mm256_madd_epi16(alo[g], sc[0][g]), _mm256_madd_epi16(ahi[g], sc[1][g])));
                    }
                }
            }
            __m256i mins[4];
            for (int t = 0; t < 4; t++) {
                mins[t] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *) (u[2 * t] + 2)),
                                                                 _mm_loadl_epi64((const __m128i *) (u[2 * t + 1] + 2))));
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) bp[b].d));
            const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) bp[b].dmin));
            for (int r = 0; r < R; r++) {
                const block_q8_K * ar = a + r * as + b;
                const __m256i q8s = _mm256_loadu_si256((const __m256i *) ar->bsums);
                const __m128i p = _mm_hadd_epi16(_mm256_castsi256_si128(q8s), _mm256_extracti128_si256(q8s, 1));
                __m256i imin = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(_mm_extract_epi32(p, 0)));
                imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[1], _mm256_set1_epi32(_mm_extract_epi32(p, 1))));
                imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[2], _mm256_set1_epi32(_mm_extract_epi32(p, 2))));
                imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[3], _mm256_set1_epi32(_mm_extract_epi32(p, 3))));
                const __m256i isum = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(iacc[r][0], iacc[r][1]), order);
                const __m256 da = _mm256_set1_ps(ar->d);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), acc[r]);
                accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dm, da), accm[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(s + r * bs + x * 8, _mm256_sub_ps(acc[r], accm[r]));
        }
    }
}
#else
#define SPECCHAT_Q4_K_ROWS 0
#endif

#if SPECCHAT_Q4_K_ROWS
// nr rows of activations (a, `as` blocks apart) times nc columns of w, into s (rows bs floats apart)
static void specchat_q4_K_x8_rows(int n, float * s, size_t bs, const void * vx, const void * vy, size_t as, int nr, int nc) {
    const block_q4_Kx8 * w = (const block_q4_Kx8 *) vx;
    const block_q8_K * a = (const block_q8_K *) vy;
#ifdef SPECCHAT_Q4_K_GEMV1
    if (nr == 1) {
        ggml_gemv_q4_K_8x8_q8_K(n, s, bs, vx, vy, 1, nc);
        return;
    }
#endif
    int r = 0;
    for (; r + SPECCHAT_Q4_K_R <= nr; r += SPECCHAT_Q4_K_R) {
        specchat_q4_K_x8<SPECCHAT_Q4_K_R>(n, s + r * bs, bs, w, a + r * as, as, nc);
    }
    switch (nr - r) {
#if SPECCHAT_Q4_K_R > 4
        case 7: specchat_q4_K_x8<7>(n, s + r * bs, bs, w, a + r * as, as, nc); break;
        case 6: specchat_q4_K_x8<6>(n, s + r * bs, bs, w, a + r * as, as, nc); break;
        case 5: specchat_q4_K_x8<5>(n, s + r * bs, bs, w, a + r * as, as, nc); break;
        case 4: specchat_q4_K_x8<4>(n, s + r * bs, bs, w, a + r * as, as, nc); break;
#endif
        case 3: specchat_q4_K_x8<3>(n, s + r * bs, bs, w, a + r * as, as, nc); break;
        case 2: specchat_q4_K_x8<2>(n, s + r * bs, bs, w, a + r * as, as, nc); break;
        case 1: specchat_q4_K_x8<1>(n, s + r * bs, bs, w, a + r * as, as, nc); break;
        default: break;
    }
}
#endif

// Which repacked type takes specchat_q4_K_x8_rows for every batch size (the rest keep gemv/gemm).
template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE>
static constexpr bool specchat_rows_kernel() {
    return SPECCHAT_Q4_K_ROWS && std::is_same_v<BLOC_TYPE, block_q4_K> && INTER_SIZE == 8 && NB_COLS == 8 && PARAM_TYPE == GGML_TYPE_Q8_K;
}

""".replace("__MARK__", MARK)

Q6K_KERNEL = """
// __MARK__ (scripts/patch_llama_cpp.py): Q6_K weights times up to 8 Q8_K activation rows at once, each row with
// the arithmetic of ggml_vec_dot_q6_K_q8_K (x86 AVX2, the kernel of a one-token step): per super block the same
// 8 int32 lanes (lane l: bytes 4l..4l+3 of every 32 values, scale-weighted, less 32 * the row's sums of sub-blocks
// 2l and 2l+1 times their scales), acc = fma(d_row*d, float(lanes), acc), then the same horizontal sum. The
// integer lanes are exact in any order; here 64 values a step (AVX-512 VNNI), the weights unpacked once for all
// rows (a verify batch loads each weight block once, as it stays in cache).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#define SPECCHAT_Q6_K_ROWS 1
static inline float specchat_hsum_float_8(const __m256 x) {  // hsum_float_8 of arch/x86/quants.c
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

static inline __attribute__((always_inline)) void specchat_q6_K_rows(const int R, const int n, const block_q6_K * GGML_RESTRICT x,
        const block_q8_K * GGML_RESTRICT y, const size_t ys, float * GGML_RESTRICT s, const size_t ss) {
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m48 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);  // (qh&3)<<4 | (qh&12)<<2
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1); // qh&48    | (qh&192)>>2
    __m256 acc[8];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
    }
    for (int i = 0; i < nb; i++) {
        __m512i w[4];  // values 64m..64m+63, 0..63 each
        for (int j = 0; j < 2; j++) {
            const __m512i l = _mm512_loadu_si512((const void *) (x[i].ql + 64 * j));
            const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (x[i].qh + 32 * j)));
            w[2 * j] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(h, shl), m48));
            w[2 * j + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), _mm512_and_si512(_mm512_srlv_epi16(h, shr), m48));
        }
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x[i].scales));
        const __m256i s16x32 = _mm256_slli_epi16(s16, 5);
        __m512i sc[4];  // int16 lane L of w[m]: the scale of sub-block 4m + L/8
        for (int m = 0; m < 4; m++) {
            const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16(4 * m), _mm512_srli_epi16(_mm512_set_epi16(
                31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3));
            sc[m] = _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(s16));
        }
        const float dx = GGML_CPU_FP16_TO_FP32(x[i].d);
        for (int r = 0; r < R; r++) {
            const block_q8_K * GGML_RESTRICT yr = y + r * ys + i;
            __m512i z = _mm512_setzero_si512();
            for (int m = 0; m < 4; m++) {
                z = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(w[m], _mm512_loadu_si512((const void *) (yr->qs + 64 * m))), sc[m]);
            }
            __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
            sumi = _mm256_sub_epi32(sumi, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) yr->bsums), s16x32));
            const float d = yr->d * dx;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        s[r * ss] = specchat_hsum_float_8(acc[r]);
    }
}
#else
#define SPECCHAT_Q6_K_ROWS 0
#endif

#if SPECCHAT_Q6_K_ROWS
// A Q6_K product of 2..SPECCHAT_EXACT_ROWS rows (one row keeps ggml_vec_dot_q6_K_q8_K itself): work items of 16
// weight rows, handed out as the stock loop does; within one, 8 activation rows at a time against each weight row.
static bool specchat_mul_mat_q6_K(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    const int64_t ne11 = src1->ne[1];
    if (src0->type != GGML_TYPE_Q6_K || src1->type != GGML_TYPE_F32 || ne11 < 2 || ne11 > SPECCHAT_EXACT_ROWS ||
            src0->ne[2] != 1 || src0->ne[3] != 1 || src1->ne[2] != 1 || src1->ne[3] != 1 || dst->nb[0] != sizeof(float)) {
        return false;
    }
    const int n = (int) src0->ne[0];
    const int64_t nr0 = src0->ne[1];
    const size_t ys = ggml_row_size(GGML_TYPE_Q8_K, n) / sizeof(block_q8_K);  // the rows quantized above, in wdata
    const block_q8_K * y = (const block_q8_K *) params->wdata;
    const size_t ss = dst->nb[1] / sizeof(float);
    const int64_t per = 16;
    const int64_t nchunk = (nr0 + per - 1) / per;
    for (int64_t c = params->ith; c < nchunk; c = atomic_fetch_add_explicit(&params->threadpool->current_chunk, 1, memory_order_relaxed)) {
        const int64_t i1 = MIN((c + 1) * per, nr0);
        for (int64_t r = 0; r < ne11; r += 8) {
            for (int64_t i = c * per; i < i1; i++) {
                const block_q6_K * x = (const block_q6_K *) ((const char *) src0->data + i * src0->nb[1]);
                float * s = (float *) dst->data + r * ss + i;
                const block_q8_K * yr = y + r * ys;
                switch (MIN(8, ne11 - r)) {
                    case 8: specchat_q6_K_rows(8, n, x, yr, ys, s, ss); break;
                    case 7: specchat_q6_K_rows(7, n, x, yr, ys, s, ss); break;
                    case 6: specchat_q6_K_rows(6, n, x, yr, ys, s, ss); break;
                    case 5: specchat_q6_K_rows(5, n, x, yr, ys, s, ss); break;
                    case 4: specchat_q6_K_rows(4, n, x, yr, ys, s, ss); break;
                    case 3: specchat_q6_K_rows(3, n, x, yr, ys, s, ss); break;
                    case 2: specchat_q6_K_rows(2, n, x, yr, ys, s, ss); break;
                    default: specchat_q6_K_rows(1, n, x, yr, ys, s, ss); break;
                }
            }
        }
    }
    return true;
}
#endif

""".replace("__MARK__", MARK)

Q4K_ANCHOR = "class tensor_traits_base : public ggml::cpu::tensor_traits {\n"
Q4K_NS_END = "static const ggml::cpu::tensor_traits * ggml_repack_get_optimal_repack_type(const struct ggml_tensor * cur) {\n"

# every row of the batch quantized alone (quantize_row_q8_K, as a row of 1-3 is) where the kernel takes the type
Q4K_QUANT_OLD = """            for (int64_t i11 = ith * 4; i11 < ne11 - ne11 % 4; i11 += nth * 4) {
                ggml_quantize_mat_t<INTER_SIZE, PARAM_TYPE>((float *) (data_ptr + i11 * nb11),
                                                            (void *) (wdata_ptr + i11 * nbw1), 4, ne10);
            }

            const int64_t i11_processed = ne11 - ne11 % 4;
"""
Q4K_QUANT_NEW = """            constexpr bool specchat_rows = specchat_rows_kernel<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(); // __MARK__
            for (int64_t i11 = ith * 4; !specchat_rows && i11 < ne11 - ne11 % 4; i11 += nth * 4) {
                ggml_quantize_mat_t<INTER_SIZE, PARAM_TYPE>((float *) (data_ptr + i11 * nb11),
                                                            (void *) (wdata_ptr + i11 * nbw1), 4, ne10);
            }

            const int64_t i11_processed = specchat_rows ? 0 : ne11 - ne11 % 4;
""".replace("__MARK__", MARK + ": rows quantized alone")

Q4K_CHUNK_OLD = """        // If there are more than three rows in src1, use gemm; otherwise, use gemv.
        if (nrows > 3) {
"""
Q4K_CHUNK_NEW = (
    """#if SPECCHAT_Q4_K_ROWS // __MARK__: one kernel for every batch size
        if constexpr (specchat_rows_kernel<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>()) {
            specchat_q4_K_x8_rows(ne00, (float *) dst_ptr + src0_start, nb1 / nb0, src0_ptr + src0_start * nb01, src1_ptr,
                                  src1_col_stride / sizeof(block_q8_K), (int) nrows, (int) ncols);
            return;
        }
#endif
""".replace("__MARK__", MARK)
    + Q4K_CHUNK_OLD
)

# ggml's tiled K-quant kernel only for prefill batches
TILED_OLD = """    // If tiled is supported, it will execute the full op here and we return
    if (ggml_compute_forward_mul_mat_tiled(params, dst)) {
"""
TILED_NEW = """    // If tiled is supported, it will execute the full op here and we return
    // __MARK__: not for a batch of up to SPECCHAT_EXACT_ROWS rows (vec_dot's rounding per row)
    if (dst->src[1]->ne[1] > SPECCHAT_EXACT_ROWS && ggml_compute_forward_mul_mat_tiled(params, dst)) {
""".replace("__MARK__", MARK)

# and the same for mixture-of-experts weights: an expert takes the tiled kernel from 8 routed rows
# (ggml_compute_forward_mul_mat_id_tiled), so which rows of a verify pass round otherwise depended on the routing
TILED_ID_OLD = """        // tiled takes over if profitable for this expert (see tiled.h)
        if (ggml_compute_forward_mul_mat_id_tiled(params, dst, cur_a, cne1, (const int32_t *) &MMID_MATRIX_ROW(cur_a, 0), tiled_scratch)) {
"""
TILED_ID_NEW = """        // tiled takes over if profitable for this expert (see tiled.h)
        // __MARK__: not within a batch of up to SPECCHAT_EXACT_ROWS tokens, whatever its routing
        if (src1->ne[2] > SPECCHAT_EXACT_ROWS && ggml_compute_forward_mul_mat_id_tiled(params, dst, cur_a, cne1, (const int32_t *) &MMID_MATRIX_ROW(cur_a, 0), tiled_scratch)) {
""".replace("__MARK__", MARK)

# tinyBLAS (llamafile/sgemm.cpp) takes a batch of 2+ rows of float32, bfloat16 and IQ4_NL weights (and Q8_0, Q4_0,
# whose kernels agree with their vec_dot here) with another summation order than the one-row vec_dot: within a batch
# of up to SPECCHAT_EXACT_ROWS rows those take vec_dot per row, as one token does. Float32 weights are the small
# ones of a quantized file (a MoE's router, a shared expert's gate, a Gated DeltaNet's projections of a few rows);
# bfloat16 files and unpacked IQ4_NL (IQ4_XS files hold IQ4_NL tensors) otherwise padded every plain step.
SGEMM_GATE_OLD = """    const bool src1_cont = ggml_is_contiguous(src1);

    if (src1_cont) {
        for (int64_t i13 = 0; i13 < ne13; i13++)
            for (int64_t i12 = 0; i12 < ne12; i12++)
                if (!llamafile_sgemm(params,
"""
SGEMM_GATE_NEW = """    // __MARK__: float32, bfloat16 and IQ4_NL weights take vec_dot per row within a small batch
    const bool specchat_rows = ne11 <= SPECCHAT_EXACT_ROWS &&
        (src0->type == GGML_TYPE_F32 || src0->type == GGML_TYPE_BF16 || src0->type == GGML_TYPE_IQ4_NL);
    const bool src1_cont = ggml_is_contiguous(src1) && !specchat_rows;

    if (src1_cont) {
        for (int64_t i13 = 0; i13 < ne13; i13++)
            for (int64_t i12 = 0; i12 < ne12; i12++)
                if (!llamafile_sgemm(params,
""".replace("__MARK__", MARK)

# A Gated DeltaNet layer with native rollback (n_rs_seq = N) wrote N + 1 conv-state snapshots every decode, a
# one-token step included (src/models/delta-net-base.cpp, build_conv_state): 17 copies a layer a step, 7% of a
# plain step on a Qwen3.5-0.8B-shaped Q4_K_M. Only the snapshots of the pass's own tokens can be rolled back to
# (the recurrent state's are written for min(n_tokens, N + 1) of them, as mamba-base.cpp and lfm2.cpp write their
# conv states), so the others are left unwritten.
DELTANET_CONV_OLD = """        const int64_t K = (int64_t) cparams.n_rs_seq + 1;

        for (int64_t t = 1; t <= K; ++t) {
"""
DELTANET_CONV_NEW = """        const int64_t K = (int64_t) cparams.n_rs_seq + 1;
        // __MARK__ (scripts/patch_llama_cpp.py): the slots of this pass's tokens only
        const int64_t specchat_written = std::min<int64_t>(conv_input->ne[0] - conv_states->ne[0], K);

        for (int64_t t = K - specchat_written + 1; t <= K; ++t) {
""".replace("__MARK__", MARK)

Q6K_ANCHOR = "void ggml_compute_forward_mul_mat(\n"

# what specchat's engine looks up (ctypes) to know the build computes quantized batches exactly
EXPORTS_C = f"""int specchat_exact_rows(void) {{ // {MARK}: quantized weights exact up to this batch
    return SPECCHAT_EXACT_ROWS;
}}

"""
EXPORTS_REPACK = f"""extern "C" int specchat_repack_exact(void) {{ // {MARK}: 1 where repacked Q4_K takes the kernel above
    return SPECCHAT_Q4_K_ROWS;
}}

"""

# after the activations are quantized (and the threads met), a Q6_K batch takes the rows kernel
Q6K_HOOK_OLD = """    ggml_barrier(params->threadpool);

#if GGML_USE_LLAMAFILE
    if (src1->type != vec_dot_type) {
"""
Q6K_HOOK_NEW = """    ggml_barrier(params->threadpool);

#if SPECCHAT_Q6_K_ROWS // __MARK__
    if (specchat_mul_mat_q6_K(params, dst)) {
        return;
    }
#endif

#if GGML_USE_LLAMAFILE
    if (src1->type != vec_dot_type && !specchat_rows) {
""".replace("__MARK__", MARK)


# Q8_K activations (every K-quant's vec_dot type) quantized with vector instructions, bit for bit the reference
Q8K_OLD = """void quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT y, int64_t k) {
    quantize_row_q8_K_ref(x, y, k);
}
"""
Q8K_NEW = """void quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT y, int64_t k) {
#if defined(__AVX2__)
    // __MARK__ (scripts/patch_llama_cpp.py): quantize_row_q8_K_ref vectorized, bit for bit: the first value of
    // largest magnitude sets iscale = -127/max, every value is iscale*x rounded to nearest even (the reference's
    // float trick, here the vector conversion), d = 1/iscale, bsums the sums of 16. A block that is all zeros or
    // holds a NaN or an infinity takes the reference itself. Every Q8_K activation row is quantized here: one
    // token, a batch row (specchat's kernels quantize every row alone), the Q4_K/Q6_K vec_dot paths.
    assert(k % QK_K == 0);
    block_q8_K * GGML_RESTRICT yb = (block_q8_K *) y;
    const int64_t nb = k / QK_K;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        __m256 nan = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 v = _mm256_loadu_ps(x + j);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        __m128 h = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (!(amax > 0.0f && isfinite(amax)) || _mm256_movemask_ps(nan)) {
            quantize_row_q8_K_ref(x, yb + i, QK_K);
            continue;
        }
        int jmax = 0;
        while (fabsf(x[jmax]) != amax) {
            jmax++;
        }
        const float iscale = -127.f/x[jmax];
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int t = 0; t < 4; t++) {
                q[t] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * t))), top);
            }
            const __m256i s0 = _mm256_add_epi32(q[0], q[1]);  // values j..j+15
            const __m256i s1 = _mm256_add_epi32(q[2], q[3]);  // values j+16..j+31
            __m128i a = _mm_add_epi32(_mm256_castsi256_si128(s0), _mm256_extracti128_si256(s0, 1));
            __m128i b = _mm_add_epi32(_mm256_castsi256_si128(s1), _mm256_extracti128_si256(s1, 1));
            a = _mm_hadd_epi32(a, b);
            a = _mm_hadd_epi32(a, a);
            yb[i].bsums[j / 16] = (int16_t) _mm_extract_epi32(a, 0);
            yb[i].bsums[j / 16 + 1] = (int16_t) _mm_extract_epi32(a, 1);
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *) (yb[i].qs + j), _mm256_permutevar8x32_epi32(p, perm));
        }
        yb[i].d = 1/iscale;
    }
#else
    quantize_row_q8_K_ref(x, y, k);
#endif
}
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
    """A short hash of what the patch writes (every edit of `plan`, not this file's text): the wheel cache's key."""
    import hashlib

    edits = [text for edits in plan(Path(".")).values() for edit in edits for text in edit[:2]]
    return hashlib.sha256("\0".join(edits).encode()).hexdigest()[:12]


def plan(root: Path) -> dict[Path, list[tuple]]:
    """Every file the patch edits under the llama.cpp folder `root`, with its (old, new[, times]) edits."""
    cpu = root / "ggml" / "src" / "ggml-cpu"
    anchor = "void ggml_vec_dot_f32("
    return {
        cpu / "vec.h": [(DECL_AFTER, DECL_AFTER + DECL)],
        cpu / "vec.cpp": [(anchor, DOT.lstrip("\n") + "\n" + anchor)],
        cpu / "ggml-cpu.c": [
            (TRAIT_OLD, TRAIT_NEW),
            (PLAN_OLD, PLAN_NEW),
            (TILED_OLD, TILED_NEW),
            (TILED_ID_OLD, TILED_ID_NEW),
            (SGEMM_GATE_OLD, SGEMM_GATE_NEW),
            (Q6K_ANCHOR, Q6K_KERNEL + EXPORTS_C + Q6K_ANCHOR),
            (Q6K_HOOK_OLD, Q6K_HOOK_NEW),
        ],
        cpu / "repack.cpp": [
            (Q4K_ANCHOR, Q4K_KERNEL + Q4K_ANCHOR),
            (Q4K_NS_END, EXPORTS_REPACK + Q4K_NS_END),
            (Q4K_QUANT_OLD, Q4K_QUANT_NEW),
            (Q4K_CHUNK_OLD, Q4K_CHUNK_NEW),
        ],
        cpu / "arch" / "x86" / "quants.c": [(Q8K_OLD, Q8K_NEW)],
        cpu / "ops.cpp": [
            (KQ_OLD, KQ_NEW),
            (CHUNKED_ANCHOR, CHUNKED + CHUNKED_ANCHOR),
            (DISPATCH_OLD, DISPATCH_NEW),
        ],
        root / "src" / "models" / "delta-net-base.cpp": [(DELTANET_CONV_OLD, DELTANET_CONV_NEW)],
        cpu / "llamafile" / "sgemm.cpp": [
            (SGEMM_512_OLD, SGEMM_512_NEW),
            (SGEMM_256_OLD, SGEMM_256_NEW),
            (SGEMM_PF_OLD, SGEMM_PF_NEW),
            (SGEMM_JOBS_OLD, SGEMM_JOBS_NEW, 2),
            (SGEMM_NEXT_OLD, SGEMM_NEXT_NEW, 2),
        ],
    }


def main(argv: list[str]) -> int:
    if argv[1:] == ["--key"]:
        print(key())
        return 0
    if len(argv) != 2:
        print("usage: patch_llama_cpp.py <llama.cpp source folder>", file=sys.stderr)
        return 2
    files = plan(Path(argv[1]))
    for path in files:
        if not path.is_file():
            print(f"patch_llama_cpp: no {path}", file=sys.stderr)
            return 1
    try:  # every file checked before any is written: a refused tree is left as it was
        texts = {path: patched_text(path, edits) for path, edits in files.items()}
    except PatchError as exc:
        print(exc, file=sys.stderr)
        return 1
    for path, text in texts.items():
        if text is not None:
            path.write_text(text)
    print(
        f"patched llama.cpp in {argv[1]}: float32 activations for float16 weights, one kernel per batch size, "
        "fixed key chunks in attention (a dense kernel over a float16 cache), tinyBLAS streaming its weights, "
        "quantized weights (Q4_K repacked, Q6_K, other K-quants, F32, BF16, IQ4_NL) exact up to 64 rows, "
        "conv-state snapshots of a pass's own tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
