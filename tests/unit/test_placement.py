"""Where the unconditional branch runs (ideogram4.placement), with fake device lists, and moving a pass's inputs."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import placement

TWO = ["cuda:0", "cuda:1"]


def test_second_gpu_is_the_first_other_card():
    p = placement.place_branch("second GPU", "cuda:0", TWO)
    assert p.device == "cuda:1" and "same time" in p.note
    assert placement.place_branch("second GPU", "cuda:1", ["cuda:0", "cuda:1", "cuda:2"]).device == "cuda:0"


def test_named_card():
    assert placement.place_branch("cuda:2", "cuda:0", ["cuda:0", "cuda:1", "cuda:2"]).device == "cuda:2"


@pytest.mark.parametrize(
    ("choice", "main", "devices", "says"),
    [
        ("second GPU", "cuda:0", ["cuda:0"], "one GPU (cuda:0)"),
        ("cuda:3", "cuda:0", TWO, "cuda:3 is not present (2 GPU(s) here)"),
        ("cuda:1", "cuda:1", TWO, "conditional branch's card"),
        ("second GPU", "cpu", [], "needs CUDA"),
        ("same GPU", "cuda:0", TWO, "both branches on cuda:0"),
    ],
)
def test_no_second_card_leaves_the_branch_and_says_why(choice, main, devices, says):
    p = placement.place_branch(choice, main, devices)
    assert p.device is None and says in p.note


def test_a_choice_not_offered_names_the_field():
    with pytest.raises(placement.BranchDeviceError, match="'device' is 'gpu2'"):
        placement.place_branch("gpu2", "cuda:0", TWO)


def test_to_device_moves_every_tensor_and_keeps_the_rest():
    opts = {"sigmas": torch.ones(2), "patches": {"x": [len]}, "cond_or_uncond": [1], "none": None}
    args = (torch.zeros(3), [torch.ones(1), "text"], opts)
    moved = placement.to_device(args, torch.device("meta"))
    assert moved[0].device.type == "meta" and moved[1][0].device.type == "meta" and moved[1][1] == "text"
    assert moved[2]["sigmas"].device.type == "meta" and moved[2]["patches"]["x"][0] is len
    assert moved[2]["cond_or_uncond"] == [1] and moved[2]["none"] is None
    assert opts["sigmas"].device.type == "cpu"  # the caller's containers are not changed
    same = torch.ones(2)
    assert placement.to_device(same, torch.device("cpu")) is same
