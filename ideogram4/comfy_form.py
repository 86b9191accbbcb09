"""This pack's in-memory W8A8 form <-> the per-layer ``comfy_quant`` form ComfyUI's ops load.

``read_branch`` returns a quantized linear ``<m>`` as ``<m>.weight`` int8 [N, K],
``<m>.weight_scale`` float32 [N], optional ``<m>.input_smooth`` float32 [K], optional
``<m>.convrot_groupsize``, optional ``<m>.bias``. ComfyUI's ``mixed_precision_ops`` expects
``int8_tensorwise`` layers as ``<m>.weight`` int8 [N, K], ``<m>.weight_scale`` float32 [N, 1] and a
``<m>.comfy_quant`` uint8 JSON marker (ConvRot in the marker). The smoothing vector has no slot
in ComfyUI's format: it stays ``<m>.input_smooth`` (and, after the smoothing fold, ``<m>.input_folded``:
``smooth_fold``) and the pack's ops consume it.

``to_comfy_state_dict`` converts without copying a weight (scales are reshaped views); the result
loads into ComfyUI's own Ideogram 4 model built with the pack's ops. The other direction (a native
model's ``state_dict()`` -> in-memory form, quantizing fp8 / bf16 layers on load) is
``read_branch(state_dict, branch)``: the reader accepts a dict of tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from .config import Ideogram4Config
from .errors import TensorMismatchError, few
from .formats.comfy_quant import encode_comfy_quant

SMOOTH_KEY = "input_smooth"
FOLDED_KEY = "input_folded"
INT8_FORMAT = "int8_tensorwise"
FP8_FORMAT = "float8_e4m3fn"


def int8_marker(convrot_groupsize: int | None) -> torch.Tensor:
    """The ``comfy_quant`` marker of an int8 per-channel layer (ConvRot when a group size is given)."""
    info: dict = {"format": INT8_FORMAT}
    if convrot_groupsize:
        info.update(convrot=True, convrot_groupsize=int(convrot_groupsize))
    return encode_comfy_quant(info)


def to_comfy_state_dict(state: Mapping[str, torch.Tensor], config: Ideogram4Config) -> dict[str, torch.Tensor]:
    """In-memory W8A8 form (``read_branch`` output) -> comfy_quant form, same tensors (no copies).

    Raises TensorMismatchError naming the key when the dict does not hold exactly one Ideogram 4
    branch of ``config`` (a missing tensor, an int8 weight without its scale, a stray key).
    """
    src = dict(state)
    out: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for spec in config.linears():
        m = spec.name
        w = src.pop(f"{m}.weight", None)
        if w is None:
            missing.append(f"{m}.weight")
            continue
        if tuple(w.shape) != (spec.out_features, spec.in_features):
            raise TensorMismatchError(
                "linear weight has the wrong shape",
                file="<state dict>",
                key=f"{m}.weight",
                expected=f"[{spec.out_features}, {spec.in_features}]",
                found=str(list(w.shape)),
            )
        out[f"{m}.weight"] = w
        scale = src.pop(f"{m}.weight_scale", None)
        smooth = src.pop(f"{m}.{SMOOTH_KEY}", None)
        folded = src.pop(f"{m}.{FOLDED_KEY}", None)
        group = src.pop(f"{m}.convrot_groupsize", None)
        if w.dtype == torch.int8:
            if scale is None:
                raise TensorMismatchError(
                    "int8 weight without its scale",
                    file="<state dict>",
                    key=f"{m}.weight_scale",
                    expected=f"float32 [{spec.out_features}]",
                    found="nothing",
                    fix="pass a read_branch() result",
                )
            out[f"{m}.weight_scale"] = scale.float().reshape(spec.out_features, 1)
            out[f"{m}.comfy_quant"] = int8_marker(int(group) if group is not None else None)
            if smooth is not None:
                out[f"{m}.{SMOOTH_KEY}"] = smooth.float().reshape(spec.in_features)
            if folded is not None:
                out[f"{m}.{FOLDED_KEY}"] = folded.float().reshape(spec.in_features)
        elif w.dtype == torch.float8_e4m3fn:
            if scale is None or scale.numel() != 1 or smooth is not None or group is not None or folded is not None:
                raise TensorMismatchError(
                    "a float8 e4m3 weight needs exactly one scale (ComfyUI's float8_e4m3fn form)",
                    file="<state dict>",
                    key=f"{m}.weight_scale",
                    expected="float32 [] and no smoothing / ConvRot tensors",
                    found="nothing" if scale is None else f"{scale.numel()} scale values",
                    fix="pass a read_branch() result",
                )
            out[f"{m}.weight_scale"] = scale.float().reshape(())
            out[f"{m}.comfy_quant"] = encode_comfy_quant({"format": FP8_FORMAT})
        elif scale is not None or smooth is not None or group is not None or folded is not None:
            raise TensorMismatchError(
                "a float weight carries int8 scale / smoothing tensors",
                file="<state dict>",
                key=f"{m}.weight",
                expected="int8 weight",
                found=str(w.dtype),
            )
        bias = src.pop(f"{m}.bias", None)
        if bias is not None:
            out[f"{m}.bias"] = bias
        elif spec.bias:
            missing.append(f"{m}.bias")
    for key in config.other_shapes():
        t = src.pop(key, None)
        if t is None:
            missing.append(key)
        else:
            out[key] = t
    if missing:
        raise TensorMismatchError(
            f"{len(missing)} tensors are missing",
            file="<state dict>",
            key=missing[0],
            expected="one complete Ideogram 4 branch",
            found=f"missing {few(missing)}",
            fix="pass a read_branch() result",
        )
    if src:
        raise TensorMismatchError(
            f"{len(src)} tensors are not part of the architecture",
            file="<state dict>",
            key=sorted(src)[0],
            expected="only Ideogram 4 DiT tensors",
            found=few(src),
        )
    return out


@dataclasses.dataclass(frozen=True)
class LinearInfo:
    """How one linear of a branch is stored (for the loader summary and the panel)."""

    name: str
    out_features: int
    in_features: int
    int8: bool
    smooth: bool = False
    convrot: int | None = None
    folded: bool = False
    fp8: bool = False  # a float8 e4m3 weight (a protected layer stored fp8: read_branch's float_blocks_fp8)

    @property
    def top_level(self) -> bool:
        return not self.name.startswith("layers.")


def linear_infos(state: Mapping[str, torch.Tensor], config: Ideogram4Config) -> list[LinearInfo]:
    """One LinearInfo per linear of ``config`` from an in-memory-form (or comfy-form) state dict."""
    infos = []
    for spec in config.linears():
        w = state[f"{spec.name}.weight"]
        group = state.get(f"{spec.name}.convrot_groupsize")
        if group is None and f"{spec.name}.comfy_quant" in state:
            from .formats.comfy_quant import decode_comfy_quant

            group = decode_comfy_quant(state[f"{spec.name}.comfy_quant"])["convrot_groupsize"]
        infos.append(
            LinearInfo(
                spec.name,
                spec.out_features,
                spec.in_features,
                w.dtype == torch.int8,
                f"{spec.name}.{SMOOTH_KEY}" in state,
                int(group) if group is not None else None,
                f"{spec.name}.{FOLDED_KEY}" in state,
                w.dtype == torch.float8_e4m3fn,
            )
        )
    return infos


__all__ = [
    "to_comfy_state_dict",
    "int8_marker",
    "linear_infos",
    "LinearInfo",
    "SMOOTH_KEY",
    "FOLDED_KEY",
    "INT8_FORMAT",
    "FP8_FORMAT",
]
