"""What the ``upload`` check of ``comfy_nodes_script.py`` must show, on the CPU (the host twin standing in for the
card: tests/comfyui) and with ComfyUI on a GPU (pinned staging: tests/cuda)."""

from __future__ import annotations

CASES = ("full", "lora", "streamed", "offload")


def assert_upload(r: dict, path: str) -> None:
    """``r``: the check's RESULT; ``path``: the upload path the pack's loads must report."""
    seed = r["__seed__"]
    pack, comfy = r["pack"], r["comfyui"]
    for case in CASES:
        p, c = pack[case], comfy[case]
        # the same output as ComfyUI's own move, bit for bit
        assert r["max_abs_vs_comfyui"][case] == 0.0, (seed, case)
        # the pack's load copied every tensor it planned, through the staged path, and said so
        assert p["report"]["path"] == path and p["report"]["tensors"] == p["planned"], (case, p["report"])
        assert p["planned"] > 0 and p["copied_planned"] == p["planned"], (case, p)
        assert p["note"].startswith("weights to the card: ") and "staging buffers" in p["note"], p["note"]
        # the host copies kept (an unload then copies nothing), but not under host-copies=off (the offload case)
        assert ("their host copies kept" in p["note"]) == (case != "offload"), (case, p["note"])
        # upload=comfyui: ComfyUI's own path ran, no note
        assert c["report"] is None and c["note"] is None, (case, c)
        if case == "streamed":  # the streamed blocks' weights stay on the host (on a GPU), with either move
            assert p["on_device"] == c["on_device"] > 0, (case, p, c)
        for side in (p, c):
            if case != "streamed":
                assert side["on_device"] == side["tensors"], (case, side)
            assert side["on_host_after"] and side["weights_after"], (case, side)
            # pinned after: only the streamed weights' host copies the pack keeps for the next plan
            assert side["pinned_after"] == side["kept_pinned_after"] and side["comfy_pinned_keys_after"] == 0, side
            if case != "streamed":
                assert side["kept_pinned_after"] <= 0, (case, side)  # host-copies=off unpins what earlier cases kept
        # no more on the card than ComfyUI's own move leaves, loaded or unloaded (a second copy, or a tensor kept,
        # would show here: the ComfyUI run comes second)
        assert p["allocated"] == c["allocated"] and p["allocated_after"] == c["allocated_after"], (case, p, c)
        assert p["planned"] == c["planned"] and p["copied_other"] == c["copied_other"], (case, p, c)
    for case in ("full", "streamed", "offload"):
        assert pack[case]["weights_as_loaded"], case  # every uploaded tensor equal to its host original
    # the LoRA-patched module stays on ComfyUI's path (merged on the card, its original kept in ComfyUI's backup)
    lora = pack["lora"]
    assert lora["module_keys_planned"] == 0 and lora["planned"] < pack["full"]["planned"]
    assert r["lora_changed_output"] > 1e-3
    # the resident part of a streamed load only: the streamed blocks' weights stay on the host
    streamed = pack["streamed"]
    assert streamed["streamed_blocks"] == 2 and streamed["streamed_weights_on_host"]
    assert streamed["planned_streamed"] == 0 and streamed["planned"] < pack["full"]["planned"]
    # ComfyUI's partial unload, then a full reload through the pack's upload
    off = pack["offload"]
    assert off["freed"] and off["reload_report"]["path"] == path and off["on_device_reloaded"] == off["tensors"]
    assert off["comfy_pinned_keys_reloaded"] == 0 and off["pinned_reloaded"] == 0
    if off["comfy_pinned_keys_unloaded"]:  # what ComfyUI pinned when it offloaded went up straight from there
        assert off["reload_report"]["pinned"] > 0, off
    # upload=overlap: the same weights and output, the host not waiting on a GPU, and ComfyUI's load skipping the
    # modules the upload moved (no patch call for them, so no synchronize after each); the LoRA module still patched
    over = r["overlap"]
    for case in CASES:
        o, p = over[case], pack[case]
        assert r["overlap_max_abs_vs_comfyui"][case] == 0.0, (seed, case)
        assert o["report"]["path"] == path and o["copied_planned"] == o["planned"] == p["planned"], (case, o)
        assert o["weights_as_loaded"] == p["weights_as_loaded"] and o["on_device"] == p["on_device"], (case, o)
        assert o["report"]["queued"] is (path == "staged"), (case, o["report"])
        assert p["report"]["queued"] is False, (case, p["report"])
    assert over["full"]["patch_calls"] == 0 < pack["full"]["patch_calls"], (over["full"], pack["full"])
    assert 0 < over["lora"]["patch_calls"] < pack["lora"]["patch_calls"], (over["lora"], pack["lora"])
    if over["offload"]["comfy_pinned_keys_unloaded"]:  # ComfyUI's pins are dropped after the copies: waited for
        assert over["offload"]["reload_report"]["queued"] is False, over["offload"]
