"""What ``comfy_checks/pin_ahead.py`` must show, on a CPU (ComfyUI's pin book faked) and on a GPU (real pins)."""


def assert_pin_ahead(r: dict, gpu: bool) -> None:
    assert r["off_started"] is False  # pin-ahead=off: nothing queued
    every = r["all"]
    assert every["started"] and every["entries"] >= 20, every
    assert "all of them" in every["summary"], every["summary"]
    # file pages are copied, and each copy holds the weight's bytes; every pinned tensor is in the MODEL's list
    assert not any(every["copies_mapped"]) and all(every["copies_equal"]) and every["in_pinned_list"], every
    # the first load took them all: the weights are the pinned copies, kept as the host copies, bytes unchanged,
    # and the model computes exactly as one loaded without pinning ahead
    assert every["left_after_load"] is None and all(every["kept_are_copies"]) and every["weights_equal"], every
    assert every["same_output"] is True
    assert "taken by the first load" in every["note"], every["note"]
    if gpu:
        assert all(every["really_pinned"]), every
        return
    # pins ran on the worker thread, under the pack's lock on ComfyUI's pin book; unpinned when collected
    assert every["threads"] == ["ideogram4-pin-ahead"] and every["pins_under_lock"] is True, every
    assert every["unpinned_when_collected"] is True
    # a weight that moved since it was pinned keeps its own tensor: its copy is unpinned and leaves the list
    changed = r["changed"]
    assert changed["changed_unpinned"] is True and changed["changed_left_pinned_list"] is True, changed
    assert changed["same_output"] is True and "1 changed since (unpinned)" in changed["note"], changed
    # a load to the card during a pin stops the worker after that pin; what was pinned is taken
    halted = r["halted"]
    assert halted["entries"] == 2 and "stopped by a load to the card" in halted["summary"], halted
    assert halted["same_output"] is True and all(halted["kept_are_copies"]), halted
    # ComfyUI's budget less the reserve: pins stop short of it, never evicting
    budget = r["budget"]
    assert 1 <= budget["entries"] < every["entries"] and "budget" in budget["summary"], budget
    assert budget["same_output"] is True
    # ComfyUI's RAM cache on: nothing is pinned ahead (its pins may evict cache entries), the load is as before
    ram_cache = r["ram_cache"]
    assert ram_cache["entries"] == 0 and "RAM cache" in ram_cache["summary"] and ram_cache["same_output"], ram_cache
    assert r["pinning_off_started"] is False  # ComfyUI pins nothing
