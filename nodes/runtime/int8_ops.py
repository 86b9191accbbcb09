"""Custom operations that make ComfyUI's native Ideogram 4 model run its linears on the fused INT8 path.

``make_ops(compute_dtype)`` returns a subclass of ComfyUI's ``mixed_precision_ops`` container whose Linear and
RMSNorm put this module's ``Int8Linear`` / ``FoldedRMSNorm`` in front of ComfyUI's own: LayerNorm and Embedding
(with ``out_dtype``) stay ComfyUI's, RMSNorm only gains LoRA conversions, and the Linear keeps
everything model management relies on: ``comfy_cast_weights`` offloading (weights cast/streamed
per call in lowvram mode), ``.to()`` re-wrapping of the int8 ``QuantizedTensor`` weight,
``state_dict()`` in comfy_quant form, and ``convert_weight``/``set_weight`` so a LoRA merged in
full-load mode is requantized and stays INT8.

What the Linear adds:
* ``_forward(input, weight, bias)`` — the narrowest override point: an ``int8_tensorwise`` QuantizedTensor weight
  goes to ``kernels.w8a8_linear`` (ConvRot rotation first), a float weight (a protected layer, or one ComfyUI
  dequantized for a lowvram LoRA) to ``kernels.float_linear``, a ``float8_e4m3fn`` weight to ``kernels.fp8_linear``;
  each call is recorded as ``<label>/<module path>`` with its path and reason for the panel.
* ``input_smooth`` (SmoothQuant vector, no slot in ComfyUI's format): loaded, saved, moved and cast with the module;
  LoRA deltas are always applied to the real W (the int8 weight stores W·diag(s)).
* the smoothing fold (``ideogram4.smooth_fold``, at load): ``input_folded`` f is the part of s divided out upstream,
  so the GEMM divides by s / f only (``input_divisor``), and LoRA undoes / redoes the folds around the weight
  functions (``output_folded``, ``RMSNorm.ideogram4_fold``; ``link_folds`` sets them after a load).
* ``run_every_op()`` (interruption) is called by the inherited ``forward``.

How each of these works, w1|w3 as one GEMM (``ffn_fusion``), the bypass check that counts the calls reaching the op
(``op_calls``, ``op_coverage``) and what changes under torch.compile: docs/design/comfyui-ops.md.
"""

from __future__ import annotations

import contextlib
import functools

import comfy.float
import comfy.model_management
import comfy.ops
import torch
from comfy.quant_ops import QuantizedTensor

from ... import kernels
from ...ideogram4.comfy_form import FOLDED_KEY, SMOOTH_KEY
from ...ideogram4.smooth_fold import (
    folded_rows,
    linked_folds,
    real_to_input,
    real_to_stored,
    refold_norm,
    runtime_divisor,
    stored_to_real,
    unfold_norm,
)
from ...ideogram4.w8a8_module import w8a8_forward
from ...kernels import model_notes
from ...kernels import ops as kernel_ops
from ...kernels.fp8_gemm import select_fp8_path

_is_compiling = torch.compiler.is_compiling  # True while dynamo traces: module counters are not touched then
INT8_LAYOUT = "TensorWiseINT8Layout"
FP8_LAYOUTS = ("TensorCoreFP8E4M3Layout", "TensorCoreFP8Layout")  # ComfyUI's float8_e4m3fn (per-tensor scale)
REASON_FORCED_FLOAT = "forced by the GEMM path widget (dequant-bf16)"
REASON_PROTECTED = "protected in checkpoint (stored bf16)"
REASON_TOP = "unquantized top-level layer"
REASON_DEQUANT = (
    "weight dequantized by ComfyUI for a float GEMM (LoRA applied on the fly in lowvram mode, or a "
    "forced cast); merge LoRAs in full-load mode to keep INT8"
)
REASON_DEQUANT_FP8 = (
    "fp8 weight dequantized by ComfyUI for a float GEMM (LoRA applied on the fly in lowvram mode, or a forced "
    "cast); merge LoRAs in full-load mode to keep the fused FP8 GEMM"
)
REASON_FULL_PRECISION = (
    "weight dequantized by ComfyUI before the pack's op: this layer has ComfyUI's "
    "full-precision matmul set (_full_precision_mm), a float GEMM"
)


def is_int8_weight(weight) -> bool:
    return isinstance(weight, QuantizedTensor) and _layout_name(weight) == INT8_LAYOUT


def _forced_float(gemm_path: str | None) -> str | None:
    """The reason an fp8 layer runs float (the model's GEMM path forced to dequant-bf16), else None."""
    return REASON_FORCED_FLOAT if gemm_path == kernels.PATH_DEQUANT else None


def is_fp8_weight(weight) -> bool:
    return isinstance(weight, QuantizedTensor) and _layout_name(weight) in FP8_LAYOUTS


def runs_packs_op(weight) -> bool:
    """A weight whose linear runs through the pack's quantized op: int8, or fp8 (a protected layer stored fp8)."""
    return is_int8_weight(weight) or is_fp8_weight(weight)


def _layout_name(qt) -> str:
    layout = getattr(qt, "_layout_cls", None)
    return layout if isinstance(layout, str) else getattr(layout, "__name__", str(layout))


@contextlib.contextmanager
def _around_weight_functions(module, before, after):
    """ComfyUI applies ``module.weight_function`` to the cast weight on its float path: run ``before`` first and
    ``after`` last for the duration (the module's own list is restored, even on an exception)."""
    had_own = "weight_function" in module.__dict__
    fns = module.weight_function
    module.weight_function = [f for f in (before, *fns, after) if f is not None]
    try:
        yield
    finally:
        if had_own:
            module.weight_function = fns
        else:
            del module.weight_function


class Int8Linear:
    """The pack's Linear, mixed in front of a ``mixed_precision_ops`` Linear by ``make_ops``."""

    ideogram4_int8 = True

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.register_parameter(SMOOTH_KEY, None)
        self.register_parameter(FOLDED_KEY, None)
        self.register_buffer("input_divisor", None, persistent=False)  # s / f: what the GEMM path divides by
        self.output_folded: torch.Tensor | None = None  # float32 [N]: rows divided by a consumer's fold
        self.smooth_note: str | None = None  # the panel's note when a divide remains (smooth_fold)
        self.site: str | None = None  # "<label>/<module path>", set by label_sites()
        self.gemm_path: str | None = None  # forced GEMM path (None: automatic)
        self.float_reason = REASON_PROTECTED
        self.op_calls = 0  # calls that reached the pack's op (op_coverage reads it around each forward)

    # -- loading / saving -----------------------------------------------------------
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        vectors = {key: state_dict.pop(prefix + key, None) for key in (SMOOTH_KEY, FOLDED_KEY)}
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        for key, vec in vectors.items():
            if vec is not None:
                if not is_int8_weight(self.weight):
                    error_msgs.append(f"{prefix}{key}: a smoothing vector needs an int8 weight")
                    return
                if vec.numel() != self.in_features:
                    error_msgs.append(f"{prefix}{key}: {vec.numel()} values for K={self.in_features}")
                    return
                device = self.factory_kwargs["device"]
                value = vec.reshape(self.in_features).to(device=device, dtype=torch.float32)
                setattr(self, key, torch.nn.Parameter(value, requires_grad=False))
            if prefix + key in missing_keys:
                missing_keys.remove(prefix + key)
        self.refresh_divisor()

    def refresh_divisor(self) -> None:
        """``input_divisor`` = input_smooth / input_folded (None after a full fold): what the GEMM path
        divides the input by. Derived from the two saved vectors, so not saved itself."""
        s = None if self.input_smooth is None else self.input_smooth.detach()
        f = None if self.input_folded is None else self.input_folded.detach()
        self.input_divisor = runtime_divisor(s, f)

    def state_dict(self, *args, destination=None, prefix="", **kwargs):
        sd = super().state_dict(*args, destination=destination, prefix=prefix, **kwargs)
        for key in (SMOOTH_KEY, FOLDED_KEY):
            if getattr(self, key) is not None:
                sd[prefix + key] = getattr(self, key)
        return sd

    # -- LoRA (ModelPatcher.patch_weight_to_device): functions see the real W (smooth_fold's inverse) ---------
    def _has_folds(self) -> bool:
        return is_int8_weight(self.weight) and (self.input_smooth is not None or self.output_folded is not None)

    def _to_real(self, w: torch.Tensor) -> torch.Tensor:
        return stored_to_real(w, self.input_smooth, self.output_folded)

    def _to_input(self, w: torch.Tensor) -> torch.Tensor:
        return real_to_input(w, self.input_folded, self.output_folded)

    def convert_weight(self, weight, inplace=False, **kwargs):
        w = super().convert_weight(weight, inplace=inplace, **kwargs)
        if isinstance(weight, QuantizedTensor) and self._has_folds():
            w = self._to_real(w)
        return w

    def set_weight(self, weight, inplace_update=False, seed=None, return_weight=False, **kwargs):
        if self._has_folds():
            weight = real_to_stored(weight, self.input_smooth, self.output_folded)
        return super().set_weight(
            weight, inplace_update=inplace_update, seed=seed, return_weight=return_weight, **kwargs
        )

    # -- forward ------------------------------------------------------------------------
    def _float_path(self) -> bool:
        return bool(
            self._full_precision_mm
            or getattr(self, "comfy_force_cast_weights", False)
            or len(self.weight_function)
            or len(self.bias_function)
        )

    def forward(self, input, *args, **kwargs):
        if is_fp8_weight(self.weight) and not self._float_path() and not isinstance(input, QuantizedTensor):
            # ComfyUI's forward would quantize the input per tensor for its own fp8 matmul; the pack's op quantizes
            # per token: the cast (offload, streaming) is ComfyUI's, as for an int8 weight
            comfy.ops.run_every_op()
            return self.forward_comfy_cast_weights(input, input.dtype, weight_only_quant=True)
        if not self._has_folds() or not self._float_path():
            return super().forward(input, *args, **kwargs)
        # ComfyUI will dequantize (the stored weight) and run the weight functions (LoRA) on it: undo the
        # smoothing and the output fold first so the functions see the real W, and re-apply what the
        # module's input and its consumer expect last (F.linear(x / f, W'·diag(f)) = F.linear(x, W')).
        after = self._to_input if (self.input_folded is not None or self.output_folded is not None) else None
        with _around_weight_functions(self, self._to_real, after):
            return super().forward(input, *args, **kwargs)

    def _forward(self, input, weight, bias):
        if not _is_compiling():  # a traced graph's calls are counted by the registered op (op_calls())
            self.op_calls += 1
        site = self.site
        if is_int8_weight(weight):
            if _is_compiling() and weight.device == self.weight.device:
                # a resident weight is handed over as the parameter itself, but dynamo lost track of where
                # it came from (it passed through ComfyUI's cast context) and cannot read its Params then;
                # the op finds the site by it (a per-layer constant would recompile every block: sites.py)
                weight, site = self.weight, None
            params = weight._params
            qdata, scale = weight._qdata, params.scale
            if getattr(params, "transposed", False):
                return super()._forward(input, weight, bias)
            smooth = self.input_divisor
            if smooth is not None and smooth.device != input.device:
                smooth = comfy.model_management.cast_to_device(smooth, input.device, None)
            group = params.convrot_groupsize if getattr(params, "convrot", False) else None
            if bias is not None and bias.dtype != input.dtype:
                bias = bias.to(input.dtype)
            return w8a8_forward(input, qdata, scale, bias, smooth, group, path=self.gemm_path, site=site)
        if is_fp8_weight(weight):
            if _is_compiling() and weight.device == self.weight.device:
                weight, site = self.weight, None  # as for an int8 weight above: the op finds the site
            forced = _forced_float(self.gemm_path)
            return kernel_ops.fp8_linear(input, weight._qdata, weight._params.scale, bias, site, forced)
        if isinstance(weight, QuantizedTensor):
            weight = weight.dequantize()
        if not isinstance(self.weight, QuantizedTensor):
            reason = self.float_reason
            if (
                _is_compiling()
                and not len(self.weight_function)
                and weight.device == self.weight.device
                and weight.dtype == self.weight.dtype
            ):
                weight, site = self.weight, None  # the parameter itself, uncast: the op finds the site
        elif self._full_precision_mm:
            reason = REASON_FULL_PRECISION
        else:
            reason = REASON_DEQUANT_FP8 if is_fp8_weight(self.weight) else REASON_DEQUANT
        return kernel_ops.float_linear(input, weight, bias, site, reason)


def quantizes_plain_rows(linear) -> bool:
    """Whether ``linear`` (a pack Linear) quantizes its input per token with nothing to divide or rotate first (an
    int8 weight, its smoothing folded upstream, no ConvRot, no float path): the input a block's pre-norm can hand
    over already quantized (``kernels/handoff.py``). A GEMM path that quantizes nothing (a forced dequant-bf16) just
    leaves the offer unclaimed."""
    weight = getattr(linear, "weight", None)
    if not getattr(linear, "ideogram4_int8", False) or not is_int8_weight(weight) or linear.input_divisor is not None:
        return False
    params = weight._params
    if getattr(params, "convrot", False) or getattr(params, "transposed", False):
        return False
    return not linear._float_path()


class FoldedRMSNorm:
    """ComfyUI's RMSNorm (mixed in front of it by ``make_ops``), plus LoRA conversions for a weight that carries
    a folded smoothing vector: ``ideogram4_fold`` (float32 [dim], set by ``link_folds``) = what the weight was
    divided by. LoRA functions see the real weight; the stored one stays divided."""

    ideogram4_fold: torch.Tensor | None = None

    def convert_weight(self, weight, inplace=False, **kwargs):
        fold = self.ideogram4_fold
        return weight if fold is None else unfold_norm(weight, fold)

    def set_weight(self, weight, inplace_update=False, seed=None, return_weight=False, **kwargs):
        # what ModelPatcher does for a weight without set_weight, on the re-folded value
        fold = self.ideogram4_fold
        if fold is not None:
            weight = refold_norm(weight, fold)
        out = comfy.float.stochastic_rounding(weight, self.weight.dtype, seed=seed)
        if return_weight:
            return out
        if inplace_update:
            self.weight.data.copy_(out)
        else:
            self.weight = torch.nn.Parameter(out, requires_grad=False)

    def _refold(self, w: torch.Tensor) -> torch.Tensor:
        return refold_norm(w, self.ideogram4_fold)

    def _unfold(self, w: torch.Tensor) -> torch.Tensor:
        return unfold_norm(w, self.ideogram4_fold)

    def forward(self, *args, **kwargs):
        if self.ideogram4_fold is None or not len(self.weight_function):
            return super().forward(*args, **kwargs)
        with _around_weight_functions(self, self._unfold, self._refold):
            return super().forward(*args, **kwargs)


@functools.lru_cache(maxsize=8)
def make_ops(compute_dtype: torch.dtype = torch.bfloat16):
    """The ops container for ``model_config.custom_operations``: ComfyUI's ``mixed_precision_ops`` for
    ``compute_dtype`` with ``Int8Linear`` / ``FoldedRMSNorm`` in front of its Linear / RMSNorm (one class per
    compute dtype, cached: ComfyUI builds that base per dtype)."""
    base = comfy.ops.mixed_precision_ops(quant_config={}, compute_dtype=compute_dtype)

    class Ideogram4Int8Ops(base):
        class Linear(Int8Linear, base.Linear):
            pass

        class RMSNorm(FoldedRMSNorm, base.RMSNorm):
            pass

    Ideogram4Int8Ops.__name__ = f"Ideogram4Int8Ops_{str(compute_dtype).replace('torch.', '')}"
    return Ideogram4Int8Ops


def op_calls(module) -> int:
    """Calls of the pack's Linear ``module`` that reached the pack's op: its own count (eager forwards) plus the
    calls a torch.compile'd graph made of the registered ops under its call site (counted inside the op)."""
    return module.op_calls + compiled_calls(module)


def compiled_calls(module) -> int:
    """Calls a torch.compile'd graph made of the registered ops under ``module``'s call site, ever (0 without a
    site): more than 0 means a compiled graph has run this layer through the pack's op."""
    return kernel_ops.OP_CALLS[module.site] if kernel_ops.OP_CALLS and module.site else 0


def int8_linears(diffusion_model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The pack's Linear modules of a model, by module path."""
    return {n: m for n, m in diffusion_model.named_modules() if getattr(m, "ideogram4_int8", False)}


def label_sites(diffusion_model: torch.nn.Module, label: str, gemm_path: str | None = None) -> int:
    """Name every linear's registry call site "<label>/<module path>", set its forced GEMM path, and give the
    registry its smoothing note (a divide left at run time, and why)."""
    n = 0
    for name, m in int8_linears(diffusion_model).items():
        m.site = f"{label}/{name}"
        m.gemm_path = gemm_path
        m.float_reason = REASON_PROTECTED if name.startswith("layers.") else REASON_TOP
        kernels.REGISTRY.set_note(m.site, m.smooth_note)
        kernels.SITES.track(m, _site_tensors)
        n += 1
    for m in diffusion_model.modules():  # ffn_fusion's gate/up pairs: the label their compiled split note names
        if getattr(type(m), "ideogram4_pair", False):
            m.site_label = label
    return n


def site_label(diffusion_model: torch.nn.Module) -> str | None:
    """The registry label ("conditional", ...) of a model whose linears ``label_sites`` named; None without them."""
    for m in diffusion_model.modules():
        site = getattr(m, "site", None) if getattr(m, "ideogram4_int8", False) else None
        if site:
            return site.split("/", 1)[0]
    return None


def _site_tensors(m) -> tuple:
    """The tensor a compiled graph hands the pack's op for ``m`` (``kernels.sites``): its int8 data or its weight."""
    w = m.weight
    return (w._qdata,) if runs_packs_op(w) else (w,)


def link_folds(diffusion_model: torch.nn.Module, config, report=None) -> int:
    """After a load: tell every producer of a folded smoothing vector what it carries (a norm's
    ``ideogram4_fold``, a linear's ``output_folded`` rows) so LoRA conversions can undo it, and give each linear
    its panel note from ``report`` (a ``smooth_fold.FoldReport``; None keeps the notes). Returns the number of
    folded linears linked."""
    modules = dict(diffusion_model.named_modules())
    linears = int8_linears(diffusion_model)
    linked = 0
    for site, f in linked_folds(config, {name: m.input_folded for name, m in linears.items()}):
        producer = modules.get(site.producer)
        if producer is None:
            continue
        if site.kind == "norm":
            producer.ideogram4_fold = f
        else:
            producer.output_folded = folded_rows(producer.output_folded, producer.out_features, site, f)
        linked += 1
    if report is not None:
        for name, m in linears.items():
            m.smooth_note = report.note(name)
    return linked


def predicted_paths(diffusion_model: torch.nn.Module, device: torch.device) -> dict[str, tuple[str, str]]:
    """{module path: (GEMM path, reason)} each linear will take on ``device`` (for the summary/panel)."""
    out = {}
    for name, m in int8_linears(diffusion_model).items():
        if is_int8_weight(m.weight):
            try:
                out[name] = kernels.select_path(device, m.out_features, m.in_features, m.gemm_path)
            except ValueError as exc:
                out[name] = (kernels.PATH_DEQUANT, str(exc))
        elif is_fp8_weight(m.weight):
            out[name] = select_fp8_path(device, _forced_float(m.gemm_path))
        else:
            out[name] = (kernels.PATH_BF16, m.float_reason)
    return out


def declare_sites(diffusion_model: torch.nn.Module, label: str, device: torch.device) -> dict[str, tuple[str, str]]:
    """Replace the registry's records of ``label`` by this model's linears (0 calls, predicted path) and drop the
    notes a model of that label left (its runtime writes this model's own as it runs)."""
    paths = predicted_paths(diffusion_model, device)
    model_notes.forget(label)
    for name, m in int8_linears(diffusion_model).items():
        path, reason = paths[name]
        kernels.REGISTRY.declare(f"{label}/{name}", path, reason, m.out_features, m.in_features, note=m.smooth_note)
    return paths


__all__ = [
    "make_ops",
    "label_sites",
    "site_label",
    "declare_sites",
    "predicted_paths",
    "int8_linears",
    "is_int8_weight",
    "is_fp8_weight",
    "runs_packs_op",
    "link_folds",
    "op_calls",
    "compiled_calls",
]
