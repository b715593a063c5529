"""The pinned exllamav3 wheel's real Python modules, importable here without CUDA (tests only).

exllamav3 is a pure-Python wheel whose `exllamav3/ext.py` imports a prebuilt `exllamav3_ext` where one is importable
(`is_precompiled_extension_available`: an extension-module spec) and otherwise compiles ~194 CUDA sources. The
helper downloads the pinned wheel once with pip (`pip download --no-deps exllamav3==PINNED`, the project's own
registry client), checks its sha256, unpacks it into the user cache, and imports it with two stand-ins for what
cannot exist here: an empty `exllamav3_ext` whose spec looks like a compiled module (any attribute is a callable
that raises), and `triton` (a decorator that returns the function). Nothing of the package runs beyond import:
the signature test reads signatures and source.

On a fresh machine `make test` gets the wheel the same way it gets the embedded model, from PyPI; set
SPECCHAT_EXL3_WHEEL to a local copy of the wheel to skip the download.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

from engine.backends.exllamav3.library import PINNED_VERSION, PINNED_WHEEL_SHA256

WHEEL_NAME = f"exllamav3-{PINNED_VERSION}-py3-none-any.whl"
STUBBED = ("exllamav3_ext", "triton")


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "specchat" / "test-wheels"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pinned_wheel() -> Path:
    """The pinned wheel, downloaded once and verified; RuntimeError (one line) where it cannot be had."""
    given = os.environ.get("SPECCHAT_EXL3_WHEEL")
    wheel = Path(given) if given else cache_root() / WHEEL_NAME
    if not wheel.is_file():
        wheel.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheel.parent) as tmp:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp,
                 f"exllamav3=={PINNED_VERSION}"],
                capture_output=True, text=True, check=False, timeout=600,
            )  # fmt: skip
            got = Path(tmp) / WHEEL_NAME
            if done.returncode != 0 or not got.is_file():
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise RuntimeError(f"pip download exllamav3=={PINNED_VERSION} failed: {tail[0]}")
            got.replace(wheel)
    actual = _sha256(wheel)
    if actual != PINNED_WHEEL_SHA256:
        raise RuntimeError(f"{wheel}: sha256 {actual} is not the pinned {PINNED_WHEEL_SHA256}")
    return wheel


def unpacked_source() -> Path:
    """A folder holding the pinned wheel's `exllamav3/` package."""
    target = cache_root() / f"exllamav3-{PINNED_VERSION}"
    if not (target / "exllamav3" / "generator" / "generator.py").is_file():
        wheel = pinned_wheel()
        with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(tmp)
            staged = Path(tmp) / "unpacked"
            staged.mkdir()
            Path(tmp, "exllamav3").replace(staged / "exllamav3")
            if target.exists():
                import shutil

                shutil.rmtree(target)
            staged.replace(target)
    return target


class _Anything:
    """What a stubbed module hands out: callable (a decorator returns what it decorates), indexable, attributes."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _Anything):
            return args[0]
        return _Anything(f"{self._name}()")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self._name}.{name}")

    def __getitem__(self, key):
        return _Anything(f"{self._name}[]")

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self.__name__}.{name}")


def _stub(name: str, origin: str | None = None) -> None:
    module = _StubModule(name)
    loader = importlib.machinery.ExtensionFileLoader(name, origin) if origin else None
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader, origin=origin)
    module.__path__ = []  # a package, so triton.language and the like import too
    sys.modules[name] = module


def _ours(name: str) -> bool:
    return any(name == root or name.startswith(root + ".") for root in ("exllamav3", *STUBBED))


@contextlib.contextmanager
def real_exllamav3() -> Iterator[types.ModuleType]:
    """The real pinned `exllamav3` imported with its extension and triton stubbed; sys.modules restored after."""
    source = unpacked_source()
    saved = {name: module for name, module in sys.modules.items() if _ours(name)}
    for name in saved:
        del sys.modules[name]
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "")  # exllamav3 then leaves torch's allocator alone
    sys.path.insert(0, str(source))
    try:
        _stub("exllamav3_ext", f"/nonexistent/exllamav3_ext{importlib.machinery.EXTENSION_SUFFIXES[0]}")
        for name in ("triton", "triton.language", "triton.language.extra", "triton.language.extra.libdevice",
                     "triton.runtime", "triton.runtime.autotuner"):  # fmt: skip
            _stub(name)
        module = importlib.import_module("exllamav3")
        assert Path(module.__file__).is_relative_to(source), module.__file__
        yield module
    finally:
        sys.path.remove(str(source))
        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        sys.modules.update(saved)
        if alloc_conf is None:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
