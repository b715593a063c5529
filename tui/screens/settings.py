"""Settings for this chat: the model and draft, the system prompt and the preset's K, temperature, top_p, ramp
and drafting. The model and draft fields also take a model name (qwen2.5-coder-1.5b), completed as typed. The
engine's rows (model, draft) are the engine options marked for the dialog in the engines' registry, handed in as
`EngineField`s (`tui.chat_settings.engine_fields`).

The values are checked (by `check`: the session's preset rules, and that the model and draft paths hold models)
before the dialog closes: a bad one shows a one-line error in the dialog and every edit stays. An empty number
field leaves that value to the preset; an empty model field means the embedded model. The model and draft fields
are checked as they are typed (Input validators). The dialog returns its values (`dismiss`); the chat screen
opens it (its F12 action, with `tui.chat_settings.ChatSettings`) and applies what comes back: another model or
draft is loaded by the app after the dialog closes, and the conversation stays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.validation import ValidationResult, Validator
from textual.widgets import Button, Input, Label, Static, Switch, TextArea

from engine.errors import UserError
from tui.keymap import SETTINGS_KEYS, bindings
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


def no_check(_: str) -> None:
    """An engine field that takes any text."""


@dataclass(frozen=True)
class EngineField:
    """One engine option's row: a text field (id settings-NAME) with a button that picks a folder or file."""

    name: str  # the option's: the field's id, and the key of its value in the dialog's result
    label: str
    placeholder: str
    picker: str  # the title of the folder picker the button opens
    value: str = ""  # in the field as the dialog opens
    check: Callable[[str], None] = no_check  # as typed and on apply: UserError with a one-line message
    completions: Sequence[str] = ()  # what the field completes as it is typed (model names, drafters)
    optional: bool = False  # empty is a value (the option's default), not checked


class ChoiceValidator(Validator):
    """An Input validator around one of the session's checks (raises UserError with a one-line message)."""

    def __init__(self, check: Callable[[str], None]) -> None:
        super().__init__()
        self.check = check

    def validate(self, value: str) -> ValidationResult:
        try:
            self.check(value)
        except UserError as exc:
            return self.failure(str(exc))
        return self.success()


class SettingsScreen(ModalScreen[dict[str, Any] | None]):
    """Dismisses with {"system_prompt": str, "overrides": {...}, and each engine field's text by its name ("model":
    str, "draft": str)} (and "history_drafting": bool where it shows that switch) on apply, None on escape. Each
    engine field's `check` checks its text (UserError, one line); `check` the whole."""

    BINDINGS = bindings(SETTINGS_KEYS)

    # Rows around the scrolling fields: the dialog's border 2, title 2, error line 1, button row 2, footer 1,
    # and one to spare. In cells, not vh: a vh height inside this auto-height dialog is measured too tall.
    CHROME_ROWS = 9

    def __init__(
        self,
        system_prompt: str | None,
        values: dict[str, Any],
        check: Callable[[dict[str, Any]], None],
        title: str = "Settings for this chat",
        fields: Sequence[EngineField] = (),
        error: str = "",
        history_drafting: bool | None = None,
    ) -> None:
        """`fields`: the engine's rows, in order; `error`: shown in the dialog as it opens (why the model or draft
        last applied did not load); `history_drafting`: the `history_drafting` setting's switch (None: no switch)."""
        super().__init__()
        self.history_drafting = history_drafting
        self.fields = list(fields)
        self.opening_error = error
        self.system_prompt = system_prompt or ""
        self.values = values
        self.check = check  # raises UserError with a one-line message
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical(id="settings", classes="dialog"):
            yield Static(Text(self.title_text, style="bold"), classes="title")
            with VerticalScroll():
                yield from self._engine_rows()
                yield Label("system prompt")
                yield TextArea(self.system_prompt, id="settings-system-prompt")
                yield from self._reply_rows()
            yield Static("", id="settings-error")
            # One row for the button and the hint: the dialog fits 80x24 with the hint on screen.
            with Horizontal(id="settings-actions"):
                yield Button("Apply", id="settings-apply", variant="primary", compact=True)
                yield Static("ctrl+s apply · esc close", classes="hint")
        yield FittingFooter()

    def _engine_rows(self) -> ComposeResult:
        """The model and the draft, each an input with a browse button, and what applying them does."""
        for field in self.fields:
            with Horizontal(classes="settings-row"):
                yield Label(field.label)
                yield Input(
                    field.value,
                    placeholder=field.placeholder,
                    id=f"settings-{field.name}",
                    validators=[ChoiceValidator(field.check)],
                    # Model names (qwen2.5-coder-1.5b) complete as they are typed; loading fetches them.
                    suggester=SuggestFromList(list(field.completions), case_sensitive=False),
                    valid_empty=field.optional,
                    compact=True,
                )
                yield Button(
                    "…", id=f"settings-{field.name}-browse", compact=True, tooltip="pick a folder or file"
                )
        if self.fields:
            yield Static(
                Text("another model or draft is loaded on apply; the chat stays", style="dim"),
                classes="settings-note",
            )

    def _reply_rows(self) -> ComposeResult:
        """This chat's reply settings: the number fields (empty: the preset's value) and the drafting switches."""
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
        if self.history_drafting is not None:
            with Horizontal(classes="settings-row switch-row"):
                # Drafts copied from what the chat already wrote (other variants, branches, past chats
                # not marked private): the `history_drafting` setting, for this session.
                yield Label("history drafting")
                yield Switch(self.history_drafting, id="settings-history-drafting")

    def on_mount(self) -> None:
        self._fit_height()
        if self.opening_error:
            self.show_error(self.opening_error)
            # The field that did not load has the focus, its typed path as it was: fix it and apply again.
            field = self._field_that_failed()
            self.query_one(f"#settings-{field.name}" if field else "#settings-system-prompt").focus()
        else:
            self.query_one("#settings-system-prompt", TextArea).focus()

    def _field_that_failed(self) -> EngineField | None:
        """The engine field the opening error names (a later one first: "draft model"), else the first."""
        error = self.opening_error.lower()
        return next((f for f in self.fields[1:] if f.name in error), self.fields[0] if self.fields else None)

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
        result: dict[str, Any] = {"system_prompt": system_prompt, "overrides": overrides}
        for field in self.fields:
            result[field.name] = self.query_one(f"#settings-{field.name}", Input).value.strip()
        if self.history_drafting is not None:
            result["history_drafting"] = self.query_one("#settings-history-drafting", Switch).value
        return result

    def show_error(self, message: str) -> None:
        error = self.query_one("#settings-error", Static)
        error.update(Text(message.splitlines()[0] if message else "", style="bold red"))

    def hide_error(self) -> None:
        # Emptied, not hidden: the error's row stays, so the dialog keeps its height (and its hint stays put).
        self.query_one("#settings-error", Static).update("")

    def on_input_changed(self, event: Input.Changed) -> None:
        """A model or draft path is checked as it is typed: what is wrong shows at once, on one line."""
        field = next((f for f in self.fields if event.input.id == f"settings-{f.name}"), None)
        if field is None:
            return
        result = event.validation_result
        if result is not None and not result.is_valid:
            self.show_error(result.failure_descriptions[0])
        elif self.opening_error and event.value == field.value:
            self.show_error(
                self.opening_error
            )  # as it opened (the fields' first Changed): why it did not load
        else:
            self.hide_error()

    def action_apply(self) -> None:
        try:
            result = self.collect()
            for field in self.fields:
                if result[field.name] or not field.optional:
                    field.check(result[field.name])
            self.check(result)
        except (ValueError, UserError) as exc:
            self.show_error(str(exc))
            return
        self.dismiss(result)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "settings-apply":
            event.stop()
            self.action_apply()
            return
        field = next((f for f in self.fields if event.button.id == f"settings-{f.name}-browse"), None)
        if field is not None:
            event.stop()
            self.browse(field)

    def browse(self, field: EngineField) -> None:
        """Pick the model or draft from a folder tree; the picked path goes into the field (and is checked)."""
        from tui.screens.path_picker import PathPickerScreen, start_folder

        target = self.query_one(f"#settings-{field.name}", Input)

        def picked(path: str | None) -> None:
            if path:
                target.value = path
            target.focus()

        self.app.push_screen(PathPickerScreen(field.picker, start_folder(target.value)), picked)
