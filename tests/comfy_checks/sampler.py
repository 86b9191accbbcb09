"""The sampler node against ``ideogram4.sample`` and ComfyUI's own graph; interrupting a run; the step profile."""

import comfy.model_management
import comfy.utils
import torch
from comfyui_ideogram4_int8.ideogram4 import make_noise, read_branch, sample
from comfyui_ideogram4_int8.nodes import sampler_nodes
from comfyui_ideogram4_int8.nodes.runtime import int8_ops

from comfy_checks.common import CFG, G, dequantized_state, inputs, latent_node, load, reference, rel, seed, write_all


def _float_models(path):
    """Both branches as native MODELs through the pack's build path, with the dequantized float weights."""
    from comfyui_ideogram4_int8.nodes.runtime.native_model import build_native_model

    out = []
    for branch in ("conditional", "unconditional"):
        floats = dequantized_state(read_branch(path, branch, dtype=torch.float32))
        out.append(build_native_model(floats, CFG, label=f"float-{branch}", compute_dtype=torch.float32)[0])
    return out


def check_sampler():
    """Our sampler node vs ideogram4.sample (same models, same seed), vs the native DualModelGuider graph, and the
    per-step guidance / sigmas it feeds ComfyUI for each official preset."""
    files, _ = write_all()
    res = {}
    ctx = torch.randn(1, 7, CFG.llm_features_dim, generator=G)
    s = int(torch.randint(0, 2**31, (1,), generator=G))
    noise = make_noise(s, 256, 256, 1)

    def node_and_sample(c, u):
        """The node's latent, and ``sample``'s on the same two diffusion models and noise."""
        got = latent_node(c, u, ctx, s)
        with torch.no_grad():
            want = sample(
                c.model.diffusion_model,
                u.model.diffusion_model,
                ctx,
                width=256,
                height=256,
                preset="Turbo 12",
                noise=noise,
            )
        return got, want

    # float weights: the loop itself, no activation quantization in between
    fc, fu = _float_models(files["w8a8"])
    res["float/vs_sample"] = rel(*node_and_sample(fc, fu))
    # W8A8 (the fused-path stand-in on CPU): the same comparison, plus our reference DiT
    cond, uncond, _ = load("i4_w8a8.safetensors")
    got, want = node_and_sample(cond, uncond)
    with torch.no_grad():
        ref = sample(
            reference(files["w8a8"], "conditional"),
            reference(files["w8a8"], "unconditional"),
            ctx,
            width=256,
            height=256,
            preset="Turbo 12",
            noise=noise,
        )
    res["int8/vs_sample"] = rel(got, want)
    res["int8/vs_reference_dit"] = rel(got, ref)
    res["int8/shape"] = list(got.shape)
    res["int8/other_seed_diff"] = rel(latent_node(cond, uncond, ctx, s + 1, preset="custom", steps=3), got)
    # the native graph (DualModelGuider, negative unconnected + Ideogram4Scheduler + SamplerCustomAdvanced) with a
    # constant guidance: our node with a custom preset of 0 polish steps must give the same latent
    from comfy_extras import nodes_custom_sampler as ncs
    from comfy_extras.nodes_flux import EmptyFlux2LatentImage
    from comfy_extras.nodes_ideogram4 import Ideogram4Scheduler

    guider = ncs.DualModelGuider.execute(model=cond, positive=[[ctx, {}]], cfg=5.5, model_negative=uncond).result[0]
    sigmas = Ideogram4Scheduler.execute(steps=4, width=256, height=384, mu=0.25, std=1.6).result[0]
    native = ncs.SamplerCustomAdvanced.execute(
        noise=ncs.RandomNoise.execute(noise_seed=s).result[0],
        guider=guider,
        sampler=ncs.KSamplerSelect.execute(sampler_name="euler").result[0],
        sigmas=sigmas,
        latent_image=EmptyFlux2LatentImage.execute(width=256, height=384, batch_size=1).result[0],
    ).result[0]["samples"]
    ours = latent_node(
        cond,
        uncond,
        ctx,
        s,
        preset="custom",
        w=256,
        h=384,
        steps=4,
        guidance=5.5,
        polish_steps=0,
        polish_guidance=3.0,
        mu=0.25,
        std=1.6,
    )
    res["native_graph_max_abs"] = (native - ours).abs().max().item()
    res["native_graph_norm"] = native.norm().item()
    # per-step guidance and sigmas of every preset at 1024x1024, with the model calls stubbed out (fast)
    import comfy.samplers

    guider = sampler_nodes.PerStepGuidanceGuider
    seen = []
    real_predict, real_calc = guider.predict_noise, comfy.samplers.calc_cond_batch

    def spy(self, x, timestep, model_options={}, seed=None):  # noqa: B006
        out = real_predict(self, x, timestep, model_options, seed)
        seen.append((float(timestep.reshape(-1)[0]), float(self.cfg)))  # the guidance this step ran with
        return out

    guider.predict_noise = spy
    comfy.samplers.calc_cond_batch = lambda model, conds, x, *a, **k: [torch.zeros_like(x) for _ in conds]
    try:
        from comfyui_ideogram4_int8.ideogram4 import PRESETS
        from comfyui_ideogram4_int8.ideogram4 import sigmas as our_sigmas

        for name, p in PRESETS.items():
            seen.clear()
            latent_node(cond, uncond, ctx, s, preset=name, w=1024, h=1024)
            want_sig = our_sigmas(p.steps, 1024, 1024, p.mu, p.std)[:-1].tolist()
            res[f"preset/{name}/guidance_ok"] = [g for _, g in seen] == list(p.guidance)
            res[f"preset/{name}/sigma_max_abs"] = max(abs(a - b) for (a, _), b in zip(seen, want_sig, strict=True))
            res[f"preset/{name}/calls"] = len(seen)
    finally:
        guider.predict_noise, comfy.samplers.calc_cond_batch = real_predict, real_calc
    return res


def check_interrupt():
    write_all()
    cond, uncond, _ = load("i4_w8a8.safetensors")
    ctx = torch.randn(1, 6, CFG.llm_features_dim, generator=G)
    clean = latent_node(cond, uncond, ctx, 7, preset="Turbo 12")
    steps_seen = []

    def hook(value, total, preview, node_id=None):
        steps_seen.append(value)
        if value == 3:
            comfy.model_management.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    # ComfyUI passes a step to the hook only 100 ms after the last one it passed: on a fast machine step 3 would
    # never reach it (the check then depended on the machine's speed). Every step, here.
    throttle = comfy.utils.PROGRESS_THROTTLE_MIN_INTERVAL
    comfy.utils.PROGRESS_THROTTLE_MIN_INTERVAL = 0.0
    interrupted = False
    try:
        latent_node(cond, uncond, ctx, 7, preset="Turbo 12")
    except comfy.model_management.InterruptProcessingException:
        interrupted = True
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
        comfy.utils.PROGRESS_THROTTLE_MIN_INTERVAL = throttle
        comfy.model_management.interrupt_current_processing(False)
    leftovers = [n for n, m in int8_ops.int8_linears(cond.model.diffusion_model).items() if len(m.weight_function)]
    again = latent_node(cond, uncond, ctx, 7, preset="Turbo 12")
    return {
        "interrupted": interrupted,
        "steps_before_interrupt": max(steps_seen) if steps_seen else 0,
        "rerun_max_abs": (again - clean).abs().max().item(),
        "leftover_weight_functions": leftovers,
        "clean_norm": clean.norm().item(),
    }


def check_step_profile():
    """bench/step_profile.py stepped from ComfyUI's per-step preview callback, as bench/comfy/child.py steps it: the
    pack's sampler calls it once per step, in order, after the step's model calls, so the middle steps' operators
    (CPU profiler here) are the same per step in runs of different lengths, and the run's seeded noise, drawn once
    before the first step, is no per-step row."""
    import latent_preview
    from comfyui_ideogram4_int8.bench.step_profile import StepProfile, middle_steps
    from comfyui_ideogram4_int8.ideogram4 import sampling_args
    from torch.profiler import ProfilerActivity

    write_all()
    cond, uncond, _ = load("i4_w8a8.safetensors")
    _, ctx, _, _ = inputs(batch=1)
    prepare, res = latent_preview.prepare_callback, {}
    for steps in (5, 8):
        prof, seen = StepProfile(middle_steps(steps, 2), [ProfilerActivity.CPU]), []

        def hooked(model, total, x0_output_dict=None, prof=prof, seen=seen):
            preview = prepare(model, total, x0_output_dict)

            def each(step, x0, x, total_steps):
                preview(step, x0, x, total_steps)
                seen.append(step)
                prof.step_done(step)

            return each

        latent_preview.prepare_callback = hooked
        try:
            plan = sampling_args.plan_sampling("custom", 256, 256, steps=steps, polish_steps=1)
            with prof:
                sampler_nodes.sample(cond, uncond, [[ctx, {}]], plan, 256, 256, seed)
        finally:
            latent_preview.prepare_callback = prepare
        out = prof.report()
        res[f"{steps}/seen"] = seen
        res[f"{steps}/profile"] = out["profile"]
        res[f"{steps}/per_step_counts"] = {k: v["count"] for k, v in out["kernels"].items()}
        res[f"{steps}/per_run"] = out["per_run"]["kernels"]
    return res
