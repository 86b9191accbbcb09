"""How one linear layer is stored in a source, checked from the header (no tensor data).

Kinds:
  w8a8   transformerlab: <m>.wq int8 [N,K], <m>.ws [N] | [N,1] (f32/bf16/f16), <m>.smooth [K]
  int8   ComfyUI int8_tensorwise (optionally ConvRot) or this pack's own form:
         <m>.weight int8, <m>.weight_scale [] | [1] | [N] | [N,1], <m>.comfy_quant / <m>.input_smooth /
         <m>.input_folded (a model saved after ``smooth_fold``: the part of input_smooth folded upstream) /
         <m>.convrot_groupsize
  fp8    ComfyUI fp8_scaled: <m>.weight float8, <m>.weight_scale (or legacy <m>.scale_weight)
  float  <m>.weight float32 / bf16 / fp16
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import LinearSpec
from ..errors import TensorMismatchError, describe
from .comfy_quant import FP8_FORMATS, decode_comfy_quant
from .source import Source

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
IGNORED_SUFFIXES = ("input_scale", "scale_input")  # static fp8 activation scales: W8A8 quantizes per token


@dataclasses.dataclass
class LinearPlan:
    spec: LinearSpec
    source: Source
    kind: str
    weight: str
    scale: str | None = None
    smooth: str | None = None
    folded: str | None = None
    bias_source: Source | None = None
    group: int | None = None
    comfy_format: str | None = None
    quantize: bool = False
    fp8: bool = False  # not quantized to W8A8: kept / stored as float8 e4m3 with a per-tensor scale
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    def _fp8_or(self, otherwise: str) -> str:
        return " -> float8 e4m3 (one scale per tensor)" if self.fp8 else otherwise

    def describe(self) -> str:
        """One line for logs / the panel: how the layer was stored and what it became."""
        src = self.source.label.rsplit("/", 1)[-1]
        if self.kind == "w8a8":
            what = "W8A8 (.wq/.ws" + (", smooth" if self.smooth else "") + ")"
        elif self.kind == "int8":
            what = f"int8 per-channel ({self.comfy_format or 'no comfy_quant marker'}"
            what += f", ConvRot {self.group}" if self.group else ""
            what += ", smoothing folded upstream)" if self.folded else ")"
        elif self.kind == "fp8":
            dt = str(self.source.dtype(self.weight)).replace("torch.", "")
            what = f"{dt} scaled" + (" -> W8A8, quantized on load" if self.quantize else self._fp8_or(" -> float"))
        else:
            dt = str(self.source.dtype(self.weight)).replace("torch.", "")
            what = dt + (" -> W8A8, quantized on load" if self.quantize else self._fp8_or(""))
        text = f"{what} from {src}"
        return text + ("; " + "; ".join(self.notes) if self.notes else "")


def _err(problem, source, key, expected=None, found=None, fix=None):
    return TensorMismatchError(
        problem, file=source.label, key=source.file_key(key), expected=expected, found=found, fix=fix
    )


def check_float(source: Source, key: str, shape: tuple, what: str) -> None:
    dt, sh = source.dtype(key), source.shape(key)
    if dt not in FLOAT_DTYPES:
        raise _err(f"{what} has the wrong dtype", source, key, "float32 / bfloat16 / float16", describe((dt, sh)))
    if tuple(sh) != tuple(shape):
        raise _err(
            f"{what} has the wrong shape",
            source,
            key,
            f"{list(shape)}",
            describe((dt, sh)),
            "the file does not match the Ideogram 4 architecture (or the config passed)",
        )


def _check_vector(source, key, n, what, allow_scalar=False):
    dt, sh = source.dtype(key), tuple(source.shape(key))
    ok_shapes = [(n,), (n, 1)] + ([(), (1,)] if allow_scalar else [])
    if dt not in FLOAT_DTYPES:
        raise _err(f"{what} has the wrong dtype", source, key, "float32 / bfloat16 / float16", describe((dt, sh)))
    if sh not in ok_shapes:
        want = " or ".join(str(list(s)) for s in ok_shapes)
        raise _err(f"{what} has the wrong shape", source, key, want, describe((dt, sh)))


def classify(source: Source, spec: LinearSpec) -> LinearPlan | None:
    """The storage plan of ``spec`` in ``source``, or None if the source lacks the layer."""
    m, n, k = spec.name, spec.out_features, spec.in_features
    has = source.has
    if has(f"{m}.wq") and has(f"{m}.weight"):
        raise _err(
            "the layer is stored twice (.wq and .weight)", source, f"{m}.weight", f"{m}.wq or {m}.weight", "both"
        )
    if has(f"{m}.wq"):
        return _classify_w8a8(source, spec)
    if not has(f"{m}.weight"):
        orphans = [
            f"{m}.{s}"
            for s in ("ws", "smooth", "weight_scale", "scale_weight", "comfy_quant", "input_smooth", "input_folded")
            if has(f"{m}.{s}")
        ]
        if orphans:
            raise _err(
                "scale / smooth tensors without a weight", source, orphans[0], f"{m}.wq or {m}.weight", "neither"
            )
        return None
    key = source.use(f"{m}.weight")
    dt, sh = source.dtype(key), tuple(source.shape(key))
    if sh != (n, k):
        raise _err(
            "weight has the wrong shape",
            source,
            key,
            f"[{n}, {k}] ([out, in])",
            describe((dt, sh)),
            "the file does not match the Ideogram 4 architecture (or the config passed)",
        )
    cq = None
    if has(f"{m}.comfy_quant"):
        cq = decode_comfy_quant(
            source.load(source.use(f"{m}.comfy_quant")), file=source.label, key=source.file_key(f"{m}.comfy_quant")
        )
    if dt == torch.int8:
        plan = _classify_int8(source, spec, key, cq)
    elif dt in FP8_DTYPES:
        plan = _classify_fp8(source, spec, key, cq)
    elif dt in FLOAT_DTYPES:
        if cq is not None:
            raise _err(
                "comfy_quant marks a quantized layer but the weight is a plain float tensor",
                source,
                key,
                f"{cq['format']} storage",
                describe((dt, sh)),
            )
        plan = LinearPlan(spec, source, "float", key)
    else:
        raise _err(
            "weight has an unsupported dtype", source, key, "int8, float8 or float32/bf16/fp16", describe((dt, sh))
        )
    for suffix in IGNORED_SUFFIXES:
        if has(f"{m}.{suffix}"):
            source.use(f"{m}.{suffix}")
            plan.notes.append(f"{suffix} ignored (W8A8 quantizes activations per token)")
    return plan


def _classify_w8a8(source, spec):
    m, n, k = spec.name, spec.out_features, spec.in_features
    key = source.use(f"{m}.wq")
    dt, sh = source.dtype(key), tuple(source.shape(key))
    if dt != torch.int8:
        raise _err(".wq must hold int8 weights", source, key, "int8", describe((dt, sh)))
    if sh != (n, k):
        raise _err(".wq has the wrong shape", source, key, f"[{n}, {k}] ([out, in])", describe((dt, sh)))
    if not source.has(f"{m}.ws"):
        raise _err(
            "int8 weight without scale",
            source,
            key,
            f"{source.file_key(m + '.ws')} float [{n}] or [{n}, 1]",
            "no .ws tensor",
            "the file is incomplete or not a W8A8 checkpoint",
        )
    scale = source.use(f"{m}.ws")
    _check_vector(source, scale, n, "per-channel scale .ws")
    smooth = None
    if source.has(f"{m}.smooth"):
        smooth = source.use(f"{m}.smooth")
        _check_vector(source, smooth, k, "SmoothQuant vector .smooth")
    return LinearPlan(spec, source, "w8a8", key, scale=scale, smooth=smooth)


def _classify_int8(source, spec, key, cq):
    m, n, k = spec.name, spec.out_features, spec.in_features
    if cq is not None and cq["format"] != "int8_tensorwise":
        raise _err("comfy_quant format does not match the int8 weight", source, key, "int8_tensorwise", cq["format"])
    scale_key = next((f"{m}.{s}" for s in ("weight_scale", "scale_weight") if source.has(f"{m}.{s}")), None)
    if scale_key is None:
        raise _err(
            "int8 weight without scale",
            source,
            key,
            f"{source.file_key(m + '.weight_scale')} float32",
            "no scale tensor",
            "the file is incomplete; int8 values alone cannot be dequantized",
        )
    source.use(scale_key)
    _check_vector(source, scale_key, n, "int8 weight scale", allow_scalar=True)
    plan = LinearPlan(spec, source, "int8", key, scale=scale_key, comfy_format=cq["format"] if cq else None)
    if source.has(f"{m}.input_smooth"):
        plan.smooth = source.use(f"{m}.input_smooth")
        _check_vector(source, plan.smooth, k, "SmoothQuant vector input_smooth")
    if source.has(f"{m}.input_folded"):
        plan.folded = source.use(f"{m}.input_folded")
        _check_vector(source, plan.folded, k, "folded SmoothQuant vector input_folded")
    group = cq["convrot_groupsize"] if cq and cq["convrot"] else None
    if source.has(f"{m}.convrot_groupsize"):
        group = int(source.load(source.use(f"{m}.convrot_groupsize")))
    if group is not None:
        from ..convrot import check_group_size

        try:
            check_group_size(group)
        except ValueError as exc:
            raise _err(str(exc), source, f"{m}.comfy_quant") from None
        if k % group:
            raise _err("ConvRot group size does not divide K", source, key, f"K % {group} == 0", f"K = {k}")
        plan.group = group
    if cq and cq["full_precision_mm"]:
        plan.notes.append("full_precision_matrix_mult ignored (the W8A8 path runs the int8 GEMM)")
    return plan


def _classify_fp8(source, spec, key, cq):
    m, n = spec.name, spec.out_features
    dt = source.dtype(key)
    if cq is not None:
        want = FP8_FORMATS.get(cq["format"])
        if want != dt:
            raise _err(
                "comfy_quant format does not match the fp8 weight",
                source,
                key,
                cq["format"],
                describe((dt, source.shape(key))),
            )
    scale_key = next((f"{m}.{s}" for s in ("weight_scale", "scale_weight") if source.has(f"{m}.{s}")), None)
    plan = LinearPlan(spec, source, "fp8", key, comfy_format=cq["format"] if cq else None)
    if scale_key is None:
        plan.notes.append("no weight scale: fp8 values taken as they are (scale 1)")
    else:
        plan.scale = source.use(scale_key)
        _check_vector(source, scale_key, n, "fp8 weight scale", allow_scalar=True)
    return plan


def classify_bias(source: Source, spec: LinearSpec) -> str | None:
    key = f"{spec.name}.bias"
    if not source.has(key):
        return None
    if not spec.bias:
        raise _err(
            "the architecture has no bias for this layer",
            source,
            key,
            "no tensor",
            "a bias tensor",
            "the file does not match the Ideogram 4 architecture",
        )
    check_float(source, key, (spec.out_features,), "bias")
    return source.use(key)
