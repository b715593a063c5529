"""Finding text in the conversation: the chat screen's `ConversationFinder` (the dialog that asks for it is
`tui.screens.find`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.app import App
    from textual.widget import Widget

    from tui.chat_parts.branches import BranchEditor
    from tui.widgets.message import ReplyMessage, UserMessage


class FinderScreen(Protocol):
    """What the part uses of the chat screen."""

    branches: BranchEditor

    @property
    def app(self) -> App[Any]: ...

    @property
    def focused(self) -> Widget | None: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...

    def shown_key(self, binding_id: str) -> str: ...


class ConversationFinder:
    """The last text looked for, and the messages on screen that hold it; a match is selected (focused)."""

    def __init__(self, screen: FinderScreen) -> None:
        self.screen = screen
        self.query = ""

    def matches(self, query: str) -> list[UserMessage | ReplyMessage]:
        needle = query.casefold().strip()
        return (
            [m for m in self.screen.branches.on_screen() if needle and needle in m.text.casefold()]
            if needle
            else []
        )

    def ask(self) -> None:
        """The find dialog, which counts the matches as they are typed; enter selects one."""
        from tui.screens.find import FindScreen

        def chosen(query: str | None) -> None:
            if query:
                self.jump(query)

        self.screen.app.push_screen(FindScreen(self.query, lambda q: len(self.matches(q))), chosen)

    def jump(self, query: str) -> None:
        """Select the newest message holding `query`; the same query again goes one match further back."""
        screen = self.screen
        found = self.matches(query)
        if not found:
            screen.notify(f"No message contains {query.strip()!r}.", severity="warning", timeout=3)
            return
        focused = screen.focused
        # The same query again, on a match: one back (from the oldest round to the newest).
        again = query == self.query and focused in found
        target = found[found.index(focused) - 1] if again else found[-1]
        self.query = query
        target.focus()
        target.scroll_visible(animate=False)
        number = found.index(target) + 1
        screen.notify(
            f"Match {number} of {len(found)} for {query.strip()!r} · {screen.shown_key('chat.find')}, enter: the next",
            timeout=4,
        )
