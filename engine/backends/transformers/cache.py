"""KV caches for the transformers backend: full precision, and int8 with per-(token, head) scales.

transformers' own `QuantizedCache` needs optimum-quanto or hqq and cannot be cropped, and speculative decoding
rolls the cache back after every rejected draft. So both layers here keep their states in preallocated
buffers that grow by doubling: appending writes in place (no `torch.cat` of the whole history per step, which
is what `DynamicLayer` does), and cropping only moves the length mark.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

# Buffers start at this many positions and double when full.
INITIAL_CAPACITY = 256
INT8_MAX = 127.0
# Keys of a fused q8 layer are stored in blocks of this many tokens (rowlin.c's KBLOCK).
KEY_BLOCK = 16


class GrowingLayer(DynamicLayer):
    """Full-precision layer: states in a buffer of shape [batch, heads, capacity, head_dim].

    With `fused` (the target model on the row-invariant C kernels) attention reads the buffers itself
    (rowlin.c), and the keys are stored in blocks of KEY_BLOCK tokens, dimension-major within a block
    ([batch, heads, capacity / KEY_BLOCK, head_dim, KEY_BLOCK]: the kernel scores a block per vector step);
    `update` then returns the buffers themselves, each carrying its layer (`specchat_layer`).
    """

    is_croppable = True

    def __init__(self, fused: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fused = fused
        self.length = 0
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.is_initialized = True

    def _buffer_specs(self, head_dim: int, capacity: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Buffers this layer keeps: attribute name -> (shape after [batch, heads], dtype)."""
        return {
            "_key_buffer": (self._key_shape(head_dim, capacity), self.dtype),
            "_value_buffer": ((capacity, head_dim), self.dtype),
        }

    def _key_shape(self, head_dim: int, capacity: int) -> tuple[int, ...]:
        return (capacity // KEY_BLOCK, head_dim, KEY_BLOCK) if self.fused else (capacity, head_dim)

    def _write_keys(self, keys: torch.Tensor, start: int) -> None:
        end = start + keys.shape[2]
        if not self.fused:
            self._key_buffer[:, :, start:end] = keys
            return
        for block in range(start // KEY_BLOCK, (end - 1) // KEY_BLOCK + 1):
            a, b = max(start, block * KEY_BLOCK), min(end, (block + 1) * KEY_BLOCK)
            lanes = slice(a - block * KEY_BLOCK, b - block * KEY_BLOCK)
            self._key_buffer[:, :, block, :, lanes] = keys[:, :, a - start : b - start].transpose(-1, -2)

    def _token_major_keys(self, length: int) -> torch.Tensor:
        """The stored keys as [batch, heads, length, head_dim] (a copy where the layout is blocked)."""
        if not self.fused:
            return self._key_buffer[:, :, :length]
        batch, heads, _, head_dim, _ = self._key_buffer.shape
        used = -(-length // KEY_BLOCK)
        keys = (
            self._key_buffer[:, :, :used].transpose(-1, -2).reshape(batch, heads, used * KEY_BLOCK, head_dim)
        )
        return keys[:, :, :length]

    def _fused_result(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._key_buffer.specchat_layer = self
        self._value_buffer.specchat_layer = self
        return self._key_buffer, self._value_buffer

    def attention_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Float keys and values [batch, heads, length, head_dim] for a stock attention (long passes)."""
        return self._token_major_keys(self.length), self._value_buffer[:, :, : self.length]

    @property
    def capacity(self) -> int:
        return 0 if self._value_buffer is None else self._value_buffer.shape[2]

    def _grow(self, needed: int, template: torch.Tensor) -> None:
        capacity = self.capacity
        if needed <= capacity:
            return
        new_capacity = max(INITIAL_CAPACITY, capacity)
        while new_capacity < needed:
            new_capacity *= 2
        batch, heads, _, head_dim = template.shape
        for name, (shape, dtype) in self._buffer_specs(head_dim, new_capacity).items():
            tensor = torch.empty((batch, heads, *shape), dtype=dtype, device=self.device)
            old = getattr(self, name)
            if self.length and old is not None:
                tensor[:, :, : old.shape[2]] = old  # every buffer's third dimension grows with capacity
            setattr(self, name, tensor)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        self._grow(end, key_states)
        self._write_keys(key_states, start)
        self._value_buffer[:, :, start:end] = value_states
        self.length = end
        if self.fused:  # attention reads the buffers itself (hf_kernels.rowwise_attention)
            self.keys = self.values = None
            return self._fused_result()
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def stored_keys(self) -> torch.Tensor:
        """The keys kept for the positions in use, [batch, heads, length, head_dim], as stored (for checks)."""
        return self._token_major_keys(self.length)

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` positions (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of positions to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self._key_buffer is not None and not self.fused:
            self.keys = self._key_buffer[:, :, : self.length]
            self.values = self._value_buffer[:, :, : self.length]

    def reset(self) -> None:
        self.length = 0
        self._key_buffer = self._value_buffer = None
        super().reset()

    def storage_bytes(self, used_only: bool = True) -> int:
        """Bytes of the cache tensors: of the `length` positions in use, or of the whole allocated buffers."""
        if self._value_buffer is None:
            return 0
        head_dim = self._value_buffer.shape[-1]
        allocated = sum(
            getattr(self, name).numel() * getattr(self, name).element_size()
            for name in self._buffer_specs(head_dim, self.capacity)
        )
        return allocated * self.length // self.capacity if used_only else allocated

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("specchat decodes one sequence; beam search is not supported")


class DequantScratch:
    """Two float buffers that every int8 layer of one cache dequantizes into, one layer at a time.

    Layers run one after another and attention consumes a layer's keys and values before the next layer
    starts, so one pair of buffers serves them all: the fp32 history is never kept per layer (that is the
    memory the int8 cache saves), and nothing is allocated per step.
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def views(self, like: torch.Tensor, dtype: torch.dtype, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch, heads, capacity, head_dim = like.shape
        current = self.keys
        if (
            current is None
            or current.dtype != dtype
            or current.shape[-2] < capacity
            or current.shape[:2] != (batch, heads)
            or current.shape[-1] != head_dim
        ):
            shape = (batch, heads, capacity, head_dim)
            self.keys = torch.empty(shape, dtype=dtype, device=like.device)
            self.values = torch.empty(shape, dtype=dtype, device=like.device)
        return self.keys[:, :, :length], self.values[:, :, :length]


class Int8Layer(GrowingLayer):
    """K/V stored as int8 with one float32 scale per (token, head).

    A token's scale comes from that token's own values, so what is stored does not depend on how many tokens
    were written at once; with row-invariant kernels (engine/backends/transformers/kernels.py) speculative and plain
    decoding store the same bytes and give the same text.

    With `fused` (the target model on the row-invariant C kernels) attention reads the int8 bytes as they are
    (rowlin.c: q8attn), and the keys are stored in blocks of KEY_BLOCK tokens, dimension-major within a block,
    the layout that kernel reads; `update` then returns the int8 buffers themselves, each carrying its layer
    (`specchat_layer`). Otherwise (and for long prefill passes) the history is dequantized for attention: one
    fused multiply per layer into a scratch buffer shared by all layers (`DequantScratch`).
    """

    def __init__(self, scratch: DequantScratch | None = None, fused: bool = False, **kwargs) -> None:
        super().__init__(fused=fused, **kwargs)
        self._key_scales: torch.Tensor | None = None
        self._value_scales: torch.Tensor | None = None
        self.scratch = scratch or DequantScratch()

    def _buffer_specs(self, head_dim: int, capacity: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {
            "_key_buffer": (self._key_shape(head_dim, capacity), torch.int8),
            "_value_buffer": ((capacity, head_dim), torch.int8),
            "_key_scales": ((capacity, 1), torch.float32),
            "_value_scales": ((capacity, 1), torch.float32),
        }

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The float keys and values of the positions in use (views of the shared scratch buffers)."""
        end = self.length
        keys, values = self.scratch.views(self._value_buffer, self.dtype, end)
        torch.mul(self._token_major_keys(end), self._key_scales[:, :, :end], out=keys)
        torch.mul(self._value_buffer[:, :, :end], self._value_scales[:, :, :end], out=values)
        return keys, values

    def attention_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.dequantized()

    @staticmethod
    def quantize(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scales = (states.abs().amax(dim=-1, keepdim=True).float() / INT8_MAX).clamp_(min=1e-12)
        quantized = (states.float() / scales).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return quantized, scales

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        self._grow(end, key_states)
        qk, sk = self.quantize(key_states)
        qv, sv = self.quantize(value_states)
        self._write_keys(qk, start)
        self._key_scales[:, :, start:end] = sk
        self._value_buffer[:, :, start:end] = qv
        self._value_scales[:, :, start:end] = sv
        self.length = end
        self.keys = self.values = None
        if self.fused:  # attention reads the int8 buffers itself (hf_kernels.rowwise_attention)
            return self._fused_result()
        # Only the quantized form is kept; these dequantized views live for this layer's attention.
        return self.dequantized()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of positions to remove")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self._key_scales = self._value_scales = None
        super().reset()


class SpecCache(Cache):
    """A croppable cache of `GrowingLayer`s (full precision) or `Int8Layer`s (q8), one per model layer."""

    def __init__(self, mode: str = "fp16", fused: bool = False) -> None:
        """`fused`: attention reads the cache buffers itself (a model on hf_kernels' attention with rowlin)."""
        if mode not in ("fp16", "q8"):
            raise ValueError(f"cache mode {mode!r}: this cache holds fp16 (full precision) or q8")
        self.mode = mode
        super().__init__(layer_class_to_replicate=lambda **kwargs: GrowingLayer(fused=fused, **kwargs))
        if mode == "q8":
            scratch = DequantScratch()
            self.layer_class_to_replicate = lambda **kwargs: Int8Layer(scratch=scratch, fused=fused, **kwargs)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if layer_idx >= len(self.layers):
            return 0
        return self.layers[layer_idx].length

    def crop_to(self, length: int) -> None:
        """Keep the first `length` positions."""
        for layer in self.layers:
            if layer.length > length:
                layer.crop(length - layer.length)

    def storage_bytes(self, used_only: bool = True) -> int:
        return sum(layer.storage_bytes(used_only) for layer in self.layers)


def full_precision_bytes(cache: SpecCache, dtype: torch.dtype) -> int:
    """What the cache's positions in use would take as plain `dtype` tensors (for the memory comparison)."""
    total = 0
    element = torch.empty((), dtype=dtype).element_size()
    for layer in cache.layers:
        if layer._value_buffer is not None:
            total += 2 * layer.length * layer._value_buffer[:, :, :1].numel() * element
    return total
