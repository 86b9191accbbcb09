"""What the ``host_copies`` check of ``comfy_nodes_script.py`` must show, on the CPU (the host twin standing in for
the card: tests/comfyui) and with ComfyUI on a GPU (tests/cuda)."""

from __future__ import annotations


def assert_host_copies(r: dict) -> None:
    # the full load kept the host tensor of everything it uploaded; none of them in use while loaded
    assert r["kept"] == r["tensors"] and r["on_copies_loaded"] == 0 and r["covers"] and r["uncovered"] == []
    # outside the pack's runs a large request unloads whole (nothing freed: ComfyUI detaches), a small one streams
    assert r["large_outside"] == 0 and r["small_outside"] > 0 and r["streams_after_small"]
    # a large request inside ComfyUI's load of the loaded MODEL, or inside a run, streams more, never a whole unload
    assert r["shrunk_in_load"] > 0
    assert r["large_inside"] > 0 and r["max_abs_streamed"] == 0.0
    # unloaded: every tensor is its host copy again (no copy made), as loaded; the next load computes the same
    assert r["on_copies_unloaded"] == r["tensors"] and r["on_host_unloaded"] and r["as_loaded_unloaded"]
    assert r["max_abs_reloaded"] == 0.0 and r["as_loaded_reloaded"]
    # a LoRA-patched weight has no host copy; the MODEL is not covered; its unload restores ComfyUI's backup
    key = "diffusion_model.layers.0.attention.qkv.weight"
    assert r["lora_changed"] > 1e-3 and not r["lora_key_kept"] and r["lora_uncovered"] == [key]
    assert not r["lora_covers"] and r["lora_large_outside"] > 0 and r["as_loaded_after_lora"]
    assert r["kept_off"] == 0 and not r["covers_off"]
    # a pinned host copy stays pinned over an unload, and is unpinned when its model is collected
    pins = r["pins"]
    assert pins["unpinned_at_unload"] == [True] and pins["pinned_after_unload"] == [True], pins
    assert pins["unpinned_when_collected"] == [True], pins
    # a sampling run of ComfyUI's own holds the MODEL: a large request shrinks it (DualModelGuider loads the other
    # branch after this one's pre_run)
    assert r["large_in_comfyui_run"] > 0
    # a hook's in-place patch makes the host copy stale: not used while the hook holds the weight
    assert not r["hooked_key_kept"] and r["unhooked_key_kept"]
    # an offload device on the card (--gpu-only, --highvram): no host copy would ever be put back, none kept
    assert r["kept_offload_on_card"] == 0 and not r["covers_offload_on_card"]
