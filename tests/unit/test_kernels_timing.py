"""GEMM timing (the panel's per-path milliseconds): what a timed launch covers and what an untimed run keeps."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends
from kernel_checks import activations, weight

pytestmark = pytest.mark.skipif(
    backends.unavailable("triton", torch.device("cpu")) is not None,
    reason="Triton interpreter not available (needs triton + TRITON_INTERPRET=1)",
)


# -- GEMM timing (the panel's per-path milliseconds) ------------------------------------------------


class _Depth:
    """Stand-in for REGISTRY.timed on the CPU: counts how deep inside timed regions the code is."""

    def __init__(self):
        self.depth = 0
        self.entered: list[str] = []

    def __call__(self, path, device):
        import contextlib

        @contextlib.contextmanager
        def region():
            self.entered.append(path)
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1

        return region()


@pytest.mark.parametrize("entry", ["w8a8_linear", "swiglu_w8a8_pair"])
def test_timing_covers_the_launch_not_the_autotuning(entry, gen, monkeypatch):
    """A shape's first call may autotune (many trial launches): only the real launch counts as GEMM time."""
    from comfyui_ideogram4_int8.kernels import gemm_triton, tuning

    depth = _Depth()
    monkeypatch.setattr(K.REGISTRY, "timed", depth)
    launch_depths: list[int] = []
    real_launch = gemm_triton.launch_gemm

    def counting_launch(*args, **kwargs):
        launch_depths.append(depth.depth)
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(gemm_triton, "launch_gemm", counting_launch)
    trials = 2 + int(gen.initial_seed() % 3)
    real_pick = tuning.PICKER.pick

    def autotuning_pick(q, w, launch=None, **key):  # what _autotune does on a GPU: time trials
        cfg, _ = real_pick(q, w, None, **key)
        for _ in range(trials):
            launch(cfg)
        return cfg, "autotuned (test)"

    monkeypatch.setattr(tuning.PICKER, "pick", autotuning_pick)
    x = activations(5, 64, gen)
    if entry == "w8a8_linear":
        w, ws = weight(48, 64, gen)
        K.w8a8_linear(x, w, ws, path="triton-int8", site="timingtest/a")
    else:
        K.swiglu_w8a8_pair(x, *weight(32, 64, gen), *weight(32, 64, gen), path="triton-int8", site="timingtest/p")
    assert launch_depths == [0] * trials + [1]  # trials untimed, the launch timed (once, not nested)
    assert depth.entered and set(depth.entered) == {"triton-int8"}
    # unfused paths are timed as a whole, under their own path
    depth.entered.clear()
    K.w8a8_linear(x, *weight(48, 64, gen), path="cublas-int8", site="timingtest/c")
    assert depth.entered == ["cublas-int8"]


class _FakeCudaEvent:
    """torch.cuda.Event on a CPU machine: records a fake clock."""

    clock = 0.0

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = _FakeCudaEvent.clock

    def elapsed_time(self, end):
        return end.t - self.t


def test_untimed_run_keeps_the_last_timed_result(gen, monkeypatch):
    from comfyui_ideogram4_int8.kernels.registry import GemmRegistry

    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    reg = GemmRegistry()
    reg.enable_timing(True)
    cuda = torch.device("cuda")
    ms = [0.5 + float(v) for v in torch.rand(2, generator=gen)]
    reg.begin_run()
    for path, dt in zip(("triton-int8", "bf16"), ms, strict=True):
        with reg.timed(path, cuda):
            _FakeCudaEvent.clock += dt
    first = reg.end_run()
    assert first["triton-int8"] == pytest.approx(ms[0]) and first["bf16"] == pytest.approx(ms[1])
    wall = reg.last_run()["wall_ms"]
    # a run with nothing timed (timing switched off, or GEMMs on the CPU) leaves the timed result in place
    reg.enable_timing(False)
    reg.begin_run()
    with reg.timed("triton-int8", cuda):
        _FakeCudaEvent.clock += 9.0
    assert reg.end_run() == first
    reg.enable_timing(True)
    reg.begin_run()
    with reg.timed("triton-int8", torch.device("cpu")):
        pass
    reg.end_run()
    assert reg.last_run() == {"gemm_ms_per_path": first, "wall_ms": wall}
    # the next timed run replaces it
    reg.begin_run()
    with reg.timed("cublas-int8", cuda):
        _FakeCudaEvent.clock += 2.0
    assert reg.end_run()["cublas-int8"] == pytest.approx(2.0)
    assert reg.last_run()["gemm_ms_per_path"]["triton-int8"] == 0.0
