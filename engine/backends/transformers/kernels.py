"""Batch-invariant forward passes for the transformers backend on the CPU.

Speculative decoding is exact only if a token's logits do not depend on how many tokens share its forward pass:
a verify pass computes rows 1 + k at once, plain decoding one row at a time. Stock kernels break that twice:
- `F.linear` calls MKL's gemv for one row and its gemm for more, and the two sum in different orders (about 1e-6
  apart per layer). MKL's small-M gemm also re-packs the whole weight on every call, so a pass of 2 rows costs
  well over one row, which made every failed draft expensive (figures: docs/performance.md).
- SDPA runs a multi-row causal pass through other code (a mask, copies of K/V per query head) than a single row.
Under the full-precision cache those differences only flip a near-tie now and then; under an int8 cache they
move a value across a rounding boundary and the text diverges (issue: 1 prompt in 12).

So the target's linear layers run a row-invariant kernel: our own (rowlin.c, compiled once per machine: as
fast as MKL's gemv for one row, and a pass of 1 + K rows streams the weight once), or where it cannot be built,
oneDNN with weights packed once at load (row-invariant too, slower for one row). Attention for a short pass
runs each query row exactly as a one-row decode step would: SDPA over its own causal prefix of the keys, with
grouped-query heads, no mask. Long passes (prefill) keep SDPA's causal kernel. `install()` checks the first
property on the loaded model and leaves the stock kernels in place where it does not hold.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.backends.transformers import rowlin


class KernelSwitch:
    """Which linear kernels a model's next forward pass uses: packed (row-invariant) or stock (MKL gemv/gemm).

    `kind` says which row-invariant kernel "packed" means: "rowlin" (rowlin.c: as fast as MKL's gemv for one
    row, so every pass runs it and speculation is bit-exact) or "onednn" (slower than MKL for one row, so the
    backend may run one-row passes stock and only multi-row verify passes packed ("hybrid"), or everything
    packed ("invariant": needed where an int8 cache would amplify a last-bit difference)).
    """

    __slots__ = ("packed", "kind")

    def __init__(self, kind: str = "onednn") -> None:
        self.packed = True
        self.kind = kind


# Passes of at most this many rows (a verify pass: last token + K drafts) run attention row by row.
ROWWISE_MAX_ROWS = 32
ATTENTION_NAME = "specchat_rowwise"


class PackedLinear(nn.Module):
    """nn.Linear on a row-invariant kernel: a row's result does not depend on the number of rows.

    With `kernel` (rowlin.c) every pass runs it, or where the stock weight is kept (`keep_stock`), only passes
    of up to `rowlin.MAX_ROWS` rows and longer ones (prefill) PyTorch's gemm.
    Otherwise oneDNN with prepacked weights; it keeps the property only for reductions of at most `CHUNK`
    inputs (wider ones take another path for one row than for several), so a wider layer is split into input
    chunks whose products are added in order.
    """

    CHUNK = 1024

    def __init__(
        self,
        linear: nn.Linear,
        switch: KernelSwitch | None = None,
        kernel: rowlin.Kernel | None = None,
        keep_stock: bool = True,
    ) -> None:
        """With `kernel` and not `keep_stock`, the stock weight is let go (half the memory): every pass, prefill
        included, runs the kernel (a little slower than PyTorch's gemm for hundreds of rows; figures:
        docs/performance.md)."""
        super().__init__()
        self.switch = switch or KernelSwitch()
        # The stock weight stays for stock passes (the same tensor: no copy).
        self.weight = linear.weight.detach()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.kernel = kernel
        if kernel is not None:
            self.rowlin_weight = kernel.pack(self.weight)
            self.rowlin_bias = kernel.pack_bias(self.bias)
            if not keep_stock:
                self.weight = None
            return
        weight = linear.weight.detach()
        pieces = -(-self.in_features // self.CHUNK)
        step = -(-self.in_features // pieces)
        self.bounds = [
            (start, min(start + step, self.in_features)) for start in range(0, self.in_features, step)
        ]
        # A batch-size hint of 1 would let oneDNN pick a one-row kernel for one row: the hint must be > 1.
        self.packed = [
            torch.ops.mkldnn._reorder_linear_weight(weight[:, a:b].contiguous(), 4) for a, b in self.bounds
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.switch.packed:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        if self.kernel is not None:
            if rows.shape[0] > rowlin.MAX_ROWS and self.weight is not None:
                return torch.nn.functional.linear(x, self.weight, self.bias)
            out = self.kernel.linear(rows, self.rowlin_weight, self.out_features, self.rowlin_bias)
        elif len(self.packed) == 1:
            out = torch.ops.mkldnn._linear_pointwise(
                rows.contiguous(), self.packed[0], self.bias, "none", [], ""
            )
        else:
            out = None
            for (a, b), packed in zip(self.bounds, self.packed, strict=True):
                part = torch.ops.mkldnn._linear_pointwise(
                    rows[:, a:b].contiguous(), packed, None, "none", [], ""
                )
                out = part if out is None else out.add_(part)
            if self.bias is not None:
                out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)


def rowwise_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """Attention for one sequence (no padding): short passes one query row at a time, long ones as SDPA does.

    A sliding window (Mistral, Gemma 2/3: `sliding_window` keys up to and including the query's own) and a
    logit soft-cap (Gemma 2) are applied here as the model's own attention applies them; the cache keeps the
    whole history, so a rejected draft can always be cropped.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows = query.shape[2]
    window = kwargs.pop("sliding_window", None) or None
    softcap = kwargs.pop("softcap", None)
    layer = getattr(key, "specchat_layer", None)
    if (
        layer is not None
    ):  # a fused cache layer (engine/backends/transformers/cache.py) handed its buffers: attention reads them
        kernel, _ = rowlin.load()
        if rows <= ROWWISE_MAX_ROWS and kernel is not None:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            return rowlin.cached_attention(kernel, query, layer, scale), None
        key, value = layer.attention_states()
    groups = getattr(module, "num_key_value_groups", 1)
    past = key.shape[2] - rows
    if rows > ROWWISE_MAX_ROWS:
        if softcap is None:  # the mask transformers built for this layer carries its window
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        attn = explicit_attention(query, key, value, past, scaling, groups, window, softcap)
        return attn.transpose(1, 2).contiguous(), None
    outputs = []
    for j in range(rows):
        visible = past + j + 1
        first = max(0, visible - window) if window else 0
        if softcap is None:
            out = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, j : j + 1],
                key[:, :, first:visible],
                value[:, :, first:visible],
                scale=scaling,
                enable_gqa=groups > 1,
            )
        else:
            out = explicit_attention(
                query[:, :, j : j + 1], key[:, :, first:visible], value[:, :, first:visible], None, scaling,
                groups, None, softcap,
            )  # fmt: skip
        outputs.append(out)
    attn = outputs[0] if rows == 1 else torch.cat(outputs, dim=2)
    return attn.transpose(1, 2).contiguous(), None


def explicit_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    past: int | None,
    scaling: float | None,
    groups: int,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """Attention written out, as transformers' eager attention computes it (soft-cap before the mask).

    `past`: the queries are the last rows of a causal sequence of key.shape[2] positions, masked causally (and to
    `window` keys); None: every key is visible (a caller that sliced the keys itself). [B, H, rows, D].
    """
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    weights = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if past is not None:
        q_pos = torch.arange(past, past + query.shape[2]).unsqueeze(1)
        k_pos = torch.arange(key.shape[2]).unsqueeze(0)
        visible = k_pos <= q_pos
        if window:
            visible &= k_pos > q_pos - window
        weights = weights.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)


def fused_attention_fits(config) -> bool:
    """Can the cache attention kernel serve this architecture? (plain causal attention, whole vectors per head)"""
    kernel, _ = rowlin.load()
    if kernel is None:
        return False
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", 0) or heads)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)
    return (
        heads > 0
        and heads % kv_heads == 0
        and head_dim % kernel.lanes == 0
        and not getattr(config, "sliding_window", None)
        and not getattr(config, "attn_logit_softcapping", None)
    )


def _register_attention() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)


# Sibling projections that read the same input: packed as one wider weight, computed in one call.
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _FusedProjections:
    """Several linears over one input, as one packed linear; each member returns its slice of the output."""

    def __init__(
        self,
        linears: list[nn.Linear],
        switch: KernelSwitch,
        kernel: rowlin.Kernel | None = None,
        keep_stock: bool = True,
    ) -> None:
        self.switch = switch
        self.stock = (
            [(lin.weight.detach(), None if lin.bias is None else lin.bias.detach()) for lin in linears]
            if keep_stock or kernel is None
            else None
        )
        fused = nn.Linear(linears[0].in_features, sum(lin.out_features for lin in linears), bias=False)
        with torch.no_grad():
            fused.weight = nn.Parameter(
                torch.cat([lin.weight.detach() for lin in linears]), requires_grad=False
            )
        if any(lin.bias is not None for lin in linears):
            fused.bias = nn.Parameter(
                torch.cat(
                    [lin.bias if lin.bias is not None else torch.zeros(lin.out_features) for lin in linears]
                ),
                requires_grad=False,
            )
        self.linear = PackedLinear(fused, switch, kernel, keep_stock)
        edges = [0]
        for lin in linears:
            edges.append(edges[-1] + lin.out_features)
        self.slices = [slice(a, b) for a, b in zip(edges, edges[1:], strict=False)]
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if self.stock is not None and (
            not self.switch.packed
            or (self.linear.kernel is not None and x.numel() > rowlin.MAX_ROWS * self.linear.in_features)
        ):
            weight, bias = self.stock[index]
            return torch.nn.functional.linear(x, weight, bias)
        if x is not self._input:  # the first member called with this input computes all of them
            self._input, self._output = x, self.linear(x)
        return self._output[..., self.slices[index]]


class FusedMember(nn.Module):
    def __init__(self, group: _FusedProjections, index: int) -> None:
        super().__init__()
        self.group = group
        self.index = index
        self.out_features = group.slices[index].stop - group.slices[index].start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(x, self.index)


def _pack_linears(
    module: nn.Module, switch: KernelSwitch, kernel: rowlin.Kernel | None = None, keep_stock: bool = True
) -> int:
    """Replace every nn.Linear below `module` by a packed one (sibling projections fused); returns the count."""
    count = 0
    children = dict(module.named_children())
    for names in FUSED_GROUPS:
        linears = [children.get(name) for name in names]
        if (
            all(isinstance(lin, nn.Linear) for lin in linears)
            and len({lin.in_features for lin in linears}) == 1
        ):
            group = _FusedProjections(linears, switch, kernel, keep_stock)
            for index, name in enumerate(names):
                setattr(module, name, FusedMember(group, index))
            count += len(names)
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child, switch, kernel, keep_stock))
            count += 1
        elif not isinstance(child, FusedMember):
            count += _pack_linears(child, switch, kernel, keep_stock)
    return count


def packing_is_row_invariant(features: int = 1536, outputs: int = 96) -> bool:
    """Does a packed linear give each row the same result whether computed alone or with others?"""
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(features, outputs, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(outputs, features, generator=generator))
    packed = PackedLinear(linear)
    x = torch.randn(9, features, generator=generator)
    with torch.inference_mode():
        together = packed(x)
        alone = torch.cat([packed(x[i : i + 1]) for i in range(x.shape[0])])
    return torch.equal(together, alone)


def _return_freed_memory() -> None:
    """Hand the heap pages of the let-go weights back to the system (glibc keeps them otherwise)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass


def install(
    model: nn.Module, device: str, keep_stock: bool = False
) -> tuple[KernelSwitch | None, str | None]:
    """Give `model` row-invariant kernels where this machine allows; the switch (None where the stock kernels
    stay) and a note for the user, if any (why the fastest kernel is not used). On rowlin the stock weights
    are let go unless `keep_stock` (for "hybrid" passes): every pass then runs rowlin."""
    if device != "cpu" or next(model.parameters()).dtype != torch.float32:
        return None, None  # GPU kernels and other dtypes: stock kernels, no note needed
    kernel, note = rowlin.load()
    if kernel is not None:
        _register_attention()
        switch = KernelSwitch("rowlin")
        _pack_linears(model, switch, kernel, keep_stock)
        _return_freed_memory()
        model.config._attn_implementation = ATTENTION_NAME
        return switch, None
    if not torch.backends.mkldnn.is_available():
        return None, "oneDNN is not available in this PyTorch build: stock kernels (speculation may drift)"
    try:
        if not packing_is_row_invariant():
            return None, "oneDNN's packed linear is not row-invariant here: stock kernels"
        _register_attention()
        switch = KernelSwitch()
        _pack_linears(model, switch)
        model.config._attn_implementation = ATTENTION_NAME
    except Exception as exc:  # an old PyTorch without these ops: run as before, and say so
        return None, f"row-invariant kernels unavailable ({type(exc).__name__}): stock kernels"
    return switch, note
