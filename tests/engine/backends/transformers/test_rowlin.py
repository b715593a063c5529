"""The row-invariant C kernel (engine/backends/transformers/rowlin.c): built here, exact per row, and a clean fallback.

Mutations checked by hand (each sent a test here red): accumulating a tile's rows in a different order than a
single row's (a two-way split of k for tiles of more than one row), dropping the bias in the tile store, and a
`self_check` that compared only the first row.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from engine.backends.transformers import TransformersBackend, rowlin
from engine.backends.transformers import kernels as hf_kernels
from engine.request import GenerationRequest, SamplerSettings

needs_compiler = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler on this machine"
)


def greedy_reply(
    backend: TransformersBackend, prompt: list[int], k: int, max_new: int
) -> tuple[list[int], int]:
    """The greedy reply's token ids and how many drafted tokens were accepted (fixed K)."""
    request = GenerationRequest(
        prompt_ids=tuple(prompt),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        k_mode="fixed",
    )
    tokens, accepted = [], 0
    for event in backend.generate(request, threading.Event()):
        if hasattr(event, "token_ids"):
            tokens += list(event.token_ids)
            accepted += event.accepted
    return tokens, accepted


@pytest.fixture
def kernel(tmp_path: Path) -> rowlin.Kernel:
    built, note = rowlin._load(tmp_path)
    assert built is not None, note
    return built


@needs_compiler
@pytest.mark.parametrize(("outputs", "inputs"), [(96, 576), (40, 1536), (3, 7)])
def test_every_row_gets_the_same_bits_in_any_batch(kernel: rowlin.Kernel, outputs: int, inputs: int) -> None:
    generator = torch.Generator().manual_seed(outputs)
    weight = torch.randn(outputs, inputs, generator=generator) * 0.05
    bias = torch.randn(outputs, generator=generator)
    x = torch.randn(rowlin.MAX_ROWS, inputs, generator=generator)
    packed, packed_bias = kernel.pack(weight), kernel.pack_bias(bias)
    alone = torch.cat([kernel.linear(x[i : i + 1], packed, outputs, packed_bias) for i in range(x.shape[0])])
    assert alone.shape == (rowlin.MAX_ROWS, outputs)
    for rows in range(2, rowlin.MAX_ROWS + 1):
        assert torch.equal(kernel.linear(x[:rows], packed, outputs, packed_bias), alone[:rows]), rows
    expected = torch.nn.functional.linear(x, weight, bias)
    assert torch.allclose(alone, expected, atol=1e-5, rtol=1e-5)


@needs_compiler
def test_the_library_is_built_once_and_reused(tmp_path: Path) -> None:
    first, _ = rowlin._load(tmp_path)
    libraries = list(tmp_path.glob("rowlin-*.so"))
    assert first is not None and len(libraries) == 1
    stamp = libraries[0].stat().st_mtime_ns
    second, _ = rowlin._load(tmp_path)
    assert second is not None and second.path == first.path
    assert libraries[0].stat().st_mtime_ns == stamp  # not rebuilt


def test_no_compiler_is_one_line_and_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "specchat-no-such-compiler")
    monkeypatch.setattr(rowlin.shutil, "which", lambda name: None)
    built, note = rowlin._load(tmp_path)
    assert built is None
    assert "no C compiler" in note and "\n" not in note


def test_a_failing_build_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "badcc"
    fake.write_text("#!/bin/sh\necho 'badcc: error: cannot do this' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    built, note = rowlin._load(tmp_path / "kernels")
    assert built is None
    assert "could not build" in note and "cannot do this" in note and "\n" not in note


class _RowDependent(rowlin.Kernel):
    """A kernel whose result for a row changes with the number of rows (what the check must refuse)."""

    def linear(self, rows, packed, out_features, bias):
        out = super().linear(rows, packed, out_features, bias)
        return out + 1e-3 * (rows.shape[0] > 1)


@needs_compiler
def test_the_self_check_refuses_a_row_dependent_kernel(kernel: rowlin.Kernel) -> None:
    assert rowlin.self_check(kernel) is None
    broken = _RowDependent(kernel.lib, kernel.lanes, kernel.path)
    assert "number of rows" in rowlin.self_check(broken)


@pytest.mark.slow
@needs_compiler
def test_the_backend_runs_every_pass_on_rowlin_and_stays_exact(smol_dir: Path) -> None:
    """Default settings on the real model: every decode pass on the kernel, spec == plain, cache == prefill."""
    rowlin.reset_for_tests()
    backend = TransformersBackend(smol_dir, draft="ngram")
    backend.load()
    try:
        state = backend.target
        assert state.switch is not None and state.switch.kind == "rowlin" and state.invariant
        assert isinstance(backend.model.lm_head, hf_kernels.PackedLinear)
        # The stock weights are let go (the packed copy serves prefill too): one copy of the weights in memory.
        packed = [m for m in backend.model.modules() if isinstance(m, hf_kernels.PackedLinear)]
        assert packed and all(m.weight is None for m in packed)
        text = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."
        prompt = backend.encode_chat([{"role": "user", "content": text}])

        plain, _ = greedy_reply(backend, prompt, 0, 40)
        drafted, accepted = greedy_reply(backend, prompt, 5, 40)
        assert accepted > 0  # drafts were proposed and accepted
        assert drafted == plain
        # The cache written by verify passes holds the bits a fresh pass over the same ids gives.
        ids = list(state.ids)
        kept = [layer.stored_keys().clone() for layer in state.cache.layers]
        state.new_cache()
        state.prefill(prompt[:-1])  # as the reply began
        for token in ids[len(prompt) - 1 :]:  # then one-row steps, as plain decoding writes them
            state.forward([token], keep=1)
        for keys, layer in zip(kept, state.cache.layers, strict=True):
            assert torch.equal(keys, layer.stored_keys())
    finally:
        backend.close()
        rowlin.reset_for_tests()


def _history(kind: str, heads: int, length: int, head_dim: int, seed: int):
    """The same keys/values written into a plain and a fused layer of `kind` ("q8" or "fp32")."""
    from engine.backends.transformers.cache import GrowingLayer, Int8Layer

    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, heads, length, head_dim, generator=generator)
    values = torch.randn(1, heads, length, head_dim, generator=generator)
    layer_class = Int8Layer if kind == "q8" else GrowingLayer
    plain, fused = layer_class(), layer_class(fused=True)
    for layer in (plain, fused):
        layer.update(keys, values)
    return plain, fused


@needs_compiler
@pytest.mark.parametrize("kind", ["q8", "fp32"])
@pytest.mark.parametrize(("length", "rows"), [(37, 1), (100, 5), (700, 7), (16, 16)])
def test_cache_attention_matches_sdpa_and_every_row_stands_alone(
    kernel: rowlin.Kernel, kind: str, length: int, rows: int
) -> None:
    heads, query_heads, dim = 3, 9, 64
    plain, fused = _history(kind, heads, length, dim, seed=length)
    assert torch.equal(plain.stored_keys(), fused.stored_keys())  # the blocked layout holds the same values
    query = torch.randn(1, query_heads, rows, dim, generator=torch.Generator().manual_seed(rows))
    out = rowlin.cached_attention(kernel, query, fused, 0.125)
    keys, values = plain.attention_states()
    expected = []
    for j in range(rows):
        visible = length - rows + j + 1
        expected.append(
            torch.nn.functional.scaled_dot_product_attention(
                query[:, :, j : j + 1],
                keys[:, :, :visible],
                values[:, :, :visible],
                scale=0.125,
                enable_gqa=True,
            )
        )
    expected = torch.cat(expected, dim=2).transpose(1, 2)
    assert torch.allclose(out, expected, atol=2e-6, rtol=1e-5)
    alone = []
    for j in range(rows):
        fused.length = length - rows + j + 1  # the cache as a one-row step sees it
        alone.append(rowlin.cached_attention(kernel, query[:, :, j : j + 1], fused, 0.125))
    fused.length = length
    assert torch.equal(out, torch.cat(alone, dim=1))


def test_a_fused_int8_layer_keeps_what_the_plain_one_keeps_across_crops_and_growth() -> None:
    from engine.backends.transformers.cache import INITIAL_CAPACITY, Int8Layer

    generator = torch.Generator().manual_seed(5)
    plain, fused = Int8Layer(), Int8Layer(fused=True)
    writes = [INITIAL_CAPACITY - 21, 3, 1, 7, 40]  # odd sizes that straddle key blocks, then the doubling
    for count in writes:
        states = torch.randn(1, 2, count, 16, generator=generator)
        for layer in (plain, fused):
            layer.update(states, states * 3)
            layer.crop(-2)  # a rejected draft
    assert plain.length == fused.length == sum(writes) - 2 * len(writes)
    assert torch.equal(plain.stored_keys(), fused.stored_keys())
    for a, b in zip(plain.dequantized(), fused.dequantized(), strict=True):
        assert torch.equal(a, b)
    assert plain.storage_bytes() == fused.storage_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("cache_mode", ["fp16", "q8"])
def test_without_the_c_kernel_the_onednn_fallback_still_drafts_exactly(
    copy_model_dir: Path, cache_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPECCHAT_ROWLIN=0 (as on a machine without a compiler): oneDNN kernels, a note, and the same text."""
    from tests.support.drafting import FreeVerify
    from tests.support.tiny_models import COPY_CYCLE

    monkeypatch.setenv("SPECCHAT_ROWLIN", "0")
    rowlin.reset_for_tests()
    backend = TransformersBackend(copy_model_dir, draft="ngram", cache_mode=cache_mode)
    try:
        backend.load()
        state = backend.target
        assert state.switch is not None and state.switch.kind == "onednn"
        assert not state.fused_attention
        assert any("SPECCHAT_ROWLIN=0" in note for note in backend.info.notes)
        backend.target.costs = FreeVerify()
        prompt = [*COPY_CYCLE, 100, 101]

        plain, _ = greedy_reply(backend, prompt, 0, 12)
        drafted, accepted = greedy_reply(backend, prompt, 5, 12)
        assert accepted > 0 and drafted == plain
    finally:
        backend.close()
        rowlin.reset_for_tests()


# --- the compiled library's cache (issue 18) ---------------------------------------------------------------
# Mutations checked by hand (each sent a test here red): no mode check, no owner check, `flags` alone in the key,
# no machine name without /proc, no rebuild after a failed load, attention left out of the self-check, no chmod
# after the build (umask 002), no tightening of a loose folder.

PLANTED_C = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("the planted library ran", f); fclose(f); }
}
int rowlin_lanes(void) { return 4; }
"""


def _plant(tmp_path: Path, target: Path, marker: Path) -> None:
    """A shared library at `target` whose constructor writes `marker` the moment anything loads it."""
    source = tmp_path / "planted.c"
    source.write_text(PLANTED_C % marker)
    compiler = rowlin._compiler()
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(target), str(source)], check=True, timeout=60)


def _cache(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    return folder, rowlin._library_path(rowlin._compiler(), folder)


@needs_compiler
@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_planted_group_or_world_writable_library_is_never_loaded(tmp_path: Path, mode: int) -> None:
    folder, target = _cache(tmp_path)
    marker = tmp_path / "ran"
    _plant(tmp_path, target, marker)
    target.chmod(mode)
    kernel, note = rowlin._load(folder)
    assert not marker.exists(), "the planted library's constructor ran"
    assert kernel is not None, note
    assert rowlin.self_check(kernel) is None
    # The fresh build replaced the planted file (the folder is ours): the next process loads it as it is.
    assert rowlin.unsafe_reason(target) is None
    assert kernel.path != target  # this process loaded its private copy


@needs_compiler
@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="only root can give a file away")
def test_a_planted_library_owned_by_another_user_is_never_loaded(tmp_path: Path) -> None:
    folder, target = _cache(tmp_path)
    marker = tmp_path / "ran"
    _plant(tmp_path, target, marker)
    target.chmod(0o755)
    os.chown(target, 65534, 65534)  # nobody's: mode alone would pass
    assert rowlin.unsafe_reason(target) == "it belongs to another user"
    kernel, note = rowlin._load(folder)
    assert kernel is not None, note
    assert not marker.exists(), "the planted library's constructor ran"


@needs_compiler
def test_a_library_in_a_folder_others_can_write_is_rebuilt_and_the_folder_tightened(tmp_path: Path) -> None:
    folder, target = _cache(tmp_path)
    first, _ = rowlin._load(folder)
    assert first is not None and first.path == target
    folder.chmod(0o777)
    second, _ = rowlin._load(folder)
    assert second is not None
    assert folder.stat().st_mode & 0o777 == 0o755  # group/world write dropped: only its owner writes it now


@needs_compiler
def test_a_symlinked_library_is_not_followed(tmp_path: Path) -> None:
    folder, target = _cache(tmp_path)
    elsewhere, marker = tmp_path / "elsewhere.so", tmp_path / "ran"
    _plant(tmp_path, elsewhere, marker)
    target.symlink_to(elsewhere)
    assert rowlin.unsafe_reason(target) == "it is a symbolic link"
    kernel, note = rowlin._load(folder)
    assert kernel is not None, note
    assert not marker.exists()


@needs_compiler
def test_a_built_library_is_not_group_writable_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        kernel, note = rowlin._load(tmp_path / "kernels")
    finally:
        os.umask(old)
    assert kernel is not None, note
    assert kernel.path.stat().st_mode & 0o022 == 0
    assert tmp_path.joinpath("kernels").stat().st_mode & 0o022 == 0


@needs_compiler
def test_a_cached_library_that_fails_to_load_or_its_check_is_rebuilt_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, target = _cache(tmp_path)
    target.write_bytes(b"not an ELF file")  # a truncated or foreign file: ours, but it does not load
    target.chmod(0o755)
    builds = []
    real_build = rowlin._build
    monkeypatch.setattr(rowlin, "_build", lambda c, t: (builds.append(t), real_build(c, t)))
    kernel, note = rowlin._load(folder)
    assert kernel is not None, note
    assert len(builds) == 1
    assert rowlin._open(target).lanes == kernel.lanes  # the cache now holds the good build
    # A check that always fails: one rebuild, then the reason (no loop).
    builds.clear()
    monkeypatch.setattr(rowlin, "self_check", lambda k: "it disagrees with PyTorch's linear")
    kernel, note = rowlin._load(folder)
    assert kernel is None and len(builds) == 1
    assert note == (
        "the row-invariant C kernel failed its check (it disagrees with PyTorch's linear): oneDNN kernels instead"
    )


def _cpuinfo_x86(flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n" * 2


def _cpuinfo_arm(features: str, part: str = "0xd0c") -> str:
    return (
        f"processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
        f"CPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: {part}\nCPU revision\t: 1\n\n"
    )


@needs_compiler
def test_the_cache_key_follows_the_cpu_on_x86_arm_and_without_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = rowlin._compiler()

    def key(cpuinfo: str | None) -> str:
        monkeypatch.setattr(rowlin, "_cpuinfo", lambda: cpuinfo)
        return rowlin._library_path(compiler, tmp_path).name

    arm_neon = key(_cpuinfo_arm("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics"))
    arm_sve = key(_cpuinfo_arm("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve sve2"))
    assert arm_neon != arm_sve  # ARM names its features `Features`, not `flags`
    assert key(_cpuinfo_arm("fp asimd", part="0xd40")) != key(_cpuinfo_arm("fp asimd"))  # another core
    assert key(_cpuinfo_x86("fpu sse2 avx2")) != key(_cpuinfo_x86("fpu sse2 avx2 avx512f"))
    assert key(_cpuinfo_x86("avx2 fpu sse2")) == key(
        _cpuinfo_x86("fpu sse2 avx2")
    )  # the order does not matter
    # No /proc/cpuinfo (macOS): the platform's names, the machine's own among them.
    monkeypatch.setattr(
        rowlin.platform, "uname", lambda: platform.uname_result("Darwin", "a", "23.1", "", "arm64")
    )
    on_a = key(None)
    monkeypatch.setattr(
        rowlin.platform, "uname", lambda: platform.uname_result("Darwin", "b", "23.1", "", "arm64")
    )
    assert key(None) != on_a


class _LeakyAttention:
    """cached_attention whose rows see each other (what the self-check must refuse), or that is off by a bit."""

    def __init__(self, real, mode: str) -> None:
        self.real, self.mode = real, mode

    def __call__(self, kernel, query, layer, scale):
        out = self.real(kernel, query, layer, scale)
        if self.mode == "rows":
            return out + 1e-3 * (query.shape[2] > 1)
        return out * 1.001


@needs_compiler
@pytest.mark.parametrize(("mode", "problem"), [("rows", "rows depend"), ("values", "disagrees")])
def test_the_self_check_covers_both_attention_kernels(
    kernel: rowlin.Kernel, monkeypatch: pytest.MonkeyPatch, mode: str, problem: str
) -> None:
    monkeypatch.setattr(rowlin, "cached_attention", _LeakyAttention(rowlin.cached_attention, mode))
    found = rowlin.self_check(kernel)
    assert found is not None and found.startswith("q8 attention:") and problem in found
    monkeypatch.setattr(rowlin, "_check_attention", lambda k, int8, g: None if int8 else "broken")
    assert rowlin.self_check(kernel) == "f32 attention: broken"
