"""Custom operations that make ComfyUI's native Ideogram 4 model run its linears on the fused INT8 path.

``make_ops(compute_dtype)`` returns a subclass of ComfyUI's ``mixed_precision_ops`` container, so
RMSNorm, LayerNorm and Embedding (with ``out_dtype``) stay ComfyUI's own, and the Linear keeps
everything model management relies on: ``comfy_cast_weights`` offloading (weights cast/streamed
per call in lowvram mode), ``.to()`` re-wrapping of the int8 ``QuantizedTensor`` weight,
``state_dict()`` in comfy_quant form, and ``convert_weight``/``set_weight`` so a LoRA merged in
full-load mode is requantized and stays INT8.

What the Linear adds (comfyui-integration.md §3.4):
* ``_forward(input, weight, bias)`` — the narrowest override point: an ``int8_tensorwise``
  QuantizedTensor weight goes to ``kernels.w8a8_linear`` (fused Triton GEMM where it can run;
  ConvRot activation rotation first), recorded as ``<label>/<module path>``; a float weight
  (bf16-protected / top-level layers, or a weight ComfyUI dequantized to apply a LoRA in lowvram
  mode) goes to ``kernels.float_linear`` so the panel lists it as ``bf16`` with the reason.
* ``input_smooth`` (SmoothQuant vector, no slot in ComfyUI's format): loaded from
  ``<m>.input_smooth``, saved back, moved with the module, cast to the input's device when the
  module is offloaded. The int8 weight stores W·diag(s), so ``convert_weight`` divides the
  dequantized weight by s and ``set_weight`` multiplies by s before requantizing, and when
  ComfyUI dequantizes for a float GEMM (lowvram LoRA, forced cast) the division is put in front
  of its weight functions — LoRA deltas are always applied to the real W.
* ``run_every_op()`` (interruption) is called by the inherited ``forward``.

w1|w3 as one GEMM with the SwiGLU in its epilogue: a native MODEL keeps ``feed_forward.w1`` / ``w3`` as separate
[F, K] parameters (LoRA keys, state_dict, per-module offload move each on its own; an interleaved copy would add
~3.6 GiB per branch, and views of one buffer cannot be [F, K] matrices). ``ffn_fusion`` runs each block's pair
through ``kernels.swiglu_w8a8_pair``, which reads the gate and up tiles from the two weights as they are, and
falls back to these modules' own forwards where that call cannot serve (offloaded weights, a LoRA applied on the
fly, ...); ``w2`` stays its own linear.

Every call that reaches the op counts in ``op_calls`` (the fused pair counts on both modules): ``op_coverage``
checks after each forward that every quantized linear of the model ran through it — a newer ComfyUI may compute
a layer its own way without calling ``Linear.forward`` — and labels the model when one did not.
"""

from __future__ import annotations

import functools

import comfy.model_management
import comfy.ops
import torch
from comfy.quant_ops import QuantizedTensor

from .. import kernels
from ..ideogram4.comfy_form import SMOOTH_KEY
from ..ideogram4.w8a8_module import w8a8_forward

INT8_LAYOUT = "TensorWiseINT8Layout"
REASON_PROTECTED = "protected in checkpoint (stored bf16)"
REASON_TOP = "unquantized top-level layer"
REASON_DEQUANT = ("weight dequantized by ComfyUI for a float GEMM (LoRA applied on the fly in lowvram mode, or a "
                  "forced cast); merge LoRAs in full-load mode to keep INT8")  # fmt: skip
REASON_FULL_PRECISION = ("weight dequantized by ComfyUI before the pack's op: this layer has ComfyUI's "
                         "full-precision matmul set (_full_precision_mm), a float GEMM")  # fmt: skip


def is_int8_weight(weight) -> bool:
    return isinstance(weight, QuantizedTensor) and _layout_name(weight) == INT8_LAYOUT


def _layout_name(qt) -> str:
    layout = getattr(qt, "_layout_cls", None)
    return layout if isinstance(layout, str) else getattr(layout, "__name__", str(layout))


@functools.lru_cache(maxsize=8)
def make_ops(compute_dtype: torch.dtype = torch.bfloat16):
    """The ops container for ``model_config.custom_operations`` (one class per compute dtype)."""
    base = comfy.ops.mixed_precision_ops(quant_config={}, compute_dtype=compute_dtype)

    class Ideogram4Int8Ops(base):
        class Linear(base.Linear):
            ideogram4_int8 = True

            def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
                super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
                self.register_parameter(SMOOTH_KEY, None)
                self.site: str | None = None  # "<label>/<module path>", set by label_sites()
                self.gemm_path: str | None = None  # forced GEMM path (None: automatic)
                self.float_reason = REASON_PROTECTED
                self.op_calls = 0  # calls that reached the pack's op (op_coverage reads it around each forward)

            # -- loading / saving -----------------------------------------------------------
            def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs):  # fmt: skip
                smooth = state_dict.pop(prefix + SMOOTH_KEY, None)
                super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                              unexpected_keys, error_msgs)  # fmt: skip
                if smooth is not None:
                    if not is_int8_weight(self.weight):
                        error_msgs.append(f"{prefix}{SMOOTH_KEY}: a smoothing vector needs an int8 weight")
                        return
                    if smooth.numel() != self.in_features:
                        error_msgs.append(f"{prefix}{SMOOTH_KEY}: {smooth.numel()} values for K={self.in_features}")
                        return
                    device = self.factory_kwargs["device"]
                    value = smooth.reshape(self.in_features).to(device=device, dtype=torch.float32)
                    self.input_smooth = torch.nn.Parameter(value, requires_grad=False)
                if prefix + SMOOTH_KEY in missing_keys:
                    missing_keys.remove(prefix + SMOOTH_KEY)

            def state_dict(self, *args, destination=None, prefix="", **kwargs):
                sd = super().state_dict(*args, destination=destination, prefix=prefix, **kwargs)
                if self.input_smooth is not None:
                    sd[prefix + SMOOTH_KEY] = self.input_smooth
                return sd

            # -- LoRA (ModelPatcher.patch_weight_to_device) -----------------------------------
            def _smooth_like(self, w: torch.Tensor) -> torch.Tensor:
                return self.input_smooth.to(device=w.device, dtype=w.dtype)

            def convert_weight(self, weight, inplace=False, **kwargs):
                w = super().convert_weight(weight, inplace=inplace, **kwargs)
                if self.input_smooth is not None and isinstance(weight, QuantizedTensor):
                    w = w / self._smooth_like(w)
                return w

            def set_weight(self, weight, inplace_update=False, seed=None, return_weight=False, **kwargs):
                if self.input_smooth is not None and is_int8_weight(self.weight):
                    weight = weight * self._smooth_like(weight)
                return super().set_weight(weight, inplace_update=inplace_update, seed=seed,
                                          return_weight=return_weight, **kwargs)  # fmt: skip

            # -- forward ------------------------------------------------------------------------
            def _unsmooth(self, w: torch.Tensor) -> torch.Tensor:
                return w / self._smooth_like(w)

            def _float_path(self) -> bool:
                return bool(self._full_precision_mm or getattr(self, "comfy_force_cast_weights", False)
                            or len(self.weight_function) or len(self.bias_function))  # fmt: skip

            def forward(self, input, *args, **kwargs):
                if self.input_smooth is None or not is_int8_weight(self.weight) or not self._float_path():
                    return super().forward(input, *args, **kwargs)
                # ComfyUI will dequantize (W·diag(s)) and run the weight functions (LoRA) on it:
                # undo the smoothing first so the functions and the float GEMM see the real W.
                had_own = "weight_function" in self.__dict__
                fns = self.weight_function
                self.weight_function = [self._unsmooth, *fns]
                try:
                    return super().forward(input, *args, **kwargs)
                finally:
                    if had_own:
                        self.weight_function = fns
                    else:
                        del self.weight_function

            def _forward(self, input, weight, bias):
                self.op_calls += 1
                if is_int8_weight(weight):
                    params = weight._params
                    qdata, scale = weight._qdata, params.scale
                    if getattr(params, "transposed", False):
                        return super()._forward(input, weight, bias)
                    smooth = self.input_smooth
                    if smooth is not None and smooth.device != input.device:
                        smooth = comfy.model_management.cast_to_device(smooth, input.device, None)
                    group = params.convrot_groupsize if getattr(params, "convrot", False) else None
                    if bias is not None and bias.dtype != input.dtype:
                        bias = bias.to(input.dtype)
                    return w8a8_forward(input, qdata, scale, bias, smooth, group, path=self.gemm_path, site=self.site)
                if isinstance(weight, QuantizedTensor):
                    weight = weight.dequantize()
                if not isinstance(self.weight, QuantizedTensor):
                    reason = self.float_reason
                elif self._full_precision_mm:
                    reason = REASON_FULL_PRECISION
                else:
                    reason = REASON_DEQUANT
                return kernels.float_linear(input, weight, bias, site=self.site, reason=reason)

    Ideogram4Int8Ops.__name__ = f"Ideogram4Int8Ops_{str(compute_dtype).replace('torch.', '')}"
    return Ideogram4Int8Ops


def int8_linears(diffusion_model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The pack's Linear modules of a model, by module path."""
    return {n: m for n, m in diffusion_model.named_modules() if getattr(m, "ideogram4_int8", False)}


def label_sites(diffusion_model: torch.nn.Module, label: str, gemm_path: str | None = None) -> int:
    """Name every linear's registry call site "<label>/<module path>" and set its forced GEMM path."""
    n = 0
    for name, m in int8_linears(diffusion_model).items():
        m.site = f"{label}/{name}"
        m.gemm_path = gemm_path
        m.float_reason = REASON_PROTECTED if name.startswith("layers.") else REASON_TOP
        n += 1
    return n


def predicted_paths(diffusion_model: torch.nn.Module, device: torch.device) -> dict[str, tuple[str, str]]:
    """{module path: (GEMM path, reason)} each linear will take on ``device`` (for the summary/panel)."""
    out = {}
    for name, m in int8_linears(diffusion_model).items():
        if is_int8_weight(m.weight):
            try:
                out[name] = kernels.select_path(device, m.out_features, m.in_features, m.gemm_path)
            except ValueError as exc:
                out[name] = (kernels.PATH_DEQUANT, str(exc))
        else:
            out[name] = (kernels.PATH_BF16, m.float_reason)
    return out


def declare_sites(diffusion_model: torch.nn.Module, label: str, device: torch.device) -> dict[str, tuple[str, str]]:
    """Replace the registry's records of ``label`` by this model's linears (0 calls, predicted path)."""
    paths = predicted_paths(diffusion_model, device)
    kernels.REGISTRY.clear(model=label)
    for name, m in int8_linears(diffusion_model).items():
        path, reason = paths[name]
        kernels.REGISTRY.declare(f"{label}/{name}", path, reason, m.out_features, m.in_features)
    return paths


__all__ = ["make_ops", "label_sites", "declare_sites", "predicted_paths", "int8_linears", "is_int8_weight"]
