"""Build a native ComfyUI Ideogram 4 MODEL (ModelPatcher) from one branch in the pack's in-memory form.

The model is ComfyUI's own ``model_base.Ideogram4`` / ``Ideogram4Transformer2DModel`` from
``supported_models.Ideogram4`` — so DualModelGuider, KSampler, previews and model management see
a normal Ideogram 4 model — built with the pack's custom operations (``int8_ops.make_ops``). The
state dict is converted to ComfyUI's comfy_quant form without copying a weight.

Model management: ``streaming_patcher.Ideogram4ModelPatcher``, ComfyUI's legacy (non-dynamic)
ModelPatcher whose partial loads stream whole blocks of int8 weights from pinned host memory behind
compute. ComfyUI's DynamicVRAM applies LoRA patches to the dequantized stored weight inside its
streaming code, where the pack's op cannot undo the SmoothQuant scaling first, and it casts each
layer when called; the pack's patcher keeps ComfyUI's loading decisions and LoRA patches and runs
every layer, streamed or resident, through the op (see ``int8_ops``). ``cached_patcher_init`` is set
so clones and multi-GPU deep clones rebuild the model from its source.

Three things are added to the model without changing its modules or keys: each block's FFN runs w1|w3 as one fused
call where it can (``ffn_fusion``), every forward checks that each quantized linear ran through the pack's op
(``op_coverage``: a model whose forward routed around it is labelled in the registry and the panel), and the text
context is put on the sampling device once per run instead of in every call (``resident_conds``).
"""

from __future__ import annotations

import comfy.model_base
import comfy.model_management
import comfy.supported_models
import psutil
import torch

from ...ideogram4 import smooth_fold
from ...ideogram4.comfy_form import to_comfy_state_dict
from ...ideogram4.config import Ideogram4Config
from ...ideogram4.errors import CheckpointError
from ...kernels import settings
from . import block_norms, ffn_fusion, op_coverage, qk_rope, resident_conds
from .attention_override import install as install_attention
from .int8_ops import declare_sites, label_sites, link_folds, make_ops, site_label
from .streaming_patcher import Ideogram4ModelPatcher

COMPUTE_DTYPES = {"auto": None, "bf16": torch.bfloat16, "fp32": torch.float32}


def free_host_memory() -> int:
    """Free RAM plus free swap, in bytes (what a loaded or patched branch can take)."""
    return psutil.virtual_memory().available + psutil.swap_memory().free


def resolve_compute_dtype(name: str | None, load_device: torch.device, parameters: int = 0) -> torch.dtype:
    """ "auto" = what ComfyUI would pick for an Ideogram 4 model on ``load_device`` (bf16 or fp32)."""
    dtype = COMPUTE_DTYPES.get(name or "auto", "invalid")
    if dtype == "invalid":
        raise ValueError(f"compute_dtype={name!r}: choose one of {list(COMPUTE_DTYPES)}")
    if dtype is not None:
        return dtype
    picked = comfy.model_management.unet_dtype(
        device=load_device, model_params=parameters, supported_dtypes=[torch.bfloat16, torch.float32]
    )
    return picked if picked in (torch.bfloat16, torch.float32) else torch.float32


def model_config_for(config: Ideogram4Config, dtype: torch.dtype):
    """ComfyUI's Ideogram 4 model config with the architecture of ``config`` and the pack's ops."""
    mc = comfy.supported_models.Ideogram4(
        {"image_model": "ideogram4", "in_channels": config.in_channels, "num_layers": config.num_layers}
    )
    # unet_extra_config (the full model's sizes) was copied over the detected config; ours decides
    mc.unet_config.update(
        num_attention_heads=config.num_heads,
        attention_head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        adaln_dim=config.adaln_dim,
        llm_features_dim=config.llm_features_dim,
        rope_theta=config.rope_theta,
        mrope_section=list(config.mrope_section),
        norm_eps=config.norm_eps,
    )
    mc.set_inference_dtype(dtype, None)
    mc.custom_operations = make_ops(dtype)
    return mc


def smooth_fold_mode() -> str:
    """The smoothing fold mode for MODELs built here: the experiment ``smooth-fold`` (a w1/w3 mode, or "off"), else
    ``smooth_fold.DEFAULT_GATE_UP``."""
    return settings.experiment("smooth-fold") or smooth_fold.DEFAULT_GATE_UP


def build_native_model(
    state,
    config: Ideogram4Config,
    *,
    label: str,
    compute_dtype: torch.dtype,
    gemm_path: str | None = None,
    load_device: torch.device | None = None,
    offload_device: torch.device | None = None,
    smooth: str | None = None,
):
    """A ModelPatcher around ComfyUI's Ideogram 4 model holding ``state`` (a read_branch result).

    SmoothQuant divides are folded at load where they can be (``smooth_fold.fold_smoothing``, mode ``smooth`` or
    ``smooth_fold_mode()``; the report lands in ``state.smoothing`` for the loader's summary, notes for the panel).
    ``state`` is changed in place by that (entries replaced, never the tensors themselves).

    Returns ``(patcher, paths)`` with ``paths`` = {linear: (predicted GEMM path, reason)} on the
    load device. Raises CheckpointError naming the key when the state does not fit the model; a
    failed build leaves nothing behind.
    """
    load_device = load_device or comfy.model_management.get_torch_device()
    offload_device = offload_device or comfy.model_management.unet_offload_device()
    mode = smooth or smooth_fold_mode()
    work = load_device if load_device.type == "cuda" else None  # re-quantization (w1/w3) runs on the GPU if any
    report = smooth_fold.fold_smoothing(state, config, gate_up=mode, work_device=work)
    comfy_sd = to_comfy_state_dict(state, config)
    model = None
    try:
        mc = model_config_for(config, compute_dtype)
        model = mc.get_model({}, "")
        missing, unexpected = model.diffusion_model.load_state_dict(comfy_sd, strict=False)
        if missing or unexpected:
            key = (missing or unexpected)[0]
            raise CheckpointError(
                f"ComfyUI's Ideogram 4 model did not take the weights ({len(missing)} missing, "
                f"{len(unexpected)} unexpected)",
                file="<converted state dict>",
                key=key,
                fix="report this: the pack's conversion and ComfyUI's Ideogram 4 model disagree",
            )
        comfy_sd.clear()
        link_folds(model.diffusion_model, config, report)
        ffn_fusion.install(model.diffusion_model)  # first: label_sites also names the gate/up pairs' model
        label_sites(model.diffusion_model, label, gemm_path)
        qk_rope.install(model.diffusion_model, label)
        block_norms.install(model.diffusion_model, label)
        op_coverage.install(model.diffusion_model, label)
        resident_conds.install(model)
        patcher = Ideogram4ModelPatcher(model, load_device=load_device, offload_device=offload_device)
        patcher.ideogram4_attention = install_attention(patcher.model_options, load_device, label)
        if offload_device.type != "cpu":
            model.to(offload_device)
        paths = declare_sites(model.diffusion_model, label, load_device)
        return patcher, paths
    except BaseException:
        comfy_sd.clear()
        del model
        raise


def is_ideogram4_patcher(model) -> bool:
    """True for a ModelPatcher whose model is ComfyUI's native Ideogram 4."""
    inner = getattr(model, "model", None)
    return isinstance(inner, comfy.model_base.Ideogram4)


def describe_model(model) -> str:
    inner = getattr(model, "model", None)
    if inner is None:
        return f"a {type(model).__name__} (not a MODEL)"
    return f"a {type(inner).__name__} model"


def require_ideogram4(model, input_name: str, node: str) -> None:
    """Raise ValueError unless ``model`` is a native Ideogram 4 MODEL (what to connect instead)."""
    if not is_ideogram4_patcher(model):
        raise ValueError(
            f"{node}: '{input_name}' is {describe_model(model)}, not an Ideogram 4 diffusion model. Connect the "
            "MODEL output of 'Ideogram 4 INT8 Loader', or of Load Diffusion Model (UNETLoader) with an ideogram4_* "
            "file"
        )


def config_of(model) -> Ideogram4Config:
    """The architecture of a native Ideogram 4 MODEL, read from its diffusion model."""
    dm = model.model.diffusion_model
    uc = model.model.model_config.unet_config
    return Ideogram4Config(
        in_channels=int(uc.get("in_channels", 128)),
        num_layers=len(dm.layers),
        num_heads=int(uc["num_attention_heads"]),
        head_dim=int(uc["attention_head_dim"]),
        intermediate_size=int(uc["intermediate_size"]),
        adaln_dim=int(uc["adaln_dim"]),
        llm_features_dim=int(uc["llm_features_dim"]),
        rope_theta=float(uc["rope_theta"]),
        mrope_section=tuple(uc["mrope_section"]),
        norm_eps=float(uc["norm_eps"]),
    )


def text_features(model) -> int:
    return int(model.model.model_config.unet_config["llm_features_dim"])


def model_labels(*models) -> list[str]:
    """Registry labels ("conditional", "unconditional", ...) of the MODELs whose linears run the pack's ops.

    In argument order, without repeats; a MODEL without the pack's linears adds nothing."""
    labels: list[str] = []
    for model in models:
        dm = getattr(getattr(model, "model", None), "diffusion_model", None)
        label = site_label(dm) if dm is not None else None
        if label and label not in labels:
            labels.append(label)
    return labels


__all__ = [
    "build_native_model",
    "model_config_for",
    "resolve_compute_dtype",
    "is_ideogram4_patcher",
    "require_ideogram4",
    "config_of",
    "text_features",
    "model_labels",
    "COMPUTE_DTYPES",
]
