"""Ideogram 4 Sampler: the official asymmetric-CFG Euler loop, run through ComfyUI's sampling machinery.

Reproduces ``ideogram4.sample`` exactly — preset sigmas (``ideogram4.sigmas`` = the native
Ideogram4Scheduler), per-step guidance with the low-guidance polish steps last, the
unconditional branch image-only (negative ``[[None, {}]]`` → ``context=None``, not zero text
features), ComfyUI's noise (``comfy.sample.prepare_noise``) — while ComfyUI's guider / KSAMPLER
("euler") / model management do the work, so progress, latent previews and interruption behave
like any sampler node. Argument checking lives in ``ideogram4.sampling_args``.
"""

from __future__ import annotations

import math

import comfy.model_management
import comfy.multigpu
import comfy.sample
import comfy.samplers
import comfy.utils
import latent_preview
import torch
from comfy_api.v0_0_2 import io
from comfy_extras.nodes_custom_sampler import Guider_DualModel

from .. import kernels
from ..ideogram4 import placement
from ..ideogram4 import sampling_args as sa
from ..ideogram4.schedule import DEFAULT_PRESET, PRESETS
from ..kernels import settings
from .panel import node_id_of, publish
from .runtime import pin_ahead
from .runtime.cuda_graphs import pass_graphs
from .runtime.native_model import model_labels, require_ideogram4, text_features
from .runtime.streaming_patcher import load_together, one_pass_per_branch

CATEGORY = "Ideogram 4 INT8/sampling"
NODE_NAME = "Ideogram 4 Sampler"
UNCOND_IMAGE_ONLY = [[None, {}]]  # no cross_attn -> the model's image-only (unconditional) sequence
SIZE = {"default": sa.DEFAULT_SIZE, "min": sa.MIN_SIZE, "max": sa.MAX_SIZE, "step": sa.SIZE_MULTIPLE}


def _size_tooltip(side: str) -> str:
    return (
        f"Image {side} in pixels: a multiple of {sa.SIZE_MULTIPLE}, {sa.MIN_SIZE}..{sa.MAX_SIZE}, aspect ratio at "
        f"most {sa.MAX_ASPECT:g}:1."
    )


class PerStepGuidanceGuider(Guider_DualModel):
    """ComfyUI's dual-model CFG guider with one guidance value per step (the step counted by ``sample``).

    When the unconditional MODEL loads on another card (``nodes/branch_device_nodes.py``), its pass runs in ComfyUI's
    ``MultiGPUThreadPool`` while this thread runs the conditional pass; ``concurrent=True`` does that on one device
    too (tests)."""

    def __init__(
        self,
        model,
        model_negative,
        guidance: tuple[float, ...],
        concurrent: bool | None = None,
    ) -> None:
        super().__init__(model, model_negative)
        self.guidance = tuple(float(g) for g in guidance)
        # outer_sample prepares the unconditional model only when cfg != 1: any step with guidance
        self.set_cfg(next((g for g in self.guidance if g != 1.0), 1.0))
        self.concurrent = concurrent  # None: when the two MODELs load on different devices
        self.branch_pool = None
        self.step = 0  # the step the next model call belongs to (``sample``'s step callback advances it)

    def side_device(self) -> torch.device | None:
        """The device whose worker thread runs the unconditional pass, or None (one after the other here)."""
        main = torch.device(self.model_patcher.load_device)
        side = torch.device(self.uncond_model_patcher.load_device)
        if self.concurrent is None:
            return side if side != main else None
        return side if self.concurrent else None

    def sample(self, noise, latent_image, sampler, sigmas, denoise_mask=None, callback=None, *args, **kwargs):
        """ComfyUI's sample, counting steps through the sampler's step callback (called once per finished step, after
        all of that step's model calls): the guidance of a call is that of the step it belongs to. Reading the step off
        the timestep (a device tensor) made the host wait for the card at every step, so the GPU sat idle while the
        host prepared each step's first kernels (a sampler with no previews never syncs otherwise)."""
        self.step = 0

        def step_done(step, x0, x, total_steps):
            self.step = step + 1
            if callback is not None:
                return callback(step, x0, x, total_steps)

        return super().sample(noise, latent_image, sampler, sigmas, denoise_mask, step_done, *args, **kwargs)

    def outer_sample(self, *args, **kwargs):
        side = self.side_device()
        self.branch_pool = comfy.multigpu.MultiGPUThreadPool([side]) if side is not None else None
        try:
            return super().outer_sample(*args, **kwargs)
        finally:
            if self.branch_pool is not None:
                self.branch_pool.shutdown()
                self.branch_pool = None

    def predict_noise(self, x, timestep, model_options={}, seed=None):  # noqa: B006 - ComfyUI's signature
        self.cfg = self.guidance[min(self.step, len(self.guidance) - 1)]
        uncond_inner, uncond_conds = getattr(self, "uncond_inner", None), getattr(self, "_uncond_conds", None)
        if (
            uncond_inner is None
            or uncond_conds is None
            or (math.isclose(self.cfg, 1.0) and not model_options.get("disable_cfg1_optimization", False))
        ):
            return super().predict_noise(x, timestep, model_options, seed)  # the conditional pass alone
        # ComfyUI's dual-model guider runs the negative pass with the positive MODEL's options, so a wrapper of the
        # positive MODEL (TorchCompileModel's swaps in its compiled diffusion model) computed the negative pass with
        # the positive weights. Each pass here gets its own MODEL's wrappers and patches.
        positive = self.conds.get("positive")
        uncond_options = own_model_options(model_options, self.uncond_model_patcher, self.model_patcher)
        pool = self.branch_pool
        if pool is None:
            cond = comfy.samplers.calc_cond_batch(self.inner_model, [positive], x, timestep, model_options)[0]
            uncond = comfy.samplers.calc_cond_batch(uncond_inner, [uncond_conds], x, timestep, uncond_options)[0]
        else:
            side = pool.devices[0]
            # The pass's inputs cross to the side card from this thread, before the conditional pass is queued: a
            # copy between cards runs on the source card's stream, so from the worker it would wait behind the whole
            # conditional pass (measured on two H200s: the two passes then ran one after the other).
            hop = placement.to_device((x, timestep, uncond_options), torch.device(side))
            pool.submit(side, comfy.samplers.calc_cond_batch, uncond_inner, [uncond_conds], *hop)
            try:
                cond = comfy.samplers.calc_cond_batch(self.inner_model, [positive], x, timestep, model_options)[0]
            finally:
                result, error = pool.get_result(side)  # collected even when this pass failed: one result per submit
            if error is not None:
                raise error
            uncond = result[0].to(x.device, non_blocking=True)  # queued after the side pass on its card's stream
        return comfy.samplers.cfg_function(
            self.inner_model,
            cond,
            uncond,
            self.cfg,
            x,
            timestep,
            model_options=model_options,
            cond=positive,
            uncond=uncond_conds,
        )


PER_MODEL_TRANSFORMER_OPTIONS = ("wrappers", "callbacks", "patches", "patches_replace")


def own_model_options(run_options: dict, patcher, run_patcher) -> dict:
    """The sampling run's ``model_options`` (prepared for ``run_patcher``, the positive MODEL) for a pass of
    ``patcher``: what the run added (sigmas, ...) stays; what a MODEL brings — its transformer options (attention
    override, ...), wrappers, callbacks, patches, ``model_function_wrapper`` — comes from ``patcher``, not from
    ``run_patcher``."""
    own = patcher.model_options
    out = {k: v for k, v in run_options.items() if k not in ("model_function_wrapper", "multigpu_clones")}
    if "model_function_wrapper" in own:
        out["model_function_wrapper"] = own["model_function_wrapper"]
    run_to = run_options.get("transformer_options", {})
    run_own = run_patcher.model_options.get("transformer_options", {})
    own_to = own.get("transformer_options", {})
    to = {k: v for k, v in run_to.items() if k not in run_own and k not in PER_MODEL_TRANSFORMER_OPTIONS}
    to.update((k, v) for k, v in own_to.items() if k not in ("wrappers", "callbacks"))
    # the MODEL's own wrappers / callbacks and those its options already hold (from a node, or merged by a guider):
    # each function once
    to["wrappers"] = _each_once(own_to.get("wrappers", {}), getattr(patcher, "wrappers", {}))
    to["callbacks"] = _each_once(own_to.get("callbacks", {}), getattr(patcher, "callbacks", {}))
    out["transformer_options"] = to
    return out


def _each_once(*tables: dict) -> dict:
    """``{kind: {key: [fn, ...]}}`` tables merged, each function once, in order."""
    out: dict = {}
    for table in tables:
        for kind, by_key in table.items():
            for key, fns in by_key.items():
                have = out.setdefault(kind, {}).setdefault(key, [])
                have.extend(f for f in fns if not any(f is g for g in have))
    return out


def check_conditioning(positive, features: int) -> None:
    if not isinstance(positive, list) or not positive:
        raise sa.SamplingArgumentError(f"{NODE_NAME}: 'positive' is empty or not a CONDITIONING: {sa.FIX_CONDITIONING}")
    for i, item in enumerate(positive):
        cond = item[0] if isinstance(item, (list, tuple)) and item else None
        if not isinstance(cond, torch.Tensor):
            raise sa.SamplingArgumentError(
                f"{NODE_NAME}: 'positive' entry {i} holds no text features "
                f"(a zeroed-out or empty conditioning?): {sa.FIX_CONDITIONING}"
            )
        try:
            sa.check_text_features(cond.shape, features)
        except sa.SamplingArgumentError as exc:
            raise sa.SamplingArgumentError(f"{NODE_NAME}: {exc}") from None


def _on_device(conditioning, device: torch.device):
    """The conditioning tensors moved to the model's device once per run. ComfyUI keeps CLIPTextEncode's output
    on the intermediate device and copies it at every model call: Ideogram 4's 512 x 53248 text features are
    54 MB, a pageable copy per step."""
    if device.type == "cpu":
        return conditioning
    return [[c.to(device, non_blocking=True) if isinstance(c, torch.Tensor) else c, *rest] for c, *rest in conditioning]


def empty_latent(model, width: int, height: int, batch_size: int = 1) -> torch.Tensor:
    """The zero latent [B, C, H/16, W/16] a run of ``model`` starts from (float32, intermediate device): C the
    model's input channels."""
    channels = model.model.latent_format.latent_channels
    in_ch = int(model.model.model_config.unet_config.get("in_channels", channels))
    return torch.zeros(
        [batch_size, in_ch, height // 16, width // 16], device=comfy.model_management.intermediate_device()
    )


def sample(
    model,
    model_negative,
    positive,
    plan: sa.SamplingPlan,
    width: int,
    height: int,
    seed: int,
    batch_size: int = 1,
    node_id: str | None = None,
) -> torch.Tensor:
    """The latent [B, C, H/16, W/16] (float32, intermediate device) of one run.

    The GEMM-path panel is told after the run (``publish("run", labels of both MODELs, node_id)``)."""
    settings.reload()  # the switches are read once per run
    latent = empty_latent(model, width, height, batch_size)
    noise = comfy.sample.prepare_noise(latent, seed)
    guider = PerStepGuidanceGuider(model, model_negative, plan.guidance)
    guider.set_conds(_on_device(positive, model.load_device), UNCOND_IMAGE_ONLY)
    sampler = comfy.samplers.sampler_object("euler")
    callback = latent_preview.prepare_callback(model, plan.steps, {})
    kernels.REGISTRY.begin_run()
    try:
        with pin_ahead.during_run(), one_pass_per_branch([model, model_negative]), pass_graphs([model, model_negative]):
            # each MODEL runs its own pass (no doubled batch), replayed as a CUDA graph where it can
            load_together([model, model_negative], latent.shape)  # both branches share the card (low-VRAM streaming)
            samples = guider.sample(
                noise,
                latent,
                sampler,
                plan.sigmas,
                callback=callback,
                disable_pbar=not comfy.utils.PROGRESS_BAR_ENABLED,
                seed=seed,
            )
    finally:
        kernels.REGISTRY.end_run()
        publish("run", model_labels(model, model_negative) or None, node_id, "Ideogram4Int8Sampler")
    return samples.to(comfy.model_management.intermediate_device())


CUSTOM_ONLY = "custom preset only: "  # how the tooltip of each input of _custom_inputs() starts
GUIDANCE = (0.0, 30.0, 0.1)  # min, max, step of both guidance inputs


def _custom_inputs(base) -> list:
    """The inputs only the 'custom' preset reads (the web extension hides them under a named preset, CUSTOM_ONLY in
    web/lib/sampler_widgets.mjs): advanced widgets starting at the preset ``base``'s values, each tooltip starting
    with CUSTOM_ONLY."""
    g = base.guidance  # per step: the main steps' guidance, then the polish steps'
    polish_tip = "how many final steps use the polish guidance (official: 3 / 2 / 1 for Quality / Default / Turbo)."
    specs = (
        (io.Int, "steps", base.steps, (1, sa.MAX_STEPS, 1), "number of Euler steps."),
        (io.Float, "guidance", g[0], GUIDANCE, "guidance of the main steps (official: 7)."),
        (io.Int, "polish_steps", g.count(g[-1]), (0, sa.MAX_STEPS, 1), polish_tip),
        (io.Float, "polish_guidance", g[-1], GUIDANCE, "guidance of the polish steps (official: 3)."),
        (io.Float, "mu", base.mu, (-5.0, 5.0, 0.05), "logSNR shift of the logit-normal schedule."),
        (io.Float, "std", base.std, (0.05, 5.0, 0.05), "spread of the logit-normal schedule."),
    )
    return [
        kind.Input(name, default=default, min=lo, max=hi, step=step, advanced=True, tooltip=CUSTOM_ONLY + what)
        for kind, name, default, (lo, hi, step), what in specs
    ]


class Ideogram4Int8Sampler(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        presets = list(sa.PRESET_CHOICES)
        base = PRESETS[DEFAULT_PRESET]
        return io.Schema(
            node_id="Ideogram4Int8Sampler",
            display_name=NODE_NAME,
            category=CATEGORY,
            description="Samples Ideogram 4 exactly like the official pipeline: asymmetric CFG with the "
            "unconditional branch image-only, per-step guidance with the polish steps last, the preset's "
            "schedule, ComfyUI's seeded noise. Output LATENT goes to VAE Decode with flux2-vae.",
            search_aliases=["ideogram4 sampler", "ideogram ksampler", "asymmetric cfg"],
            inputs=[
                io.Model.Input(
                    "model",
                    tooltip="Conditional Ideogram 4 MODEL (the 'conditional' output of "
                    "Ideogram 4 INT8 Loader, or any native Ideogram 4 model).",
                ),
                io.Model.Input(
                    "model_negative",
                    tooltip="Unconditional Ideogram 4 MODEL (the separate "
                    "unconditional weights; it sees image tokens only).",
                ),
                io.Conditioning.Input(
                    "positive",
                    tooltip="Ideogram 4 text features: CLIPTextEncode with a "
                    "CLIPLoader of type ideogram4 (Qwen3-VL 8B). A JSON "
                    "caption from the caption builder works best.",
                ),
                io.Int.Input(
                    "seed",
                    default=0,
                    min=0,
                    max=0xFFFFFFFFFFFFFFFF,
                    step=1,
                    control_after_generate=True,
                    tooltip="Noise seed: the same seed gives the same noise as RandomNoise + "
                    "SamplerCustomAdvanced in a native graph.",
                ),
                io.Combo.Input(
                    "preset",
                    options=presets,
                    default=DEFAULT_PRESET,
                    tooltip="Official presets: Quality 48 (45x7 then 3x3, mu 0, std 1.5), Default 20 "
                    "(18x7 then 2x3, mu 0, std 1.75), Turbo 12 (11x7 then 1x3, mu 0.5, std "
                    "1.75). 'custom' uses the inputs below.",
                ),
                io.Int.Input("width", **SIZE, tooltip=_size_tooltip("width")),
                io.Int.Input("height", **SIZE, tooltip=_size_tooltip("height")),
                io.Int.Input(
                    "batch_size",
                    default=1,
                    min=1,
                    max=sa.MAX_BATCH,
                    step=1,
                    advanced=True,
                    tooltip="Images per run (one noise tensor for the batch, as ComfyUI draws it).",
                ),
                *_custom_inputs(base),
            ],
            outputs=[io.Latent.Output(display_name="LATENT")],
            hidden=[io.Hidden.unique_id],  # the panel ties this node's badge to the models it ran
        )

    @classmethod
    def execute(
        cls,
        model,
        model_negative,
        positive,
        seed,
        preset,
        width,
        height,
        batch_size=1,
        **custom,
    ) -> io.NodeOutput:
        """Before the run ComfyUI refuses a value past a widget's min / max, on that widget alone. What it cannot
        express (a multiple of 16, the aspect ratio of width and height, polish_steps <= steps) is refused here,
        when the node runs (after the nodes upstream), in one error. No validate_inputs: ComfyUI 0.33 drops its
        min / max check for every input that function names and lists each failure under each of them.
        ``custom``: the custom-only inputs (``_custom``), which go to ``plan_sampling`` as they are."""
        try:  # the arguments first: a bad one is reported before anything else is looked at
            plan = sa.plan_sampling(preset, width, height, **custom)
            sa.check_batch_size(batch_size)
        except sa.SamplingArgumentError as exc:
            raise sa.SamplingArgumentError(f"{NODE_NAME}: {exc}") from None
        require_ideogram4(model, "model", NODE_NAME)
        require_ideogram4(model_negative, "model_negative", NODE_NAME)
        features = text_features(model)
        check_conditioning(positive, features)
        if text_features(model_negative) != features or model_negative.model.model_config.unet_config.get(
            "in_channels"
        ) != model.model.model_config.unet_config.get("in_channels"):
            raise sa.SamplingArgumentError(
                f"{NODE_NAME}: 'model' and 'model_negative' are different Ideogram 4 "
                "architectures; connect the two branches of the same checkpoint"
            )
        samples = sample(model, model_negative, positive, plan, width, height, seed, batch_size, node_id_of(cls))
        return io.NodeOutput({"samples": samples})


NODES = [Ideogram4Int8Sampler]
