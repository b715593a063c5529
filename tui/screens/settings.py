"""Settings for this chat: the model and draft, the system prompt and the preset's K, temperature, top_p, ramp
and drafting. The model and draft fields also take a model name (qwen2.5-coder-1.5b), completed as typed.

The values are checked (by `check`: the session's preset rules, and that the model and draft paths hold models)
before the dialog closes: a bad one shows a one-line error in the dialog and every edit stays. An empty number
field leaves that value to the preset; an empty model field means the embedded model. The model and draft fields
are checked as they are typed (Input validators); another model or draft is loaded by the app after the dialog
closes, and the conversation stays. `open_chat_settings` opens the dialog for the app's chat and applies what
comes back (the app's F12 action).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.validation import ValidationResult, Validator
from textual.widgets import Button, Input, Label, Static, Switch, TextArea

from engine.errors import SpecchatError
from engine.models.named import NAMED_MODELS
from tui.widgets.footer import FittingFooter

# (field, label, type) of the number fields, in dialog order.
NUMBER_FIELDS: tuple[tuple[str, str, type], ...] = (
    ("k", "K (draft tokens)", int),
    ("temperature", "temperature", float),
    ("top_p", "top_p", float),
    ("ramp_tokens", "ramp tokens", int),
    ("ramp_start", "ramp start", float),
)


def parse_number(field: str, text: str, kind: type) -> int | float | None:
    """A number field's value: None when empty; ValueError with a one-line message when it is no number."""
    text = text.strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"{field}: must be {what} (got {text!r})") from None


class ChoiceValidator(Validator):
    """An Input validator around one of the session's checks (raises SpecchatError with a one-line message)."""

    def __init__(self, check: Callable[[str], None]) -> None:
        super().__init__()
        self.check = check

    def validate(self, value: str) -> ValidationResult:
        try:
            self.check(value)
        except SpecchatError as exc:
            return self.failure(str(exc))
        return self.success()


class SettingsScreen(ModalScreen[dict[str, Any] | None]):
    """Dismisses with {"system_prompt": str, "overrides": {...}, "model": str, "draft": str} on apply, None on
    escape. `check_model` / `check_draft` check one field's text (SpecchatError, one line); `check` the whole."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "close", id="settings.close"),
        Binding("ctrl+s", "apply", "apply", id="settings.apply", priority=True),
    ]

    # Rows around the scrolling fields: the dialog's border 2, title 2, error line 1, button row 2, footer 1,
    # and one to spare. In cells, not vh: a vh height inside this auto-height dialog is measured too tall.
    CHROME_ROWS = 9

    def __init__(
        self,
        system_prompt: str | None,
        values: dict[str, Any],
        check: Callable[[dict[str, Any]], None],
        title: str = "Settings for this chat",
        model: str = "",
        draft: str = "ngram",
        check_model: Callable[[str], None] | None = None,
        check_draft: Callable[[str], None] | None = None,
        error: str = "",
    ) -> None:
        """`error`: shown in the dialog as it opens (why the model or draft last applied did not load)."""
        super().__init__()
        self.opening_error = error
        self.system_prompt = system_prompt or ""
        self.values = values
        self.check = check  # raises SpecchatError with a one-line message
        self.title_text = title
        self.model = model
        self.draft = draft
        self.check_model = check_model or (lambda _: None)
        self.check_draft = check_draft or (lambda _: None)

    def compose(self) -> ComposeResult:
        with Vertical(id="settings", classes="dialog"):
            yield Static(Text(self.title_text, style="bold"), classes="title")
            with VerticalScroll():
                with Horizontal(classes="settings-row"):
                    yield Label("model")
                    yield Input(
                        self.model,
                        placeholder="a model folder or .gguf file (empty: the embedded model)",
                        id="settings-model",
                        validators=[ChoiceValidator(self.check_model)],
                        # Model names (qwen2.5-coder-1.5b) complete as they are typed; loading fetches them.
                        suggester=SuggestFromList(list(NAMED_MODELS), case_sensitive=False),
                        valid_empty=True,
                        compact=True,
                    )
                    yield Button(
                        "…", id="settings-model-browse", compact=True, tooltip="pick a folder or file"
                    )
                with Horizontal(classes="settings-row"):
                    yield Label("draft")
                    yield Input(
                        self.draft,
                        placeholder="ngram, none, or a draft model folder",
                        id="settings-draft",
                        validators=[ChoiceValidator(self.check_draft)],
                        suggester=SuggestFromList(["ngram", "none", *NAMED_MODELS], case_sensitive=False),
                        compact=True,
                    )
                    yield Button(
                        "…", id="settings-draft-browse", compact=True, tooltip="pick a folder or file"
                    )
                yield Static(
                    Text("another model or draft is loaded on apply; the chat stays", style="dim"),
                    classes="settings-note",
                )
                yield Label("system prompt")
                yield TextArea(self.system_prompt, id="settings-system-prompt")
                for field, label, _ in NUMBER_FIELDS:
                    value = self.values.get(field)
                    with Horizontal(classes="settings-row"):
                        yield Label(label)
                        yield Input(
                            "" if value is None else str(value),
                            placeholder="preset's value",
                            id=f"settings-{field}",
                            compact=True,
                        )
                with Horizontal(classes="settings-row switch-row"):
                    yield Label("drafting")
                    yield Switch(bool(self.values.get("drafting", True)), id="settings-drafting")
            yield Static("", id="settings-error")
            # One row for the button and the hint: the dialog fits 80x24 with the hint on screen.
            with Horizontal(id="settings-actions"):
                yield Button("Apply", id="settings-apply", variant="primary", compact=True)
                yield Static("ctrl+s apply · esc close", classes="hint")
        yield FittingFooter()

    def on_mount(self) -> None:
        self._fit_height()
        if self.opening_error:
            self.show_error(self.opening_error)
            # The field that did not load has the focus, its typed path as it was: fix it and apply again.
            field = "draft" if "draft" in self.opening_error.lower() else "model"
            self.query_one(f"#settings-{field}", Input).focus()
        else:
            self.query_one("#settings-system-prompt", TextArea).focus()

    def on_resize(self) -> None:
        self._fit_height()

    def _fit_height(self) -> None:
        """The fields scroll in what the screen leaves: the hint and the Apply button stay on screen at 80x24."""
        self.query_one("#settings VerticalScroll").styles.max_height = max(
            3, self.size.height - self.CHROME_ROWS
        )

    def collect(self) -> dict[str, Any]:
        """The dialog's values; ValueError (one line) for a field that is not a number."""
        overrides: dict[str, Any] = {}
        for field, _, kind in NUMBER_FIELDS:
            overrides[field] = parse_number(field, self.query_one(f"#settings-{field}", Input).value, kind)
        overrides["drafting"] = self.query_one("#settings-drafting", Switch).value
        system_prompt = self.query_one("#settings-system-prompt", TextArea).text
        return {
            "system_prompt": system_prompt,
            "overrides": overrides,
            "model": self.query_one("#settings-model", Input).value.strip(),
            "draft": self.query_one("#settings-draft", Input).value.strip(),
        }

    def show_error(self, message: str) -> None:
        error = self.query_one("#settings-error", Static)
        error.update(Text(message.splitlines()[0] if message else "", style="bold red"))

    def hide_error(self) -> None:
        # Emptied, not hidden: the error's row stays, so the dialog keeps its height (and its hint stays put).
        self.query_one("#settings-error", Static).update("")

    def on_input_changed(self, event: Input.Changed) -> None:
        """A model or draft path is checked as it is typed: what is wrong shows at once, on one line."""
        if event.input.id not in ("settings-model", "settings-draft"):
            return
        result = event.validation_result
        if result is not None and not result.is_valid:
            self.show_error(result.failure_descriptions[0])
        elif self.opening_error and event.value == (
            self.model if event.input.id == "settings-model" else self.draft
        ):
            self.show_error(
                self.opening_error
            )  # as it opened (the fields' first Changed): why it did not load
        else:
            self.hide_error()

    def action_apply(self) -> None:
        try:
            result = self.collect()
            for field, check in (("model", self.check_model), ("draft", self.check_draft)):
                if result[field] or field == "draft":
                    check(result[field])
            self.check(result)
        except (ValueError, SpecchatError) as exc:
            self.show_error(str(exc))
            return
        self.dismiss(result)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "settings-apply":
            event.stop()
            self.action_apply()
        elif event.button.id in ("settings-model-browse", "settings-draft-browse"):
            event.stop()
            self.browse(event.button.id.split("-")[1])

    def browse(self, field: str) -> None:
        """Pick the model or draft from a folder tree; the picked path goes into the field (and is checked)."""
        from tui.screens.path_picker import PathPickerScreen, start_folder

        target = self.query_one(f"#settings-{field}", Input)

        def picked(path: str | None) -> None:
            if path:
                target.value = path
            target.focus()

        title = "Pick the model folder or .gguf file" if field == "model" else "Pick the draft model"
        self.app.push_screen(PathPickerScreen(title, start_folder(target.value)), picked)


def open_chat_settings(app: Any, typed: dict[str, Any] | None = None, error: str = "") -> None:
    """Open this dialog for the chat screen `app` (its F12 action): the values shown are the preset's or the chat's,
    and what is applied goes to the session; another model or draft is loaded by the app once the dialog is gone.
    `typed` (a result this dialog returned) and `error`: reopened after that model or draft failed to load, with
    what was typed and why (`reopen_after_failed_load`)."""
    session = app.session
    values: dict[str, Any] = dict(session.overrides)
    if session.mode != "auto":
        # A preset chosen by hand: show its values (with this chat's overrides) to edit.
        preset = session.effective_preset(session.mode)
        values = {f: getattr(preset, f) for f in ("k", "temperature", "top_p", "ramp_tokens", "ramp_start")}
        values["drafting"] = preset.drafting
    title = f"Settings for this chat · preset {session.mode}"

    model, draft = session.model_dir or "", session.settings.draft
    shown_model, shown_draft, system_prompt = model, draft, session.settings.system_prompt
    if typed is not None:
        values.update({k: v for k, v in typed["overrides"].items() if v is not None})
        shown_model, shown_draft = typed["model"], typed["draft"]
        system_prompt = typed["system_prompt"]

    def same_choice(text: str, current: str) -> bool:
        """'NGRAM' is ngram, '~/m/' is /home/me/m: only a real change reloads the model."""
        if text.lower() in ("ngram", "none") or not text or not current:
            return text.lower() == current.lower()
        return Path(text).expanduser().resolve() == Path(current).expanduser().resolve()

    def model_changed(result: dict[str, Any]) -> bool:
        return not (same_choice(result["model"], model) and same_choice(result["draft"], draft))

    def check(result: dict[str, Any]) -> None:
        session.check_overrides(**result["overrides"])
        if model_changed(result) and (app.generating or app.state == "loading"):
            busy = "a reply is streaming (esc stops it)" if app.generating else "a model is loading"
            raise SpecchatError(f"{busy}: change the model or draft when it is done")

    def applied(result: dict[str, Any] | None) -> None:
        if result is None:
            return
        overrides = dict(result["overrides"])
        if session.mode == "auto" and overrides.get("drafting") and "drafting" not in session.overrides:
            overrides["drafting"] = None  # left on: each routed preset keeps its own drafting
        session.set_system_prompt(result["system_prompt"])
        session.set_overrides(**overrides)
        if app.generating:
            app.notify("The settings apply from the next reply.", timeout=2)
        if model_changed(result):
            # Kept until the load ends: where it fails, the dialog comes back with what was typed.
            app.settings_typed = result
            # After the dialog is gone from the screen: a load thread busy from the start keeps the app
            # from repainting what the dialog covered (its border and keys stayed until the load ended).
            app.call_after_refresh(app.start_reload, result["model"] or None, result["draft"])
        app.refresh_status()

    app.app.push_screen(
        SettingsScreen(
            system_prompt,
            values,
            check,
            title,
            model=shown_model,
            draft=shown_draft,
            check_model=lambda text: session.check_model_choice(model=text or None),
            check_draft=lambda text: session.check_model_choice(draft=text),
            error=error,
        ),
        applied,
    )


def reopen_after_failed_load(app: Any, reason: str) -> bool:
    """The model or draft applied in this dialog did not load: open it again with what was typed and `reason`
    in its error line (a toast would vanish, and the typed path with it). False where no dialog applied it."""
    typed = getattr(app, "settings_typed", None)
    app.settings_typed = None
    if typed is None:
        return False
    open_chat_settings(app, typed, f"not loaded: {reason}")
    return True
