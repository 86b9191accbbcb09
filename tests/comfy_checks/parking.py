"""A MODEL unloaded whole with its host copies is parked: ComfyUI counts it as loaded, and its next load takes back
its room from dynamic-VRAM models' pages before anything is unloaded whole (nodes/runtime/parking.py)."""

import torch

from comfy_checks.common import GPU, experiments, inputs, load, streaming_budget, write_all

GIB = 2**30


class _Dynamic:
    """A dynamic-VRAM model as ComfyUI's free_memory sees it: ``holds`` bytes of pages on the card."""

    def __init__(self, holds):
        self.holds, self.asked, self.offload_device = holds, [], torch.device("cpu")

    def is_dynamic(self):
        return True

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        self.asked.append(memory_to_free)
        freed = min(self.holds, memory_to_free)
        self.holds -= freed
        return freed


class _Pack:
    def is_dynamic(self):
        return False


class _Entry:
    def __init__(self, model, device):
        self.model, self.device = model, device


def _reclaims():
    """``parking.reclaim`` against stand-ins of ComfyUI's loaded models on a card (no tensor is touched): the free
    memory and ``free_memory`` are ComfyUI's, replaced for the call."""
    import comfy.model_management as mm
    from comfyui_ideogram4_int8.nodes.runtime import parking

    card = torch.device("cuda", 0)
    state = {"free": 0}
    calls = []

    def free_memory(memory_required, device, keep_loaded=(), **_):
        calls.append((memory_required, str(device), [e.model for e in keep_loaded]))
        state["free"] = max(state["free"], memory_required - GIB)  # what the non-dynamic models gave: all but 1 GiB

    saved = mm.current_loaded_models[:], mm.get_free_memory, mm.free_memory
    mm.get_free_memory = lambda device=None, torch_free_too=False: state["free"]
    mm.free_memory = free_memory
    pack = _Pack()
    out = {}
    try:

        def case(name, free, offered, want, holds, other=False):
            dynamic = [_Dynamic(h) for h in holds]
            entries = [_Entry(d, card) for d in dynamic] + [_Entry(pack, card)]
            mm.current_loaded_models[:] = entries + ([_Entry(_Pack(), card)] if other else [])
            state["free"] = free
            calls.clear()
            budget = parking.reclaim(card, offered, want, lambda e: e.model is pack)
            out[name] = {
                "budget_gib": budget / GIB if budget < 1e30 else "unlimited",
                "asked_gib": [[a / GIB for a in d.asked] for d in dynamic],
                "free_memory": [(r / GIB, d, [m is pack or m in dynamic for m in kept]) for r, d, kept in calls],
            }

        case("enough_offered", free=6 * GIB, offered=5 * GIB, want=4 * GIB, holds=[8 * GIB])
        case("from_pages", free=3 * GIB, offered=2 * GIB, want=7 * GIB, holds=[1 * GIB, 8 * GIB])
        case("then_comfyui", free=3 * GIB, offered=2 * GIB, want=7 * GIB, holds=[1 * GIB], other=True)
        case("short_streams", free=3 * GIB, offered=2 * GIB, want=7 * GIB, holds=[1 * GIB])
        case("unlimited_offer", free=1 * GIB, offered=1e32, want=5 * GIB, holds=[8 * GIB])
        case("negative_offer", free=1 * GIB, offered=-3 * GIB, want=2 * GIB, holds=[8 * GIB])
        out["cpu"] = parking.reclaim(torch.device("cpu"), 3.0, 9 * GIB, lambda e: True)
    finally:
        mm.current_loaded_models[:], mm.get_free_memory, mm.free_memory = saved
    return out


def _slack_keeps_plans(cond, uncond, device, budget):
    """A first load of both branches in one call, with ``budget`` too small for both: the budgets they plan from add
    up to at most 99% of it. Both unloaded (parked), then a smaller budget, just what their plans held: each takes
    its own plan again."""
    from comfyui_ideogram4_int8.nodes.runtime import parking, streaming_patcher

    cpu = torch.device("cpu")
    real, margin = parking.reclaim, parking.MARGIN
    planned, real_plan = [], streaming_patcher.Ideogram4ModelPatcher.stream_plan

    def spy(self, given):
        planned.append(given)
        return real_plan(self, given)

    parking.reclaim, parking.MARGIN = (lambda dev, offered, want, keep: offered), 0
    streaming_patcher.Ideogram4ModelPatcher.stream_plan = spy

    def load_both(total):
        with streaming_patcher.loading_together([cond, uncond]):
            cond.partially_load(device, extra_memory=total)
            uncond.partially_load(device, extra_memory=total - cond.model.model_loaded_weight_memory)
        return {p.model.diffusion_model: (p.stream.plan if p.stream else None) for p in (cond, uncond)}

    try:
        for p in (cond, uncond):  # as never loaded: parked with all their bytes
            parking.unpark(p)
            parking.park_fresh(p)
        first = load_both(budget)
        given = list(planned)
        held = cond.model.model_loaded_weight_memory + uncond.model.model_loaded_weight_memory
        uncond.unpatch_model(cpu)
        cond.unpatch_model(cpu)
        again = load_both(held)
        uncond.unpatch_model(cpu)
        cond.unpatch_model(cpu)
    finally:
        parking.reclaim, parking.MARGIN = real, margin
        streaming_patcher.Ideogram4ModelPatcher.stream_plan = real_plan
    return {
        "both_stream": all(plan is not None and plan.streamed for plan in first.values()),
        "given_within": len(given) == 2 and sum(given) <= budget * 0.99,
        "same_plans": [again[k] == v for k, v in first.items()],
    }


def check_parking():
    """The patcher parks at a whole unload with host copies, counts as loaded while parked, and at its next load asks
    ``parking.reclaim`` for its own bytes plus the other parked branch's of the same call; the load then computes as
    before (the budget stands in for what reclaim gives on a card)."""
    import comfy.model_management as mm
    from comfyui_ideogram4_int8.nodes.runtime import parking, streaming_patcher

    write_all()
    cond, uncond, _ = load("i4_w8a8.safetensors")
    cpu = torch.device("cpu")
    device = cond.load_device if GPU else cpu
    for p in (cond, uncond):
        if not GPU:
            p.model.ideogram4_upload_any_device = True
            p.model.ideogram4_stream_any_device = True
    dm = cond.model.diffusion_model
    x, ctx, sigma, _ = inputs()
    x, ctx, sigma = (t.to(device) for t in (x, ctx, sigma))

    def forward():
        with torch.no_grad():
            return dm(x, sigma, context=ctx).float().cpu()

    res = {"reclaim": _reclaims()}
    cond.patch_model(device_to=device, lowvram_model_memory=0)
    uncond.patch_model(device_to=device, lowvram_model_memory=0)
    ref = forward()
    loaded = {"cond": cond.model.model_loaded_weight_memory, "uncond": uncond.model.model_loaded_weight_memory}
    res["loaded_positive"] = min(loaded.values()) > 0
    cond.unpatch_model(cpu)
    uncond.unpatch_model(cpu)
    res["parked_is_loaded"] = parking.parked_bytes(cond) == loaded["cond"]
    res["on_card_parked"] = cond.model.model_loaded_weight_memory
    res["loaded_size_parked"] = cond.loaded_size() == cond.model_size()
    res["device_parked"] = str(cond.current_loaded_device()) == str(cond.load_device)
    res["required_parked"] = mm.LoadedModel(cond).model_memory_required(cond.load_device)

    asked, kept = [], {}
    # what reclaim gives the call: cond's share by size (the pack's rule for one call's MODELs) streams 2 blocks
    budget = streaming_budget(cond, 2) * (cond.model_size() + uncond.model_size()) / cond.model_size() + 16
    real = parking.reclaim
    # another loader's MODEL on the card, in no run and not in this call
    idle = streaming_patcher.Ideogram4ModelPatcher(torch.nn.Linear(1, 1), load_device=device, offload_device=cpu)

    def reclaim(dev, offered, want, keep):
        asked.append((offered, want, keep(mm.LoadedModel(uncond))))
        kept["idle"] = keep(mm.LoadedModel(idle))
        idle.model.current_patcher = idle  # a sampling run holds it (the other branch of ComfyUI's dual guider)
        kept["in_run"] = keep(mm.LoadedModel(idle))
        idle.model.current_patcher = None
        kept["not_pack"] = keep(_Entry(_Pack(), device))
        return budget

    parking.reclaim = reclaim
    try:
        with streaming_patcher.loading_together([cond, uncond]):
            cond.partially_load(device, extra_memory=-12345)  # ComfyUI's offer can be negative for a parked MODEL
    finally:
        parking.reclaim = real
    margin = parking.MARGIN
    res["asked"] = [(o, w == loaded["cond"] + loaded["uncond"] + 2 * margin, k) for o, w, k in asked]
    res["kept"] = kept
    res["unparked"] = parking.parked_bytes(cond) == 0 and parking.parked_bytes(uncond) == loaded["uncond"]
    res["on_card_after"] = cond.model.model_loaded_weight_memory
    res["streams_after"] = cond.stream is not None and len(cond.stream.plan.streamed) > 0
    res["max_abs_after"] = (forward() - ref).abs().max().item()
    res["required_after"] = mm.LoadedModel(cond).model_memory_required(cond.load_device)
    # a streaming MODEL's unload parks it too; park=off: nothing parked, ComfyUI counts the bytes again
    cond.unpatch_model(cpu)
    res["parked_from_streaming"] = parking.parked_bytes(cond) > 0
    # offered no limit (ComfyUI's full load, force_full_load): the room asked is every byte, not the plan's
    wants = []
    parking.reclaim = lambda dev, offered, want, keep: wants.append(want) or offered
    try:
        cond.partially_load(device, extra_memory=1e32)
    finally:
        parking.reclaim = real
    res["full_load_want"] = [w - margin - cond.model_size() for w in wants]
    res["full_load_resident"] = cond.stream is None and cond.model.model_loaded_weight_memory > 0
    cond.unpatch_model(cpu)
    # both parked from plans that stream, and the room for both as they were: each takes its own bytes back, so
    # each gets its plan again (a share by size, or the second load rebalancing the first, would move blocks from
    # one branch to the other)
    uncond.patch_model(device_to=device, lowvram_model_memory=streaming_budget(uncond, 3))
    plans = {"uncond": uncond.stream.plan}
    uncond.unpatch_model(cpu)
    cond.patch_model(device_to=device, lowvram_model_memory=streaming_budget(cond, 2))
    plans["cond"] = cond.stream.plan
    cond.unpatch_model(cpu)
    parking.reclaim = lambda dev, offered, want, keep: offered if offered > 0 else want
    margin, parking.MARGIN = parking.MARGIN, 0  # 64 MiB would hold the whole synthetic model
    try:
        with streaming_patcher.loading_together([cond, uncond]):
            cond.partially_load(device, extra_memory=0)
            uncond.partially_load(device, extra_memory=parking.parked_bytes(uncond))
    finally:
        parking.reclaim, parking.MARGIN = real, margin
    res["same_plans"] = [cond.stream.plan == plans["cond"], uncond.stream.plan == plans["uncond"]]
    res["plans_differ_in_size"] = plans["cond"].streamed != plans["uncond"].streamed
    uncond.unpatch_model(cpu)
    cond.unpatch_model(cpu)
    res["slack"] = _slack_keeps_plans(cond, uncond, device, budget)
    with experiments(f"{parking.EXPERIMENT}=off"):
        res["parked_off"] = parking.parked_bytes(cond)
        res["required_off"] = mm.LoadedModel(cond).model_memory_required(cond.load_device) == cond.model_size()
        cond.patch_model(device_to=device, lowvram_model_memory=0)
        cond.unpatch_model(cpu)
        res["parks_off"] = getattr(cond.model, "ideogram4_parked", 0)
    uncond.patch_model(device_to=device, lowvram_model_memory=0)
    res["uncond_unparked_by_load"] = parking.parked_bytes(uncond) == 0
    uncond.unpatch_model(cpu)
    return res
