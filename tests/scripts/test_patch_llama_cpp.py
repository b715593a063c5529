"""scripts/patch_llama_cpp.py on a miniature llama.cpp tree: each edit lands once, a second run changes nothing,
and a tree of another version is refused with one line (the Makefile then builds the stock bindings)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support import paths

SCRIPT = paths.SCRIPTS / "patch_llama_cpp.py"


@pytest.fixture(scope="module")
def patch():
    spec = importlib.util.spec_from_file_location("patch_llama_cpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def miniature(root: Path, patch) -> Path:
    cpu = root / "ggml" / "src" / "ggml-cpu"
    (cpu / "llamafile").mkdir(parents=True)
    (cpu / "vec.h").write_text("// header\n" + patch.DECL_AFTER + "void other(void);\n")
    (cpu / "vec.cpp").write_text('#include "vec.h"\n\nvoid ggml_vec_dot_f32(int n) {}\n')
    (cpu / "ggml-cpu.c").write_text(
        "static const t traits[] = {\n"
        + patch.TRAIT_OLD
        + "    },\n};\n\n"
        + patch.Q6K_ANCHOR
        + "        const struct ggml_compute_params * params) {\n"
        + patch.TILED_OLD
        + "        return;\n    }\n#if GGML_USE_LLAMAFILE\n"
        + patch.SGEMM_GATE_OLD
        + "                    goto UseGgmlGemm1;\n        return;\n    }\n#endif\n    quantize();\n"
        + patch.Q6K_HOOK_OLD
        + "    }\n#endif\n}\n\nplan() {\n"
        + patch.PLAN_OLD
        + "}\n\nmul_mat_id() {\n    for (int cur_a = 0; cur_a < n_as; ++cur_a) {\n"
        + patch.TILED_ID_OLD
        + "            continue;\n        }\n    }\n}\n"
    )
    models = root / "src" / "models"
    models.mkdir(parents=True)
    (models / "delta-net-base.cpp").write_text(
        "void build_conv_state() {\n    if (cparams.n_rs_seq == 0) {\n    } else {\n"
        + patch.DELTANET_CONV_OLD
        + "        }\n    }\n}\n"
    )
    (cpu / "arch" / "x86").mkdir(parents=True)
    (cpu / "arch" / "x86" / "quants.c").write_text(
        "// x86\n\n" + patch.Q8K_OLD + "\nvoid ggml_vec_dot(void) {}\n"
    )
    (cpu / "repack.cpp").write_text(
        "namespace ggml::cpu::repack {\n"
        + patch.Q4K_ANCHOR
        + "    void forward_mul_mat_one_chunk() {\n"
        + patch.Q4K_CHUNK_OLD
        + "        }\n    }\n    void forward_mul_mat() {\n"
        + patch.Q4K_QUANT_OLD
        + "    }\n};\n}  // namespace ggml::cpu::repack\n\n"
        + patch.Q4K_NS_END
        + "}\n"
    )
    (cpu / "ops.cpp").write_text(
        "static void one_chunk() {\n"
        + patch.KQ_OLD
        + "}\n\n"
        + patch.CHUNKED_ANCHOR
        + "static void reduce() {}\n\nvoid fa() {\n"
        + patch.DISPATCH_OLD
        + "    }\n}\n"
    )
    gemm = patch.SGEMM_JOBS_OLD + "            work();\n" + patch.SGEMM_NEXT_OLD
    (cpu / "llamafile" / "sgemm.cpp").write_text(
        "#if defined(__AVX512F__)\n"
        + patch.SGEMM_512_OLD
        + "\n#elif defined(__AVX2__)\n"
        + patch.SGEMM_256_OLD
        + "\n#endif\n"
        + patch.SGEMM_PF_OLD
        + "        }\n    }\n"
        + gemm
        + "#if defined(__riscv_v_intrinsic)\n"
        + gemm
        + "#endif\n"
    )
    return cpu


def test_every_edit_lands_once_and_a_second_run_changes_nothing(tmp_path: Path, patch, capsys) -> None:
    cpu = miniature(tmp_path, patch)
    assert patch.main(["patch", str(tmp_path)]) == 0
    vec_cpp = (cpu / "vec.cpp").read_text()
    assert vec_cpp.index("void ggml_vec_dot_f16_f32(") < vec_cpp.index("void ggml_vec_dot_f32(")
    assert "ggml_vec_dot_f16_f32" in (cpu / "vec.h").read_text()
    trait = (cpu / "ggml-cpu.c").read_text()
    assert "ggml_vec_dot_f16_f32" in trait and ".vec_dot_type             = GGML_TYPE_F32" in trait
    ops = (cpu / "ops.cpp").read_text()
    # attention's key . query over a float16 cache: llama.cpp's own float16 dot
    assert "specchat_kq_f16 ? (ggml_vec_dot_t) ggml_vec_dot_f16 :" in ops
    assert ops.index("void one_chunk(") < ops.index("specchat_kq_f16") < ops.index("static bool specchat_fa")
    # the fixed-chunk attention is defined before the function that dispatches to it, after one_chunk
    assert (
        ops.index("void one_chunk(") < ops.index("static bool specchat_fa_chunked(") < ops.index("void fa(")
    )
    # a chunk over a float16 cache: the dense kernel, defined before the dispatcher that calls it
    assert ops.index("static void specchat_fa_chunk_f16(") < ops.index("static bool specchat_fa_chunked(")
    assert "specchat_fa_chunk_f16(dst, ir, c, c*C, c1, base, nch, sc);" in ops
    assert ops.index("if (specchat_fa_chunked(params, dst,") < ops.index("    if (use_split_kv_path) {")
    assert "#define SPECCHAT_FA_CHUNK 256" in (cpu / "vec.h").read_text()
    assert "decode = MAX(decode, chunked);" in trait
    sgemm = (cpu / "llamafile" / "sgemm.cpp").read_text()
    assert sgemm.count("if (Btype == GGML_TYPE_F32)") == 2
    assert "tinyBLAS<16, __m512, __m512, ggml_fp16_t, float, float>" in sgemm
    assert "tinyBLAS<8, __m256, __m256, ggml_fp16_t, float, float>" in sgemm
    # tinyBLAS prefetches the next weight rows; a small batch's row blocks are a contiguous range per thread
    assert sgemm.count("__builtin_prefetch(specchat_next") == 1
    assert sgemm.count("specchat_ranges ? job + 1 : ggml_threadpool_chunk_add") == 2
    # quantized weights: the tiled K-quant kernel only above 64 rows; Q6_K batches take the rows kernel after the
    # activations are quantized, defined (with the exported row count) before the function that calls it
    assert (
        "if (dst->src[1]->ne[1] > SPECCHAT_EXACT_ROWS && ggml_compute_forward_mul_mat_tiled(params, dst)) {"
        in trait
    )
    assert "#define SPECCHAT_EXACT_ROWS 64" in (cpu / "vec.h").read_text()
    assert (
        trait.index("static bool specchat_mul_mat_q6_K(")
        < trait.index("int specchat_exact_rows(void)")
        < trait.index("void ggml_compute_forward_mul_mat(")
        < trait.index("quantize();")
        < trait.index("if (specchat_mul_mat_q6_K(params, dst)) {")
        < trait.rindex("#if GGML_USE_LLAMAFILE")
    )
    # repacked Q4_K: the kernel and its predicate before the tensor traits, rows quantized alone, one kernel per chunk
    repack = (cpu / "repack.cpp").read_text()
    assert repack.index("static void specchat_q4_K_x8_rows(") < repack.index("class tensor_traits_base")
    assert repack.index("static constexpr bool specchat_rows_kernel()") < repack.index(
        "class tensor_traits_base"
    )
    assert "for (int64_t i11 = ith * 4; !specchat_rows && i11 < ne11 - ne11 % 4; i11 += nth * 4) {" in repack
    assert "const int64_t i11_processed = specchat_rows ? 0 : ne11 - ne11 % 4;" in repack
    assert repack.index("specchat_q4_K_x8_rows(ne00,") < repack.index("if (nrows > 3) {")
    assert repack.index('extern "C" int specchat_repack_exact(void)') > repack.index(
        "}  // namespace ggml::cpu::repack"
    )
    # Q8_K activations quantized with vector instructions (the reference kept for zeros and non-finite blocks)
    quants = (cpu / "arch" / "x86" / "quants.c").read_text()
    assert "quantize_row_q8_K_ref(x, yb + i, QK_K);" in quants and "_mm256_cvtps_epi32" in quants
    assert quants.index("void quantize_row_q8_K(") < quants.index("void ggml_vec_dot(")
    # attention's fixed chunks reach 64 rows, as the matrix products do
    assert "k->type == v->type && neq1 > SPECCHAT_EXACT_ROWS)) {" in ops
    assert "node->src[0]->ne[1] <= SPECCHAT_EXACT_ROWS ? node->src[0]->ne[1] : 1;" in trait
    # float32, bfloat16 and IQ4_NL weights: vec_dot per row within a small batch, at both of tinyBLAS's calls
    assert trait.index("const bool specchat_rows = ne11 <= SPECCHAT_EXACT_ROWS &&") < trait.index(
        "const bool src1_cont = ggml_is_contiguous(src1) && !specchat_rows;"
    )
    assert "if (src1->type != vec_dot_type && !specchat_rows) {" in trait
    # a Gated DeltaNet with native rollback writes the conv-state slots of the pass's own tokens only
    deltanet = (tmp_path / "src" / "models" / "delta-net-base.cpp").read_text()
    assert "for (int64_t t = K - specchat_written + 1; t <= K; ++t) {" in deltanet
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    assert patch.main(["patch", str(tmp_path)]) == 0
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_tree_of_another_version_is_refused_in_one_line(tmp_path: Path, patch, capsys) -> None:
    cpu = miniature(tmp_path, patch)
    (cpu / "ggml-cpu.c").write_text("static const t traits[] = { /* rearranged */ };\n")
    assert patch.main(["patch", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ggml-cpu.c does not look as expected" in err
    assert patch.main(["patch", str(tmp_path / "nowhere")]) == 1
    assert "no " in capsys.readouterr().err


def test_the_wheel_cache_key_follows_the_edits_not_the_files_text(patch, monkeypatch) -> None:
    first = patch.key()
    assert len(first) == 12 and int(first, 16) >= 0
    assert patch.key() == first
    monkeypatch.setattr(patch, "DOT", patch.DOT.replace("_mm512_reduce_add_ps", "_mm512_reduce_max_ps"))
    assert patch.key() != first


def test_every_edit_lands_and_moves_the_key(tmp_path: Path, patch) -> None:
    """Each (old, new) of the plan shows in the patched miniature, and changing any edit's text changes the wheel
    cache's key: an edit dropped from the plan (or a stale wheel after an edit) fails here."""
    miniature(tmp_path, patch)
    assert patch.main(["patch", str(tmp_path)]) == 0
    edits = patch.plan(tmp_path)
    assert {p.name for p in edits} == {
        "vec.h",
        "vec.cpp",
        "ggml-cpu.c",
        "repack.cpp",
        "quants.c",
        "ops.cpp",
        "delta-net-base.cpp",
        "sgemm.cpp",
    }
    for path, file_edits in edits.items():
        text = path.read_text()
        for _old, new, *_times in file_edits:
            assert new in text, f"an edit of {path.name} did not land"
    names = [n for n in dir(patch) if n.endswith(("_NEW", "_KERNEL")) or n in ("DOT", "DECL", "CHUNKED")]
    assert {"Q4K_KERNEL", "Q6K_KERNEL", "TILED_NEW", "Q4K_QUANT_NEW", "Q4K_CHUNK_NEW", "Q6K_HOOK_NEW"} <= set(
        names
    )
    first = patch.key()
    for name in names:
        original = getattr(patch, name)
        setattr(patch, name, original + "// changed\n")
        try:
            assert patch.key() != first, f"{name} is not in the plan (nor the key)"
        finally:
            setattr(patch, name, original)
