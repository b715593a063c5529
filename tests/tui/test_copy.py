"""ctrl+b copies a reply's code blocks one per press, in reading order (it took only the last: the 2-line usage
example, not the function); the toast says whether the system clipboard took the text or it was only offered to
the terminal by OSC 52 (which no terminal acknowledges)."""

from __future__ import annotations

import stat
from pathlib import Path

from engine.backends.scripted import ScriptedBackend
from tests.support.tui import SIZE, make_app, send, wait_ready
from tui import clipboard

FUNCTION = "def add(a, b):\n    return a + b"
EXAMPLE = "print(add(1, 2))"
TWO_BLOCKS = f"Here it is:\n\n```python\n{FUNCTION}\n```\n\nUse it like this:\n\n```python\n{EXAMPLE}\n```\n"


async def test_ctrl_b_copies_each_code_block_in_turn_starting_with_the_first(monkeypatch) -> None:
    monkeypatch.setattr(clipboard, "system_copy", lambda text: None)  # no clipboard tool: OSC 52 only
    app = make_app(ScriptedBackend(replies=[TWO_BLOCKS]))
    toasts: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        monkeypatch.setattr(app, "notify", lambda message, **kw: toasts.append(str(message)))
        await wait_ready(pilot)
        await send(pilot, "add two numbers")
        copied = []
        for _ in range(3):
            await pilot.press("ctrl+b")
            copied.append(app.clipboard)
        assert copied == [FUNCTION, EXAMPLE, FUNCTION]
        # the load's own toast ("<model> on <engine>") can land late on a busy machine: only the copies' toasts count
        toasts = [toast for toast in toasts if "code block" in toast]
        assert len(toasts) == 3
        assert toasts[0].startswith("Sent code block 1 of 2 (2 lines; ctrl+b again: the next)")
        assert "OSC 52" in toasts[0] and "copies nothing" in toasts[0]


def fake_tool(folder: Path, name: str, sink: Path) -> None:
    script = folder / name
    script.write_text(f"#!/bin/sh\n/bin/cat > {sink}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_the_system_clipboard_is_used_where_a_tool_is_there(tmp_path: Path) -> None:
    sink = tmp_path / "clip.txt"
    fake_tool(tmp_path, "xclip", sink)
    environ = {"PATH": str(tmp_path), "DISPLAY": ":0"}
    assert clipboard.system_copy("hello ✓", environ) == "xclip"
    assert sink.read_text(encoding="utf-8") == "hello ✓"
    # without a display the X tools are not tried; without any tool: None (OSC 52 only, said so)
    assert clipboard.system_copy("x", {"PATH": str(tmp_path)}) is None
    assert clipboard.system_copy("x", {"PATH": str(tmp_path / "none")}) is None


def test_the_toast_names_the_path_that_took_the_text(monkeypatch) -> None:
    class App:
        clipboard = None

        def copy_to_clipboard(self, text: str) -> None:
            self.clipboard = text

    monkeypatch.setattr(clipboard, "system_copy", lambda text: "wl-copy")
    app = App()
    assert clipboard.copy_text(app, "x", "the reply") == "Copied the reply (system clipboard, wl-copy)."
    assert app.clipboard == "x"
    monkeypatch.setattr(clipboard, "system_copy", lambda text: None)
    assert clipboard.copy_text(app, "x", "the reply").startswith("Sent the reply to the terminal's clipboard")
