"""`specchat presets`: list the presets, built-in and user, and name any preset file that was skipped."""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> int:
    from engine.config import load_settings, presets_dir
    from engine.presets import load_presets

    load_settings()
    skipped: dict[str, str] = {}
    presets = load_presets(presets_dir(), skipped=skipped)
    for problem in skipped.values():  # one bad file does not hide the others
        print(f"specchat: skipped a preset file: {problem}", file=sys.stderr)
    width = max(len(n) for n in presets)
    for name, p in presets.items():
        ramp = f" ramp {p.ramp_start:g}->{p.temperature:g} over {p.ramp_tokens}" if p.ramp_tokens else ""
        draft = f"K{'≤' if p.k_mode == 'adaptive' else '='}{p.k}" if p.drafting and p.k else "draft off"
        print(f"{name:<{width}}  {draft:<9} T={p.temperature:<4g}{ramp:<26}  {p.description}  [{p.source}]")
    return 0
