"""Linear modules for the three ways the same DiT runs: W8A8 (fused INT8 GEMM), dequant, float.

In-memory form of a quantized linear ``<m>`` (what ``read_branch`` returns, what
``W8A8Linear.state_dict()`` holds):

    <m>.weight             int8 [N, K]   K-contiguous
    <m>.weight_scale       float32 [N]   per output channel: W ~ weight * weight_scale[:, None]
    <m>.input_smooth       float32 [K]   optional SmoothQuant vector: the activation is divided by it
    <m>.input_folded       float32 [K]   optional: the part of input_smooth already divided out upstream
                                         (``smooth_fold``): the module's input arrives as x / input_folded
    <m>.bias               float [N]     optional
    <m>.convrot_groupsize  int64 []      optional: ComfyUI ConvRot weight, activation is rotated first

so y = ((x / input_smooth) [rotated]) @ (weight * weight_scale[:, None])^T + bias, where the module itself
divides its input by input_smooth / input_folded only (nothing after a full fold).

A linear factory ``factory(spec: LinearSpec, entries: dict | None) -> nn.Module`` builds one
linear from its spec and its state-dict entries (keys without the ``<m>.`` prefix); ``None``
entries mean "an empty shell to fill with load_state_dict". Factories: ``w8a8_linears`` (the
fused path, falling back to labelled paths), ``float_linears`` (bf16/fp32 reference; int8
entries are dequantized).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import kernels
from ..kernels import ops as kernel_ops
from . import convrot
from .config import LinearSpec
from .smooth_fold import runtime_divisor

QUANT_KEYS = ("weight", "weight_scale", "input_smooth", "input_folded", "bias", "convrot_groupsize")
VECTOR_KEYS = ("input_smooth", "input_folded")

LinearFactory = Callable[[LinearSpec, "dict[str, torch.Tensor] | None"], nn.Module]


def is_quantized_entries(entries: dict | None) -> bool:
    return entries is not None and entries.get("weight") is not None and entries["weight"].dtype == torch.int8


def dequantize_entries(entries: dict, dtype=torch.float32) -> torch.Tensor:
    """The float weight [N, K] an int8 entry set applies to its module's input: smoothing and ConvRot undone,
    and, where part of the smoothing was folded upstream (``input_folded`` f), W·diag(f), since that input
    arrives already divided by f."""
    w = entries["weight"].float() * entries["weight_scale"].float().reshape(-1, 1)
    group = entries.get("convrot_groupsize")
    if group is not None:
        w = convrot.rotate(w, int(group))  # H is its own inverse
    smooth = entries.get("input_smooth")
    if smooth is not None:
        w = w / smooth.float().reshape(1, -1)
    folded = entries.get("input_folded")
    if folded is not None:
        w = w * folded.float().reshape(1, -1)
    return w.to(dtype)


class _KeepFloat32(nn.Module):
    """Module whose float32 scale buffers survive ``.to(bfloat16)`` / ``.half()`` untouched."""

    _fp32_buffers: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        keep = {n: getattr(self, n) for n in self._fp32_buffers if getattr(self, n, None) is not None}
        super()._apply(fn, recurse)
        for name, old in keep.items():
            new = getattr(self, name)
            if new.dtype != old.dtype:
                setattr(self, name, old.to(device=new.device))
        return self


class W8A8Linear(_KeepFloat32):
    """A W8A8 linear: int8 weight [N, K], float32 per-channel scale, dynamic per-token int8 input.

    ``forward`` calls ``kernels.w8a8_linear``, which picks triton-int8 (fused), cublas-int8 or
    dequant-bf16 and records the path under ``self.site`` in ``kernels.REGISTRY``. ``path``
    forces a path (e.g. ``"dequant-bf16"`` for the phantom-INT8 comparison).
    """

    _fp32_buffers = ("weight_scale", "input_smooth", "input_folded", "input_divisor", "bias")

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        input_smooth: torch.Tensor | None = None,
        *,
        convrot_groupsize: int | None = None,
        site: str | None = None,
        path: str | None = None,
        input_folded: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ValueError(f"W8A8Linear {site}: weight must be int8 [N, K]; got {weight.dtype} {list(weight.shape)}")
        n, k = weight.shape
        scale = _vector(weight_scale, n, "weight_scale", site)
        if convrot_groupsize is not None:
            convrot.check_group_size(int(convrot_groupsize))
            if k % int(convrot_groupsize):
                raise ValueError(f"W8A8Linear {site}: K={k} is not a multiple of convrot_groupsize {convrot_groupsize}")
        self.register_buffer("weight", weight if weight.is_contiguous() else weight.contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("input_smooth", _vector(input_smooth, k, "input_smooth", site))
        self.register_buffer("input_folded", _vector(input_folded, k, "input_folded", site))
        self._refresh_divisor()
        self.register_buffer("bias", _vector(bias, n, "bias", site))
        self.convrot_groupsize = int(convrot_groupsize) if convrot_groupsize is not None else None
        self.in_features, self.out_features = k, n
        self.site = site
        self.path = path

    @classmethod
    def from_entries(cls, entries: dict, *, site=None, path=None) -> W8A8Linear:
        group = entries.get("convrot_groupsize")
        return cls(
            entries["weight"],
            entries["weight_scale"],
            entries.get("bias"),
            entries.get("input_smooth"),
            convrot_groupsize=int(group) if group is not None else None,
            site=site,
            path=path,
            input_folded=entries.get("input_folded"),
        )

    @classmethod
    def from_float(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        smooth: torch.Tensor | None = None,
        *,
        site=None,
        path=None,
    ) -> W8A8Linear:
        """Quantize a float weight [N, K] per output channel (round half to even)."""
        q, s = quantize_rows(weight, smooth)
        return cls(q, s, bias, smooth, site=site, path=path)

    def _refresh_divisor(self) -> None:
        """``input_divisor``: what forward divides its input by (input_smooth / input_folded; None after a full
        fold). Derived, so not saved: the state dict holds input_smooth and input_folded."""
        divisor = runtime_divisor(self.input_smooth, self.input_folded)
        self.register_buffer("input_divisor", divisor, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return w8a8_forward(
            x,
            self.weight,
            self.weight_scale,
            self.bias,
            self.input_divisor,
            self.convrot_groupsize,
            path=self.path,
            site=self.site,
        )

    def dequantized_weight(self, dtype=torch.float32) -> torch.Tensor:
        """The float weight this module applies to its input (see ``dequantize_entries``)."""
        return dequantize_entries(self._entries(), dtype)

    def _entries(self) -> dict:
        e = {
            "weight": self.weight,
            "weight_scale": self.weight_scale,
            "input_smooth": self.input_smooth,
            "input_folded": self.input_folded,
        }
        if self.convrot_groupsize is not None:
            e["convrot_groupsize"] = torch.tensor(self.convrot_groupsize)
        return e

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.convrot_groupsize is not None:
            destination[prefix + "convrot_groupsize"] = torch.tensor(self.convrot_groupsize, dtype=torch.int64)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        key = prefix + "convrot_groupsize"
        if key in state_dict:
            group = int(state_dict[key])
            if group != self.convrot_groupsize:
                error_msgs.append(f"{key}: this module has convrot_groupsize {self.convrot_groupsize}, got {group}")
        elif self.convrot_groupsize is not None:
            missing_keys.append(key)
        rest = {k: v for k, v in state_dict.items() if k != key}
        for name in VECTOR_KEYS:  # a shell (or an unsmoothed module) takes the vectors a saved state carries
            t = rest.get(prefix + name)
            if t is not None and getattr(self, name) is None and isinstance(t, torch.Tensor):
                self.register_buffer(
                    name, torch.empty(self.in_features, dtype=torch.float32, device=self.weight.device)
                )
        super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        self._refresh_divisor()

    def extra_repr(self) -> str:
        extras = [
            f"in_features={self.in_features}",
            f"out_features={self.out_features}",
            f"bias={self.bias is not None}",
            f"smooth={self.input_smooth is not None}",
        ]
        if self.input_folded is not None:
            extras.append("smooth folded upstream" + (", ratio divided here" if self.input_divisor is not None else ""))
        if self.convrot_groupsize:
            extras.append(f"convrot={self.convrot_groupsize}")
        if self.path:
            extras.append(f"path={self.path}")
        return ", ".join(extras)


class FloatLinear(nn.Module):
    """A float linear. With a site it shows up in the registry as path 'bf16' with ``reason``."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        site: str | None = None,
        reason: str = "unquantized layer",
    ) -> None:
        super().__init__()
        if not weight.is_floating_point() or weight.dim() != 2:
            raise ValueError(f"FloatLinear {site}: weight must be a float [N, K] tensor; got {weight.dtype}")
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.out_features, self.in_features = weight.shape
        self.site = site
        self.reason = reason

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.site is not None:
            return kernel_ops.float_linear(x, self.weight, self.bias, self.site, self.reason)
        w = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, w, b)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class FusedGateUp(_KeepFloat32):
    """feed_forward.w1 and .w3 (SwiGLU gate and up) as ONE W8A8 GEMM with silu(gate) * up in its
    epilogue (``kernels.swiglu_w8a8_pair``): one activation quantization instead of two and no
    gate / up intermediates in memory. Built from two W8A8Linear sharing the same input (same
    smoothing vector, no ConvRot, no bias); it keeps their int8 weights and scales as they are (no copy)."""

    _fp32_buffers = ("s1", "s3", "input_smooth")

    def __init__(self, w1: W8A8Linear, w3: W8A8Linear, site: str | None = None) -> None:
        super().__init__()
        if not can_fuse_gate_up(w1, w3):
            raise ValueError(f"FusedGateUp {site}: w1 / w3 cannot share one GEMM ({fuse_gate_up_blocker(w1, w3)})")
        self.register_buffer("w1", w1.weight)
        self.register_buffer("s1", w1.weight_scale)
        self.register_buffer("w3", w3.weight)
        self.register_buffer("s3", w3.weight_scale)
        self.register_buffer("input_smooth", w1.input_divisor)  # what both divide their input by (None: folded)
        self.in_features, self.out_features = w1.in_features, w1.out_features
        self.site, self.path = site, w1.path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernel_ops.swiglu_w8a8_pair(
            x, self.w1, self.s1, self.w3, self.s3, self.input_smooth, self.path, self.site
        )


def fuse_gate_up_blocker(w1, w3) -> str | None:
    """Why w1 / w3 cannot run as one fused GEMM (None when they can)."""
    if not (isinstance(w1, W8A8Linear) and isinstance(w3, W8A8Linear)):
        return "not both W8A8"
    if w1.convrot_groupsize is not None or w3.convrot_groupsize is not None:
        return "ConvRot weights"
    if w1.bias is not None or w3.bias is not None:
        return "biased projections"
    if w1.weight.shape != w3.weight.shape:
        return "shapes"
    s1, s3 = w1.input_divisor, w3.input_divisor  # what each divides its input by at run time
    if (s1 is None) != (s3 is None) or (s1 is not None and not torch.equal(s1, s3)):
        return "different smoothing vectors (w1 and w3 would quantize different activations)"
    return None


def can_fuse_gate_up(w1, w3) -> bool:
    return fuse_gate_up_blocker(w1, w3) is None


CONVROT_NOTE = kernel_ops.CONVROT_NOTE  # noted on a ConvRot layer's registry reason


def w8a8_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    input_smooth: torch.Tensor | None = None,
    convrot_groupsize: int | None = None,
    *,
    path: str | None = None,
    site: str | None = None,
) -> torch.Tensor:
    """The W8A8 linear of the in-memory form as a function (``W8A8Linear.forward`` and the ComfyUI ops use it).

    y = ((x / input_smooth) [rotated]) @ (weight * weight_scale[:, None])^T + bias, through
    ``kernels.w8a8_linear`` (fused where it can run; path recorded under ``site``; a ConvRot layer's registry
    reason says so), or, while dynamo traces, the registered op ``torch.ops.ideogram4_int8.w8a8_linear`` that runs it.
    """
    group = int(convrot_groupsize) if convrot_groupsize is not None else None
    # the registered op under torch.compile (bookkeeping opaque to dynamo), the direct call in eager mode
    return kernel_ops.w8a8_linear(x, weight, weight_scale, bias, input_smooth, path, site, None, group)


def quantize_rows(weight: torch.Tensor, smooth: torch.Tensor | None = None):
    """Per-output-channel RTN of a float / fp8 weight [N, K] in bounded row chunks (same bits as
    ``kernels.quantize_weight_ref``)."""
    from .formats.quantize_on_load import quantize_weight

    return quantize_weight(weight, None, smooth)


def _vector(t, length, name, site):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"W8A8Linear {site}: {name} must be a float tensor of {length} values")
    if t.numel() != length or t.dim() > 2 or (t.dim() == 2 and t.shape[1] != 1):
        raise ValueError(f"W8A8Linear {site}: {name} must be [{length}] or [{length}, 1]; got {list(t.shape)}")
    t = t.reshape(length)
    return t if t.dtype == torch.float32 else t.float()


# -- linear factories ----------------------------------------------------------------------------


def name_filter(select) -> Callable[[str], bool]:
    """A layer-name predicate from True / False / None (no layer) / a callable / an iterable of names."""
    if select is None or select is False:
        return lambda name: False
    if select is True:
        return lambda name: True
    if callable(select):
        return select
    return frozenset(select).__contains__


def w8a8_linears(
    *,
    path: str | None = None,
    quantize: bool | Iterable[str] | Callable[[str], bool] | None = None,
    protected_reason: str = "protected in checkpoint (stored bf16)",
    dtype: torch.dtype | None = None,
) -> LinearFactory:
    """Factory: int8 entries -> W8A8Linear; float entries -> FloatLinear (path 'bf16', with a reason).

    Args:
        path: force a GEMM path for every W8A8 layer (None = automatic: fused where it can run).
        quantize: float layers to quantize here (names, predicate, True = all); default none —
            read_branch already quantized what the file/recipe asked for.
        protected_reason: registry reason shown for float layers.
        dtype: cast float weights / biases to this dtype (None = keep).
    """
    should_quantize = name_filter(quantize)

    def build(spec: LinearSpec, entries: dict | None) -> nn.Module:
        if entries is None:
            shell = {
                "weight": torch.zeros(spec.out_features, spec.in_features, dtype=torch.int8),
                "weight_scale": torch.zeros(spec.out_features),
                "bias": torch.zeros(spec.out_features) if spec.bias else None,
            }
            return W8A8Linear.from_entries(shell, site=spec.site, path=path)
        if is_quantized_entries(entries):
            return W8A8Linear.from_entries(entries, site=spec.site, path=path)
        weight, bias = entries["weight"], entries.get("bias")
        if should_quantize(spec.name):
            return W8A8Linear.from_float(weight, bias, site=spec.site, path=path)
        if dtype is not None:
            weight = weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        reason = protected_reason if spec.name.startswith("layers.") else "unquantized top-level layer"
        return FloatLinear(weight, bias, site=spec.site, reason=reason)

    return build


def dequant_linears() -> LinearFactory:
    """Factory for the 'phantom INT8' comparison: the same int8 operands through dequant-bf16."""
    return w8a8_linears(path=kernels.PATH_DEQUANT)


def float_linears(*, dtype: torch.dtype | None = None, record: bool = False) -> LinearFactory:
    """Factory for the float reference: float entries as they are, int8 entries dequantized.

    ``record``: route through kernels.float_linear so the registry lists the layers as 'bf16'.
    """

    def build(spec: LinearSpec, entries: dict | None) -> nn.Module:
        site = spec.site if record else None
        if entries is None:
            weight = torch.empty(spec.out_features, spec.in_features, dtype=dtype or torch.float32)
            bias = torch.zeros(spec.out_features, dtype=weight.dtype) if spec.bias else None
            return FloatLinear(weight, bias, site=site, reason="float reference")
        weight, bias = entries["weight"], entries.get("bias")
        target = dtype or (torch.float32 if weight.dtype == torch.int8 else weight.dtype)
        if weight.dtype == torch.int8:
            weight = dequantize_entries(entries, target)
        weight = weight.to(target)
        bias = None if bias is None else bias.to(target)
        return FloatLinear(weight, bias, site=site, reason="float reference")

    return build
