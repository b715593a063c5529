"""specchat's Textual app: it starts up (config problems, keymap, theme), loads the model and hands the chat to its
screen (`tui.screens.chat.ChatScreen`: the conversation, the prompt, the status bar and the reply lifecycle).
The screen sees the app as a `tui.chat_host.ChatHost`; the app tells it what happened with the messages there.

The model loads in a thread worker (group "load"; "reload" for another model picked in the settings dialog); it
posts `LoadProgressed` while it works. Every worker's failure, the chat screen's included, reaches one
`Worker.StateChanged` handler (`on_worker_state_changed`): a failed load becomes the banner and an error modal, a
reply that crashed is marked failed, anything else becomes an error modal. The app stays open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.driver import Driver
from textual.worker import Worker, WorkerState

from engine.backends.base import Backend
from engine.config import ConfigError, Settings, save_setting
from engine.session import ChatSession
from tui.chat_host import (
    LoadStageReached,
    ModelLoadDeferred,
    ModelLoaded,
    ModelLoadFailed,
    ModelLoadStarted,
    ModelReloadFailed,
    ModelStatus,
    ReplyCrashed,
    StoredChatChosen,
)
from tui.commands import SpecchatCommands
from tui.keymap import APP_KEYS, bindings, check_keymap
from tui.messages import LoadProgressed
from tui.screens.chat import ChatScreen
from tui.screens.error import ErrorScreen, describe_error


class SpecchatApp(App[None]):
    TITLE = "specchat"
    CSS_PATH = Path(__file__).with_name("app.tcss")
    BINDINGS = bindings(APP_KEYS)
    DEFAULT_MODE = "chat"
    COMMANDS = App.COMMANDS | {SpecchatCommands}

    def __init__(
        self,
        settings: Settings,
        backend: Backend | None = None,
        session: ChatSession | None = None,
        load_on_mount: bool = True,
        startup_error: str | None = None,
        open_chat: int | None = None,
    ) -> None:
        super().__init__()
        self.open_chat_id = open_chat  # a stored chat to continue (--resume, --chat ID)
        self.settings = settings
        if session is None:
            # A bad preset file is skipped (the session says which), the others load.
            session = ChatSession(settings, backend=backend)
        self.session = session
        self.load_on_mount = load_on_mount
        # The model's state (loading / failed / ready, the status bar's line, why a load failed): the chat reads it.
        self.model_status = ModelStatus(startup_error=startup_error)
        self._state_before_reload = "ready"  # what a failed reload of the model returns to
        self.keymap_problems = check_keymap(settings.keymap)
        # A keymap with errors (a stolen key, a key name that is no key) is not applied at all: defaults instead.
        self.keymap = (
            {} if any(p.severity == "error" for p in self.keymap_problems) else dict(settings.keymap)
        )
        self.chat = ChatScreen(self)
        # The chat as a mode of its own, not the default screen: the app starts once it is mounted (its prompt
        # focused), so a question typed while specchat was starting reaches the prompt.
        self.add_mode("chat", lambda: self.chat)

    @property
    def state(self) -> str:
        return self.model_status.state

    @property
    def load_error(self) -> str | None:
        return self.model_status.load_error

    def _set_state(self, state: str, message: str = "") -> None:
        self.model_status.state = state
        self.model_status.message = message

    def get_driver_class(self) -> type[Driver]:
        # A paste with escape sequences in it must arrive whole (tui/terminal.py): our parser on Linux and macOS.
        driver = super().get_driver_class()
        if driver.__module__ == "textual.drivers.linux_driver":
            from tui.terminal import PasteSafeLinuxDriver

            return PasteSafeLinuxDriver
        return driver

    def on_mount(self) -> None:
        # The chat screen is mounted by now (a mode's first screen is, before the app's Mount).
        self.set_keymap(dict(self.keymap))
        self._apply_saved_theme()
        for problem in self.keymap_problems:
            self.notify(problem.message, severity=problem.severity, timeout=12)
        for problem in self.session.preset_choice.skipped.values():
            self.notify(
                f"{problem} (the file is skipped)", title="Preset skipped", severity="warning", timeout=15
            )
        startup_error = self.model_status.startup_error
        if startup_error:
            # A broken config file: say so, and load the model all the same (the bad part left out).
            self.push_screen(ErrorScreen("The configuration has a problem", startup_error))
        if self.load_on_mount:
            self.start_loading()
        else:
            self.chat.post_message(ModelLoadDeferred())
        if self.open_chat_id is not None:
            self.chat.post_message(StoredChatChosen(self.open_chat_id))

    # --- loading the model -----------------------------------------------------------------------------------

    def start_loading(self) -> None:
        self._set_state("loading", "starting")
        self.chat.post_message(ModelLoadStarted())
        self.load_model()

    @work(thread=True, exclusive=True, exit_on_error=False, group="load")
    def load_model(self) -> None:
        # A failure goes to on_worker_state_changed, like every other worker's.
        info = self.session.load(self._progress)
        self.call_from_thread(self.model_ready, info)

    def start_reload(self, model: str | None, draft: str, options: dict[str, str] | None = None) -> None:
        """Load `model` (None: the embedded one) with `draft` and any other engine `options` in the background;
        the chat stays on screen and in the session, and messages sent meanwhile wait for the new model. A failure
        keeps the loaded one."""
        self._state_before_reload = self.state
        # Loading from now on (the status bar, a second F12, a message sent): a state still "ready" until the
        # worker started let a second apply through the check and a script see the old model as the new one.
        self._set_state("loading", "starting")
        self.chat.post_message(ModelLoadStarted(model, draft))
        # The worker after the next refresh, once the dialog is gone from the screen: a load thread busy from the
        # start keeps the app from repainting what the dialog covered (its border and keys stayed until the end).
        self.call_after_refresh(self.reload_model, model, draft, options)

    @work(thread=True, exclusive=True, exit_on_error=False, group="reload")
    def reload_model(self, model: str | None, draft: str, options: dict[str, str] | None = None) -> None:
        info = self.session.reload(model, draft, self._progress, options)
        self.call_from_thread(self.model_ready, info, True)

    def _progress(self, stage: str, fraction: float | None) -> None:
        self.post_message(LoadProgressed(stage, fraction))

    def on_load_progressed(self, message: LoadProgressed) -> None:
        if self.state != "loading":
            return
        share = f" {message.fraction * 100:.0f}%" if message.fraction is not None else ""
        self.model_status.message = f"{message.stage}{share}"
        self.chat.post_message(LoadStageReached(self.model_status.message))

    def model_ready(self, info: Any, reloaded: bool = False) -> None:
        self._set_state("ready")
        self.chat.post_message(ModelLoaded(info, reloaded))

    def _load_failed(self, message: str, title: str = "The model did not load") -> None:
        self._set_state("failed", message)
        self.model_status.load_error = message
        self.chat.post_message(ModelLoadFailed(title, message))
        self.push_screen(ErrorScreen(title, message))

    def _reload_failed(self, message: str) -> None:
        """The new model did not load: the old one (if any) stays, and so does everything typed."""
        state = self._state_before_reload
        self._set_state(state, (self.load_error or "") if state == "failed" else "")
        self.chat.post_message(ModelReloadFailed(message))

    # --- the one failure handler -----------------------------------------------------------------------------

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Failures nobody caught become a modal with the message (a user error's title where it has one); a load
        that failed is this path too, its one way to fail. The app stays open."""
        if event.state != WorkerState.ERROR:
            return
        title, message = describe_error(event.worker.error)
        if event.worker.group == "load":
            self._load_failed(message, title or "The model did not load")
            return
        if event.worker.group == "reload":
            self._reload_failed(message)
            return
        if event.worker.group == "generate":
            self.chat.post_message(ReplyCrashed(message))
        self.push_screen(ErrorScreen(title or "Something went wrong", message))

    # --- the remembered theme --------------------------------------------------------------------------------

    def _apply_saved_theme(self) -> None:
        theme = self.settings.theme
        if theme:
            if theme in self.available_themes:
                self.theme = theme
            else:
                self.notify(f"config: theme: unknown theme {theme!r}; using {self.theme}", severity="warning")
        self.theme_changed_signal.subscribe(self, self._theme_changed)

    def _theme_changed(self, theme: Any) -> None:
        name = getattr(theme, "name", str(theme))
        if name == self.settings.theme:
            return
        try:
            save_setting("theme", name)
        except ConfigError as exc:
            self.notify(str(exc), severity="warning")
            return
        self.settings = self.settings.model_copy(update={"theme": name})


def run_app(
    settings: Settings,
    startup_error: str | None = None,
    session: ChatSession | None = None,
    open_chat: int | None = None,
) -> None:
    """Entry point used by `specchat` (tui.cli): open the chat on the configured (or embedded) model.

    With `startup_error` (a broken config file, say) the app opens on default settings and shows the message.
    `open_chat` continues a stored chat (`--resume`, `--chat ID`).
    """
    SpecchatApp(settings, session=session, startup_error=startup_error, open_chat=open_chat).run()
