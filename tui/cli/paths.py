"""`specchat paths`: where config, presets, the model cache and the data live."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from engine.config import config_file_path, data_dir, load_settings, presets_dir
    from engine.models import embedded_gguf_path, embedded_model_dir

    print(f"config file   {config_file_path()}")
    print(f"user presets  {presets_dir()}")
    print(f"model cache   {embedded_model_dir()}")
    print(f"model GGUF    {embedded_gguf_path('f16')}  (llama.cpp's default; Q4_1: {embedded_gguf_path()})")
    from engine.models.named import NAMED_MODELS, is_fetched

    for model in NAMED_MODELS.values():
        state = "fetched" if is_fetched(model) else f"not fetched: specchat fetch {model.name}"
        print(f"{model.name:<13} {model.path}  ({state})")
    print(f"data          {data_dir(load_settings())}  (specchat.db, metrics.jsonl)")
    return 0
