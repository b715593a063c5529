"""Settings for this chat (F12): the chat screen's `SettingsFlow` opens the dialog (`tui.screens.settings`) with a
`tui.chat_settings.ChatSettings`, applies what it returns, asks the app to load another model or draft, and opens
the dialog again, with what was typed and why, where that load failed."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from tui.chat_settings import ChatSettings
from tui.screens.settings import SettingsScreen

if TYPE_CHECKING:
    from textual.app import App

    from engine.session import ChatSession
    from tui.chat_host import ChatHost


class SettingsFlowScreen(Protocol):
    """What the part uses of the chat screen."""

    host: ChatHost

    @property
    def app(self) -> App[Any]: ...

    @property
    def session(self) -> ChatSession: ...

    @property
    def generating(self) -> bool: ...

    @property
    def state(self) -> str: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...

    def shown_key(self, binding_id: str) -> str: ...

    def refresh_status(self) -> None: ...

    def run_worker(self, work: Any, **kwargs: Any) -> Any: ...

    async def say_verdict(self, changed: bool = False) -> None: ...


class SettingsFlow:
    """The dialog in a worker of the screen (group "settings": its failure reaches the app's one handler), and what
    the dialog applied while its model or draft loads."""

    def __init__(self, screen: SettingsFlowScreen) -> None:
        self.screen = screen
        # What the settings dialog applied while its model or draft loads: the dialog comes back with it on failure.
        self._typed: dict[str, Any] | None = None

    def open(self, typed: dict[str, Any] | None = None, error: str = "") -> None:
        """The settings dialog for this chat; `typed` and `error`: opened again with what was typed, and why that
        model or draft did not load."""
        self.screen.run_worker(
            partial(self._show, typed, error),
            name="show_settings",
            group="settings",
            exclusive=True,
            exit_on_error=False,
        )

    def reopen(self, error: str) -> bool:
        """The model or draft the dialog applied did not load: the dialog comes back with the typed path and
        `error` in it (a toast would vanish, and the typed path with it); False where no dialog applied it."""
        typed, self._typed = self._typed, None
        if typed is None:
            return False
        self.open(typed, error)
        return True

    async def _show(self, typed: dict[str, Any] | None, error: str) -> None:
        screen = self.screen
        form = ChatSettings.of(screen.session, typed)
        dialog = SettingsScreen(
            form.system_prompt,
            form.values,
            lambda result: form.check(result, self.busy()),
            form.title,
            fields=form.fields(),
            error=error,
            history_drafting=form.history_drafting,
        )
        result = await screen.app.push_screen_wait(dialog)
        if result is None:
            return
        form.apply(result)
        # History drafting turned on or off: the free drafts the verdict counts changed, and the chat says so.
        if screen.session.verdict_changed:
            await screen.say_verdict(changed=True)
        if screen.generating:
            screen.notify("The settings apply from the next reply.", timeout=2)
        if form.model_changed(result):
            # Kept until the load ends: where it fails, the dialog comes back with what was typed.
            self._typed = result
            screen.host.start_reload(result["model"] or None, result["draft"], form.changed_options(result))
        screen.refresh_status()

    def busy(self) -> str | None:
        """Why the model cannot change now, or None."""
        if self.screen.generating:
            return f"a reply is streaming ({self.screen.shown_key('reply.cancel')} stops it)"
        return "a model is loading" if self.screen.state == "loading" else None
