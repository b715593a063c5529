"""`specchat doctor`'s environment checks: torch, CUDA, each engine of the registry (whether it runs here; a GPU
engine only where CUDA is), flash-attn, the row-invariant CPU kernel."""

from __future__ import annotations

from engine.backends import registry
from engine.benchmarks.doctor.report import DoctorReport


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def check_engine(report: DoctorReport, row: registry.Engine, cuda: bool) -> None:
    """An engine of the registry: whether it runs here (a GPU engine is probed only where CUDA is)."""
    version = _version(row.distribution) if row.distribution else None
    if not row.gpu:
        usable, reason = registry.probe(row)
        if usable and row.detail:
            reason += registry.entry_point(row.detail)()
        report.add(row.check, "pass" if usable else "warn", reason)
        return
    usable, reason = registry.probe(row) if cuda else (False, "no CUDA GPU")
    if usable:
        report.add(row.check, "pass", reason, version=version)
    elif cuda and (version or not row.install_hint):
        report.add(row.check, "fail", f"{row.name} cannot run on this GPU: {reason}", version=version)
    elif cuda:
        report.add(row.check, "warn", f"not installed: {registry.entry_point(row.install_hint)}")
    else:
        report.add(
            row.check, "warn", f"not usable without CUDA ({version or 'not installed'})", version=version
        )


def check_environment(report: DoctorReport) -> bool:
    """torch, CUDA, the registry's engines (the GPU ones, flash-attn, the CPU ones), the row-invariant kernel;
    returns whether a CUDA GPU is visible."""
    try:
        import torch
    except Exception as exc:  # a broken install: everything after this needs torch
        report.add("torch", "fail", f"torch does not import ({exc}): run make install")
        return False
    report.add("torch", "pass", f"torch {torch.__version__}", version=torch.__version__)
    cuda = False
    try:
        cuda = bool(torch.cuda.is_available())
    except Exception as exc:
        report.add("cuda", "warn", f"CUDA check failed ({exc}): the CPU backends run")
    else:
        if cuda:
            name = torch.cuda.get_device_name(0)
            report.add(
                "cuda", "pass", f"CUDA {torch.version.cuda} on {name}", device=name, cuda=torch.version.cuda
            )
        else:
            why = "a CPU build of torch" if torch.version.cuda is None else "no CUDA GPU visible"
            report.add("cuda", "warn", f"{why}: ExLlamaV2 cannot run; the CPU backends run (slower)")
    gpu_engines = [row for row in registry.ENGINES if row.check and row.gpu]
    for row in gpu_engines:
        check_engine(report, row, cuda)
    flash = _version("flash-attn") or _version("flash_attn")
    if flash:
        report.add("flash_attn", "pass", f"flash-attn {flash}", version=flash)
    elif cuda:
        report.add(
            "flash_attn", "warn", "flash-attn is not installed: exllamav2 runs without it, prefill is slower"
        )
    else:
        report.add("flash_attn", "pass", "not needed without CUDA")
    for row in registry.ENGINES:
        if row.check and not row.gpu:
            check_engine(report, row, cuda)
    from engine.backends.transformers import rowlin

    kernel, why = rowlin.load()
    if kernel is not None:
        report.add(
            "cpu_kernels",
            "pass",
            f"row-invariant C kernel built ({kernel.lanes} float lanes): exact and fast speculation on the CPU",
            path=str(kernel.path),
            lanes=kernel.lanes,
        )
    else:
        report.add("cpu_kernels", "warn", f"{why} (install a C compiler for ~1.2x faster CPU decoding)")
    return cuda
