"""The server kinds (engine/backends/remote/servers.py): one object per kind behind one interface, looked up by
name; the remote backend asks the kind, never which kind it holds, and a kind added as one object is used."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.backends.remote import servers
from engine.backends.remote.backend import RemoteBackend
from engine.backends.remote.servers import OTHER, SERVERS, Probe, Server, ServerProfile, detect, server
from engine.request import GenerationRequest, SamplerSettings

REMOTE = Path(servers.__file__).parent


def test_each_kind_is_found_by_its_name_and_an_unknown_name_is_the_unknown_server() -> None:
    names = [known.name for known in SERVERS]
    assert len(set(names)) == len(names) and "other" not in names
    for known in SERVERS:
        assert server(known.name) is known
    assert server("other") is OTHER and server("no such server") is OTHER
    assert detect(Probe(models={"data": [{"id": "m"}]})) is OTHER


def test_no_module_of_the_remote_engine_branches_on_the_kind() -> None:
    for path in REMOTE.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"kind\s*(==|!=|in\s*\()|\[\s*profile\.kind\s*\]", text), path.name


class Echo(Server):
    """A kind this client did not know: it names itself in /props and takes `draft_len`."""

    name = "echo"  # type: ignore[assignment]
    sampler_fields = (("top_k", "top_k"),)

    def recognises(self, probe: Probe) -> bool:
        return isinstance(probe.props, dict) and probe.props.get("server") == "echo"

    def request_fields(self, body: dict[str, Any], profile: ServerProfile, k: int) -> None:
        body["draft_len"] = k


def test_a_kind_added_as_one_object_is_detected_and_says_what_a_request_carries(monkeypatch) -> None:
    echo = Echo()
    monkeypatch.setattr(servers, "SERVERS", (*SERVERS, echo))
    probe = Probe(models={"data": [{"id": "m"}]}, props={"server": "echo"})
    assert detect(probe) is echo and server("echo") is echo
    backend = RemoteBackend("http://127.0.0.1:9")
    backend.profile = echo.profile(probe)
    assert backend.profile.server is echo and backend.profile.kind == "echo"
    request = GenerationRequest(
        prompt_ids=(1,),
        sampler=SamplerSettings(top_k=5),
        max_new_tokens=8,
        num_draft_tokens=3,
        messages=({"role": "user", "content": "hi"},),
    )
    body = backend.request_body(request)
    assert body["top_k"] == 5 and body["draft_len"] == request.effective_k
    assert backend.profile.summary().startswith("echo: sends temperature, top_p, max_tokens, seed, top_k; ")
