"""CUDA graphs of a pass (cuda): ``PassGraphs`` replays equal eager calls on fresh inputs, weights that moved get a
new capture, a pass that cannot be captured stays eager with its reason; through ComfyUI (COMFYUI_DIR), the sampler's
latent with graphs (asked for on one card) equals the eager one bit for bit, passes were replayed and the fused path
ran; by default the graphs are on, kept for the next run (which replays every pass) and freed when the MODELs unload."""

from __future__ import annotations

import os

import pytest
import torch
from comfy_check_run import run_nodes_check_on_gpu
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4.graph_replay import PassGraphs
from comfyui_ideogram4_int8.ideogram4.w8a8_module import w8a8_forward

pytestmark = pytest.mark.cuda
K, N = 4608, 13824  # attention.qkv's shape


def _operands(g, m=333):
    w = torch.randn(N, K, generator=g, device="cuda")
    w[:, 11] *= 40  # an outlier input channel
    s = w.abs().amax(1) / 127
    q = (w / s[:, None]).round().clamp(-127, 127).to(torch.int8)
    x = torch.randn(m, K, generator=g, device="cuda").bfloat16()
    x[:, 5] *= 25
    return q, s, x


def test_replays_equal_eager_calls_on_fresh_inputs_and_moved_weights_recapture():
    seed = int.from_bytes(os.urandom(3), "little")
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, s, x0 = _operands(g)
    weights = {"q": q}

    def fn(x, scale):
        return w8a8_forward(x, weights["q"], s, site="graphs/qkv") * scale

    graphs = PassGraphs()
    kernels.REGISTRY.clear()
    modes = []
    for step in range(5):
        x = torch.randn_like(x0) * (step + 1)
        scale = torch.full((1,), 0.5 + step, device="cuda")
        want = fn(x, scale)
        got, mode = graphs.run(fn, (x, scale), {}, fingerprint=(weights["q"].data_ptr(),))
        modes.append(mode)
        assert torch.equal(got, want), f"seed {seed} step {step} ({mode})"
        got.fill_(float("nan"))  # the caller owns the result: poisoning it must not reach the next replay
    assert modes == ["eager", "captured", "replayed", "replayed", "replayed"]
    assert kernels.REGISTRY.path_of("graphs/qkv") == "triton-int8"
    # the weights moved (a re-load): a new capture at the first call (the warm-up is done), still equal; a weight
    # changed in place after it reaches the replay (the graph reads the new address)
    weights["q"] = weights["q"].clone()
    x = torch.randn_like(x0)
    one = torch.ones(1, device="cuda")
    for expected in ("captured", "replayed", "replayed"):
        got, mode = graphs.run(fn, (x, one), {}, fingerprint=(weights["q"].data_ptr(),))
        assert mode == expected and torch.equal(got, fn(x, one)), (seed, mode)
        weights["q"].neg_()
    assert graphs.stats.captures == 2 and graphs.stats.direct == 1 and not graphs.stats.failures
    graphs.clear()


def test_a_new_size_of_a_captured_pass_is_captured_at_once_and_equals_eager():
    """A prompt of another length: the same pass at new sizes is captured at its first call, equal to eager; where
    its sizes need one-time work (a GEMM bucket not autotuned yet) the capture refuses it, the call runs eagerly, and
    the next one captures; no kernel is demoted for it."""
    seed = int.from_bytes(os.urandom(3), "little")
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, s, x0 = _operands(g)
    scale = torch.ones(1, device="cuda")

    def fn(x, scale):
        return w8a8_forward(x, q, s, site="graphs/resized") * scale

    graphs = PassGraphs()
    assert [graphs.run(fn, (x0, scale), {})[1] for _ in range(2)] == ["eager", "captured"]
    demotions = len(kernels.DEMOTIONS.items())
    # the bucket of the first size, the conditional pass's sizes, and a size divisible by 16 (new kernel variants)
    for m in (401, 4096 + 77, 4096 + 63, 4096 + 64):
        x = torch.randn(m, K, generator=g, device="cuda").bfloat16()
        modes = []
        for _ in range(3):
            got, mode = graphs.run(fn, (x, scale), {})
            modes.append(mode)
            assert torch.equal(got, fn(x, scale)), (seed, m, mode)
        assert modes in (["captured", "replayed", "replayed"], ["eager", "captured", "replayed"]), (m, modes)
        if modes[0] == "eager":
            assert "at its first use, inside a CUDA graph capture" in graphs.stats.retried[-1], graphs.stats.retried
    assert graphs.stats.resized >= 1 and not graphs.stats.failures, graphs.stats
    assert len(kernels.DEMOTIONS.items()) == demotions and kernels.REGISTRY.path_of("graphs/resized") == "triton-int8"
    graphs.clear()


def test_a_pass_that_cannot_be_captured_stays_eager_with_its_reason():
    graphs = PassGraphs()

    def syncs(x):
        return x * float(x.sum().item())  # a host sync: not capturable

    x = torch.randn(64, device="cuda")
    modes = [graphs.run(syncs, (x,), {})[1] for _ in range(3)]
    assert modes == ["eager", "eager", "eager"]
    assert len(graphs.stats.failures) == 1 and graphs.stats.captures == 0
    got, _ = graphs.run(syncs, (x,), {})
    assert torch.equal(got, syncs(x))  # the device is still usable after the failed capture
    # and its random generator left capture mode (a failed capture left it there: the next torch.rand raised)
    torch.rand(8, device="cuda")
    # the next capture on the card works: a new pool, not the failed capture's (a capture into that one raised
    # "use_count > 0 INTERNAL ASSERT FAILED")
    fresh = PassGraphs()
    modes = [fresh.run(lambda x: x * 2, (x,), {})[1] for _ in range(3)]
    assert modes == ["eager", "captured", "replayed"] and not fresh.stats.failures, fresh.stats.failures
    fresh.clear()


def test_sampler_with_cuda_graphs_equals_eager_through_comfyui(tmp_path):
    res = run_nodes_check_on_gpu(tmp_path, "cuda_graphs", drop_env=("IDEOGRAM4_INT8_CUDA_GRAPHS",))
    seed = res["__seed__"]
    gpu = res["gpu"]
    assert gpu["device"] == "cpu"  # the sampler hands the latent back on ComfyUI's intermediate device
    assert gpu["equal"], (seed, gpu["max_abs"])
    assert res["off_note"] == "CUDA graphs off: IDEOGRAM4_INT8_CUDA_GRAPHS=0"
    # the default: graphs on; Turbo 12's 12 passes per branch, the first eager, the second captured, ten replayed
    assert res["auto_note"].startswith("CUDA graphs: 10 of 12 passes replayed (1 captured, 1 eager)"), res["auto_note"]
    assert res["auto_equal"]
    for label, note in gpu["notes"].items():
        # after the release: the warm-up of the run before counts, so the first pass is captured, eleven replayed
        assert note.startswith("CUDA graphs: 11 of 12 passes replayed (1 captured);"), (label, note)
    assert gpu["replayed"] == 11 and gpu["bypass"] == {"conditional": None, "unconditional": None}
    # the next prompt replays every pass from the graphs of the first run, bit for bit
    assert gpu["again_equal"] and gpu["again_captures"] == 0
    for label, note in gpu["again_notes"].items():
        assert note.startswith("CUDA graphs: 12 of 12 passes replayed (no capture: graphs kept"), (label, note)
    # while kept, the pool is counted in ComfyUI's reserved VRAM; unloading the MODELs frees it
    held, after = gpu["held"], gpu["after_unload"]
    assert held["graphs"] == 1 and held["pool_bytes"] > 0 and held["reserved"] == {"cuda:0": held["pool_bytes"]}
    assert after["graphs"] == 0 and after["pool_bytes"] == 0 and after["reserved"] == {}
    assert after["card_bytes_returned"] >= held["pool_bytes"] // 2, (after, held)
    # an eager pass out of memory while graphs are held: the pool goes and the pass runs again, same latent
    oom = gpu["oom"]
    assert oom["held_before"] >= 1 and oom["raised"] == 1 and oom["released"] == 1 and oom["equal"], oom
    assert all("triton-int8" in paths for paths in gpu["paths"].values()), gpu["paths"]
    assert gpu["wrappers_after"] == []
    assert gpu["rope_launches"] > 0  # q/k norm + RoPE through the pack's Triton kernel (nodes/runtime/qk_rope.py)
