"""Inside a CUDA graph capture the launcher reaches only kernel variants this process launched before
(kernels/launch.py): a new integer class, constexpr value, tensor alignment or descriptor refuses, so the capture
fails and the pass runs eagerly first; the same variant at other values launches."""

from __future__ import annotations

import types

import pytest
import torch
from comfyui_ideogram4_int8.kernels import capture_guard, launch


class _FakeJit:
    """A JIT function's surface the launcher uses: ``params`` (which are constexpr) and ``fn[grid](...)``."""

    __name__ = "_fake_kernel"

    def __init__(self, constexpr):
        self.params = [types.SimpleNamespace(is_constexpr=c) for c in constexpr]
        self.launched = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launched.append(args)
            return None  # no [grid] launcher: the exact-key shortcut stays out of the way

        return run


@pytest.fixture
def capturing(monkeypatch):
    state = {"on": False}
    monkeypatch.setattr(capture_guard, "capturing", lambda device: state["on"])
    return state


def _descriptor(t, shape, block):
    return types.SimpleNamespace(base=t, shape=list(shape), strides=[shape[1], 1], block_shape=list(block))


def test_a_capture_reaches_only_variants_launched_before(capturing):
    fn = _FakeJit([False, False, True])  # (x, M, BLOCK): BLOCK is a constexpr
    launcher = launch.Launcher(fn)
    x = torch.zeros(64, dtype=torch.int8)
    launcher((1,), (x, 4096 + 17, 32), {"num_warps": 4})  # an eager pass
    capturing["on"] = True
    launcher((1,), (x, 4096 + 63, 32), {"num_warps": 4})  # another M of the same class: the same variant
    assert len(fn.launched) == 2
    refused = [
        (x, 4096 + 64, 32),  # M divisible by 16 now
        (x, 1, 32),  # M == 1
        (x, 2**31 + 1, 32),  # a 64-bit integer
        (x, 4096 + 63, 64),  # another constexpr value
        (x[1:], 4096 + 63, 32),  # a tensor off its 16-byte alignment
    ]
    for args in refused:
        with pytest.raises(capture_guard.FirstUseInCapture, match="loading _fake_kernel for new argument classes"):
            launcher((1,), args, {"num_warps": 4})
    with pytest.raises(capture_guard.FirstUseInCapture):
        launcher((1,), (x, 4096 + 63, 32), {"num_warps": 8})  # another launch option
    assert len(fn.launched) == 2
    capturing["on"] = False  # eagerly, each launches and counts as launched from then on
    launcher((1,), refused[0], {"num_warps": 4})
    capturing["on"] = True
    launcher((1,), (x, 4096 + 128, 32), {"num_warps": 4})
    assert len(fn.launched) == 4


def test_a_descriptor_counts_by_dtype_alignment_size_classes_and_block(capturing):
    fn = _FakeJit([False])
    launcher = launch.Launcher(fn)
    w = torch.zeros(64, dtype=torch.int8)
    launcher((1,), (_descriptor(w, (4113, 4608), (128, 128)),), {})
    capturing["on"] = True
    launcher((1,), (_descriptor(w, (4159, 4608), (128, 128)),), {})  # rows of the same class
    on_meta = _descriptor(torch.zeros(64, dtype=torch.int8, device="meta"), (4159, 4608), (128, 128))
    for other in (_descriptor(w, (4160, 4608), (128, 128)), _descriptor(w, (4159, 4608), (64, 128)), on_meta):
        with pytest.raises(capture_guard.FirstUseInCapture):
            launcher((1,), (other,), {})
    assert len(fn.launched) == 2


def test_without_parameter_facts_every_positional_argument_counts_by_value(capturing):
    fn = _FakeJit([])
    del fn.params  # a JIT function that does not say which parameters are constexpr
    launcher = launch.Launcher(fn)
    launcher((1,), (17,), {})
    capturing["on"] = True
    with pytest.raises(capture_guard.FirstUseInCapture):
        launcher((1,), (63,), {})
