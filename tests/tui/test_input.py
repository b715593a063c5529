"""What the terminal sends reaches the prompt as typed or pasted: the raw bytes go through the parser the app reads
the terminal with (tui/terminal.py), then into the real app under Pilot.

Before the fix, Textual's parser turned `ESC[1m` inside a bracketed paste into key presses (a pasted line break
became Enter: the prompt was sent, the rest lost), and the prompt dropped a typed U+200D (not printable to Python).
"""

from __future__ import annotations

from textual import events

from tests.support.tui import SIZE, make_app, parse, wait_until
from tui.widgets.prompt import strip_escape_sequences

# What `printf 'first line\nsecond \x1b[1mbold\x1b[0m end\nthird line'` pasted into tmux (paste-buffer -p) sends:
# the paste markers around the text, its line breaks as CR.
PASTED = "first line\rsecond \x1b[1mbold\x1b[0m end\rthird line"
BRACKETED = b"\x1b[200~" + PASTED.encode() + b"\x1b[201~"
FAMILY = "👩\u200d👩\u200d👧\u200d👦"


def test_a_paste_with_escape_sequences_is_one_paste_event_in_order():
    messages = parse(b"x" + BRACKETED + b"y")
    assert [type(m) for m in messages] == [events.Key, events.Paste, events.Key]
    assert messages[1].text == PASTED
    assert (messages[0].key, messages[2].key) == ("x", "y")


def test_a_paste_split_across_reads_anywhere_is_still_whole():
    raw = b"x" + BRACKETED + b"y"
    size = len(raw.decode())
    for cut in range(1, size):
        for second in (cut, min(cut + 3, size)):
            messages = parse(raw, cut, second)
            assert [type(m) for m in messages] == [events.Key, events.Paste, events.Key], (cut, second)
            assert messages[1].text == PASTED, (cut, second)


def test_a_single_line_paste_keeps_its_order():
    messages = parse(b"\x1b[200~abc \x1b[31mRED\x1b[0m xyz\x1b[201~")
    assert [type(m) for m in messages] == [events.Paste]
    assert strip_escape_sequences(messages[0].text) == ("abc RED xyz", 2)


def test_keys_and_escape_outside_a_paste_are_unchanged():
    messages = parse(b"\x1b[Aa\x1b[1;5C")
    assert [m.key for m in messages] == ["up", "a", "ctrl+right"]


async def feed_terminal(app, raw: bytes) -> None:
    """Post what the parser makes of `raw` to the app, as its terminal driver does."""
    for message in parse(raw):
        app.post_message(message)


async def test_pasting_coloured_text_fills_the_prompt_unsent_and_says_the_sequences_were_removed():
    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        await feed_terminal(app, BRACKETED)
        expected = "first line\nsecond bold end\nthird line"
        await wait_until(pilot, lambda: app.chat.prompt.text == expected)
        await pilot.pause(0.2)
        assert app.chat.prompt.text == expected
        assert not app.chat.chat_log.messages() and not app.chat.generating  # nothing was sent
        assert any("2 escape sequences" in n.message for n in app._notifications)


async def test_a_plain_paste_says_nothing_and_undo_takes_a_big_one_back():
    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        app.chat.prompt.insert("keep ")
        lines = "\r".join(f"line {i}" for i in range(247))
        await feed_terminal(app, b"\x1b[200~" + lines.encode() + b"\x1b[201~")
        await wait_until(pilot, lambda: app.chat.prompt.document.line_count == 247)
        assert not any("escape sequence" in n.message for n in app._notifications)
        await pilot.press("ctrl+z")
        await wait_until(pilot, lambda: app.chat.prompt.text == "keep ")


async def test_typed_emoji_keep_their_zero_width_joiners():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        for character in FAMILY:  # typed: one read per key, as the terminal sends them
            await feed_terminal(app, character.encode())
        await wait_until(pilot, lambda: len(app.chat.prompt.text) == len(FAMILY))
        assert app.chat.prompt.text == FAMILY
