"""What a verify pass costs, in plain steps, and what a round of drafts costs: for every drafter and backend.

On a CPU a draft is not free. A verify pass of 1 + k tokens costs r(1 + k) plain steps, measured per load and
kept up to date from every pass (`VerifyCostModel`); a round with a draft model also pays its k draft-model steps
(c each, `VerifyCostModel.draft_ratio`). A drafter picks the k, 0 included, that maximises expected tokens per unit
of time, E(k) / cost(k) (engine/decoding/adaptive_k.py), so a draft goes out only where it beats a plain step.
Pure python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.events import StopReason

# Longest draft the cost model considers (a verify pass wider than this is extrapolated, never measured).
MAX_DRAFT_LENGTH = 16


class VerifyCostModel:
    """Forward-pass cost by width (tokens in the pass), relative to a one-token pass.

    Seeded by a calibration at load and refined by every pass the backend times. Each multi-token pass is
    compared with the recent one-token passes (a fast-moving average), not with an old figure, so a change
    in the machine's load moves both sides of the ratio alike. Ratios are bounded to 1..width plain steps, and
    widths never seen are interpolated linearly between the nearest seen ones, extrapolated with the last slope.

    With a context shape (`set_context_shape`: seconds a pass of a width takes over so many cached tokens, e.g.
    the llama.cpp backend's PassCost), the ratios are kept at the shape's reference context and read at
    `context`, the cached tokens of the latest pass: every query row attends over the whole cache, so a wide
    pass costs more plain steps at 2k cached tokens than at 64 (docs/performance.md, "Drafting").
    """

    EMA_WEIGHT = 0.1  # for the ratios
    ONE_WEIGHT = 0.3  # for the recent one-token time

    DRAFT_WEIGHT = 0.2  # for the draft-model step time

    def __init__(
        self,
        ratios: dict[int, float] | None = None,
        one_token_s: float | None = None,
        draft_ratio: float | None = None,
    ) -> None:
        self._ratios: dict[int, float] = {1: 1.0}
        for width, ratio in (ratios or {}).items():
            if width > 1:
                self._ratios[width] = min(max(ratio, 1.0), float(width))
        self._one = one_token_s
        # Cached tokens under the one-token passes `_one` follows (with a context shape).
        self._one_context = 0
        # A draft-model step: measured seconds (EMA), or a given ratio to a plain step (tests, fixed peers).
        self._draft_s: float | None = None
        self._fixed_draft_ratio = draft_ratio
        self.context = 0  # cached tokens of the latest pass (where a context shape is set)
        self._shape: Callable[[int, int], float] | None = None
        self._shape_context = 0

    def set_context_shape(self, seconds: Callable[[int, int], float], reference_context: int) -> None:
        """Read the ratios at `context` through `seconds(width, cached tokens)`; the ratios held are those at
        `reference_context` (where the load calibration ran)."""
        self._shape = seconds
        self._shape_context = reference_context
        self._one_context = reference_context  # the one-token time held is the calibration's

    def _context_factor(self, width: int) -> float:
        """How much more (or less) a pass of `width` costs in plain steps at `context` than at the reference."""
        shape = self._shape
        if shape is None or width <= 1:
            return 1.0
        one_here, one_ref = shape(1, self.context), shape(1, self._shape_context)
        wide_ref = shape(width, self._shape_context)
        if min(one_here, one_ref, wide_ref) <= 0:
            return 1.0
        return (shape(width, self.context) / one_here) / (wide_ref / one_ref)

    @classmethod
    def from_samples(cls, seconds_by_width: dict[int, float]) -> VerifyCostModel:
        """From best-of timings per width (a disturbed width is bounded to 1..w plain steps)."""
        one = seconds_by_width.get(1)
        if not one or one <= 0:
            return cls()
        return cls({w: s / one for w, s in seconds_by_width.items() if s > 0}, one)

    @classmethod
    def from_ratios(cls, ratios: dict[int, float], draft_ratio: float | None = None) -> VerifyCostModel:
        """A model from relative costs, e.g. {1: 1.0, 2: 1.1, 6: 1.3} (tests and fixed-cost peers); with
        `draft_ratio`, a draft-model step costs that many plain steps."""
        return cls(dict(ratios), draft_ratio=draft_ratio)

    @property
    def one_token_s(self) -> float | None:
        """A one-token pass's recent time, at the latest pass's context."""
        return self._one_here()

    def observe_draft(self, seconds: float) -> None:
        """One draft-model step (a one-token forward of the draft) took `seconds`."""
        if seconds <= 0:
            return
        old = self._draft_s
        self._draft_s = seconds if old is None else old + self.DRAFT_WEIGHT * (seconds - old)

    def draft_ratio(self) -> float:
        """A draft-model step in plain target steps (c); 0.0 where no draft model was timed (n-gram: free)."""
        if self._fixed_draft_ratio is not None:
            return self._fixed_draft_ratio
        if self._draft_s is None or not self._one:
            return 0.0
        return self._draft_s / self._one

    def observe(self, width: int, seconds: float) -> None:
        if width < 1 or seconds <= 0:
            return
        if width == 1:
            one = self._one_here()
            self._one = seconds if one is None else one + self.ONE_WEIGHT * (seconds - one)
            self._one_context = self.context
            return
        one = self._one_here()
        if one is None:
            return
        factor = self._context_factor(width)
        sample = min(max(seconds / one / factor, 1.0), float(width))
        old = self._ratios.get(width)
        self._ratios[width] = sample if old is None else old + self.EMA_WEIGHT * (sample - old)

    def _one_here(self) -> float | None:
        """The recent one-token time, read at `context`: where every round drafts (a long copy), the last one-token
        pass ran over a shorter cache, and a wide pass compared with it would look dearer than it is."""
        shape, one = self._shape, self._one
        if shape is None or one is None or self._one_context == self.context:
            return one
        then, now = shape(1, self._one_context), shape(1, self.context)
        return one * now / then if then > 0 and now > 0 else one

    def ratio(self, width: int) -> float:
        """t(width) / t(1) at `context`, between 1 and width; 1 + 0.1 per extra token where no width above 1 was
        measured yet."""
        if width <= 1:
            return 1.0
        return min(max(self._reference_ratio(width) * self._context_factor(width), 1.0), float(width))

    def _reference_ratio(self, width: int) -> float:
        known = sorted(self._ratios)
        if width in self._ratios:
            return self._ratios[width]
        if len(known) == 1:
            return 1.0 + 0.1 * (width - 1)
        below = [w for w in known if w < width]
        above = [w for w in known if w > width]
        if above:
            a, b = below[-1], above[0]
        else:
            a, b = known[-2], known[-1]
        slope = (self._ratios[b] - self._ratios[a]) / (b - a)
        return max(self._ratios[a] + slope * (width - a), 1.0)

    def as_dict(self) -> dict[int, float]:
        return dict(sorted(self._ratios.items()))


def round_cost(
    costs: VerifyCostModel | None, drafted: int, draft_step_s: float = 0.0, target_step_s: float = 0.0
) -> float:
    """What a round with `drafted` drafts costs in plain steps: its verify pass, plus draft-model steps
    (`draft_step_s` / `target_step_s`: mean step times, 0 where there is no draft model)."""
    cost = costs.ratio(1 + drafted) if costs is not None else 1.0
    if drafted and draft_step_s > 0 and target_step_s > 0:
        cost += drafted * draft_step_s / target_step_s
    elif drafted and costs is not None:
        cost += drafted * costs.draft_ratio()
    return cost


def round_limit(
    *, cancelled: bool, produced: int, max_new: int, context_used: int, max_context: int, k_requested: int
) -> tuple[StopReason | None, int]:
    """Before a decoding round: why the reply stops here, or else the most drafts the round may use.

    A round emits at most k + 1 tokens, so it never drafts past the token budget or the context (`context_used`:
    prompt + reply so far; the last token still needs its position)."""
    if cancelled:
        return "cancelled", 0
    remaining = max_new - produced
    if remaining <= 0:
        return "max_new_tokens", 0
    room = max_context - context_used
    if room <= 0:
        return "context", 0
    return None, min(k_requested, remaining - 1, room - 1)


class FreeDraftCosts:
    """The target's verify cost as an n-gram drafter sees it beside a draft model: its drafts take no draft-model
    steps (c = 0)."""

    def __init__(self, costs: VerifyCostModel) -> None:
        self._costs = costs

    def ratio(self, width: int) -> float:
        return self._costs.ratio(width)

    def draft_ratio(self) -> float:
        return 0.0
