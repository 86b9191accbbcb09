"""Low-VRAM block streaming: ComfyUI's partial-load budget met block by block, each streamed block read into
device slots piece by piece."""

import torch
from comfy.quant_ops import QuantizedTensor
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.kernels import model_notes, settings

from comfy_checks.common import G, experiments, inputs, load, streaming_budget, write_all


def _piece_bytes_by_hand(block):
    """The three pieces of a streamed block from its modules, independently of the streamer: attention
    (adaln_modulation, qkv, o), the w1|w3 pair, w2; each tensor aligned as in a slot."""
    from comfyui_ideogram4_int8.ideogram4 import streaming
    from comfyui_ideogram4_int8.nodes.runtime.stream_pieces import weight_bytes

    ff, at = block.feed_forward, block.attention
    groups = [(block.adaln_modulation, at.qkv, at.o), (ff.w1, ff.w3), (ff.w2,)]
    return [sum(streaming.aligned(weight_bytes(m)) for m in g) for g in groups]


def _stream_order(streamer, forwards):
    """Whether the trace of ``forwards`` forwards binds the units in order, each released before the next binds."""
    keys = [u.key for u in streamer.units]
    events = [e[:3] for e in streamer.trace if e[0] != "copy"]
    return events == [(k, *u) for u in keys * forwards for k in ("use", "free")]


def _read_from_slot(stream, block, forward):
    """Per streamable module of ``block``: whether the weight it computed with in ``forward()`` lay in a slot (an
    unbound module would still compute right on the CPU, cast from its host copy). w1 / w3 are read in the fused pair
    call (a hook on them would split the pair); the others in a pre-hook that runs after the streamer's."""
    from comfyui_ideogram4_int8.nodes.runtime import ffn_fusion
    from comfyui_ideogram4_int8.nodes.runtime.stream_pieces import host_data

    spans = [(b.data_ptr(), b.data_ptr() + b.numel()) for b in stream.streamer.buffers]
    seen = {}

    def look(name, m):
        p = host_data(m.weight).data_ptr()
        seen[name] = any(a <= p < e for a, e in spans)

    ff = block.feed_forward
    probes = [
        m.register_forward_pre_hook(lambda m, a, name=name: look(name, m))
        for name, m in (("adaln_modulation", block.adaln_modulation), ("qkv", block.attention.qkv))
        + (("o", block.attention.o), ("w2", ff.w2))
    ]
    pair = ffn_fusion._gate_up

    def gate_up(f, h):
        if f is ff:
            look("w1", f.w1)
            look("w3", f.w3)
        return pair(f, h)

    ffn_fusion._gate_up = gate_up
    try:
        with torch.no_grad():
            forward()
    finally:
        ffn_fusion._gate_up = pair
        for h in probes:
            h.remove()
    return seen


def check_streaming():
    """Low-VRAM streaming (nodes.runtime.streaming_patcher) with CPU copies: ComfyUI's partial-load budget met block by
    block; a streamed block crosses as three pieces (attention, the fused w1|w3 pair, w2) through three slots of the
    largest piece, or whole through two with the experiment stream-whole-blocks; the streamed model computes what the
    resident one does, bit for bit, through the same paths; LoRA merged into the streamed copy; partially_unload
    streams more; unpatch restores; the pack's two MODELs rebalance."""
    from comfyui_ideogram4_int8.ideogram4 import streaming
    from comfyui_ideogram4_int8.nodes.runtime import ffn_fusion, stream_pieces, streaming_patcher

    write_all()
    cond, uncond, _ = load("i4_w8a8.safetensors")
    x, ctx, sigma, mask = inputs()
    res = {"patcher": type(cond).__name__}
    dm = cond.model.diffusion_model
    udm = uncond.model.diffusion_model
    with torch.no_grad():
        full = dm(x, sigma, context=ctx)
        full_uncond = udm(x, sigma, context=None)
        full_uncond_text = udm(x, sigma, context=ctx)  # a text the image-only branch never gets from the pack
    paths_resident = {r.layer: r.path for r in kernels.REGISTRY.layers("conditional")}
    before_sd = {k: (v._qdata if isinstance(v, QuantizedTensor) else v).clone() for k, v in dm.state_dict().items()}
    cpu = torch.device("cpu")
    for m in (cond, uncond):
        m.model.ideogram4_stream_any_device = True  # the CPU stands in for the card (copies in place)
    budget = streaming_budget(cond, 3)
    cond.patch_model(device_to=cpu, lowvram_model_memory=budget)
    stream = cond.model.ideogram4_stream
    res["streamed"] = list(stream.plan.streamed)
    res["loaded_within_budget"] = cond.model.model_loaded_weight_memory <= budget
    res["model_lowvram"] = cond.model.model_lowvram
    model_notes.forget("conditional")
    stream.streamer.tracing = True
    with torch.no_grad():
        outs = [dm(x, sigma, context=ctx) for _ in range(3)]
    res["max_abs_vs_resident"] = max((o - full).abs().max().item() for o in outs)
    # the pieces: three per streamed block in call order, bound one after the other, w1 / w3 without hooks
    res["units"] = [list(u.key) for u in stream.streamer.units]
    res["pieces_in_order"] = _stream_order(stream.streamer, 3)
    first = dm.layers[stream.plan.streamed[0]]
    res["piece_modules"] = {p.name: [n for n, _ in p.modules] for p in stream_pieces.pieces(first)}
    by_hand = {i: _piece_bytes_by_hand(dm.layers[i]) for i in stream.plan.streamed}
    res["slot_bytes"] = stream.plan.slot_bytes
    res["largest_piece"] = streaming.aligned(max(max(b) for b in by_hand.values()))
    res["largest_block"] = streaming.aligned(max(sum(b) for b in by_hand.values()))
    res["slots"] = len(stream.streamer.buffers)
    res["pair_hooks"] = sum(
        len(m._forward_pre_hooks) + len(m._forward_hooks)
        for i in stream.plan.streamed
        for m in (dm.layers[i].feed_forward.w1, dm.layers[i].feed_forward.w3)
    )
    paths = {r.layer: r.path for r in kernels.REGISTRY.layers("conditional")}
    streamed_layers = [k for k in paths if k.startswith(f"layers.{stream.plan.streamed[0]}.")]
    res["streamed_layers_recorded"] = len(streamed_layers)
    res["same_paths"] = all(paths[k] == paths_resident[k] for k in streamed_layers)
    ff = dm.layers[stream.plan.streamed[0]].feed_forward
    res["streamed_ffn_fused_calls"] = ff.fused_calls if isinstance(ff, ffn_fusion.GateUpFeedForward) else None
    res["unbound_after_forward"] = dm.layers[stream.plan.streamed[0]].attention.qkv.weight._qdata.data_ptr() not in {
        b.data_ptr() for b in stream.streamer.buffers
    }
    res["mispredicted"] = stream.streamer.stats.mispredicted
    res["note"] = model_notes.notes("conditional").get(streaming_patcher.NOTE_KIND)
    res["report"] = streaming_patcher.stream_report(cond)
    # CUDA graphs while streaming: a pass may be captured unless a weight streams from pageable memory; the graph's
    # key holds the slots it copies into and the host weights it copies from
    from comfyui_ideogram4_int8.nodes.runtime import cuda_graphs

    res["graphs_off_reason"] = cuda_graphs._off_reason(cond, {})
    res["pageable"] = stream.streamer.stats.pageable
    fp = cuda_graphs.fingerprint(cond, dm)
    host_ptrs = {t.data_ptr() for u in stream.streamer.units for t in u.host}
    res["fingerprint_streaming"] = fp is not None and {b.data_ptr() for b in stream.streamer.buffers} <= set(fp)
    res["fingerprint_host_weights"] = fp is not None and len(host_ptrs & set(fp)) > 0
    res["read_from_slot"] = _read_from_slot(stream, first, lambda: dm(x, sigma, context=ctx))
    # ComfyUI asks for memory back: more blocks stream, the output stays; the replaced plan's slots are gone at once
    # (not at the next garbage collection: ComfyUI reads free memory right after and asks again if it is not there)
    import gc
    import weakref

    old_slots = [weakref.ref(b) for b in stream.streamer.buffers]
    del stream
    target = streaming_budget(cond, 4)
    gc.disable()
    try:
        freed = cond.partially_unload(cpu, memory_to_free=cond.model.model_loaded_weight_memory - target)
        res["old_slots_alive"] = sum(r() is not None for r in old_slots)
    finally:
        gc.enable()
    res["old_slots"] = len(old_slots)
    res["freed_positive"] = freed > 0
    res["streamed_after_unload"] = len(cond.model.ideogram4_stream.plan.streamed)
    with torch.no_grad():
        res["max_abs_after_unload"] = (dm(x, sigma, context=ctx) - full).abs().max().item()
    cond.unpatch_model(cpu)
    res["stream_after_unpatch"] = cond.stream is None
    # the experiment stream-whole-blocks (A/B): whole blocks through two slots of the largest block, the same output
    with experiments(streaming_patcher.WHOLE_BLOCKS):
        cond.patch_model(device_to=cpu, lowvram_model_memory=streaming_budget(cond, 3))
        whole = cond.model.ideogram4_stream
        whole.streamer.tracing = True
        fused_before = ff.fused_calls
        with torch.no_grad():
            outs = [dm(x, sigma, context=ctx) for _ in range(2)]
        by_hand = [sum(_piece_bytes_by_hand(dm.layers[i])) for i in whole.plan.streamed]
        res["whole"] = {
            "units": [list(u.key) for u in whole.streamer.units],
            "streamed": list(whole.plan.streamed),
            "slots": len(whole.streamer.buffers),
            "slot_bytes": whole.plan.slot_bytes,
            "largest_block": streaming.aligned(max(by_hand)),
            "in_order": _stream_order(whole.streamer, 2),
            "max_abs": max((o - full).abs().max().item() for o in outs),
            "fused_calls": ff.fused_calls - fused_before,
            "mispredicted": whole.streamer.stats.mispredicted,
            "report": streaming_patcher.stream_report(cond),
        }
        cond.unpatch_model(cpu)
    # LoRA on a streamed layer: merged into the host copy, equal to the same patch merged in a full load
    lora = cond.clone()
    key = f"diffusion_model.layers.{cond.stream_plan(budget).streamed[0]}.attention.qkv.weight"
    real = dm.layers[0].attention.qkv.weight.dequantize()
    patch = torch.randn(real.shape, generator=G) * 0.3 * real.float().std()
    lora.add_patches({key: (patch,)}, 1.0)
    lora.patch_model(device_to=cpu, lowvram_model_memory=0)  # full load: merged, requantized
    with torch.no_grad():
        want = lora.model.diffusion_model(x, sigma, context=ctx)
    lora.unpatch_model(cpu)
    lora.patch_model(device_to=cpu, lowvram_model_memory=budget)
    res["lora_streamed"] = key.split(".")[2] in [str(i) for i in lora.model.ideogram4_stream.plan.streamed]
    with torch.no_grad():
        got = lora.model.diffusion_model(x, sigma, context=ctx)
    res["lora_max_abs_vs_full_load"] = (got - want).abs().max().item()
    res["lora_changed_output"] = (want - full).abs().max().item()
    lora.unpatch_model(cpu)
    after_sd = dm.state_dict()
    res["restored_after_unpatch"] = all(
        torch.equal((after_sd[k]._qdata if isinstance(after_sd[k], QuantizedTensor) else after_sd[k]), v)
        for k, v in before_sd.items()
    )
    # the pack's two MODELs on one card: the second load rebalances the first to its share
    uncond.patch_model(device_to=cpu, lowvram_model_memory=uncond.model_size() * 2)
    res["uncond_first_resident"] = uncond.stream is None
    cond.patch_model(device_to=cpu, lowvram_model_memory=streaming_budget(cond, 4))
    res["uncond_streams_after_rebalance"] = uncond.stream is not None
    cond_stream = cond.model.ideogram4_stream  # None: what the other branch freed made room for all of it
    res["cond_streamed_after_rebalance"] = len(cond_stream.plan.streamed) if cond_stream is not None else 0
    res["within_pool"] = (
        cond.model.model_loaded_weight_memory + uncond.model.model_loaded_weight_memory
        <= streaming_budget(cond, 4) + uncond.model_size()
    )
    with torch.no_grad():
        res["max_abs_rebalanced"] = (dm(x, sigma, context=ctx) - full).abs().max().item()
    # the image-only branch leaves llm_cond_proj on the host once it streams; the conditional branch runs it
    res["host_bytes"] = {
        "uncond": uncond.model.ideogram4_stream.plan.host_bytes,
        "cond_layers": len(streaming_patcher._host_layers(cond.model)),
        "llm_cond_proj": streaming_patcher._weight_bytes(udm.llm_cond_proj),
    }
    res["uncond_host_layer_cast"] = bool(udm.llm_cond_proj.comfy_cast_weights) and (
        "diffusion_model.llm_cond_proj" in uncond.model.ideogram4_streamed_modules
    )
    res["uncond_plan_note"] = uncond.model.ideogram4_stream.plan.describe()
    with torch.no_grad():
        res["max_abs_uncond_streamed"] = (udm(x, sigma, context=None) - full_uncond).abs().max().item()
        res["max_abs_uncond_text_streamed"] = (udm(x, sigma, context=ctx) - full_uncond_text).abs().max().item()
    cond.unpatch_model(cpu)
    uncond.unpatch_model(cpu)
    res["uncond_host_layer_back"] = not udm.llm_cond_proj.comfy_cast_weights
    # loaded in one call (load_together), the first MODEL takes its share at once: no full load for the second
    # load to shrink (its plan stays), and the two fit what the first was offered
    joint = uncond.model_size() + streaming_budget(cond, 4)
    with streaming_patcher.loading_together([uncond, cond]):
        uncond.patch_model(device_to=cpu, lowvram_model_memory=joint)
        first = {"streams": uncond.stream is not None, "changes": uncond.model.ideogram4_plan_changes}
        cond.patch_model(device_to=cpu, lowvram_model_memory=joint - uncond.model.model_loaded_weight_memory)
    with torch.no_grad():
        out = dm(x, sigma, context=ctx)
    res["together"] = {
        "first_streams": first["streams"],
        "first_kept": uncond.model.ideogram4_plan_changes == first["changes"],
        "second_streams": cond.stream is not None,
        "within": cond.model.model_loaded_weight_memory + uncond.model.model_loaded_weight_memory <= joint,
        "max_abs": (out - full).abs().max().item(),
        "left_after": dict(streaming_patcher._TOGETHER),
    }
    cond.unpatch_model(cpu)
    uncond.unpatch_model(cpu)
    # load_together leaves free what ComfyUI's per-pass requests (prepare_sampling) will insist on, so they shrink
    # neither branch afterwards (load_models_gpu recorded instead of run: the CPU stands in for a CUDA card)
    import comfy.model_management as mm
    import comfy.sampler_helpers
    from comfyui_ideogram4_int8.nodes.runtime import parking

    calls, fresh = [], []

    def load_models_gpu(models, **kw):
        # a MODEL not on the card yet comes parked with all its bytes: ComfyUI is asked nothing for it (its load takes
        # the room itself, from the dynamic models' pages first); the load unparks it
        fresh.append(
            [
                (parking.parked_bytes(m) == m.model_size(), mm.LoadedModel(m).model_memory_required(m.load_device))
                for m in models
            ]
        )
        for m in models:
            parking.unpark(m)
        calls.append((list(models), kw))

    real_load, real_device = comfy.model_management.load_models_gpu, cond.load_device
    comfy.model_management.load_models_gpu = load_models_gpu
    # ... and, inside the pack's sampler (one_pass_per_branch), each branch's request is ComfyUI's estimate for the
    # one pass it runs (one batch), not for a doubled batch; the factor comes back after, also after a failure
    noise_shape = (1, *x.shape[1:])
    factor = cond.model.memory_usage_factor
    doubled, one_batch = comfy.sampler_helpers.estimate_memory(cond, noise_shape, {"positive": []})
    inside = {}
    try:
        cond.load_device = torch.device("cuda")
        loaded = streaming_patcher.load_together([cond, uncond, cond], noise_shape)
        # a later run, both branches on the card already: no graph share asked again (the first load left it)
        cond.model.model_loaded_weight_memory = uncond.model.model_loaded_weight_memory = 1
        streaming_patcher.load_together([cond, uncond], noise_shape)
        cond.model.model_loaded_weight_memory = uncond.model.model_loaded_weight_memory = 0
        later = calls.pop()
        # the graphs' pool as measured when last released on this card, where it is more than the share
        pool = doubled * 2
        streaming_patcher._GRAPH_POOL_BYTES["cuda"] = pool
        streaming_patcher.load_together([cond, uncond], noise_shape)
        del streaming_patcher._GRAPH_POOL_BYTES["cuda"]
        with_pool = calls.pop()
        with streaming_patcher.one_pass_per_branch([cond, uncond, cond]):
            streaming_patcher.load_together([cond, uncond], noise_shape)
            inside["estimate"] = comfy.sampler_helpers.estimate_memory(cond, noise_shape, {"positive": []})
            inside["uncond_factor"] = uncond.model.memory_usage_factor
        with experiments(f"{streaming_patcher.PASS_ESTIMATE}=comfyui"):
            with streaming_patcher.one_pass_per_branch([cond, uncond]):
                inside["comfyui_env"] = comfy.sampler_helpers.estimate_memory(cond, noise_shape, {"positive": []})
        with experiments(f"{parking.EXPERIMENT}=off"):
            streaming_patcher.load_together([cond, uncond], noise_shape)
            calls.pop()

        # a load that fails before a MODEL reached the card leaves it unparked (not counted as loaded)
        def failing(models, **kw):
            raise RuntimeError("the load failed")

        comfy.model_management.load_models_gpu = failing
        try:
            streaming_patcher.load_together([cond, uncond], noise_shape)
        except RuntimeError:
            inside["parked_after_failure"] = [parking.parked_bytes(m) for m in (cond, uncond)]
        comfy.model_management.load_models_gpu = load_models_gpu
        try:
            with streaming_patcher.one_pass_per_branch([cond, uncond]):
                raise RuntimeError("sampling failed")
        except RuntimeError:
            pass
    finally:
        comfy.model_management.load_models_gpu, cond.load_device = real_load, real_device
    res["load_together"] = {
        "loaded": loaded,
        "calls": len(calls),
        "models": [m is want for m, want in zip(calls[0][0], (cond, uncond), strict=True)] if calls else None,
        "memory_required": calls[0][1].get("memory_required") if calls else None,
        "minimum_memory_required": calls[0][1].get("minimum_memory_required") if calls else None,
        "per_pass_estimate": doubled,
        "one_batch_estimate": one_batch,
        "margin": streaming_patcher.PER_PASS_MARGIN,
        "graph_share": streaming_patcher.GRAPH_SHARE,
        "graphs_on": settings.cuda_graphs() != "off",
        "inside_memory_required": calls[1][1].get("memory_required") if len(calls) > 1 else None,
        "later_memory_required": later[1].get("memory_required"),
        "pool_memory_required": with_pool[1].get("memory_required"),
        "inside_estimate": list(inside.get("estimate", ())),
        "fresh": fresh,
        "parked_after_failure": inside.get("parked_after_failure"),
        "inside_factor_ratio": inside.get("uncond_factor", 0) / factor,
        "comfyui_env_estimate": list(inside.get("comfyui_env", ())),
        "factor_restored": cond.model.memory_usage_factor == factor and uncond.model.memory_usage_factor == factor,
    }
    try:
        cond.stream_plan(1)
        res["insufficient"] = None
    except streaming.InsufficientVRAMError as exc:
        res["insufficient"] = str(exc)
    return res
