"""The engines the backend contract suite (tests/engine/backends/test_contract.py) runs against, one builder each.

Each builder loads its engine from what the engine's own tests build: the scripted backend; the transformers backend
on the successor model (`copy_model_dir`, tests/conftest.py: a tiny Llama that continues a cycle of ids with
<|im_end|> inside it, so a reply copies its prompt and ends at a stop token); llama.cpp on that model written as a
GGUF (tests/support/tiny_gguf.py); the ExLlamaV2 and ExLlamaV3 backends on their stand-ins (tests/support/exl2_standin,
exl3_standin) with a scripted reply; the remote backend on the recorded vLLM replies (tests/support/remote_fixture_server.py). Each says what it
replies to its prompts and what it does at the context limit, so the suite's tests read the same for every engine.

A new engine adds one builder here and its name to `ENGINES`.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from engine.backends.base import Backend
from engine.request import GenerationRequest, SamplerSettings
from tests.support import paths
from tests.support.tiny_models import COPY_CYCLE

# What an engine does with a request whose prompt fits its context but whose prompt + max_new_tokens does not:
# "stops": the reply runs until the context is full (less the K positions a round may need) and Done says
# "context"; "refused": a one-line BackendError (a server that checks the request first); "unchecked": the engine
# does not read max_context at all (the session fits the prompt before it asks).
AtLimit = Literal["stops", "refused", "unchecked"]
# ... and with a prompt that alone fills the context: "done": one Done("context") and no Chunk; "refused" and
# "unchecked" as above.
PastLimit = Literal["done", "refused", "unchecked"]

ENGINES = ("scripted", "transformers", "llamacpp", "exllamav2", "exllamav3", "remote")
# Engines that load a real (tiny) model: marked slow, as their own tests are.
SLOW = frozenset({"transformers", "llamacpp"})

CONTEXT = 64  # max_context of the local engines that take any (the ExLlama caches are 256 at least)
IM_END = 2  # SmolLM2's <|im_end|>: the end of turn of every engine with SmolLM2's tokenizer
USER = "Repeat after me, twice: the quick brown fox jumps over the lazy dog."


@dataclass
class ContractEngine:
    """One loaded engine, with the prompts the contract asks it and what it answers to them."""

    name: str
    backend: Backend
    copy_prompt: tuple[int, ...]  # a prompt with something to copy, whose reply ends at a stop token
    long_prompt: tuple[int, ...]  # a prompt whose reply runs on (no stop token for a while)
    fill: Callable[[int], tuple[int, ...]]  # a prompt of exactly n tokens whose reply runs on
    reply_ids: tuple[int, ...] | None  # the copy prompt's reply, up to its stop token (None: text only)
    reply_text: str  # ... and its text
    stop_id: int | None  # the stop token that ends it (None: the engine has none / sends text only)
    stop_text: str | None  # the stop token's text, never part of a reply
    stop_reason: str  # what the Done says there
    at_limit: AtLimit
    past_limit: PastLimit
    token_ids: bool = True  # chunks carry token ids (a remote server sends text and counts)
    # Whether a cancel set before the reply starts gives the Done alone; False: one round runs first (the ExLlama
    # engines read the cancel between the generator's iterate() calls, after the first).
    cancel_before_first_round: bool = True
    messages: tuple[dict[str, str], ...] = ({"role": "user", "content": USER},)
    # The remote engine's fixture server routes: what the client sent, and how a server refuses at its limit.
    sent: Callable[[], list[dict]] | None = None
    refusing: Callable[[], AbstractContextManager[None]] = nullcontext
    closers: list[Callable[[], None]] = field(default_factory=list)

    def request(self, prompt: tuple[int, ...], k: int = 0, max_new: int = 32) -> GenerationRequest:
        """A greedy request (K drafts a round; 0: plain)."""
        return GenerationRequest(
            prompt_ids=tuple(prompt),
            sampler=SamplerSettings(temperature=0.0),
            max_new_tokens=max_new,
            num_draft_tokens=k,
            drafting=k > 0,
            seed=0,
            messages=self.messages,
        )

    @property
    def max_context(self) -> int:
        return self.backend.info.max_context

    def close(self) -> None:
        for closer in reversed(self.closers):
            closer()


def build(name: str, request: pytest.FixtureRequest) -> ContractEngine:
    """The engine `name`, loaded (skipped where it cannot run here); fixtures come from `request`."""
    return BUILDERS[name](request)


# --- scripted ----------------------------------------------------------------------------------------------

SCRIPTED_REPLY = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."


def _scripted(request: pytest.FixtureRequest) -> ContractEngine:
    from engine.backends.scripted import ScriptedBackend

    backend = ScriptedBackend(SCRIPTED_REPLY, max_context=CONTEXT)
    backend.load()
    prompt = tuple(backend.encode_chat([{"role": "user", "content": USER}]))
    reply = tuple(backend.encode(SCRIPTED_REPLY))
    return ContractEngine(
        name="scripted",
        backend=backend,
        copy_prompt=prompt,
        long_prompt=prompt,
        fill=lambda n: (prompt * n)[:n],
        reply_ids=reply,
        reply_text=SCRIPTED_REPLY,
        stop_id=None,  # each reply ends at its script's end, no token of its own
        stop_text=None,
        stop_reason="end_of_turn",
        at_limit="unchecked",
        past_limit="unchecked",
        closers=[backend.close],
    )


# --- the successor model: transformers and llama.cpp --------------------------------------------------------

# The cycle once, then its start again: the reply copies 102 ... 110 and stops at <|im_end|> (COPY_CYCLE's 12th).
COPY_PROMPT = (*COPY_CYCLE, 100, 101)
COPY_REPLY = tuple(range(102, 111))


def successor_fill(n: int) -> tuple[int, ...]:
    """n tokens of the cycle ending at its stop token: the reply then runs 111 ... 120, 100 ... 110 (21 tokens)."""
    end = COPY_CYCLE.index(IM_END) + 1
    laps = math.ceil(n / len(COPY_CYCLE)) + 1
    ids = (COPY_CYCLE * laps)[: (laps - 1) * len(COPY_CYCLE) + end]
    return ids[-n:]


def _successor(name: str, backend, reply_text: str, closers: list) -> ContractEngine:
    from tests.support.drafting import FreeVerify

    backend.target.costs = FreeVerify()  # draft the full K wherever a match is found, whatever the load
    return ContractEngine(
        name=name,
        backend=backend,
        copy_prompt=COPY_PROMPT,
        long_prompt=successor_fill(12),
        fill=successor_fill,
        reply_ids=COPY_REPLY,
        reply_text=reply_text,
        stop_id=IM_END,
        stop_text="<|im_end|>",
        stop_reason="end_of_turn",  # the round loop names the end of turn first where it is the EOS too
        at_limit="stops",
        past_limit="done",
        closers=closers,
    )


def _transformers(request: pytest.FixtureRequest) -> ContractEngine:
    from engine.backends.transformers import TransformersBackend

    folder = request.getfixturevalue("copy_model_dir")
    backend = TransformersBackend(folder, draft="ngram", cache_mode="fp16", max_context=CONTEXT)
    backend.load()
    text = backend.tokenizer.decode(list(COPY_REPLY), skip_special_tokens=True)
    return _successor("transformers", backend, text, [backend.close])


def _llamacpp(request: pytest.FixtureRequest) -> ContractEngine:
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend
    from tests.support.tiny_gguf import write_tiny_gguf

    folder = request.getfixturevalue("copy_model_dir")
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    # F32 weights: nothing is repacked, so llama.cpp's AMX repack crash (tests/support/native_guard.py) cannot
    # happen here.
    gguf = write_tiny_gguf(folder, factory.mktemp("contract-gguf") / "successor.gguf")
    backend = LlamaCppBackend(gguf, draft="ngram", cache_mode="fp16", max_context=CONTEXT, threads=1)
    backend.load()
    return _successor("llamacpp", backend, backend.decode(list(COPY_REPLY)), [backend.close])


# --- ExLlamaV2 and ExLlamaV3 on their stand-ins ----------------------------------------------------------

EXL_REPLY = "Keys stay warm in pages, prefixes reused again, drafts fly ahead fast."
EXL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 49152,
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "bos_token_id": 1,
    "eos_token_id": IM_END,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def _forget(package: str) -> None:
    for module in list(sys.modules):
        if module == package or module.startswith(f"{package}."):
            del sys.modules[module]


def _exllama(
    request: pytest.FixtureRequest, name: str, standin: Path, make: Callable[[Path], Backend]
) -> ContractEngine:
    """The stand-in imported as the library while the engine is loaded (as the engine's own tests do), a model
    folder with SmolLM2's tokenizer that replies EXL_REPLY then <|im_end|>, n-gram drafts accepted 2, 4, 1, 3."""
    smol: Path = request.getfixturevalue("smol_dir")
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    patch = pytest.MonkeyPatch()
    _forget(name)
    patch.syspath_prepend(str(standin))

    def undo() -> None:
        _forget(name)
        patch.undo()

    from tokenizers import Tokenizer

    reply = tuple(
        Tokenizer.from_file(str(smol / "tokenizer.json")).encode(EXL_REPLY, add_special_tokens=False).ids
    )
    folder = factory.mktemp(f"contract-{name}")
    for file_name in TOKENIZER_FILES:
        if (smol / file_name).is_file():
            shutil.copy(smol / file_name, folder / file_name)
    (folder / "config.json").write_text(json.dumps(EXL_CONFIG), encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"")
    script = {"reply": list(reply), "end": "end_of_turn", "ngram_acceptance": [2, 4, 1, 3]}
    (folder / "standin.json").write_text(json.dumps(script), encoding="utf-8")
    backend = make(folder)
    try:
        backend.load()
    except BaseException:
        undo()
        raise
    prompt = tuple(backend.encode_chat([{"role": "user", "content": USER}]))
    return ContractEngine(
        name=name,
        backend=backend,
        copy_prompt=prompt,
        long_prompt=prompt,
        fill=lambda n: (prompt * n)[:n],
        reply_ids=reply,
        reply_text=backend.decode(list(reply)),
        stop_id=IM_END,
        stop_text="<|im_end|>",
        # SmolLM2's EOS is its end of turn (<|im_end|>, 2): the ExLlama engines name the EOS first
        # (engine/backends/held_rounds.stop_reason_of), where the round loop says "end_of_turn".
        stop_reason="eos",
        at_limit="stops",  # keeping K positions free for the round's drafts
        past_limit="refused",
        cancel_before_first_round=False,
        closers=[undo, backend.close],
    )


def _exllamav2(request: pytest.FixtureRequest) -> ContractEngine:
    from engine.backends.exllamav2 import ExLlamaV2Backend

    return _exllama(
        request,
        "exllamav2",
        paths.EXL2_STANDIN,
        lambda folder: ExLlamaV2Backend(folder, draft="ngram", max_context=256),
    )


def _exllamav3(request: pytest.FixtureRequest) -> ContractEngine:
    """As ExLlamaV2, but at the context limit: exllamav3 keeps 1 + max_draft_tokens (16) positions free whatever the
    reply's K (job.py prepare_for_queue), so a prompt that leaves 8 is refused in one line."""
    from engine.backends.exllamav3 import ExLlamaV3Backend

    engine = _exllama(
        request,
        "exllamav3",
        paths.EXL3_STANDIN,
        lambda folder: ExLlamaV3Backend(folder, draft="ngram", max_context=256),
    )
    engine.at_limit = "refused"
    return engine


# --- remote: the recorded vLLM server ----------------------------------------------------------------------

VLLM_REPLY = "The capital of France is Paris. It is known for the Eiffel Tower."
# What vLLM answers where prompt + max_tokens exceeds max_model_len (its OpenAI server's 400).
VLLM_CONTEXT_ERROR = {
    "object": "error",
    "message": "This model's maximum context length is 8192 tokens. However, you requested 8216 tokens "
    "(24 in the messages, 8192 in the completion). Please reduce the length of the messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


def _remote(request: pytest.FixtureRequest) -> ContractEngine:
    from contextlib import contextmanager

    from engine.backends.remote import RemoteBackend
    from tests.support.remote_fixture_server import FixtureServer, Reply, file_reply, vllm_routes

    routes = vllm_routes()
    stream = file_reply("vllm_chat_stream.sse")
    stream.delay = 0.02  # a server generating at its own pace: a cancel lands mid-reply
    routes.add("POST", "/v1/chat/completions", stream)
    server = FixtureServer(routes).__enter__()
    backend = RemoteBackend(server.url)
    try:
        backend.load()
    except BaseException:
        server.__exit__(None, None, None)
        raise
    prompt = tuple(backend.encode_chat([{"role": "user", "content": USER}]))  # the server's /tokenize

    def sent() -> list[dict]:
        return [body for method, path, body, _ in routes.requests if path == "/v1/chat/completions"]

    @contextmanager
    def refusing() -> Iterator[None]:
        routes.add("POST", "/v1/chat/completions", Reply(400, json.dumps(VLLM_CONTEXT_ERROR)))
        try:
            yield
        finally:
            routes.add("POST", "/v1/chat/completions", stream)

    return ContractEngine(
        name="remote",
        backend=backend,
        copy_prompt=prompt,
        long_prompt=prompt,
        fill=lambda n: (prompt * n)[:n],
        reply_ids=None,
        reply_text=VLLM_REPLY,
        stop_id=None,
        stop_text="<|eot_id|>",  # the recorded model's (Llama 3.1) end of turn
        stop_reason="end_of_turn",  # finish_reason "stop"
        at_limit="refused",  # the server checks the request; the client passes its refusal on in one line
        past_limit="refused",
        token_ids=False,
        sent=sent,
        refusing=refusing,
        closers=[lambda: server.__exit__(None, None, None), backend.close],
    )


BUILDERS: dict[str, Callable[[pytest.FixtureRequest], ContractEngine]] = {
    "scripted": _scripted,
    "transformers": _transformers,
    "llamacpp": _llamacpp,
    "exllamav2": _exllamav2,
    "exllamav3": _exllamav3,
    "remote": _remote,
}
