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
    assert every["left_after_load"] == [] and all(every["kept_are_copies"]) and every["weights_equal"], every
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
    assert changed["untaken_unpinned"] and changed["untaken_not_weights"] and changed["same_output"], changed
    assert "1 not taken" in changed["note"] and all(changed["kept_are_copies"]), changed
    # a load while a pin is under way waits for that pin, stops the worker, and takes what was pinned
    halted = r["halted"]
    assert halted["pin_reached"] and halted["load_waited_for_the_pin"], halted
    assert halted["entries"] == 2 and "stopped by a sampling run or a load" in halted["summary"], halted
    assert halted["same_output"] is True and all(halted["kept_are_copies"]) and halted["left_after_load"] == []
    # a load that keeps no host copies (host memory short) takes none: every copy unpinned, the weights their own
    declined = r["declined"]
    assert declined["entries"] == every["entries"] and declined["untaken_unpinned"], declined
    assert declined["untaken_not_weights"] and declined["same_output"] and declined["weights_equal"], declined
    # the pack's sampler gives back, at its end, the pins of a MODEL it did not load; the later load takes none
    released = r["released"]
    assert released["released_unpinned"] and released["released_list_empty"], released
    assert released["untaken_not_weights"] and released["same_output"] and released["weights_equal"], released
    # ComfyUI's budget less the reserve: pins stop short of it, never evicting
    budget = r["budget"]
    assert 1 <= budget["entries"] < every["entries"] and "budget" in budget["summary"], budget
    assert budget["same_output"] is True
    # ComfyUI's RAM cache on: nothing is pinned ahead (its pins may evict cache entries), the load is as before
    ram_cache = r["ram_cache"]
    assert ram_cache["entries"] == 0 and "RAM cache" in ram_cache["summary"] and ram_cache["same_output"], ram_cache
    assert r["pinning_off_started"] is False  # ComfyUI pins nothing
