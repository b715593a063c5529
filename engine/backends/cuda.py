"""What the GPU engines (exllamav2, exllamav3) share about the device: its name for BackendInfo, and whether an
exception is CUDA running out of memory. torch is imported inside the functions."""

from __future__ import annotations


def device_label() -> str:
    """ "cuda: NAME[, NAME...]" for the visible GPUs, "cuda" where torch cannot name them."""
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return "cuda: " + ", ".join(names)
    except (ImportError, RuntimeError):  # pragma: no cover
        pass
    return "cuda"


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` is the GPU running out of memory."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
