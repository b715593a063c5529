"""Models without a chat template: the plain User:/Assistant: fallback, and replies that stop where the model
starts writing the next turn itself ("\\nUser:"), on both CPU backends.

- StopStringWatch alone, on texts split at every position (a stop string across chunk boundaries).
- The round loop on a scripted model: a stop string spread over several rounds leaves no token of it in the
  reply or the cache.
- transformers: a tiny model folder with SmolLM2's tokenizer and no template, built to write " Dog.\\nUser:".
- llama.cpp: the embedded GGUF copied without `tokenizer.chat_template`; the real SmolLM2, after two short
  turns, goes on to write "\\nUser" by itself.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from engine.chat_template import FALLBACK_NOTE, ChatTemplate
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.drafters import DraftModelDrafter
from engine.decoding.round_loop import LoopSetup, run_reply
from engine.decoding.stop_rules import StopStringWatch
from engine.events import Chunk, Done
from engine.paths import cache_dir
from engine.request import GenerationRequest, SamplerSettings
from tests.support.replies import generate

FALLBACK_STOPS = ("\nUser:", "\nAssistant:", "\nSystem:")


def test_the_fallback_template_stops_at_its_own_role_markers() -> None:
    plain = ChatTemplate.from_folder(Path("/nonexistent"))
    assert not plain.from_model and plain.text_stops() == FALLBACK_STOPS
    rendered = plain.render([{"role": "user", "content": "Hi"}])
    assert rendered == "User: Hi\nAssistant:"
    chatml = ChatTemplate("{{ messages }}", None, None, "<|im_end|>", from_model=True)
    assert chatml.text_stops() == ()


# --- StopStringWatch -----------------------------------------------------------------------------------------


def watch_pieces(pieces: list[str], stops=FALLBACK_STOPS) -> tuple[str, int | None, list[str]]:
    """Feed `pieces` the way the round loop does; (released text, where the stop began, each release)."""
    watch = StopStringWatch(stops)
    released: list[str] = []
    for piece in pieces:
        cut = watch.add(piece)
        if cut is not None:
            released.append(watch.release(final=True, end=cut))
            return "".join(released), cut, released
        released.append(watch.release(final=False))
    released.append(watch.release(final=True))
    return "".join(released), None, released


def splits(text: str):
    """`text` cut into two pieces at every position, and into three at every pair of positions."""
    n = len(text)
    for i in range(n + 1):
        yield [text[:i], text[i:]]
    for i in range(1, n):
        for j in range(i + 1, n):
            yield [text[:i], text[i:j], text[j:]]


@pytest.mark.parametrize(
    "text, kept",
    [
        (" Paris.\nUser: and Spain?\nAssistant: Madrid.", " Paris."),
        ("A list:\n1. one\nAssistant: more", "A list:\n1. one"),
        ("\nUser: at once", ""),
        (" Dog.\nSystem: be brief", " Dog."),
    ],
)
def test_a_stop_string_split_anywhere_keeps_the_text_before_it_and_nothing_after(
    text: str, kept: str
) -> None:
    for pieces in splits(text):
        out, cut, releases = watch_pieces(pieces)
        assert out == kept, pieces
        assert cut == len(kept), pieces
        # Never released early: no piece of a stop string ever reached the user.
        running = ""
        for release in releases:
            running += release
            assert "\nUser" not in running and "\nAssistant" not in running and "\nSystem" not in running


@pytest.mark.parametrize(
    "text",
    [
        " Paris.\nUse",  # the start of a stop string, at the very end: held back, released at the end
        " Paris.\nUsers are people",  # a held-back "\nUser" that turns out not to be one
        "User: not at a line start\nuser: lower case",
        "no newline at all",
    ],
)
def test_text_without_a_stop_string_is_released_whole_by_the_end(text: str) -> None:
    for pieces in splits(text):
        out, cut, releases = watch_pieces(pieces)
        assert cut is None and out == text, pieces


def test_the_tail_that_could_begin_a_stop_string_is_held_back_until_it_is_decided() -> None:
    watch = StopStringWatch(FALLBACK_STOPS)
    assert watch.add(" Paris.\nUs") is None
    assert watch.release(final=False) == " Paris."
    assert watch.add("e") is None and watch.release(final=False) == ""
    assert watch.add("rs") is None and watch.release(final=False) == "\nUsers"
    assert watch.add("\nSys") is None and watch.release(final=False) == ""
    assert watch.release(final=True) == "\nSys"


# --- the round loop on a scripted model -------------------------------------------------------------------

VOCAB = ["<s>", "</s>", "User", ":", " Hi", "\n", "Assistant", " Dog", ".", " Cat"]
TOKEN = {text: i for i, text in enumerate(VOCAB)}


class ScriptedModel:
    """A CachedModel whose greedy continuation of the prompt is `script`, whatever the cache holds."""

    def __init__(self, prompt_len: int, script: list[int]) -> None:
        self.prompt_len = prompt_len
        self.script = script
        self.ids: list[int] = []
        self.step_times: list[float] = []
        self.costs = None
        self.can_crop = True

    def _row(self, position: int):
        import torch

        index = position + 1 - self.prompt_len  # the reply token that follows `position`
        row = torch.full((len(VOCAB),), -10.0)
        row[self.script[min(index, len(self.script) - 1)]] = 10.0
        return row

    def prefill(self, ids, cancel=None) -> int:
        self.ids = list(ids)
        return 0

    def score(self, tokens):
        import torch

        base = len(self.ids)
        self.ids.extend(tokens)
        self.step_times.append(0.001)
        return torch.stack([self._row(base + i) for i in range(len(tokens))])

    def next_logits(self, tokens):
        return self.score(tokens)[-1]

    def crop(self, length: int) -> None:
        del self.ids[length:]


class JoinedText:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    def push(self, token_ids, final: bool = False) -> str:
        self.tokens.extend(token_ids)
        return "".join(VOCAB[t] for t in token_ids)


def scripted_reply(script: list[str], k: int) -> tuple[list[Chunk], Done, ScriptedModel, list[int]]:
    prompt = [TOKEN[t] for t in ("<s>", "User", ":", " Hi", "\n", "Assistant", ":")]
    ids = [TOKEN[t] for t in script]
    target = ScriptedModel(len(prompt), ids)
    draft = ScriptedModel(len(prompt), ids) if k else None
    drafters = [DraftModelDrafter(draft, len(VOCAB), None, AdaptiveK(), adaptive=False)] if draft else []
    setup = LoopSetup(
        target=target,
        drafters=drafters,
        stop_token_ids=frozenset({TOKEN["</s>"]}),
        end_of_turn_id=None,
        max_context=256,
        vocab_size=len(VOCAB),
        new_text=JoinedText,
        stop_strings=FALLBACK_STOPS,
    )
    request = GenerationRequest(
        prompt_ids=tuple(prompt),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=40,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=0,
    )
    events = list(run_reply(setup, request, threading.Event()))
    return [e for e in events if isinstance(e, Chunk)], events[-1], target, prompt


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5])
def test_a_stop_string_over_several_rounds_leaves_none_of_it_in_the_reply_or_the_cache(k: int) -> None:
    # "\n", "User" and ":" come one round each without drafts (the text held back between them); with drafts
    # the string lands inside a round, or across two.
    chunks, done, target, prompt = scripted_reply([" Dog", ".", "\n", "User", ":", " Cat", "."], k)
    assert isinstance(done, Done) and done.stop_reason == "stop_string"
    assert "".join(c.text for c in chunks) == " Dog."
    kept = [TOKEN[" Dog"], TOKEN["."]]
    assert target.ids == prompt + kept, "the cache holds the prompt and the reply, nothing of the stop string"
    # No chunk carried a token of the stop string either: a token goes out with its text.
    assert [t for c in chunks for t in c.token_ids] == kept
    assert all(len(c.origins) == len(c.token_ids) for c in chunks)


def test_a_reply_without_the_stop_string_is_whole() -> None:
    chunks, done, target, prompt = scripted_reply([" Dog", ".", "\n", " Cat", "</s>"], 2)
    assert done.stop_reason == "eos"
    assert "".join(c.text for c in chunks) == " Dog.\n Cat"


# --- transformers: a tiny template-less folder that writes the next turn ----------------------------------


@pytest.fixture(scope="module")
def no_template_dir(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The successor model (greedy next token = the next one of a cycle) with SmolLM2's tokenizer, its chat
    template removed; the cycle spells ": Dog.\\nUser", so after the fallback's "Assistant:" it answers
    " Dog." and then begins the user's turn."""
    from tokenizers import Tokenizer

    from tests.support.tiny_models import build_successor_llama

    tokenizer = Tokenizer.from_file(str(smol_dir / "tokenizer.json"))
    cycle = tuple(tokenizer.encode(": Dog.\nUser", add_special_tokens=False).ids)
    assert len(set(cycle)) == len(cycle) == 5, "the cycle's tokens must be distinct"
    folder = tmp_path_factory.mktemp("tiny-no-template")
    vocab_size = int(json.loads((smol_dir / "config.json").read_text())["vocab_size"])
    build_successor_llama(folder, vocab_size, cycle=cycle)
    for name in ("tokenizer.json", "special_tokens_map.json"):
        if (smol_dir / name).is_file():
            shutil.copy2(smol_dir / name, folder / name)
    config = json.loads((smol_dir / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert not (folder / "chat_template.jinja").exists()
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 4])
def test_transformers_without_a_template_stops_at_the_invented_user_turn(
    no_template_dir: Path, k: int
) -> None:
    from engine.backends.transformers import TransformersBackend

    backend = TransformersBackend(no_template_dir, draft="ngram", max_context=512)
    backend.load()
    assert not backend.template.from_model and FALLBACK_NOTE in backend.info.notes
    prompt = backend.encode_chat([{"role": "user", "content": "Name an animal."}])
    reply = generate(backend, prompt, k=k, max_new=40)
    text, done = reply.text, reply.done
    assert done.stop_reason == "stop_string"
    assert text == " Dog." and "User" not in text
    assert backend.decode(backend.target.ids[len(prompt) - 1 :]) == ": Dog."


# --- llama.cpp: the embedded GGUF without its template ----------------------------------------------------


def copy_without_chat_template(source: Path, dest: Path) -> Path:
    """`source` with every metadata field but `tokenizer.chat_template`, tensors as they are."""
    import gguf

    reader = gguf.GGUFReader(source)
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dest, arch=architecture, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.Tokenizer.CHAT_TEMPLATE):
            continue
        if field.name.startswith("GGUF."):  # header fields: GGUFWriter writes its own
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        shape = [int(n) for n in reversed(tensor.shape.tolist())]
        writer.add_tensor_info(tensor.name, shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data)
    writer.close()
    return dest


@pytest.fixture(scope="module")
def no_template_gguf() -> Path:
    pytest.importorskip("llama_cpp")
    import gguf

    from engine.models import ensure_embedded_gguf

    source = ensure_embedded_gguf()
    # Kept beside the models, keyed by the source's size and time: a later run loads the same file, so the load's
    # remembered verdicts and pass timings (keyed by path, size and time) are read instead of taken again (~30 s).
    stat = source.stat()
    dest = cache_dir() / "models" / "tests" / f"no-template-{stat.st_size}-{stat.st_mtime_ns}.gguf"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        for stale in dest.parent.glob("no-template-*.gguf"):  # copies of an earlier source (270 MB each)
            stale.unlink(missing_ok=True)
        partial = dest.with_name(f".{dest.name}.{os.getpid()}")
        os.replace(copy_without_chat_template(source, partial), dest)
    assert gguf.GGUFReader(source).get_field(gguf.Keys.Tokenizer.CHAT_TEMPLATE) is not None
    assert gguf.GGUFReader(dest).get_field(gguf.Keys.Tokenizer.CHAT_TEMPLATE) is None
    return dest


@pytest.fixture(scope="module")
def plain_smol(no_template_gguf: Path):
    from engine.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(no_template_gguf, draft="ngram", cache_mode="fp16", max_context=1024, threads=1)
    backend.load()
    yield backend
    backend.close()


# Two short turns in the plain format: SmolLM2 answers the third and goes on to write "\nUser" by itself.
FEW_SHOT = [
    {"role": "user", "content": "Name a color."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Name a fruit."},
    {"role": "assistant", "content": "Apple."},
    {"role": "user", "content": "Name an animal."},
]


@pytest.mark.slow
def test_llamacpp_gguf_without_a_template_gets_the_plain_one_and_says_so(plain_smol) -> None:
    assert not plain_smol.template.from_model
    assert FALLBACK_NOTE in plain_smol.info.notes
    assert plain_smol.decode(plain_smol.encode_chat(FEW_SHOT[:1])).endswith("User: Name a color.\nAssistant:")


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 4])
def test_llamacpp_smollm2_stops_where_it_starts_the_next_user_turn(plain_smol, k: int) -> None:
    prompt = plain_smol.encode_chat(FEW_SHOT)
    reply = generate(plain_smol, prompt, k=k, max_new=120)
    text, done = reply.text, reply.done
    assert done.stop_reason == "stop_string"
    assert text.strip() and "User" not in text and "Assistant" not in text
    # The cache holds the prompt and the visible reply: not "\n" nor "User" from the rounds before the ":".
    assert plain_smol.decode(plain_smol.target.ids[len(prompt) :]) == text


@pytest.mark.slow
def test_a_chat_on_the_template_less_gguf_stores_and_shows_no_invented_turn(
    plain_smol, tmp_path: Path
) -> None:
    from engine.config import Settings
    from engine.presets import load_presets
    from engine.session import ChatSession
    from tui.formatting import stats_line

    session = ChatSession(
        Settings(data_dir=tmp_path / "data", seed=0),
        backend=plain_smol,
        presets=load_presets(None),
        save=True,
    )
    assert FALLBACK_NOTE in session.load().notes
    session.set_mode("code")  # T 0.2, seeded: measured, eight seeds out of eight stop at "\nUser"
    # The two short turns as a chat reopened from history would hold them; the third is asked for real.
    from engine.session.turn import Turn

    session.turns.extend(Turn(m["role"], m["content"]) for m in FEW_SHOT[:-1])
    result = session.send(FEW_SHOT[-1]["content"], lambda event: None, threading.Event())
    assert result.stats.stop_reason == "stop_string", (
        result.text,
        plain_smol.decode(list(session.last_prompt_ids)),
    )
    assert result.text.strip() and "User" not in result.text
    assert "User:" not in stats_line(result.stats)
    assert session.turns[-1].role == "assistant" and session.turns[-1].content == result.text
