"""Rewrite a quantized GGUF file at full precision: the same weights, dequantized, for llama.cpp.

The embedded model ships as Q4_1. llama.cpp runs Q4_1 matrices against activations it quantizes to 8 bits on the
fly, and that changes answers ("What is the capital of France?" -> French gibberish). The transformers backend
runs the same weights dequantized (stored as float16 in its folder, computed in float32). Writing those very
values into an F16 GGUF gives llama.cpp the weights the transformers backend has, so both backends answer alike:
matrices as F16 (each value is the float16 rounding of the dequantized weight, as in the Hugging Face folder),
vectors (norms) as F32 holding the same float16-rounded values.
"""

from __future__ import annotations

import os
from pathlib import Path

PRECISIONS = ("f16", "f32")


def dequantize_gguf(source: str | Path, dest: str | Path, precision: str = "f16") -> Path:
    """Write `source`'s tensors dequantized into a new GGUF at `dest` (metadata copied, file type updated).

    Written to a temporary name beside `dest` and moved in with one `os.replace`: a crash leaves no half file.
    """
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    source, dest = Path(source), Path(dest)
    reader = gguf.GGUFReader(source)
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    file_type = gguf.LlamaFileType.MOSTLY_F16 if precision == "f16" else gguf.LlamaFileType.ALL_F32
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    writer = gguf.GGUFWriter(partial, arch=architecture, endianess=reader.endianess)
    try:
        for field in reader.fields.values():
            # The architecture and the GGUF.* header fields are written by GGUFWriter itself.
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            value = int(file_type) if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
            writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
        for tensor in reader.tensors:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).astype(np.float16)
            if precision == "f32" or values.ndim == 1:
                values = values.astype(np.float32)
            writer.add_tensor(tensor.name, values)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest
