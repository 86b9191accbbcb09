"""Ideogram 4 Branch Device: the unconditional MODEL on a second GPU, its pass run beside the conditional one.

Built on ComfyUI's own machinery: the MODEL is a ``ModelPatcher`` clone whose ``load_device`` is the second card,
so model management loads (and streams, on a small card) it there like any MODEL; the sampler runs its pass in
ComfyUI's ``MultiGPUThreadPool`` (``nodes/sampler_nodes.py``). ComfyUI's own multi-GPU work units cannot serve
here: they split one model's batch over deep clones of that model, and Ideogram 4's two passes run two different
models (``comfy/multigpu.py`` in 0.33 lists no Ideogram 4 either).

The clone carries an ``apply_model`` wrapper that moves a pass's inputs to its card and the prediction back, so
the CFG combine, the scheduler and the latent stay on the first card. ComfyUI 0.33's DualModelGuider hands the
negative pass the positive MODEL's options (without this wrapper): the diffusion model then refuses the input with
an error that says so, instead of a device mismatch deep in a kernel.
"""

from __future__ import annotations

import comfy.patcher_extension
import torch
from comfy_api.v0_0_2 import io, ui

from ..ideogram4 import placement
from ..kernels import model_notes
from .runtime.int8_ops import site_label
from .runtime.native_model import require_ideogram4

CATEGORY = "Ideogram 4 INT8/model"
NODE_NAME = "Ideogram 4 Branch Device"
WRAPPER_KEY = "ideogram4_int8_branch_device"
NOTE_KIND = "device"


class RunOnDevice:
    """``apply_model`` wrapper: the pass's tensors to ``device``, the prediction back to where the input was."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    def __call__(self, executor, x, t, *args, **kwargs):
        home = x.device
        out = executor(*placement.to_device((x, t, *args), self.device), **placement.to_device(kwargs, self.device))
        return placement.to_device(out, home)


class _InputOnItsCard:
    """Forward pre-hook of a placed diffusion model: an input on another card gets a message that names the cause."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    def __call__(self, module, args, kwargs):
        x = args[0] if args else kwargs.get("x")
        if isinstance(x, torch.Tensor) and x.device != self.device and _runs_on(module) == self.device:
            raise RuntimeError(
                f"{NODE_NAME}: this unconditional MODEL runs on {self.device} but its pass got the input on "
                f"{x.device}. The guider gave the pass another MODEL's options (ComfyUI's Dual Model CFG Guider does "
                "that for its negative pass), so the inputs were not moved. Sample with the Ideogram 4 Sampler, or "
                f"remove the {NODE_NAME} node"
            )


def _runs_on(module: torch.nn.Module) -> torch.device | None:
    """Where the module computes now: the device of its first float parameter (norms stay resident)."""
    for p in module.parameters():
        if p.dtype.is_floating_point:
            return p.device
    return None


def cuda_devices() -> list[str]:
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def place(model, choice: str):
    """(MODEL, note): ``model`` unchanged when it stays on its card, else a clone loaded on the chosen one."""
    where = placement.place_branch(choice, str(model.load_device), cuda_devices())
    label = site_label(model.model.diffusion_model)
    if label:
        model_notes.set_note(label, NOTE_KIND, where.note)
    if where.device is None:
        return model, where.note
    device = torch.device(where.device)
    placed = model.clone()
    placed.load_device = device
    placed.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, WRAPPER_KEY)
    placed.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, WRAPPER_KEY, RunOnDevice(device))
    dm = placed.model.diffusion_model
    old = getattr(dm, "ideogram4_branch_hook", None)
    if old is not None:
        old.remove()
    dm.ideogram4_branch_hook = dm.register_forward_pre_hook(_InputOnItsCard(device), with_kwargs=True)
    return placed, where.note


class Ideogram4Int8BranchDevice(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8BranchDevice",
            display_name=NODE_NAME,
            category=CATEGORY,
            description="Puts the unconditional MODEL on a second GPU: the Ideogram 4 Sampler then runs the "
            "unconditional pass there at the same time as the conditional pass on the first card (a step takes "
            "about the conditional pass's time, and each card holds one branch). With one GPU it does nothing "
            "and says so. Connect between the loader's 'unconditional' output and the sampler's 'model_negative'.",
            search_aliases=["ideogram4 multi gpu", "second gpu", "branch device", "two gpus"],
            inputs=[
                io.Model.Input("model_negative", tooltip="The unconditional MODEL (the loader's second output)."),
                io.Combo.Input(
                    "device",
                    options=list(placement.CHOICES),
                    default=placement.SECOND,
                    tooltip="second GPU: the first CUDA card other than the conditional branch's; cuda:N: that "
                    "card. A card this machine lacks leaves the branch where it is (the note says so).",
                ),
            ],
            outputs=[io.Model.Output(display_name="model_negative"), io.String.Output(display_name="placement")],
        )

    @classmethod
    def execute(cls, model_negative, device) -> io.NodeOutput:
        require_ideogram4(model_negative, "model_negative", NODE_NAME)
        placed, note = place(model_negative, device)
        return io.NodeOutput(placed, note, ui=ui.PreviewText(note))


NODES = [Ideogram4Int8BranchDevice]
