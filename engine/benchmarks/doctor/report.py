"""What `specchat doctor` reports: each check's pass / warn / fail / skip in one line (`Check`), the whole run
(`DoctorReport`, its exit code and JSON), the checks in their order (`CHECK_NAMES`), and the printed report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.backends import registry
from engine.errors import UserError

STATUSES = ("pass", "warn", "fail", "skip")
CHECK_NAMES = (
    "torch",
    "cuda",
    *(row.check for row in registry.ENGINES if row.check and row.gpu),
    "flash_attn",
    *(row.check for row in registry.ENGINES if row.check and not row.gpu),
    "cpu_kernels",
    "memory",
    "compatibility",
    "load",
    "kernel_probe",
    "architecture",
    "draft_pays",
    "baseline",
    "context_ladder",
    "tasks",
    "restart",
    "regression",
)


class DoctorError(UserError, ValueError):
    """Doctor cannot run at all (exit 2); one line."""


@dataclass(slots=True)
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class DoctorOptions:
    max_new_tokens: int = 96
    ladder: tuple[int, ...] | None = None  # prompt lengths; None: 512, 2048, 4096 ... up to max_context
    save_baseline: bool = True
    force_save: bool = False


@dataclass(slots=True)
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    fingerprint: str = ""
    backend: str = ""
    model: str = ""
    baseline_file: str = ""
    baseline_saved: bool = False

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def add(self, name: str, status: str, reason: str, /, **details: Any) -> Check:
        assert status in STATUSES, status
        check = Check(name, status, " ".join(reason.split()), details)
        self.checks.append(check)
        return check

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "fingerprint": self.fingerprint,
            "backend": self.backend,
            "model": self.model,
            "baseline_file": self.baseline_file,
            "baseline_saved": self.baseline_saved,
            "checks": [c.to_dict() for c in self.checks],
        }


def format_report(report: DoctorReport) -> str:
    width = max(len(c.name) for c in report.checks) if report.checks else 10
    lines = [f"{c.status.upper():<4}  {c.name:<{width}}  {c.reason}" for c in report.checks]
    failed = [c.name for c in report.checks if c.status == "fail"]
    lines.append("")
    lines.append("all checks passed" if not failed else f"failed: {', '.join(failed)}")
    if report.baseline_saved:
        lines.append(f"saved as the baseline for {report.fingerprint} ({report.baseline_file})")
    return "\n".join(lines)
