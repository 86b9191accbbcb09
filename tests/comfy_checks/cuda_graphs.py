"""The sampler's CUDA graphs: when they wrap a pass, replay it, and are released."""

import os

import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.kernels import model_notes, settings

from comfy_checks.common import CFG, GPU, MODELS, G, env_var, latent_node, load, native_unet, write_all


def check_cuda_graphs():
    """The sampler's CUDA graphs (nodes/runtime/cuda_graphs.py). Anywhere: the wrapper goes on the pack's MODELs for the
    run only (never on a native MODEL) and comes off after it, also when the run fails; a pass on a CPU runs as it
    always does, with no note; the reasons a pass stays eager; the graphs kept between runs go when ComfyUI moves the
    weights. With COMFY_GPU=1: the latent with graphs (the default) equals the eager one (IDEOGRAM4_INT8_CUDA_GRAPHS=0)
    bit for bit, passes were replayed, the bypass check saw no bypass, the fused path ran; the next run replays every
    pass from the first run's graphs, bit for bit; unloading the MODELs frees their pool."""
    import comfy.patcher_extension
    from comfyui_ideogram4_int8.nodes.runtime import cuda_graphs, op_coverage

    dm_kind = comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL
    write_all()
    cond, uncond, _ = load("i4_w8a8.safetensors")
    ctx = torch.randn(1, 7, CFG.llm_features_dim, generator=G)
    s = int(torch.randint(0, 2**31, (1,), generator=G))
    native = native_unet(os.path.join(MODELS, "i4_bf16.safetensors"))  # ComfyUI's own MODEL: never wrapped
    seen = {}

    def keys(m):
        return sorted(m.wrappers.get(dm_kind, {}))

    with cuda_graphs.pass_graphs([cond, uncond, cond, native]) as wrappers:
        seen["during"] = {"cond": keys(cond), "uncond": keys(uncond), "native": keys(native)}
        seen["labels"] = [w.label for w in wrappers]
    seen["after"] = {"cond": keys(cond), "uncond": keys(uncond)}
    try:
        with cuda_graphs.pass_graphs([cond, uncond]):
            raise RuntimeError("a failed run")
    except RuntimeError:
        pass
    seen["after_failure"] = {"cond": keys(cond), "uncond": keys(uncond)}
    # why a run or a pass stays eager: the setting (run_reason), then the checks before each pass

    reasons = {}
    with env_var(settings.CUDA_GRAPHS, "0"):
        reasons["env_off"] = cuda_graphs.run_reason()
    with env_var(settings.CUDA_GRAPHS, "1"):
        reasons["env_on"] = cuda_graphs.run_reason()
    with env_var(settings.CUDA_GRAPHS, None):
        reasons["default"] = cuda_graphs.run_reason()
    reasons["pass_plain"] = cuda_graphs._off_reason(cond, {})
    reasons["patches"] = cuda_graphs._off_reason(cond, {"patches_replace": {"dit": {("double_block", 0): len}}})
    reasons["empty_patches"] = cuda_graphs._off_reason(cond, {"patches": {}, "patches_replace": {}})
    compile_to = {"wrappers": {comfy.patcher_extension.WrappersMP.APPLY_MODEL: {cuda_graphs.COMPILE_KEY: [len]}}}
    reasons["compile"] = cuda_graphs._off_reason(cond, compile_to)
    kernels.REGISTRY.enable_timing(True)
    try:
        reasons["timing"] = cuda_graphs._off_reason(cond, {})
    finally:
        kernels.REGISTRY.enable_timing(False)
    seen["reasons"] = reasons
    model_notes.forget()
    eager = latent_node(cond, uncond, ctx, s)
    seen["cpu_note"] = model_notes.notes("conditional").get(cuda_graphs.NOTE_KIND)
    if GPU:
        model_notes.forget()
        with env_var(settings.CUDA_GRAPHS, "0"):
            off = latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=512, h=512)
        seen["off_note"] = model_notes.notes("conditional").get(cuda_graphs.NOTE_KIND)
        with env_var(settings.CUDA_GRAPHS, None):  # the default: graphs on
            auto = latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=512, h=512)
        seen["auto_note"] = model_notes.notes("conditional").get(cuda_graphs.NOTE_KIND)
        seen["auto_equal"] = bool(torch.equal(auto, off))
        model_notes.forget()
        from comfyui_ideogram4_int8.ideogram4 import graph_replay

        cuda_graphs.release(cond)  # what the default run captured: the next run starts with none
        replayed_before = op_coverage.coverage(cond.model.diffusion_model).replayed
        with env_var(settings.CUDA_GRAPHS, "1"):  # one card: graphs only when asked for
            on = latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=512, h=512)
        notes = {label: model_notes.notes(label) for label in ("conditional", "unconditional")}
        replayed = op_coverage.coverage(cond.model.diffusion_model).replayed - replayed_before
        graphs = graph_replay.graphs_of(cond.model.diffusion_model)
        captures = graphs.stats.captures
        with env_var(settings.CUDA_GRAPHS, "1"):  # the next prompt: the graphs of the first run replay from pass 1
            again = latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=512, h=512)
        again_notes = {label: model_notes.notes(label) for label in ("conditional", "unconditional")}
        pool = graphs.pool
        held = {"graphs": graphs.graphs, "pool_bytes": pool.bytes, "reserved": cuda_graphs.reserved_for_graphs()}
        reserved_before = torch.cuda.memory_reserved()
        comfy.model_management.unload_all_models()  # ComfyUI unloads the MODELs: the pool goes with them
        comfy.model_management.soft_empty_cache()
        seen["gpu"] = {
            "device": str(on.device),
            "equal": bool(torch.equal(on, off)),
            "max_abs": (on.double() - off.double()).abs().max().item(),
            "notes": {k: v.get(cuda_graphs.NOTE_KIND) for k, v in notes.items()},
            "bypass": {k: v.get(op_coverage.NOTE_KIND) for k, v in notes.items()},
            "replayed": replayed,
            "paths": {k: sorted({r.path for r in kernels.REGISTRY.layers(k)}) for k in notes},
            "wrappers_after": keys(cond),
            "rope_launches": kernels.REGISTRY.launches["qk_norm_rope_triton"],
            "again_equal": bool(torch.equal(again, on)),
            "again_notes": {k: v.get(cuda_graphs.NOTE_KIND) for k, v in again_notes.items()},
            "again_captures": graphs.stats.captures - captures,
            "held": held,
            "after_unload": {
                "graphs": graphs.graphs,
                "pool_bytes": pool.bytes,
                "reserved": cuda_graphs.reserved_for_graphs(),
                "card_bytes_returned": reserved_before - torch.cuda.memory_reserved(),
            },
        }
        seen["gpu"]["oom"] = _out_of_memory_case(cond, uncond, ctx, s)
    seen["cpu_finite"] = bool(torch.isfinite(eager).all())
    # the panel's note names a direct capture that failed (its pass ran eagerly first), with replays or without
    wrapper = cuda_graphs._GraphWrapper(cond, "conditional")
    wrapper.graphs.stats.retried.append("RuntimeError: a one-time copy")
    wrapper.modes.update(eager=1, captured=1, replayed=10)
    seen["retry_notes"] = [wrapper.note()]
    wrapper.modes.update(eager=1, captured=0, replayed=0)
    seen["retry_notes"].append(wrapper.note())
    wrapper.graphs.stats.retried.clear()
    seen["release"] = _graph_release_cases(cond)
    return seen


def _out_of_memory_case(cond, uncond, ctx, s):
    """A new resolution's eager pass that runs out of memory while the model holds graphs (raised inside its first
    block, under the pack's wrapper): the pool goes, the pass runs again, and the run's latent equals one without the
    failure."""
    from comfyui_ideogram4_int8.ideogram4 import graph_replay

    raised = []

    def out_of_memory_once(module, args):
        if not raised:
            raised.append(True)
            raise torch.OutOfMemoryError("CUDA out of memory (raised by the check)")

    with env_var(settings.CUDA_GRAPHS, "1"):
        latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=512, h=512)  # graphs held again after the unload
        graphs = graph_replay.graphs_of(cond.model.diffusion_model)
        held, releases = graphs.graphs, graphs.pool.releases
        hook = cond.model.diffusion_model.layers[0].register_forward_pre_hook(out_of_memory_once)
        try:
            got = latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=384, h=384)
        finally:
            hook.remove()
        want = latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=384, h=384)
    return {
        "held_before": held,
        "raised": len(raised),
        "released": graphs.pool.releases - releases,
        "equal": bool(torch.equal(got, want)),
    }


def _graph_release_cases(model):
    """The graphs a MODEL keeps between runs go when ComfyUI moves its weights (partial unload, unload, unpatch), not
    when ComfyUI detaches it to load it again (every load_models_gpu call does), and their pool's bytes are counted in
    ComfyUI's reserved VRAM while they live. A CPU has no graphs: a stand-in pool and entries are put on the model."""
    import comfy.model_management as mm
    from comfyui_ideogram4_int8.ideogram4 import graph_replay
    from comfyui_ideogram4_int8.nodes.runtime import cuda_graphs

    dm = model.model.diffusion_model
    base = mm.EXTRA_RESERVED_VRAM
    out = {}

    def hold():
        graphs = graph_replay.graphs_of(dm)
        pool = graph_replay.GraphPool(torch.device("cpu"))
        pool.join(graphs)
        graphs._pool = pool
        graphs._entries[("signature",)] = graph_replay._Entry(graph=object())
        pool.captured(5 << 20)
        return graphs

    graphs = hold()  # the pack's own run: the pool is the passes' activations, which its requests ask for
    with env_var(settings.CUDA_GRAPHS, None), cuda_graphs.pass_graphs([model]):
        out["reserved_in_run"] = mm.EXTRA_RESERVED_VRAM - base
    out["reserved_after_run"] = mm.EXTRA_RESERVED_VRAM - base
    graph_replay.release_graphs_of(dm)
    for case, move in (
        ("detach_for_reload", lambda: model.detach(unpatch_all=False)),
        ("partially_unload", lambda: model.partially_unload(model.offload_device, 1 << 20)),
        ("unpatch", lambda: model.unpatch_model(model.offload_device, unpatch_weights=True)),
        ("detach", lambda: model.detach(unpatch_all=True)),
    ):
        graphs = hold()
        reserved = mm.EXTRA_RESERVED_VRAM - base
        move()
        out[case] = {
            "reserved_while_held": reserved,
            "graphs_after": graphs.graphs,
            "reserved_after": mm.EXTRA_RESERVED_VRAM - base,
            "counted": cuda_graphs.reserved_for_graphs().get("cpu", 0),
        }
        graph_replay.release_graphs_of(dm)
    out["reserved_end"] = mm.EXTRA_RESERVED_VRAM - base
    return out
