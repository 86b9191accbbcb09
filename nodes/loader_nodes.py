"""Ideogram 4 INT8 Loader: a W8A8 checkpoint -> two native ComfyUI MODELs (conditional, unconditional).

Thin V3 node: which files to read is decided by ``ideogram4.load_plan``, the reading by
``ideogram4.read_branch``, the model by ``native_model.build_native_model``.
"""

from __future__ import annotations

import logging

import comfy.model_management
import comfy.utils
import folder_paths
from comfy_api.v0_0_2 import io, ui

from .. import kernels
from ..ideogram4 import hub
from ..ideogram4.checkpoint import read_branch
from ..ideogram4.config import Ideogram4Config
from ..ideogram4.errors import CheckpointError
from ..ideogram4.load_plan import (
    branch_report,
    check_host_memory,
    format_summary,
    host_bytes_needed,
    plan_branches,
)
from ..kernels import model_notes
from .panel import node_id_of, publish
from .runtime import ffn_fusion, native_model, pin_ahead
from .runtime.native_model import build_native_model, resolve_compute_dtype
from .runtime.streaming_patcher import streaming_summary
from .widgets import (
    COMPUTE_DTYPE,
    COMPUTE_DTYPE_TOOLTIP,
    GEMM_PATH,
    GEMM_PATH_TOOLTIP,
    PROTECTED_CHOICES,
    PROTECTED_LAYERS,
    PROTECTED_LAYERS_TOOLTIP,
)

log = logging.getLogger("comfyui_ideogram4_int8")

CATEGORY = "Ideogram 4 INT8/loaders"
FOLDER = "diffusion_models"
HF_CHOICE = "(Hugging Face repo below)"
SAME_FILE = "(second branch of the weights file)"
NO_BASE = "none"
DEFAULT_HF_FILE = "ideogram4-int8-w8a8.safetensors"
NODE_NAME = "Ideogram 4 INT8 Loader"
FULL_PARAMETERS = Ideogram4Config.full().linear_parameter_count()


def _files() -> list[str]:
    return [f for f in folder_paths.get_filename_list(FOLDER) if f.lower().endswith(".safetensors")]


def _word_then(word: str, files: list[str]) -> dict:
    """The spec of a file input whose first choice, and default, is ``word``, not a file (SAME_FILE or NO_BASE, which
    ``_optional`` reads as no file of its own)."""
    return {"options": [word, *files], "default": word}


def _full_path(name: str, input_name: str) -> str:
    path = folder_paths.get_full_path(FOLDER, name)
    if path is None:
        raise ValueError(
            f"{NODE_NAME}: '{input_name}' = {name!r} is not in ComfyUI's {FOLDER} folder; pick a file "
            "from the list (refresh the page after copying files)"
        )
    return path


def _optional(name: str, sentinel: str, input_name: str) -> str | None:
    return None if not name or name == sentinel else _full_path(name, input_name)


def _as_listed(text: str, shown: dict[str, str]) -> str:
    """An error text with each file's full path replaced by the name the user picked (as the widget lists it)."""
    for path, name in sorted(shown.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(path, name)
    return text


class _LoadProgress:
    """One ComfyUI progress bar across both branches, driven by read_branch's progress callback."""

    def __init__(self, branches: int) -> None:
        self.branches = branches
        self.index = 0
        self.pbar = comfy.utils.ProgressBar(1)

    def callback(self, done: int, total: int, name: str) -> None:
        comfy.model_management.throw_exception_if_processing_interrupted()
        self.pbar.update_absolute(self.index * total + done, total * self.branches)


def load_branch(
    path: str,
    branch: str,
    base: str | None,
    compute_dtype: str,
    gemm_path: str | None,
    progress=None,
    protected_layers: str = "bf16",
):
    """(ModelPatcher, read_branch state, {linear: (GEMM path, reason)}, compute dtype) of one branch.

    ``protected_layers`` "fp8": the block layers that stay float are stored as float8 e4m3 (``read_branch``'s
    ``float_blocks_fp8``). The state's tensors now belong to the model (the caller reports from it, then clears it).
    """
    load_device = comfy.model_management.get_torch_device()
    kernels.triton_warm.start()  # Triton's per-process keys while the file is read, not in the first pass
    dtype = resolve_compute_dtype(compute_dtype, load_device, FULL_PARAMETERS)
    state = read_branch(
        path, branch, base, device="cpu", dtype=dtype, progress=progress, float_blocks_fp8=protected_layers == "fp8"
    )
    try:
        patcher, paths = build_native_model(
            state, state.config, label=branch, compute_dtype=dtype, gemm_path=gemm_path, load_device=load_device
        )
    except BaseException:
        state.clear()
        raise
    patcher.cached_patcher_init = (reload_branch, (path, branch, base, compute_dtype, gemm_path, protected_layers))
    pin_ahead.start(patcher)  # its host weights pinned before the first load (the prompt is encoded meanwhile)
    return patcher, state, paths, dtype


def reload_branch(path, branch, base, compute_dtype, gemm_path, protected_layers="bf16", disable_dynamic=False):
    """``cached_patcher_init`` factory: the same branch built again from its file (always non-dynamic)."""
    patcher, state, _, _ = load_branch(path, branch, base, compute_dtype, gemm_path, None, protected_layers)
    state.clear()
    return patcher


def _check_forced_path(gemm_path: str | None) -> None:
    if gemm_path is None:
        return
    device = comfy.model_management.get_torch_device()
    try:
        kernels.select_path(device, 4608, 4608, gemm_path)
    except ValueError as exc:
        raise ValueError(f"{NODE_NAME}: gemm_path={gemm_path!r} cannot run on {device}: {exc}. Use 'auto'") from None


class Ideogram4Int8Loader(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        files = _files()
        return io.Schema(
            node_id="Ideogram4Int8Loader",
            display_name=NODE_NAME,
            category=CATEGORY,
            description="Loads Ideogram 4's two CFG branches from a W8A8 checkpoint (or ComfyUI's int8 / fp8 / bf16 "
            "files, quantized to W8A8 on load) as native ComfyUI MODELs whose linears run the fused "
            "INT8 GEMM. Use them with 'Ideogram 4 Sampler', or DualModelGuider (negative unconnected).",
            search_aliases=["ideogram4 int8", "w8a8 loader", "ideogram loader"],
            inputs=[
                io.Combo.Input(
                    "weights",
                    options=[*files, HF_CHOICE],
                    tooltip="Checkpoint from models/diffusion_models: the two-branch W8A8 file "
                    "(ideogram4-int8-w8a8.safetensors) gives both MODELs; a single-branch file "
                    "(ideogram4_fp8_scaled, ideogram4_int8_convrot, bf16) is the conditional "
                    f"branch. Pick '{HF_CHOICE}' to use the repo id below.",
                ),
                io.Combo.Input(
                    "unconditional_weights",
                    **_word_then(SAME_FILE, files),
                    tooltip="The unconditional branch's own file (e.g. ideogram4_unconditional_fp8_scaled"
                    ".safetensors). Needed when 'weights' holds one branch; overrides the second "
                    "branch of a two-branch file.",
                ),
                io.Combo.Input(
                    "base",
                    **_word_then(NO_BASE, files),
                    tooltip="Optional official checkpoint of the conditional branch (any format) that "
                    "supplies tensors the weights file lacks (norms, embeddings, unquantized "
                    "layers). A two-branch base serves both branches. Never overrides the "
                    "weights file.",
                ),
                io.Combo.Input(
                    "unconditional_base",
                    **_word_then(NO_BASE, files),
                    tooltip="Optional base checkpoint for the unconditional branch (see 'base').",
                ),
                io.String.Input(
                    "hf_repo_id",
                    default="",
                    optional=True,
                    tooltip=f"Only used when 'weights' is '{HF_CHOICE}': a Hugging Face repo id such as "
                    "transformerlab/ideogram-4-int8-w8a8. The file is downloaded into the "
                    "Hugging Face cache once (token from HF_TOKEN or `hf auth login`; never "
                    "stored in the workflow); HF_HUB_OFFLINE=1 uses the cache only.",
                ),
                io.String.Input(
                    "hf_filename",
                    default=DEFAULT_HF_FILE,
                    optional=True,
                    tooltip="File in that Hugging Face repo (append @revision to pin one).",
                ),
                io.Combo.Input(
                    "compute_dtype",
                    **COMPUTE_DTYPE,
                    tooltip=COMPUTE_DTYPE_TOOLTIP + " fp32 is for exact comparisons (slower).",
                ),
                io.Combo.Input(
                    "gemm_path",
                    **GEMM_PATH,
                    tooltip=GEMM_PATH_TOOLTIP + "; the panel shows which path each layer ran and why.",
                ),
                io.Combo.Input(
                    "protected_layers",
                    **PROTECTED_LAYERS,
                    optional=True,  # workflows saved before it load with the default
                    tooltip=PROTECTED_LAYERS_TOOLTIP + ".",
                ),
            ],
            outputs=[
                io.Model.Output(display_name="conditional"),
                io.Model.Output(display_name="unconditional"),
                io.String.Output(display_name="summary"),
            ],
            hidden=[io.Hidden.unique_id],  # the panel ties this node's badge to the models it loaded
        )

    @classmethod
    def execute(
        cls,
        weights,
        unconditional_weights,
        base,
        unconditional_base,
        compute_dtype,
        gemm_path,
        hf_repo_id="",
        hf_filename=DEFAULT_HF_FILE,
        protected_layers="bf16",
    ) -> io.NodeOutput:
        shown: dict[str, str] = {}  # full path -> the name the user picked, for error messages
        if weights == HF_CHOICE:
            repo = (hf_repo_id or "").strip()
            name = (hf_filename or "").strip()
            if not repo or not name:
                raise ValueError(
                    f"{NODE_NAME}: 'weights' is '{HF_CHOICE}' but hf_repo_id / hf_filename is empty: "
                    "enter e.g. transformerlab/ideogram-4-int8-w8a8 and the file name, or pick a local "
                    "file"
                )
            try:
                main = str(hub.resolve(f"{hub.SCHEME}{repo}/{name}"))
            except CheckpointError as exc:
                raise ValueError(f"{NODE_NAME}: {exc}") from None
            shown[main] = f"{repo}/{name}"
        else:
            main = _full_path(weights, "weights")
            shown[main] = weights
        if protected_layers not in PROTECTED_CHOICES:
            raise ValueError(
                f"{NODE_NAME}: protected_layers = {protected_layers!r}: pick one of {list(PROTECTED_CHOICES)}"
            )
        forced = None if gemm_path == "auto" else gemm_path
        _check_forced_path(forced)
        picked = {
            "unconditional_weights": _optional(unconditional_weights, SAME_FILE, "unconditional_weights"),
            "base": _optional(base, NO_BASE, "base"),
            "unconditional_base": _optional(unconditional_base, NO_BASE, "unconditional_base"),
        }
        for key, value in (
            ("unconditional_weights", unconditional_weights),
            ("base", base),
            ("unconditional_base", unconditional_base),
        ):
            if picked[key]:
                shown[picked[key]] = value
        try:
            sources = plan_branches(main, picked["unconditional_weights"], picked["base"], picked["unconditional_base"])
            check_host_memory(host_bytes_needed(sources), native_model.free_host_memory())
        except CheckpointError as exc:
            raise ValueError(f"{NODE_NAME}: {_as_listed(str(exc), shown)}") from None
        progress = _LoadProgress(len(sources))
        models, reports = [], []
        try:
            for i, src in enumerate(sources):
                progress.index = i
                try:
                    patcher, state, paths, dtype = load_branch(
                        str(src.path),
                        src.branch,
                        str(src.base) if src.base else None,
                        compute_dtype,
                        forced,
                        progress.callback,
                        protected_layers,
                    )
                except CheckpointError as exc:
                    where = "base" if src.branch == "conditional" else "unconditional_base"
                    raise ValueError(
                        f"{NODE_NAME}, {src.branch} branch: {_as_listed(str(exc), shown)} (node inputs: "
                        f"weights / unconditional_weights / {where})"
                    ) from None
                models.append(patcher)
                reports.append(
                    branch_report(
                        src.branch, src.describe(), str(dtype).replace("torch.", ""), paths, state, state.config
                    )
                )
                fusion = ffn_fusion.load_summary(patcher.model.diffusion_model)
                if fusion:
                    reports[-1].notes.append(fusion)
                state.clear()
        except BaseException:
            # no half-built pair: drop the branch already built, its panel records and its notes
            for src in sources[: len(models)]:
                model_notes.forget(src.branch)
            models.clear()
            raise
        notes = [streaming_summary(models), getattr(models[0], "ideogram4_attention", "attention: ComfyUI's own")]
        summary = format_summary(reports, notes)
        log.info("%s\n%s", NODE_NAME, summary)
        publish(
            "load",
            [s.branch for s in sources],
            node_id_of(cls),
            "Ideogram4Int8Loader",
            {"weights": weights, "unconditional_weights": unconditional_weights},  # the widgets, as picked
        )
        return io.NodeOutput(models[0], models[1], summary, ui=ui.PreviewText(summary))


NODES = [Ideogram4Int8Loader]
