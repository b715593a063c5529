"""Rows of the metrics log for the tests: a baseline week and a recent day of replies, at planted times."""

from __future__ import annotations

DAY = 86400.0
NOW = 1_800_000_000.0


def row(
    t: float, acceptance: float = 0.6, tps: float = 50.0, fp: str = "abc", preset: str = "qa", **extra
) -> dict:
    drafted = 100
    return {
        "timestamp": t,
        "fingerprint": fp,
        "preset": preset,
        "model": "m",
        "draft": "ngram",
        "drafted_tokens": drafted,
        "accepted_tokens": round(acceptance * drafted),
        "acceptance_rate": acceptance,
        "mean_accepted_length": 1 + acceptance * 3,
        "decode_tokens_per_s": tps,
        "ttft_s": 0.2,
        "stop_reason": "eos",
        **extra,
    }


def baseline_rows(n: int = 30, acceptance: float = 0.6, tps: float = 50.0, **kw) -> list[dict]:
    # Spread over the 6 days before NOW - 1 day.
    return [row(NOW - 7 * DAY + i * (5 * DAY / n), acceptance, tps, **kw) for i in range(n)]


def recent_rows(acceptance: float, tps: float = 50.0, **kw) -> list[dict]:
    return [row(NOW - DAY + i * 60, acceptance, tps, **kw) for i in range(20)]
