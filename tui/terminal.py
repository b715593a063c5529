"""The terminal's input at our edge: a bracketed paste arrives whole and in order, escape sequences and all.

Textual's `XTermParser` (8.x) starts an escape-sequence scan at every ESC, also inside a bracketed paste
(`ESC[200~ ... ESC[201~`). There the scan never matches, so after 32 characters (or at the next ESC) it re-issues
what it read as key presses: a pasted line break after coloured text (`ESC[1mbold ESC[0m end\\n`) arrives as Enter
and sends the prompt, and the Paste event holds only the text before the first ESC.

`PasteSafeParser` hides every ESC inside a paste from that scan behind a stand-in character, so the parser only ever
sees the end marker, and puts the ESCs back into the Paste event's text. Markers split across two reads are
handled: a tail that may begin the end marker waits for the next read (a paste always ends with the marker).
What the pasted escape sequences become is the prompt's choice (`tui.widgets.prompt`).

`PasteSafeLinuxDriver` is Textual's Linux driver reading with that parser; `SpecchatApp.get_driver_class` picks it
where Textual would pick the Linux driver (Linux and macOS terminals).
"""

from __future__ import annotations

import os
import selectors
from codecs import getincrementaldecoder
from collections.abc import Iterable

from textual import events
from textual._loop import loop_last
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

ESC = "\x1b"
PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"
# A private-use character the terminal never sends for a key; a pasted one would come back as ESC (and be removed
# with the sequences), a loss nobody will meet.
ESC_STAND_IN = "\U000f001b"


def _marker_prefix_at_end(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker` (0: none)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class PasteSafeParser(XTermParser):
    """Textual's parser, except that an ESC inside a bracketed paste is pasted text, not the start of a key."""

    def __init__(self, debug: bool = False) -> None:
        super().__init__(debug)
        self._in_paste = False
        self._held = ""  # inside a paste: the end of the last read, which may begin the end marker
        self._tail = ""  # outside: the end of the last read (already fed), which may begin the start marker

    def feed(self, data: str) -> Iterable[Message]:
        if not data:  # end of input: what was held back is pasted text
            held, self._held = self._held.replace(ESC, ESC_STAND_IN), ""
            return self._restored([*(super().feed(held) if held else ()), *super().feed("")])
        shielded = self._shield(data)
        if not shielded:  # all of it held back: feeding "" would mean end of input
            return ()
        return self._restored(super().feed(shielded))

    def _shield(self, data: str) -> str:
        """`data` with each ESC inside a paste (not its end marker) replaced by the stand-in."""
        text, self._held = self._held + data, ""
        out: list[str] = []
        pos = 0
        while pos < len(text):
            if not self._in_paste:
                seen = self._tail + text[pos:]
                start = seen.find(PASTE_START)
                if start < 0:
                    out.append(text[pos:])
                    self._tail = seen[len(seen) - _marker_prefix_at_end(seen, PASTE_START) :]
                    break
                after = start + len(PASTE_START) - len(self._tail)  # in text[pos:]
                out.append(text[pos : pos + after])
                pos += after
                self._tail = ""
                self._in_paste = True
            else:
                end = text.find(PASTE_END, pos)
                if end < 0:
                    chunk = text[pos:]
                    held = _marker_prefix_at_end(chunk, PASTE_END)
                    if held:
                        chunk, self._held = chunk[:-held], chunk[-held:]
                    out.append(chunk.replace(ESC, ESC_STAND_IN))
                    break
                out.append(text[pos:end].replace(ESC, ESC_STAND_IN))
                out.append(PASTE_END)
                pos = end + len(PASTE_END)
                self._in_paste = False
        return "".join(out)

    @staticmethod
    def _restored(messages: Iterable[Message]) -> Iterable[Message]:
        for message in messages:
            if isinstance(message, events.Paste) and ESC_STAND_IN in message.text:
                message = events.Paste(message.text.replace(ESC_STAND_IN, ESC))
            yield message


class PasteSafeLinuxDriver(LinuxDriver):
    """Textual's Linux driver with `PasteSafeParser` (its input loop, textual 8.x, with the parser swapped)."""

    parser_class: type[XTermParser] = PasteSafeParser

    def run_input_thread(self) -> None:
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        fileno = self.fileno
        parser = self.parser_class(self._debug)
        feed, tick = parser.feed, parser.tick
        decode = getincrementaldecoder("utf-8")().decode

        def process_selector_events(
            selector_events: list[tuple[selectors.SelectorKey, int]], final: bool = False
        ) -> None:
            for last, (_key, mask) in loop_last(selector_events):
                if mask & selectors.EVENT_READ:
                    unicode_data = decode(os.read(fileno, 1024 * 4), final=final and last)
                    if not unicode_data:  # stdin is a pipe
                        break
                    for event in feed(unicode_data):
                        self.process_message(event)
            for event in tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                process_selector_events(selector.select(0.1))
            selector.unregister(self.fileno)
            process_selector_events(selector.select(0.1), final=True)
        finally:
            selector.close()
            try:
                for _event in feed(""):
                    pass
            except (EOFError, ParseError):
                pass
