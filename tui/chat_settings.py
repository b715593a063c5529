"""Settings for this chat (F12), between the session and the dialog: what the dialog shows, how its whole result is
checked, and what applying it does. The dialog (tui/screens/settings.py) collects and checks the fields and returns
its result; the chat screen opens it with a `ChatSettings` and applies what comes back (another model or draft is
loaded by the app once the dialog is gone, and the conversation stays). The dialog's engine rows are the engine
options marked for it in the engines' registry (`engine_fields`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.backends import registry
from engine.config import settings_with
from engine.decoding.drafters import draft_keywords, is_draft_keyword
from engine.errors import UserError
from engine.models.named import NAMED_MODELS
from engine.session.loading import check_model_choice
from tui.screens.settings import EngineField, no_check

if TYPE_CHECKING:
    from engine.session import ChatSession

PRESET_FIELDS = ("k", "temperature", "top_p", "ramp_tokens", "ramp_start")


def model_suggestions() -> list[str]:
    """What the model field completes as it is typed: the model names (loading fetches them)."""
    return list(NAMED_MODELS)


def draft_suggestions() -> list[str]:
    """What the draft field completes: the drafters every engine runs (the drafters' name map), then model names."""
    return [*draft_keywords(every_engine=True), *NAMED_MODELS]


def engine_fields(
    values: dict[str, str],
    checks: dict[str, Callable[[str], None]] | None = None,
    completions: dict[str, Sequence[str]] | None = None,
) -> list[EngineField]:
    """The dialog's engine rows: the options of the engines' registry that have a `dialog`, in the table's order,
    each with its text as the dialog opens, its check and what it completes (each by the option's name)."""
    checks, completions = checks or {}, completions or {}
    rows = []
    for option in registry.ENGINE_OPTIONS:
        dialog = option.dialog
        if dialog is None:
            continue
        placeholder = dialog.placeholder if isinstance(dialog.placeholder, str) else dialog.placeholder()
        rows.append(
            EngineField(
                option.name,
                dialog.label,
                placeholder,
                dialog.picker,
                values.get(option.name, ""),
                checks.get(option.name, no_check),
                tuple(completions.get(option.name, ())),
                optional=option.default is None,
            )
        )
    return rows


def same_choice(text: str, current: str) -> bool:
    """'NGRAM' is ngram, '~/m/' is /home/me/m: only a real change reloads the model."""
    if is_draft_keyword(text) or not text or not current:
        return text.lower() == current.lower()
    return Path(text).expanduser().resolve() == Path(current).expanduser().resolve()


def option_text(value: Any) -> str:
    """A setting's value as its dialog field shows it ("" for None)."""
    return "" if value is None else str(value)


def dialog_options() -> list[str]:
    """The names of the engine options the dialog shows (the registry's rows with a `dialog`), in its order."""
    return [option.name for option in registry.ENGINE_OPTIONS if option.dialog is not None]


@dataclass
class ChatSettings:
    """The dialog's starting point for one session: the values shown (the preset's or this chat's overrides), the
    engine options in force now (the model and draft loaded, and any other option marked for the dialog), and what
    the dialog opens with (a result it returned before, where that model or draft did not load)."""

    session: ChatSession
    values: dict[str, Any] = field(default_factory=dict)
    title: str = ""
    loaded: dict[str, str] = field(default_factory=dict)  # each dialog option's text, as in force now
    shown: dict[str, str] = field(default_factory=dict)  # ... and in its field as the dialog opens
    system_prompt: str | None = None
    history_drafting: bool = True  # the `history_drafting` setting (this session's)

    @classmethod
    def of(cls, session: ChatSession, typed: dict[str, Any] | None = None) -> ChatSettings:
        values: dict[str, Any] = dict(session.preset_choice.overrides)
        if session.mode != "auto":
            # A preset chosen by hand: show its values (with this chat's overrides) to edit.
            preset = session.effective_preset(session.mode)
            values = {f: getattr(preset, f) for f in PRESET_FIELDS}
            values["drafting"] = preset.drafting
        loaded = {name: option_text(getattr(session.settings, name)) for name in dialog_options()}
        loaded["model"] = option_text(session.model_dir or "")  # the folder loaded (a name is resolved)
        form = cls(
            session,
            values,
            f"Settings for this chat · preset {session.mode}",
            loaded,
            dict(loaded),
            session.settings.system_prompt,
            session.settings.history_drafting,
        )
        if typed is not None:
            form.values.update({k: v for k, v in typed["overrides"].items() if v is not None})
            form.shown.update({name: typed[name] for name in loaded if name in typed})
            form.system_prompt = typed["system_prompt"]
            form.history_drafting = typed.get("history_drafting", form.history_drafting)
        return form

    @property
    def model(self) -> str:
        return self.loaded["model"]

    @property
    def draft(self) -> str:
        return self.loaded["draft"]

    def fields(self) -> list[EngineField]:
        """The dialog's engine rows, as it opens: the model and the draft checked as they are typed, and every
        other option marked for the dialog with its value in force."""
        return engine_fields(
            self.shown,
            {"model": self.check_model, "draft": self.check_draft},
            {"model": model_suggestions(), "draft": draft_suggestions()},
        )

    def changed_options(self, result: dict[str, Any]) -> dict[str, str]:
        """The dialog's other engine options (not the model or draft) whose text differs from the value in force:
        the reload takes them (`ChatSession.reload`'s `options`)."""
        return {
            name: result[name]
            for name in self.loaded
            if name not in ("model", "draft") and name in result and result[name] != self.loaded[name]
        }

    def model_changed(self, result: dict[str, Any]) -> bool:
        """Whether applying `result` loads the model again: another model or draft, or another engine option."""
        same = same_choice(result["model"], self.model) and same_choice(result["draft"], self.draft)
        return not same or bool(self.changed_options(result))

    def check(self, result: dict[str, Any], busy: str | None) -> None:
        """The whole result, as the session would take it (UserError, one line); `busy`: why the model cannot
        change now (a reply streams, a model loads), None where it can."""
        self.session.preset_choice.check_overrides(**result["overrides"])
        # Another engine option's text, checked as the config file's value would be (ConfigError, one line).
        settings_with(self.session.settings, self.changed_options(result))
        if busy and self.model_changed(result):
            raise UserError(f"{busy}: change the model or draft when it is done")

    def check_model(self, text: str) -> None:
        check_model_choice(model=text or None)

    def check_draft(self, text: str) -> None:
        check_model_choice(draft=text)

    def apply(self, result: dict[str, Any]) -> None:
        """The system prompt and the values go to the session (from the next reply); the model is the caller's."""
        session = self.session
        overrides = dict(result["overrides"])
        if (
            session.mode == "auto"
            and overrides.get("drafting")
            and "drafting" not in session.preset_choice.overrides
        ):
            overrides["drafting"] = None  # left on: each routed preset keeps its own drafting
        session.set_system_prompt(result["system_prompt"])
        session.set_overrides(**overrides)
        if "history_drafting" in result:
            # A session setting (not written to the config file), read at each reply: off, nothing is indexed;
            # the draft verdict is judged again, as at load.
            session.set_history_drafting(bool(result["history_drafting"]))
