"""One-time work per shape refuses to run inside a CUDA graph capture (kernels/capture_guard.py): the GEMM picker's
autotuning, and a kernel failure there is the capture's (nothing demoted). The attention choice's refusal is in
test_attention_choice.py; the graphs' eager retry in test_graph_replay.py."""

from __future__ import annotations

import types

import pytest
import torch
from comfyui_ideogram4_int8.kernels import backends, capture_guard, dispatch, settings, tuning

CUDA = torch.device("cuda", 0)


@pytest.fixture
def capturing(monkeypatch):
    state = {"on": True}
    monkeypatch.setattr(capture_guard, "capturing", lambda device: device.type == "cuda" and state["on"])
    return state


def test_refuse_first_use_raises_only_while_a_cuda_stream_captures(monkeypatch):
    capture_guard.refuse_first_use(torch.device("cpu"), "autotuning")  # a CPU never captures
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    capture_guard.refuse_first_use(CUDA, "autotuning")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(capture_guard.FirstUseInCapture, match="autotuning at its first use, inside a CUDA graph"):
        capture_guard.refuse_first_use(CUDA, "autotuning")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a torch without CUDA cannot capture
    assert capture_guard.capturing(CUDA) is False


def test_the_picker_never_autotunes_inside_a_capture_and_keeps_no_pick(monkeypatch, capturing, tmp_path, setting):
    setting(settings.CACHE_DIR, str(tmp_path))  # an empty autotune cache
    monkeypatch.setattr(tuning, "capability", lambda device=None: (9, 0))
    monkeypatch.setattr(tuning, "gpu_name", lambda device=None: "GPU X")
    monkeypatch.setattr(tuning, "shipped_config", lambda *args, **kwargs: None)  # a shape the table lacks
    tuned = []
    cfg = tuning.heuristic_config("sm90", 77, 4608, 53248)
    monkeypatch.setattr(tuning.ConfigPicker, "_autotune", lambda self, *args, **kw: tuned.append(args) or (cfg, "t"))
    q = types.SimpleNamespace(shape=(77, 53248), device=CUDA, is_cuda=True)
    w = types.SimpleNamespace(shape=(4608, 53248))
    picker = tuning.ConfigPicker()
    with pytest.raises(capture_guard.FirstUseInCapture, match="autotuning GEMM N=4608 K=53248 M~77"):
        picker.pick(q, w, launch=lambda c: None)
    assert tuned == [] and picker.picks() == []  # nothing timed, nothing kept: the eager retry autotunes
    capturing["on"] = False
    assert picker.pick(q, w, launch=lambda c: None) == (cfg, "t") and len(tuned) == 1
    capturing["on"] = True  # known now: a capture at another M of that bucket gets the pick without refusing
    q70 = types.SimpleNamespace(shape=(70, 53248), device=CUDA, is_cuda=True)
    assert picker.pick(q70, w, launch=lambda c: None) == (cfg, "t") and len(tuned) == 1


def test_a_kernel_failing_inside_a_capture_is_raised_not_demoted(capturing):
    backends.DEMOTIONS.clear()

    def fails():
        raise RuntimeError("operation not permitted when stream is capturing")

    try:
        with pytest.raises(RuntimeError, match="stream is capturing"):
            dispatch._unless_demoted(("quantize", 7), "Triton activation quantizer", fails, CUDA)
        assert backends.DEMOTIONS.items() == []
        capturing["on"] = False  # the same failure outside a capture: demoted, the twin runs
        assert dispatch._unless_demoted(("quantize", 7), "Triton activation quantizer", fails, CUDA) is None
        assert [d["shape"] for d in backends.DEMOTIONS.items()] == [["quantize", 7]]
    finally:
        backends.DEMOTIONS.clear()


def test_a_fused_gemm_failing_inside_a_capture_is_raised_not_demoted(monkeypatch, capturing):
    from comfyui_ideogram4_int8.kernels import fused

    cfg = tuning.heuristic_config("sm90", 64, 128, 256)
    monkeypatch.setattr(fused.PICKER, "pick", lambda *args, **kwargs: (cfg, "heuristic"))
    monkeypatch.setattr(fused, "_gluon_problem", lambda *args: None)

    def fails(*args):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(fused, "_launch", fails)
    q, w = torch.zeros(64, 256, dtype=torch.int8), torch.zeros(128, 256, dtype=torch.int8)
    out = torch.empty(64, 128, dtype=torch.bfloat16)
    capturing["on"] = True
    monkeypatch.setattr(capture_guard, "capturing", lambda device: True)  # the operands here are on the CPU
    backends.DEMOTIONS.clear()
    try:
        with pytest.raises(RuntimeError, match="stream is capturing"):
            fused.run_fused(q, w, None, None, None, out, False)
        assert backends.DEMOTIONS.items() == []
        monkeypatch.setattr(capture_guard, "capturing", lambda device: False)  # outside a capture: demoted
        with pytest.raises(fused.FusedUnavailable):
            fused.run_fused(q, w, None, None, None, out, False)
        assert backends.DEMOTIONS.items() != []
    finally:
        backends.DEMOTIONS.clear()
