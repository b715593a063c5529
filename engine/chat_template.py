"""The model's own chat template, rendered the way transformers renders it, shared by every backend.

ExLlamaV2 has no chat templates, so rendering lives here once: read `tokenizer_config.json`, render its Jinja
template in a sandbox, and name the end-of-turn token to stop on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import UserError

# End-of-turn markers of common template families, most specific first.
END_OF_TURN_CANDIDATES = (
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endoftext|>",
    "</s>",
)

# Used where a folder carries no template at all (plain base models).
FALLBACK_ROLES = ("user", "assistant", "system")
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
# The backends' note where the fallback is used (BackendInfo.notes, shown when the model loads).
FALLBACK_NOTE = (
    "no chat template in the model: a plain User:/Assistant: one is used, replies stop at the next User:"
)


class ChatTemplateError(UserError, ValueError):
    pass


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str
    bos_token: str | None
    eos_token: str | None
    end_of_turn: str | None
    from_model: bool

    @classmethod
    def from_folder(cls, folder: str | Path) -> ChatTemplate:
        path = Path(folder) / "tokenizer_config.json"
        config: dict = {}
        if path.is_file():
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise ChatTemplateError(f"{path}: not valid JSON ({exc})") from exc
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take "default", else the first
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = Path(folder) / "chat_template.jinja"
        if not template and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        from_model = bool(template)
        source = template or FALLBACK_TEMPLATE
        eos = _token_text(config.get("eos_token"))
        end_of_turn = next((c for c in END_OF_TURN_CANDIDATES if c in source), None)
        return cls(
            source=source,
            bos_token=_token_text(config.get("bos_token")),
            eos_token=eos,
            end_of_turn=end_of_turn,
            from_model=from_model,
        )

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.source).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template failed: {exc}") from exc

    def text_stops(self) -> tuple[str, ...]:
        """Text that ends a reply where no token does: the fallback template's own role markers. A base model
        under it goes on to write the next "User:" turn itself; the reply stops where that begins."""
        if self.from_model:
            return ()
        return tuple(f"\n{role.capitalize()}:" for role in FALLBACK_ROLES)

    def stop_strings(self) -> list[str]:
        """Token strings that end a reply: EOS and the template's end-of-turn token."""
        return [s for s in dict.fromkeys((self.eos_token, self.end_of_turn)) if s]
