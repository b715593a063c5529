"""Plain dataclasses that cross the engine/TUI line, and how their figures are written for people.

Everything here is data, or a pure function of it: no I/O, no threads, no torch. A backend yields `Chunk`s and
one `Done`; `ChatSession` wraps them with `ReplyStarted`, `ContextTrimmed`, `ReplyFinished`, `ReplyFailed` ... and
the TUI renders whatever arrives.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# "server": a remote server drafts by its own settings (its kind is not known to the client).
DraftMode = Literal["none", "ngram", "model", "server"]
# "repetition": the reply kept repeating one span and was stopped (engine/decoding/stop_rules.RepetitionGuard).
StopReason = Literal[
    "eos", "end_of_turn", "max_new_tokens", "cancelled", "stop_string", "context", "repetition"
]


@dataclass(frozen=True, slots=True)
class Chunk:
    """Tokens emitted by one verification round (or, for plain decoding, one step).

    `origins[i]` is True where token i was proposed by the drafter and accepted by the target, False where
    the target produced it itself (the corrected or bonus token that ends each round).
    """

    text: str
    token_ids: tuple[int, ...]
    drafted: int
    accepted: int
    origins: tuple[bool, ...]
    t: float
    temperature: float = 0.0
    # The draft length chosen for this round (adaptive K may pick less than the preset's K, 0 included);
    # None where the backend does not say (a scripted peer).
    k: int | None = None
    # A remote server sends text, not token ids: `count` is how many tokens this chunk carries (from the
    # server's counters), and such a chunk is not one verification round (`is_round` False).
    count: int | None = None
    is_round: bool = True
    # Who proposed this round's drafts, by the drafters' name map: "ngram" (the context's n-gram lookup), "history"
    # (what the chat already wrote), "model" (a draft model), "mtp" (the model's MTP head); None where the backend
    # does not say or nothing was drafted.
    drafter: str | None = None

    @property
    def n_tokens(self) -> int:
        return self.count if self.count is not None else len(self.token_ids)


@dataclass(frozen=True, slots=True)
class ServerStats:
    """Speculation figures for one reply as a remote server reported them (never estimated by the client).

    None where the server did not say; `unavailable` names each MessageStats field left empty and why.
    """

    source: str
    drafted: int | None = None
    accepted: int | None = None
    new_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    # Verification rounds that drafted (llama-server's / vLLM's "num_drafts").
    drafting_rounds: int | None = None
    # Per draft position: rounds whose draft reached that position and rounds that accepted it.
    position_drafted: tuple[int, ...] | None = None
    position_accepted: tuple[int, ...] | None = None
    unavailable: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Done:
    """The backend's last word on one generation: what it alone can know."""

    stop_reason: StopReason
    prompt_tokens: int
    cached_tokens: int = 0
    prefill_s: float = 0.0
    # Mean wall time of one draft step (one token proposed) and of one target forward pass. Their ratio is the
    # cost ratio c of the speedup model; 0.0 where it was not measured (no drafting, or an n-gram drafter).
    draft_step_s: float = 0.0
    target_step_s: float = 0.0
    # Mean cost of one round (verify pass of 1 + k tokens, plus drafting) in plain steps, from the backend's
    # measured cost curve; None where the backend has no such curve (the speedup model then uses c and K).
    round_cost: float | None = None
    # The target's verify cost r(1 + k) / r(1) for k = 1..K at the reply's end (its measured curve), where known.
    verify_cost: tuple[float, ...] = ()
    # A remote server's own figures for the reply; when set they replace the client's chunk counts.
    server: ServerStats | None = None
    # What the backend did differently in this reply and why, one line each (a loop stopped, threads dropped).
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MessageStats:
    prompt_tokens: int
    new_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    rounds: int
    acceptance_rate: float | None
    mean_accepted_length: float | None
    per_position_acceptance: list[float]
    acceptance_histogram: list[int]
    alpha: float | None
    predicted_speedup: float | None
    ttft_s: float
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    total_s: float
    preset: str
    num_draft_tokens: int
    temperature: float
    draft_mode: DraftMode
    backend: str
    model: str
    stop_reason: StopReason
    cached_tokens: int = 0
    cost_ratio: float | None = None
    # The target's verify pass of 1 + k tokens in plain steps, r(1 + k), k = 1..K (Done.verify_cost).
    verify_cost: list[float] = field(default_factory=list)
    # r_i over the draft model's own rounds, where n-gram lookup drafted some rounds beside it (None: every
    # drafting round was one drafter's, so per_position_acceptance is the draft model's or the lookup's alone).
    # Adaptive K of the next run starts from it: the lookup's long copies would seed the draft model too high.
    model_per_position_acceptance: list[float] | None = None
    router_reason: str = ""
    cache_mode: str = ""
    # A thinking reply's reasoning (<think>…</think>), counted apart: acceptance there is usually different.
    thinking_tokens: int = 0
    thinking_drafted_tokens: int = 0
    thinking_accepted_tokens: int = 0
    # "fixed" (K drafts every round) or "adaptive" (num_draft_tokens is the ceiling; the K of each round is in
    # k_per_round, one entry per verification round, where the backend reported it).
    k_mode: str = "fixed"
    k_per_round: list[int] = field(default_factory=list)
    # Figures a remote server could not give: field name -> why (the inspector shows "–" and the reason).
    unavailable: dict[str, str] = field(default_factory=dict)
    # The server fixes K (the preset's K was not sent): shown as "K server", num_draft_tokens is 0.
    k_by_server: bool = False
    # The backend's notes on this reply (Done.notes): shown in the inspector and the stats line.
    notes: list[str] = field(default_factory=list)
    # Whether drafting can pay on this machine as the reply ended (engine.decoding.verdict), in a few words;
    # "" where there is no verdict (drafting off, a backend that does not measure its costs).
    draft_verdict: str = ""
    # The verdict's status: "pass" (some K can pay), "warn" (none can), "" (no verdict).
    draft_verdict_status: str = ""
    # Drafted and accepted tokens per source (Chunk.drafter: "ngram", "history", "model", "mtp"), over the rounds
    # whose backend says who drafted; they add up to drafted_tokens / accepted_tokens where every round says.
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)

    @property
    def thinking_acceptance_rate(self) -> float | None:
        drafted = self.thinking_drafted_tokens
        return self.thinking_accepted_tokens / drafted if drafted else None

    @property
    def answer_acceptance_rate(self) -> float | None:
        drafted = self.drafted_tokens - self.thinking_drafted_tokens
        return (self.accepted_tokens - self.thinking_accepted_tokens) / drafted if drafted else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What a loaded backend is, for the status bar and the stats."""

    backend: str
    model: str
    device: str
    cache_mode: str
    draft_cache_mode: str
    draft_mode: DraftMode
    draft_model: str | None
    max_context: int
    notes: tuple[str, ...] = ()
    # A remote server that decides K itself (the preset's K is not sent): the status bar says "K server".
    k_by_server: bool = False


# --- session-level events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadProgress:
    stage: str
    fraction: float | None = None


@dataclass(frozen=True, slots=True)
class Loaded:
    info: BackendInfo


@dataclass(frozen=True, slots=True)
class LoadFailed:
    message: str


@dataclass(frozen=True, slots=True)
class ReplyStarted:
    preset: str
    auto: bool
    router_reason: str
    num_draft_tokens: int
    temperature: float
    drafting: bool
    prompt_tokens: int
    k_mode: str = "fixed"  # "adaptive": num_draft_tokens is the ceiling


@dataclass(frozen=True, slots=True)
class ContextTrimmed:
    dropped_turns: int
    prompt_tokens: int
    max_context: int


@dataclass(frozen=True, slots=True)
class ReplyFinished:
    text: str
    token_ids: tuple[int, ...]
    origins: tuple[bool, ...]
    stats: MessageStats
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class ReplyFailed:
    message: str
    partial_text: str = ""
    # True when the session took the turn back (nothing was generated): the message returns to the prompt,
    # or a regenerated reply's old text stays.
    undone: bool = False


@dataclass(slots=True)
class LiveStats:
    """Running figures for the reply in progress; plain attributes the status bar polls."""

    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    new_tokens: int = 0
    # Decode speed and time to first token, as engine.decoding.rates defines them (None until measurable).
    tokens_per_s: float | None = None
    ttft_s: float | None = None
    temperature: float = 0.0
    ema_acceptance: float | None = None
    recent_round_acceptance: list[float] = field(default_factory=list)
    # Adaptive K: the draft length of the recent rounds (their median), None until a round reports one.
    k_now: int | None = None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        return self.new_tokens / self.rounds if self.rounds else None


# --- How a figure is written, wherever a user reads it: the chat's status bar, the stats and the inspector
# (tui/formatting.py) as the benches, `tune` and `doctor`: one dash where nothing was measured, never 0. ---

DASH = "–"


def fmt(value: float | None, pattern: str = "{:.1f}") -> str:
    """`value` in `pattern`; DASH for None (nothing measured)."""
    return DASH if value is None else pattern.format(value)


def percent(value: float | None) -> str:
    """A fraction as a whole percentage ("42%"); DASH for None."""
    return fmt(value, "{:.0%}")


def number(value: float | None, digits: int = 1) -> str:
    """`value` with `digits` decimals; DASH for None."""
    return fmt(value, f"{{:.{digits}f}}")
