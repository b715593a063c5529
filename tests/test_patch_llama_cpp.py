"""scripts/patch_llama_cpp.py on a miniature llama.cpp tree: each edit lands once, a second run changes nothing,
and a tree of another version is refused with one line (the Makefile then builds the stock bindings)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "patch_llama_cpp.py"


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
        + "    },\n};\n\nplan() {\n"
        + patch.PLAN_OLD
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
    before = {p: p.read_text() for p in cpu.rglob("*") if p.is_file()}
    assert patch.main(["patch", str(tmp_path)]) == 0
    assert {p: p.read_text() for p in cpu.rglob("*") if p.is_file()} == before


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
