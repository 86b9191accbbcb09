"""Ideogram 4 INT8 Patch: any native Ideogram 4 MODEL -> one whose linears run the fused INT8 path.

The source model's ``state_dict()`` (comfy_quant form: fp8_scaled, int8_tensorwise(+ConvRot) or
bf16) is read by ``ideogram4.read_branch`` like a file: int8 layers are taken as they are (no
copy), fp8 / bf16 block linears and ``llm_cond_proj`` are quantized to W8A8 on load, the small
top-level linears stay float. The result is a new native MODEL (``native_model``); LoRA patches
and model options of the source MODEL carry over.
"""

from __future__ import annotations

import logging

import comfy.model_management
import comfy.model_patcher
import comfy.utils
import torch
from comfy_api.v0_0_2 import io, ui

from .. import kernels
from ..ideogram4.checkpoint import read_branch
from ..ideogram4.errors import CheckpointError
from ..ideogram4.load_plan import FREE_SOME_RAM, branch_report, check_host_memory, format_summary, host_bytes_of
from .panel import node_id_of, publish
from .runtime import ffn_fusion, native_model
from .runtime.attention_override import install as install_attention
from .runtime.int8_ops import int8_linears
from .runtime.native_model import build_native_model, config_of, require_ideogram4
from .widgets import GEMM_PATH, GEMM_PATH_TOOLTIP

log = logging.getLogger("comfyui_ideogram4_int8")

CATEGORY = "Ideogram 4 INT8/model"
NODE_NAME = "Ideogram 4 INT8 Patch"
LABELS = ("conditional", "unconditional")
PATCH_RAM_WHY = "to patch this branch: its W8A8 copy is built in host memory next to the source MODEL's weights"
PATCH_RAM_FIX = (
    f"{FREE_SOME_RAM}; or load the file with the Ideogram 4 INT8 Loader instead, which reads it without a source "
    "MODEL held next to it"
)


def _compute_dtype(source) -> torch.dtype:
    dtype = source.model.get_dtype_inference()
    return dtype if dtype in (torch.bfloat16, torch.float32) else torch.bfloat16


def patch_model(source, label: str, gemm_path: str | None, progress=None):
    """(new ModelPatcher, report lines) for a native Ideogram 4 ModelPatcher ``source``."""
    config = config_of(source)
    dtype = _compute_dtype(source)
    # a MODEL that ran before may still hold merged LoRA weights / object patches: read the pristine weights
    comfy.model_management.unload_model_and_clones(source)
    # the W8A8 copy is built in host memory next to the source's weights (now off the card): refuse before an
    # out-of-memory kill of the server halfway through
    check_host_memory(host_bytes_of(config), native_model.free_host_memory(), PATCH_RAM_WHY, PATCH_RAM_FIX)
    sd = source.model.diffusion_model.state_dict()
    try:
        state = read_branch(
            sd, "conditional", config=config, dtype=dtype, device="cpu", strict=False, progress=progress
        )
    finally:
        sd.clear()
    try:
        patcher, paths = build_native_model(
            state,
            config,
            label=label,
            compute_dtype=dtype,
            gemm_path=gemm_path,
            load_device=source.load_device,
            offload_device=source.offload_device,
        )
    except BaseException:
        state.clear()
        raise
    notes = []
    if state.ignored:
        notes.append(
            f"ignored source tensors (not used by a W8A8 linear): {', '.join(state.ignored[:6])}"
            + (f" … (+{len(state.ignored) - 6})" if len(state.ignored) > 6 else "")
        )
    if source.patches:
        patcher.patches = {k: list(v) for k, v in source.patches.items()}
        patcher.patches_uuid = source.patches_uuid
        notes.append(f"kept {len(source.patches)} weight patches (LoRA) of the source MODEL")
    patcher.model_options = comfy.model_patcher.create_model_options_clone(source.model_options)
    notes.append(install_attention(patcher.model_options, source.load_device, label))
    if source.object_patches:
        notes.append(
            f"dropped {len(source.object_patches)} object patches of the source MODEL (they point at its "
            "modules); apply them after this node"
        )
    report = branch_report(
        label,
        f"patched {type(source.model).__name__} ({str(dtype).replace('torch.', '')})",
        str(dtype).replace("torch.", ""),
        paths,
        state,
        config,
    )
    fusion = ffn_fusion.load_summary(patcher.model.diffusion_model)
    report.notes.extend(notes + ([fusion] if fusion else []))
    state.clear()
    init = getattr(source, "cached_patcher_init", None)
    patcher.cached_patcher_init = (repatch, (init, label, gemm_path)) if init is not None else None
    return patcher, report


def repatch(source_init, label, gemm_path, disable_dynamic=False):
    """``cached_patcher_init`` factory: load the source MODEL again with its own factory, convert it again.

    (ComfyUI's clone() takes only the model from here and re-applies the patches of the patcher it clones.)
    """
    fn, args = source_init[0], source_init[1]
    source = fn(*args, disable_dynamic=True)
    if len(source_init) > 2:
        source = source[source_init[2]]
    return patch_model(source, label, gemm_path)[0]


class Ideogram4Int8Patch(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8Patch",
            display_name=NODE_NAME,
            category=CATEGORY,
            description="Takes a native Ideogram 4 MODEL (fp8_scaled, bf16 or int8_tensorwise, e.g. from Load "
            "Diffusion Model) and returns one whose linears run the fused INT8 GEMM: int8 layers are "
            "used as they are, fp8 / bf16 layers are quantized to W8A8 on load. Patch each branch.",
            search_aliases=["ideogram4 int8 patch", "w8a8 patch", "quantize ideogram"],
            inputs=[
                io.Model.Input(
                    "model",
                    tooltip="A native Ideogram 4 MODEL (conditional or unconditional branch), "
                    "e.g. from Load Diffusion Model with ideogram4_fp8_scaled.",
                ),
                io.Combo.Input(
                    "label",
                    options=list(LABELS),
                    default="conditional",
                    tooltip="Which branch this is: names the layers in the GEMM-path panel "
                    "(conditional/…, unconditional/…). Use a different label for each branch.",
                ),
                io.Combo.Input("gemm_path", **GEMM_PATH, tooltip=GEMM_PATH_TOOLTIP + "."),
            ],
            outputs=[io.Model.Output(display_name="model"), io.String.Output(display_name="report")],
        )

    @classmethod
    def execute(cls, model, label, gemm_path) -> io.NodeOutput:
        require_ideogram4(model, "model", NODE_NAME)
        if int8_linears(model.model.diffusion_model):
            text = f"{label}: this MODEL already runs the pack's INT8 ops; returned unchanged"
            return io.NodeOutput(model, text, ui=ui.PreviewText(text))
        forced = None if gemm_path == "auto" else gemm_path
        if forced is not None:
            try:
                kernels.select_path(model.load_device, 4608, 4608, forced)
            except ValueError as exc:
                raise ValueError(
                    f"{NODE_NAME}: gemm_path={forced!r} cannot run on {model.load_device}: {exc}. Use 'auto'"
                ) from None
        kernels.triton_warm.start()  # Triton's per-process keys while the weights convert, not in the first pass
        pbar = comfy.utils.ProgressBar(1)

        def progress(done, total, name):
            comfy.model_management.throw_exception_if_processing_interrupted()
            pbar.update_absolute(done, total)

        try:
            patched, report = patch_model(model, label, forced, progress)
        except CheckpointError as exc:
            raise ValueError(f"{NODE_NAME}: the MODEL's weights cannot be converted: {exc}") from None
        text = format_summary([report])
        log.info("%s\n%s", NODE_NAME, text)
        publish("load", [label], node_id_of(cls), "Ideogram4Int8Patch")
        return io.NodeOutput(patched, text, ui=ui.PreviewText(text))


NODES = [Ideogram4Int8Patch]
