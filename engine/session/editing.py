"""Changing a conversation that already has replies: an earlier message edited (a new branch beside the old one)
and a reply cut at its token limit continued. Mixed into `ChatSession` (one concept per file: this is editing);
the reply itself is `ChatSession._reply`, given what to put back if it produces nothing.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from engine.errors import SpecchatError
from engine.session.turn import Turn

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.backends.base import Backend
    from engine.events import BackendInfo, ReplyFailed, ReplyFinished


class SessionEditing:
    # Provided by ChatSession.
    turns: list[Turn]
    backend: Backend | None
    _info: BackendInfo | None

    def _record_user(self, turn: Turn) -> None: ...

    def _reply(
        self, text: str, on_event: Callable[[object], None], cancel: threading.Event, **undo: object
    ) -> ReplyFinished | ReplyFailed: ...

    def _messages(self, turns: list[Turn]) -> list[dict[str, str]]: ...

    @property
    def context_turns(self) -> list[Turn]: ...

    def edit(
        self, index: int, text: str, on_event: Callable[[object], None], cancel: threading.Event
    ) -> ReplyFinished | ReplyFailed:
        """Send `text` in place of user turn `index` (any of them, not only the last): a new branch from the turn
        before it. The old message and everything after it stay in the store, a sibling branch (`branches`,
        `show_branch`); stopped before the first token, the old branch comes back."""
        if not text.strip():
            raise SpecchatError("empty message: type something to send")
        if not 0 <= index < len(self.turns) or self.turns[index].role != "user":
            raise SpecchatError("no such message to edit")
        edited = self.turns[index:]
        del self.turns[index:]
        turn = Turn("user", text)
        self.turns.append(turn)
        self._record_user(turn)
        return self._reply(text, on_event, cancel, edited=edited)

    def can_continue(self) -> bool:
        """True when the last reply stopped at its token limit (max_new_tokens) and can be continued."""
        last = self.turns[-1] if self.turns else None
        return (
            last is not None
            and last.role == "assistant"
            and last.stats is not None
            and last.stats.stop_reason == "max_new_tokens"
        )

    def continue_reply(
        self, on_event: Callable[[object], None], cancel: threading.Event
    ) -> ReplyFinished | ReplyFailed:
        """Extend the last reply where it stopped at its token limit: the model goes on from its last token (the
        same reply, in the store too). Stopped before anything new, the reply stays as it was."""
        if not self.can_continue():
            raise SpecchatError("nothing to continue: the last reply did not stop at its token limit")
        if self._info is not None and self._info.backend == "remote":
            raise SpecchatError("continue needs a local model (a server cannot resume a reply mid-turn)")
        last = self.turns.pop()
        user_text = next((t.content for t in reversed(self.turns) if t.role == "user"), "")
        return self._reply(user_text, on_event, cancel, replaced=[last], continuing=last)

    def _continued_prompt(self, text: str) -> list[int]:
        """The prompt that goes on from reply `text`: the conversation rendered with it as the last turn, cut right
        after its last character (before the end of turn). Found by decoding, so a template that joins the
        turn's header and its first token differently still cuts at the right place."""
        assert self.backend is not None
        messages = self._messages(self.context_turns)
        base = self.backend.encode_chat(messages)
        closed = self.backend.encode_chat([*messages, {"role": "assistant", "content": text}])
        start = 0
        while start < min(len(base), len(closed)) and base[start] == closed[start]:
            start += 1
        want = text.rstrip() or text

        def shown(end: int) -> str:
            return self.backend.decode(list(closed[start:end]))  # type: ignore[union-attr]

        low, high = start, len(closed)
        while low < high:  # the fewest tokens that decode to at least the reply's length
            middle = (low + high) // 2
            if len(shown(middle)) >= len(want):
                high = middle
            else:
                low = middle + 1
        for end in range(low, min(len(closed), low + 16) + 1):
            if shown(end).endswith(want):
                return list(closed[:end])
        raise SpecchatError("this model's chat template cannot continue a reply")
