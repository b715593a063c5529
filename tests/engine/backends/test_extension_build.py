"""First start of exllamav2 on a GPU: build progress, MAX_JOBS, and a failed build (engine/backends/extension_build.py).

CUDA cannot run here, so the build itself is not run; what is tested: the progress parser on a build.ninja that
torch 2.13's JIT loader wrote for exllamav2 0.3.2's 47 sources and a ninja log in ninja's own format, the watcher
on a real ninja build of a small project, when the "building" message shows (only when a build is coming), and
that a failed build is one line naming a log with the compiler's output, after which `auto` takes transformers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.backends import extension_build
from engine.backends.exllamav2 import import_exllamav2, probe_exllamav2
from engine.backends.exllamav2.library import BUILD_STAGE
from engine.errors import BackendError
from tests.support import paths

DATA = paths.DATA / "exl2_build"
NINJA = shutil.which("ninja", path=str(Path(sys.executable).parent)) or shutil.which("ninja")


def _forget_exllamav2() -> None:
    for name in list(sys.modules):
        if name == "exllamav2" or name.startswith("exllamav2."):
            del sys.modules[name]


def recorded_build(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / "build.ninja", folder / "build.ninja")
    shutil.copy(DATA / "ninja_log.txt", folder / ".ninja_log")
    return folder


def test_progress_from_torch_s_build_ninja_and_a_ninja_log(tmp_path):
    folder = recorded_build(tmp_path / "exllamav2_ext")
    objects = extension_build.ninja_objects((folder / "build.ninja").read_text())
    assert len(objects) == 47 and "unit_exl2_3b.cuda.o" in objects and "ext_bindings.o" in objects
    assert "exllamav2_ext.so" not in objects  # the link step is not a compiled file
    # 12 of the 47 finished; an entry left from an older build ("old_unit.cuda.o") does not count.
    assert extension_build.build_progress(folder) == (12, 47)
    (folder / ".ninja_log").unlink()
    assert extension_build.build_progress(folder) == (0, 47)
    assert extension_build.build_progress(tmp_path / "nothing-yet") == (0, None)


def test_watcher_reports_files_and_elapsed_then_the_last_word(tmp_path):
    folder = recorded_build(tmp_path / "exllamav2_ext")
    reports: list[tuple[str, float | None]] = []
    with extension_build.BuildWatcher(
        folder, lambda s, f: reports.append((s, f)), BUILD_STAGE, poll_s=0.05, heartbeat_s=60
    ):
        pass
    assert reports[0][0].startswith(BUILD_STAGE) and reports[0][1] == 0.0
    stage, fraction = reports[-1]
    assert stage.startswith(f"{BUILD_STAGE}: 12/47 files, ") and stage.endswith("s")
    assert fraction == pytest.approx(12 / 47)
    assert extension_build.format_elapsed(5) == "5s" and extension_build.format_elapsed(671) == "11m 11s"


@pytest.mark.skipif(NINJA is None, reason="ninja is not installed")
def test_watcher_follows_a_real_ninja_build(tmp_path):
    folder = tmp_path / "build"
    folder.mkdir()
    names = [f"unit_{i}" for i in range(6)]
    lines = [
        "rule compile\n  command = sleep 0.3 && touch $out",
        "rule cuda_compile\n  command = sleep 0.3 && touch $out",
        "rule link\n  command = touch $out",
    ]
    for i, name in enumerate(names):
        (folder / f"{name}.src").write_text("", encoding="utf-8")
        rule, suffix = ("cuda_compile", ".cuda.o") if i % 2 else ("compile", ".o")
        lines.append(f"build {name}{suffix}: {rule} {name}.src")
    objects = [f"{n}{'.cuda.o' if i % 2 else '.o'}" for i, n in enumerate(names)]
    lines += [f"build ext.so: link {' '.join(objects)}", "default ext.so"]
    (folder / "build.ninja").write_text("\n".join(lines) + "\n", encoding="utf-8")

    reports: list[tuple[str, float | None]] = []
    with extension_build.BuildWatcher(
        folder, lambda s, f: reports.append((s, f)), BUILD_STAGE, poll_s=0.05, heartbeat_s=60
    ):
        subprocess.run([NINJA, "-j", "1"], cwd=folder, check=True, capture_output=True, timeout=60)
    counts = [s.split(": ")[1].split(" files")[0] for s, _ in reports[1:]]
    assert counts[-1] == "6/6" and reports[-1][1] == 1.0
    done = [int(c.split("/")[0]) for c in counts]
    assert done == sorted(done) and len(set(done)) >= 3  # seen climbing while ninja ran, file by file


def test_max_jobs_is_every_core_unless_set(monkeypatch):
    monkeypatch.delenv("MAX_JOBS", raising=False)
    import os

    assert extension_build.use_all_cores() == str(os.cpu_count())
    monkeypatch.setenv("MAX_JOBS", "3")
    assert extension_build.use_all_cores() == "3"


def fake_exllamav2(root: Path, body: str) -> Path:
    package = root / "exllamav2"
    (package / "generator").mkdir(parents=True)
    (package / "__init__.py").write_text(body, encoding="utf-8")
    return root


def test_build_message_shows_only_when_a_build_is_coming(tmp_path, monkeypatch):
    import torch
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda", raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.delenv("MAX_JOBS", raising=False)
    # An exllamav2 whose import "builds": it writes ninja's files as torch's loader would, then fails late.
    body = (
        "import os, shutil, pathlib\n"
        f"d = pathlib.Path({str(tmp_path / 'ext' / 'exllamav2_ext')!r}); d.mkdir(parents=True, exist_ok=True)\n"
        f"shutil.copy({str(DATA / 'build.ninja')!r}, d / 'build.ninja')\n"
        f"shutil.copy({str(DATA / 'ninja_log.txt')!r}, d / '.ninja_log')\n"
        "assert os.environ['MAX_JOBS'] == str(os.cpu_count())\n"
        "raise ImportError('stop here')\n"
    )
    monkeypatch.syspath_prepend(str(fake_exllamav2(tmp_path / "pkg", body)))
    _forget_exllamav2()
    reports: list[str] = []
    try:
        with pytest.raises(BackendError, match="stop here"):
            import_exllamav2(lambda s, f: reports.append(s))
        assert reports[0].startswith(BUILD_STAGE)
        assert reports[-1].startswith(f"{BUILD_STAGE}: 12/47 files, ")

        # Built before (the JIT library is there), or a prebuilt wheel's module: no message.
        (tmp_path / "ext" / "exllamav2_ext" / "exllamav2_ext.so").write_bytes(b"")
        reports.clear()
        _forget_exllamav2()
        with pytest.raises(BackendError):
            import_exllamav2(lambda s, f: reports.append(s))
        assert reports == []
        (tmp_path / "ext" / "exllamav2_ext" / "exllamav2_ext.so").unlink()
        (tmp_path / "pkg" / "exllamav2_ext.py").write_text("", encoding="utf-8")
        _forget_exllamav2()
        with pytest.raises(BackendError):
            import_exllamav2(lambda s, f: reports.append(s))
        assert reports == []
    finally:
        _forget_exllamav2()
        sys.modules.pop("exllamav2_ext", None)


def test_a_failed_build_is_one_line_with_the_log_and_auto_falls_back(tmp_path, monkeypatch, smol_dir):
    import torch

    from engine.backends.select import create_backend

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    compiler_output = (
        "Error building extension 'exllamav2_ext': [1/47] /usr/local/cuda/bin/nvcc ... -c unit_exl2_3b.cu\n"
        "FAILED: unit_exl2_3b.cuda.o\nnvcc fatal   : Unsupported gpu architecture 'compute_120'\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    body = f"raise RuntimeError({compiler_output!r})\n"
    monkeypatch.syspath_prepend(str(fake_exllamav2(tmp_path / "pkg", body)))
    _forget_exllamav2()
    log = tmp_path / "ext" / "exllamav2_ext" / extension_build.BUILD_LOG_NAME
    try:
        with pytest.raises(BackendError) as info:
            import_exllamav2()
        message = str(info.value)
        assert message == (
            f"exllamav2 is unusable here: its CUDA extension failed to build (compiler output: {log}); "
            "use --backend transformers"
        )
        assert log.read_text(encoding="utf-8") == compiler_output
        usable, reason = probe_exllamav2()
        assert not usable and reason == f"its CUDA extension failed to build (compiler output: {log})"
        pytest.importorskip("engine.backends.transformers")
        settings = SimpleNamespace(
            model=smol_dir, draft="ngram", backend="auto", cache_mode="q8", draft_cache_mode="q8",
            max_context=1024, gpu_split=None,
        )  # fmt: skip
        _, why = create_backend(settings)
        # the CPU engine auto falls back to: llama.cpp for the embedded model where its bindings import
        assert why in (
            f"auto: exllamav2 unusable ({reason}) -> transformers",
            f"auto: exllamav2 unusable ({reason}) -> llama.cpp",
        ) or why.startswith(f"auto: exllamav2 unusable ({reason}); ")
    finally:
        _forget_exllamav2()


def test_build_progress_reaches_the_session_s_progress_callback(tmp_path, monkeypatch, smol_dir):
    """The chat's loading banner and the CLI print what ChatSession.load's progress callback hears."""
    import torch
    from torch.utils import cpp_extension

    from engine.config import Settings
    from engine.session import ChatSession

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda", raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    recorded_build(tmp_path / "ext" / "exllamav2_ext")
    monkeypatch.syspath_prepend(str(fake_exllamav2(tmp_path / "pkg", "raise ImportError('no')\n")))
    _forget_exllamav2()
    stages: list[str] = []
    lock = threading.Lock()

    def progress(stage: str, fraction: float | None) -> None:
        with lock:
            stages.append(stage)

    try:
        session = ChatSession(Settings(model=smol_dir, backend="auto"))
        session.load(progress)
    finally:
        _forget_exllamav2()
    assert any(s.startswith(f"{BUILD_STAGE}: 12/47 files") for s in stages)
    assert session.backend_reason.startswith("auto: exllamav2 unusable (")


async def test_the_chat_s_loading_banner_shows_the_build(tmp_path, monkeypatch, tiny_model_dir):
    """The real app under Pilot: while exllamav2 'builds', the banner says so with files and elapsed time."""
    import torch
    from torch.utils import cpp_extension

    from engine.config import Settings
    from tests.support.tui import SIZE, plain, wait_until
    from tui.app import SpecchatApp

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda", raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    recorded_build(tmp_path / "ext" / "exllamav2_ext")
    release = tmp_path / "release"
    body = (  # a build that takes until the test has seen the banner, then fails: auto falls back
        "import pathlib, time\n"
        f"flag = pathlib.Path({str(release)!r})\n"
        "deadline = time.monotonic() + 30\n"
        "while not flag.exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "raise RuntimeError(\"Error building extension 'exllamav2_ext': nvcc fatal\")\n"
    )
    monkeypatch.syspath_prepend(str(fake_exllamav2(tmp_path / "pkg", body)))
    _forget_exllamav2()
    app = SpecchatApp(Settings(model=tiny_model_dir, backend="auto"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "12/47 files" in plain(app.chat.chat_log.banner), timeout=30)
            banner = plain(app.chat.chat_log.banner)
            assert "building exllamav2's CUDA extension" in banner and "first start only" in banner
            release.write_text("", encoding="utf-8")
            await wait_until(pilot, lambda: app.state == "ready", timeout=120)
            assert "failed to build" in app.session.backend_reason
            assert app.session.backend_reason.endswith("-> transformers")
    finally:
        release.write_text("", encoding="utf-8")
        _forget_exllamav2()
