"""`specchat history`: the saved chats: list, show, export (Markdown or JSON), delete."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tui.cli.common import CliError, OneLineParser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    hsub = parser.add_subparsers(dest="history_command", parser_class=OneLineParser, metavar="ACTION")
    hsub.required = True
    hlist = hsub.add_parser("list", help="chats, most recent first")
    hlist.add_argument("--json", action="store_true", help="one JSON object per chat, one per line")
    hlist.add_argument("--search", default="", help="only chats whose title or text contains this")
    hshow = hsub.add_parser("show", help="print a chat with its stats lines")
    hshow.add_argument("id", type=int)
    hexport = hsub.add_parser("export", help="a chat as Markdown or JSON")
    hexport.add_argument("id", type=int)
    hexport.add_argument("--format", choices=["md", "json"], default="md", help="md (default) or json")
    hexport.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    hdelete = hsub.add_parser("delete", help="delete a chat and its messages")
    hdelete.add_argument("id", type=int)


def open_store():
    from engine.config import data_dir, load_settings
    from engine.storage.store import Store

    store = Store.open(data_dir(load_settings()))
    for notice in store.take_notices():
        print(f"specchat: {notice}", file=sys.stderr)
    return store


def run(args: argparse.Namespace) -> int:
    import orjson

    from engine.storage.store import export_json, export_markdown
    from tui.formatting import stored_stats_line

    store = open_store()
    action = args.history_command
    if action == "list":
        chats = store.chats(args.search)
        for chat in chats:
            if args.json:
                record = {
                    "id": chat.id,
                    "title": chat.title,
                    "created_at": chat.created_at,
                    "updated_at": chat.updated_at,
                    "messages": chat.message_count,
                    "model": chat.model,
                }
                sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
            else:
                when = local_time(chat.updated_at)
                print(f"{chat.id:>5}  {when}  {chat.message_count:>4} msgs  {chat.title}")
        if not chats and not args.json:
            print(
                "no saved chats yet" + (f" matching {args.search!r}" if args.search else ""), file=sys.stderr
            )
        sys.stdout.flush()
        return 0
    chat = store.chat(args.id)  # StoreError (exit 2) for an unknown id
    if action == "delete":
        store.delete_chat(chat.id)
        print(f"deleted chat {chat.id}: {chat.title}")
        return 0
    messages = store.conversation(chat.id)
    if action == "show":
        print(f"chat {chat.id} · {chat.title} · {local_time(chat.created_at)}")
        for message in messages:
            print(f"\n[{'you' if message.role == 'user' else message.role}]")
            print(message.text)
            line = stored_stats_line(message)
            if line:
                print(f"  ({line})")
        return 0
    data = (
        export_json(chat, messages)
        if args.format == "json"
        else export_markdown(chat, messages, stored_stats_line).encode("utf-8")
    )
    if args.output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        args.output.write_bytes(data)
    except OSError as exc:
        raise CliError(f"cannot write {args.output}: {exc.strerror or exc}") from exc
    print(f"wrote chat {chat.id} to {args.output}", file=sys.stderr)
    return 0


def local_time(timestamp: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))
