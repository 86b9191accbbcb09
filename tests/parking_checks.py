"""What the ``parking`` check of ``comfy_nodes_script.py`` must show, on the CPU (tests/comfyui) and with ComfyUI on
a GPU (tests/cuda)."""

from __future__ import annotations


def assert_parking(r: dict) -> None:
    rc = r["reclaim"]
    # ComfyUI's offer covers the want: nothing freed; else the dynamic models' pages first, in order, and only what
    # is short; ComfyUI's free_memory only for what the pages could not give and only when another non-dynamic
    # model is loaded there, with the pack's MODELs and the dynamic models kept (never unloaded whole)
    assert rc["enough_offered"] == {"budget_gib": 5.0, "asked_gib": [[]], "free_memory": []}, rc
    assert rc["from_pages"] == {"budget_gib": 7.0, "asked_gib": [[5.0], [4.0]], "free_memory": []}, rc
    then = rc["then_comfyui"]
    assert then["asked_gib"] == [[5.0]] and then["free_memory"] == [[7.0, "cuda:0", [True, True]]], rc
    assert then["budget_gib"] == 6.0, rc  # 2 offered + 1 from pages + 3 from ComfyUI (its stand-in keeps 1 GiB)
    # no other non-dynamic model: what the pages could not give streams (nothing unloaded whole)
    assert rc["short_streams"] == {"budget_gib": 3.0, "asked_gib": [[5.0]], "free_memory": []}, rc
    # no limit offered (a full load): the room is still made, the offer stays unlimited
    assert rc["unlimited_offer"] == {"budget_gib": "unlimited", "asked_gib": [[4.0]], "free_memory": []}, rc
    # a negative offer (free memory below ComfyUI's minimum by 3 GiB): those 3 GiB are freed too, so the load still
    # leaves ComfyUI's minimum free
    assert rc["negative_offer"]["budget_gib"] == 2.0 and rc["negative_offer"]["asked_gib"] == [[5.0]], rc
    assert rc["cpu"] == 3.0  # nothing to make room for on a CPU
    # a whole unload with host copies parks: nothing on the card, counted loaded, nothing asked of ComfyUI for it
    assert r["loaded_positive"] and r["parked_is_loaded"] and r["on_card_parked"] == 0
    assert r["loaded_size_parked"] and r["device_parked"] and r["required_parked"] == 0
    # the next load asks once, with ComfyUI's offer, for both parked branches of the call plus a margin each
    assert r["asked"] == [[-12345, True, True]], r["asked"]
    # the room never comes from the pack's MODELs of the call or of a run; another loader's idle one may go
    assert r["kept"] == {"idle": False, "in_run": True, "not_pack": False}, r["kept"]
    # loaded from the budget given: unparked (the other branch still parked), streaming, the same output
    assert r["unparked"] and r["on_card_after"] > 0 and r["streams_after"] and r["max_abs_after"] == 0.0
    assert r["required_after"] == 0  # streaming: counted loaded, as before
    assert r["parked_from_streaming"] and r["uncond_unparked_by_load"]
    # offered no limit, a MODEL parked from a streaming plan asks room for all its bytes, then loads them all
    assert r["full_load_want"] == [0] and r["full_load_resident"], (r["full_load_want"], r["full_load_resident"])
    # room for both parked as they were: each takes its own plan again (the first streamed 2 blocks, the second 3)
    assert r["same_plans"] == [True, True] and r["plans_differ_in_size"], (r["same_plans"], r["plans_differ_in_size"])
    # a first load of both in one call plans from less than its budget, so a budget a little smaller at the next
    # prompt gives both their plans again (a plan made again from less streams another spread of blocks)
    assert r["slack"] == {"both_stream": True, "given_within": True, "same_plans": [True, True]}, r["slack"]
    # park=off: nothing parked, ComfyUI asks the MODEL's bytes again
    assert r["parked_off"] == 0 and r["required_off"] and r["parks_off"] == 0
