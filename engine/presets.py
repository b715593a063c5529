"""Task presets: the draft length K and the sampler settings for one kind of message.

Built-ins (`code`, `qa`, `creative`) ship as TOML files in the `presets` package. A user folder
(`<config dir>/presets/*.toml`) adds presets or overrides built-in ones; a partial file that overrides a
built-in keeps the built-in's other values. The preset's name is the file's stem.

Every mistake in a preset file becomes a one-line `PresetError` naming the file and the field, e.g.
`~/.config/specchat/presets/fast.toml: k: must be between 0 and 16 (got 40)`.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine.config import describe_validation_error, display_path, presets_dir, read_toml_file
from engine.errors import UserError
from engine.request import SamplerSettings

PRESET_NAMES_BUILTIN = ("code", "qa", "creative")
BUILTIN_SOURCE = "built-in"
# "auto" means "let the router choose" in settings and the UI, so no preset may take that name.
RESERVED_NAMES = ("auto",)
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")


class PresetError(UserError, ValueError):
    """A bad preset file; the message is one line naming the file and the field."""


class Preset(BaseModel):
    """Decoding settings for one kind of task. Immutable; `sampler()` gives the backend's view of it."""

    # strict: a TOML value of the wrong type ("6", 6.0 for k, 1 for a bool) is an error, not coerced.
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    name: str
    description: str = ""
    k: int = Field(4, ge=0, le=16)
    # "adaptive": k is the ceiling and each round drafts the length that pays most (0 included);
    # "fixed": k drafts every round; "dynamic": exllamav3's own dynamic draft length (draft model or MTP head; k is
    # the ceiling), "fixed" on the other engines.
    k_mode: Literal["fixed", "adaptive", "dynamic"] = "adaptive"
    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    ramp_tokens: int = Field(0, ge=0)
    ramp_start: float = Field(0.0, ge=0.0)
    max_new_tokens: int = Field(512, ge=1, le=32768)
    drafting: bool = True
    source: str = BUILTIN_SOURCE

    @field_validator("description", mode="after")
    @classmethod
    def _one_line(cls, value: str) -> str:
        value = value.strip()
        if "\n" in value or "\r" in value:
            raise ValueError("must be one line")
        return value

    @field_validator("temperature", "top_p", "min_p", "repetition_penalty", "ramp_start", mode="after")
    @classmethod
    def _finite(cls, value: float) -> float:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"must be a finite number (got {value})")
        return value

    @model_validator(mode="after")
    def _ramp_below_temperature(self) -> Preset:
        if self.ramp_start > self.temperature:
            # "field: message" lets the error formatter name the field for a model-level check.
            raise ValueError(
                f"ramp_start: must be at most temperature ({self.temperature}) (got {self.ramp_start})"
            )
        return self

    @property
    def is_builtin(self) -> bool:
        return self.source == BUILTIN_SOURCE

    def sampler(self) -> SamplerSettings:
        return SamplerSettings(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            ramp_tokens=self.ramp_tokens,
            ramp_start=self.ramp_start,
        )


# Keys a preset file may set: every field but the two that come from the file itself.
FILE_KEYS: tuple[str, ...] = tuple(field for field in Preset.model_fields if field not in ("name", "source"))


def _build(values: dict[str, Any], shown: str) -> Preset:
    try:
        return Preset(**values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field, phrase = describe_validation_error(error, Preset, known_keys=FILE_KEYS)
            problems.append(f"{field}: {phrase}" if field else phrase)
        raise PresetError(f"{shown}: " + "; ".join(problems)) from None


def _check_keys(data: dict[str, Any], shown: str) -> None:
    for key in ("name", "source"):
        if key in data:
            raise PresetError(f"{shown}: {key}: not allowed in a preset file (the name is the file's name)")


def _builtin_values(name: str) -> tuple[dict[str, Any], str]:
    resource = resources.files("presets").joinpath(f"{name}.toml")
    shown = f"presets/{name}.toml (built-in)"
    try:
        data = tomllib.loads(resource.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        # Only a broken install gets here; still say which file.
        raise PresetError(f"{shown}: cannot load ({exc})") from None
    _check_keys(data, shown)
    return data, shown


def with_overrides(preset: Preset, values: dict[str, Any], shown: str = "settings") -> Preset:
    """`preset` with some fields changed, checked by the rules of a preset file (a one-line PresetError).

    As for a partial preset file, a new temperature without a ramp start keeps the ramp below it.
    """
    data = preset.model_dump()
    temperature = values.get("temperature")
    if (
        "ramp_start" not in values
        and isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
    ):
        data["ramp_start"] = min(data["ramp_start"], max(float(temperature), 0.0))
    data.update(values)
    return _build(data, shown)


def load_builtin_presets() -> dict[str, Preset]:
    """The three presets shipped with specchat, in the order code, qa, creative."""
    presets = {}
    for name in PRESET_NAMES_BUILTIN:
        data, shown = _builtin_values(name)
        presets[name] = _build({**data, "name": name, "source": BUILTIN_SOURCE}, shown)
    return presets


def load_user_preset(path: Path, base: Preset | None = None) -> Preset:
    """One user preset file; with `base` (the built-in of the same name) missing keys keep base's values."""
    shown = display_path(path)
    name = path.stem
    if not _NAME_PATTERN.match(name):
        raise PresetError(
            f"{shown}: the file name must be a preset name: letters, digits, '-' or '_' (got {name!r})"
        )
    if name.lower() in RESERVED_NAMES:
        raise PresetError(f"{shown}: '{name}' is reserved for automatic preset choice; rename the file")
    data = read_toml_file(path, PresetError)
    _check_keys(data, shown)
    values: dict[str, Any] = {}
    if base is not None:
        values = base.model_dump(exclude={"name", "source"})
        # A user who cools a built-in down without touching its ramp means "ramp up to the new
        # temperature", not "ramp start above it": clamp the inherited start instead of failing.
        if "temperature" in data and "ramp_start" not in data:
            temperature = data["temperature"]
            if (
                isinstance(temperature, int | float)
                and not isinstance(temperature, bool)
                and temperature >= 0
            ):
                values["ramp_start"] = min(values["ramp_start"], float(temperature))
    values.update(data)
    if base is None and not values.get("description"):
        values["description"] = f"user preset ({path.name})"
    return _build({**values, "name": name, "source": str(path)}, shown)


def load_presets(user_dir: Path | None = None, skipped: dict[str, str] | None = None) -> dict[str, Preset]:
    """Built-in presets with the user's added and overriding ones: code, qa, creative, then user names sorted.

    `user_dir` defaults to `<config dir>/presets`; a missing folder means no user presets.
    Without `skipped`, the first bad file raises PresetError (one line, names the file and field). With it, a
    bad file is left out (a bad override leaves the built-in as it is) and `skipped[name]` gets that line, so
    one broken file does not take the others down with it.
    """
    presets = load_builtin_presets()
    folder = presets_dir() if user_dir is None else user_dir
    if not folder.is_dir():
        return presets
    added: dict[str, Preset] = {}
    for path in sorted(folder.glob("*.toml"), key=lambda p: p.name):
        if not path.is_file():
            continue
        name = path.stem
        try:
            if name in presets:
                presets[name] = load_user_preset(path, base=presets[name])
            else:
                added[name] = load_user_preset(path)
        except PresetError as exc:
            if skipped is None:
                raise
            skipped[name] = str(exc)
    presets.update(sorted(added.items()))
    return presets
