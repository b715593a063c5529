"""A stored conversation written out: as JSON (the records as they are) or as Markdown (`specchat history export`,
the history dialog's export)."""

from __future__ import annotations

import time
from dataclasses import asdict

import orjson

from engine.storage.store.records import ChatRecord, MessageRecord


def export_json(chat: ChatRecord, messages: list[MessageRecord]) -> bytes:
    # Origins are the app's colouring data, not part of the conversation.
    record = {
        "chat": asdict(chat),
        "messages": [{k: v for k, v in asdict(m).items() if k != "origins"} for m in messages],
    }
    return orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n"


def export_markdown(chat: ChatRecord, messages: list[MessageRecord], stats_line=None) -> str:
    """The conversation as Markdown; `stats_line(stats_dict, message)` adds a line under each reply."""
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.created_at))
    lines = [
        f"# {chat.title or 'Untitled chat'}",
        "",
        f"*chat {chat.id} · {created} · {chat.model or ''}*",
        "",
    ]
    for message in messages:
        lines.append(f"## {'You' if message.role == 'user' else message.role.capitalize()}")
        lines.append("")
        lines.append(message.text)
        lines.append("")
        if message.role == "assistant" and stats_line is not None:
            line = stats_line(message)
            if line:
                lines += [f"*{line}*", ""]
    return "\n".join(lines)
