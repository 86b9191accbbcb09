"""The embedded demo model in ComfyUI: a graph that runs with no download (the example workflow "Ideogram 4 INT8 demo,
no download").

* *Ideogram 4 INT8 Demo Model*: the CLI demo's small random-weight model pair (``ideogram4.demo_model``) as two native
  MODELs built exactly as the real loader builds its branches (``native_model.build_native_model``: the pack's INT8
  ops, registry labels, panel), so *Ideogram 4 Sampler* samples it unchanged;
* *Ideogram 4 INT8 Demo Text*: seeded random vectors per word in place of the 8B text encoder;
* *Ideogram 4 INT8 Demo Decode*: latents to an IMAGE without a VAE, stamped "RANDOM WEIGHTS".
"""

from __future__ import annotations

import logging

import comfy.model_management
import torch
from comfy_api.v0_0_2 import io, ui

from .. import kernels
from ..ideogram4 import demo_model
from ..ideogram4.load_plan import branch_report, format_summary
from ..kernels import model_notes
from .panel import node_id_of, publish
from .runtime.native_model import COMPUTE_DTYPES, build_native_model, resolve_compute_dtype
from .widgets import COMPUTE_DTYPE, COMPUTE_DTYPE_TOOLTIP, GEMM_CHOICES, GEMM_PATH, GEMM_PATH_TOOLTIP

log = logging.getLogger("comfyui_ideogram4_int8")

CATEGORY = "Ideogram 4 INT8/demo"
LOADER_NAME = "Ideogram 4 INT8 Demo Model"
TEXT_NAME = "Ideogram 4 INT8 Demo Text"
DECODE_NAME = "Ideogram 4 INT8 Demo Decode"
CFG = demo_model.config()  # the demo architecture: the branches' sizes, and the loader's and text node's descriptions


def _choice(node: str, field: str, value, options) -> None:
    if value not in options:
        raise ValueError(f"{node}: '{field}' = {value!r} is not one of {list(options)}")


def build_branch(branch: str, compute_dtype: str, gemm_path: str | None):
    """(ModelPatcher, state, {linear: (GEMM path, reason)}, dtype) of one demo branch; the caller clears the state."""
    load_device = comfy.model_management.get_torch_device()
    dtype = resolve_compute_dtype(compute_dtype, load_device, CFG.linear_parameter_count())
    state = demo_model.branch_state(branch, dtype)
    try:
        patcher, paths = build_native_model(
            state,
            CFG,
            label=demo_model.LABELS[branch],
            compute_dtype=dtype,
            gemm_path=gemm_path,
            load_device=load_device,
        )
    except BaseException:
        state.clear()
        raise
    patcher.cached_patcher_init = (rebuild_branch, (branch, compute_dtype, gemm_path))
    return patcher, state, paths, dtype


def rebuild_branch(branch, compute_dtype, gemm_path, disable_dynamic=False):
    """``cached_patcher_init`` factory (as the real loader's ``reload_branch``): the same branch built again."""
    patcher, state, _, _ = build_branch(branch, compute_dtype, gemm_path)
    state.clear()
    return patcher


class Ideogram4Int8DemoLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8DemoLoader",
            display_name=LOADER_NAME,
            category=CATEGORY,
            description=f"The pack's embedded demo model (no download): a {CFG.num_layers}-block Ideogram-4-shaped "
            "model pair with seeded RANDOM weights, stored W8A8 like the real checkpoint and built as two native "
            "MODELs whose linears run the pack's INT8 GEMM (the GEMM paths panel lists them as conditional-demo / "
            "unconditional-demo). It draws colour noise, not pictures. Use it with 'Ideogram 4 Sampler', "
            "'Ideogram 4 INT8 Demo Text' and 'Ideogram 4 INT8 Demo Decode'.",
            search_aliases=["ideogram4 demo", "demo model", "random weights"],
            inputs=[
                io.Combo.Input("compute_dtype", **COMPUTE_DTYPE, tooltip=COMPUTE_DTYPE_TOOLTIP),
                io.Combo.Input("gemm_path", **GEMM_PATH, tooltip=GEMM_PATH_TOOLTIP + "."),
            ],
            outputs=[
                io.Model.Output(display_name="conditional"),
                io.Model.Output(display_name="unconditional"),
                io.String.Output(display_name="summary"),
            ],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, compute_dtype, gemm_path) -> io.NodeOutput:
        _choice(LOADER_NAME, "compute_dtype", compute_dtype, COMPUTE_DTYPES)
        _choice(LOADER_NAME, "gemm_path", gemm_path, GEMM_CHOICES)
        forced = None if gemm_path == "auto" else gemm_path
        if forced is not None:
            device = comfy.model_management.get_torch_device()
            try:
                kernels.select_path(device, 256, 256, forced)
            except ValueError as exc:
                raise ValueError(
                    f"{LOADER_NAME}: 'gemm_path' = {forced!r} cannot run on {device}: {exc}. Use 'auto'"
                ) from None
        models, reports = [], []
        try:
            for branch in demo_model.BRANCHES:
                patcher, state, paths, dtype = build_branch(branch, compute_dtype, forced)
                models.append(patcher)
                reports.append(
                    branch_report(
                        demo_model.LABELS[branch],
                        f"{state.file} (random weights)",
                        str(dtype).replace("torch.", ""),
                        paths,
                        state,
                        state.config,
                    )
                )
                state.clear()
        except BaseException:
            for branch in demo_model.BRANCHES[: len(models)]:
                model_notes.forget(demo_model.LABELS[branch])
            models.clear()
            raise
        summary = format_summary(reports, ["random weights: the images are colour noise, not pictures"])
        log.info("%s\n%s", LOADER_NAME, summary)
        publish("load", list(demo_model.LABELS.values()), node_id_of(cls))
        return io.NodeOutput(models[0], models[1], summary, ui=ui.PreviewText(summary))


class Ideogram4Int8DemoText(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8DemoText",
            display_name=TEXT_NAME,
            category=CATEGORY,
            description="NOT a text encoder: a stand-in for Qwen3-VL 8B that gives the demo model text features "
            f"without a download. Each word (up to {demo_model.MAX_TOKENS}) becomes a seeded random vector of "
            f"{CFG.llm_features_dim} features, so different prompts give different conditionings and the same "
            "prompt always the same one. Only for 'Ideogram 4 INT8 Demo Model'.",
            search_aliases=["ideogram4 demo text", "demo conditioning"],
            inputs=[
                io.String.Input(
                    "text",
                    multiline=True,
                    default="A red fox in the snow",
                    tooltip="Any text: only its words' identity and order matter (no meaning is understood).",
                ),
            ],
            outputs=[io.Conditioning.Output(display_name="CONDITIONING")],
        )

    @classmethod
    def execute(cls, text) -> io.NodeOutput:
        if not isinstance(text, str):
            raise ValueError(f"{TEXT_NAME}: 'text' must be a string; got {type(text).__name__}")
        cond = demo_model.text_features(text)
        return io.NodeOutput([[cond, {"pooled_output": None}]])


class Ideogram4Int8DemoDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8DemoDecode",
            display_name=DECODE_NAME,
            category=CATEGORY,
            description="Turns the demo model's latents into an IMAGE without a VAE (the CLI demo's preview: the "
            "first three principal components of the latent channels, 16 pixels per latent cell) and stamps "
            f"'{demo_model.BANNER}' across the top of each image.",
            search_aliases=["ideogram4 demo decode", "latent preview"],
            inputs=[io.Latent.Input("samples", tooltip="The LATENT of 'Ideogram 4 Sampler' run on the demo model.")],
            outputs=[io.Image.Output(display_name="IMAGE")],
        )

    @classmethod
    def execute(cls, samples) -> io.NodeOutput:
        latent = samples.get("samples") if isinstance(samples, dict) else None
        if not isinstance(latent, torch.Tensor):
            raise ValueError(f"{DECODE_NAME}: 'samples' is not a LATENT (no 'samples' tensor)")
        try:
            images = demo_model.decode(latent)
        except ValueError as exc:
            raise ValueError(
                f"{DECODE_NAME}: 'samples': {exc}. Connect the LATENT of 'Ideogram 4 Sampler' run on '{LOADER_NAME}'"
            ) from None
        return io.NodeOutput(images)


NODES = [Ideogram4Int8DemoLoader, Ideogram4Int8DemoText, Ideogram4Int8DemoDecode]
