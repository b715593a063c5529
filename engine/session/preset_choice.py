"""Which preset a chat's next reply uses (`PresetChoice`): the presets loaded (and the user files skipped), the mode
(a preset by name, or "auto": the router picks per message), and the command line's overrides of preset fields."""

from __future__ import annotations

from typing import Any

from engine.errors import SpecchatError
from engine.presets import Preset, with_overrides
from engine.router import RECENT_TURNS, route
from engine.session.turn import Turn

# Preset fields the command line may override for every message (`--k`, `--temperature`, ...).
OVERRIDABLE = (
    "k",
    "k_mode",
    "temperature",
    "max_new_tokens",
    "drafting",
    "ramp_tokens",
    "ramp_start",
    "top_p",
)
# The presets "auto" routes between.
ROUTED = ("code", "qa", "creative")


class PresetChoice:
    """The presets a chat chooses from, its mode and overrides; `choose()` names the preset for a message."""

    def __init__(self, presets: dict[str, Preset], skipped: dict[str, str]) -> None:
        self.presets = presets
        # A bad user preset file is left out (name -> its one-line problem), the others load: the UI says so.
        self.skipped = skipped
        self.mode = "auto"
        self.overrides: dict[str, Any] = {}

    def routed(self) -> list[str]:
        """The routed presets this chat has."""
        return [n for n in ROUTED if n in self.presets]

    def set_mode(self, name: str) -> None:
        if name != "auto" and name not in self.presets:
            if name in self.skipped:
                raise SpecchatError(f"preset {name!r} was skipped: {self.skipped[name]}")
            known = ", ".join(["auto", *self.presets])
            raise SpecchatError(f"unknown preset {name!r} (known: {known})")
        self.mode = name

    def set_overrides(self, **values: Any) -> None:
        """Override preset fields for every following message; None leaves a field to the preset."""
        unknown = set(values) - set(OVERRIDABLE)
        if unknown:
            raise SpecchatError(f"cannot override {', '.join(sorted(unknown))}")
        self.overrides = {k: v for k, v in values.items() if v is not None}

    def check_overrides(self, **values: Any) -> None:
        """Raise a UserError (one line) unless `values` make a valid preset of every preset they may apply to."""
        unknown = set(values) - set(OVERRIDABLE)
        if unknown:
            raise SpecchatError(f"cannot override {', '.join(sorted(unknown))}")
        values = {k: v for k, v in values.items() if v is not None}
        bases = [self.presets[n] for n in self.routed()] if self.mode == "auto" else [self.presets[self.mode]]
        for base in bases:
            with_overrides(base, values)  # PresetError, as it is

    def effective(self, name: str) -> Preset:
        """Preset `name` as the next reply would use it: with this chat's overrides."""
        preset = self.presets[name]
        if not self.overrides:
            return preset
        update = dict(self.overrides)
        if "temperature" in update and "ramp_tokens" not in update:
            update["ramp_tokens"] = 0  # an explicit temperature means exactly that temperature
        return preset.model_copy(update=update)

    def choose(self, text: str, turns: list[Turn]) -> tuple[Preset, bool, str]:
        """The preset for message `text` after `turns`: (preset, chosen automatically, why)."""
        if self.mode == "auto":
            # The conversation counts: a follow-up ("show that function again") stays with the code before it.
            earlier = turns[:-1] if turns and turns[-1].role == "user" else turns
            decision = route(
                text,
                available=self.routed(),
                recent=[(turn.role, turn.content) for turn in earlier[-RECENT_TURNS:]],
            )
            preset, auto, reason = self.presets[decision.preset], True, decision.reason
        else:
            preset, auto, reason = self.presets[self.mode], False, "chosen by hand"
        if self.overrides:
            preset = self.effective(preset.name)
        return preset, auto, reason

    def next_presets(self) -> list[Preset]:
        """The presets the next reply may use, as it would use them: the mode's, or (auto: the router picks per
        message) every routed one (every preset where none of those is loaded)."""
        if self.mode != "auto":
            return [self.effective(self.mode)]
        return [self.effective(n) for n in (self.routed() or list(self.presets))]
