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
2. turns off the KV-split path of flash attention for a single query row (rows are then computed alike at any
   batch size and context length).

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

SPLIT_OLD = "const bool use_split_kv_path = !use_ref && (neq1 == 1 && neq3 == 1)"
SPLIT_NEW = f"const bool use_split_kv_path = false && /* {MARK} */ !use_ref && (neq1 == 1 && neq3 == 1)"


class PatchError(Exception):
    """A source file that does not look as the patch expects (another llama.cpp version)."""


def patched_text(path: Path, edits: list[tuple[str, str]]) -> str | None:
    """`path`'s text with every (old, new) edit made, each `old` found exactly once; None if already patched."""
    text = path.read_text()
    if MARK in text:
        return None
    for old, new in edits:
        if text.count(old) != 1:
            raise PatchError(
                f"patch_llama_cpp: {path} does not look as expected (another llama.cpp version?)"
            )
        text = text.replace(old, new)
    return text


def key() -> str:
    """A short hash of what the patch writes (not of this file's text): the wheel cache's key."""
    import hashlib

    edits = (DECL, DOT, TRAIT_OLD, TRAIT_NEW, SPLIT_OLD, SPLIT_NEW, SGEMM_512_NEW, SGEMM_256_NEW)
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
        cpu / "ggml-cpu.c": [(TRAIT_OLD, TRAIT_NEW)],
        cpu / "ops.cpp": [(SPLIT_OLD, SPLIT_NEW)],
        cpu / "llamafile" / "sgemm.cpp": [(SGEMM_512_OLD, SGEMM_512_NEW), (SGEMM_256_OLD, SGEMM_256_NEW)],
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
        f"patched llama.cpp in {argv[1]}: float32 activations for float16 weights, one kernel per batch size"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
