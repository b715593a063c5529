"""Drafting that always pays: for tests of the rules a draft exercises."""

from __future__ import annotations


def _free_verify_class():
    from engine.decoding.cost_model import VerifyCostModel

    class FreeVerify(VerifyCostModel):
        """Verification that costs nothing and stays so: the drafter drafts the full K wherever it finds a
        match (what the rules need to see), whatever the machine's load makes the real passes cost."""

        def __init__(self) -> None:
            super().__init__({2: 1.0})

        def observe(self, width: int, seconds: float) -> None:
            pass

    return FreeVerify


FreeVerify = _free_verify_class()
