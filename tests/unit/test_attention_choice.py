"""The attention choice (kernels/attention_choice.py): fastest within the error bound, cache, forcing, fallbacks."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from attention_fakes import FakeCandidate, fake_timer
from comfyui_ideogram4_int8.kernels import attention_choice as AC
from comfyui_ideogram4_int8.kernels import attention_fp8_cudnn as fp8_cudnn
from comfyui_ideogram4_int8.kernels import capture_guard, settings

CPU = torch.device("cpu")
SHAPE = AC.Shape(48, 2, 16)


@pytest.fixture(autouse=True)
def _fresh(setting, tmp_path):
    setting(settings.CACHE_DIR, str(tmp_path))
    AC.clear()
    yield
    AC.clear()


def _pool(**fakes):
    return {"sdpa": FakeCandidate("sdpa"), **fakes}


def _choose(pool, ms, shape=SHAPE, device=CPU):
    timer = fake_timer(pool, ms)
    return AC.choose(device, shape, torch.float32, candidates=pool, timer=timer), timer


def test_the_fastest_path_within_the_bound_wins_with_its_numbers():
    pool = _pool(int8=FakeCandidate("int8", noise=AC.BOUND / 10), fp8=FakeCandidate("fp8", noise=AC.BOUND / 10))
    choice, timer = _choose(pool, {"sdpa": 0.58, "int8": 0.41, "fp8": 0.47})
    assert choice.path == "int8" and choice.measured and sorted(timer.timed) == ["fp8", "int8", "sdpa"]
    assert choice.ms == {"sdpa": 0.58, "int8": 0.41, "fp8": 0.47}
    assert choice.errors["sdpa"] < 1e-6 < choice.errors["int8"] <= AC.BOUND
    assert "int8 0.410 ms" in choice.reason and "sdpa 0.580 ms" in choice.reason and "fp8 0.470 ms" in choice.reason


def test_an_8bit_path_over_the_bound_loses_with_its_error_in_the_reason():
    pool = _pool(int8=FakeCandidate("int8", noise=AC.BOUND * 5))
    choice, _ = _choose(pool, {"sdpa": 0.58, "int8": 0.30})
    assert choice.path == "sdpa" and choice.errors["int8"] > AC.BOUND
    assert f"int8 0.300 ms (error {choice.errors['int8']:.1e} over the bound" in choice.reason


def test_no_faster_8bit_path_keeps_sdpa_and_says_so_with_the_numbers():
    pool = _pool(int8=FakeCandidate("int8", noise=AC.BOUND / 10))
    choice, _ = _choose(pool, {"sdpa": 0.579, "int8": 1.288})
    assert choice.path == "sdpa"
    assert choice.reason.startswith("no 8-bit path is faster within the error bound")
    assert "sdpa 0.579 ms" in choice.reason and "int8 1.288 ms" in choice.reason
    tie, _ = _choose(_pool(int8=FakeCandidate("int8")), {"sdpa": 1.0, "int8": 1.0}, shape=AC.Shape(8, 1, 8))
    assert tie.path == "sdpa"  # a tie is no reason to leave SDPA


def test_the_cache_key_names_everything_the_answer_depends_on(monkeypatch):
    fields = AC.key_fields(CPU, SHAPE, torch.bfloat16)
    assert set(fields) == {
        *("gpu", "capability", "torch", "comfy_kitchen", "cudnn", "cudnn_frontend", "cudnn_fp8", "shape", "dtype")
    }
    assert fields["shape"] == [48, 2, 16] and fields["dtype"] == "bfloat16" and fields["torch"] == torch.__version__
    key = AC.cache_key(CPU, SHAPE, torch.bfloat16)
    assert AC.cache_key(CPU, AC.Shape(49, 2, 16), torch.bfloat16) != key
    assert AC.cache_key(CPU, SHAPE, torch.float16) != key
    monkeypatch.setattr(AC, "kitchen_version", lambda: "9.9.9")
    assert AC.cache_key(CPU, SHAPE, torch.bfloat16) != key
    monkeypatch.setattr(AC, "cudnn_frontend_version", lambda: "1.2.3")
    with_frontend = AC.cache_key(CPU, SHAPE, torch.bfloat16)
    assert json.loads(with_frontend)["cudnn_frontend"] == "1.2.3" and with_frontend != key
    monkeypatch.setattr(fp8_cudnn, "backend_version", lambda: 91500)  # the cuDNN the frontend loaded
    assert json.loads(AC.cache_key(CPU, SHAPE, torch.bfloat16))["cudnn_fp8"] == 91500


def test_an_answer_is_reused_in_memory_and_from_the_cache_file(monkeypatch):
    pool = _pool(int8=FakeCandidate("int8", noise=AC.BOUND / 10))
    first, timer = _choose(pool, {"sdpa": 2.0, "int8": 1.0})
    again, timer2 = _choose(pool, {"sdpa": 1.0, "int8": 2.0})
    assert again is first and timer2.timed == []  # a lookup, not a measurement
    entry = json.loads(AC.cache_file().read_text())["entries"][AC.cache_key(CPU, SHAPE, torch.float32)]
    assert entry["int8"]["ms"] == 1.0 and entry["sdpa"]["ms"] == 2.0 and entry["int8"]["err"] > 0
    AC.clear()  # a new process: the file answers, nothing is measured
    later, timer3 = _choose(pool, {"sdpa": 1.0, "int8": 2.0})
    assert later.path == "int8" and timer3.timed == [] and not later.measured
    assert "measured earlier on this GPU" in later.reason and later.ms == first.ms
    AC.clear()
    monkeypatch.setattr(AC, "kitchen_version", lambda: "another")  # another key: measured again
    other, timer4 = _choose(pool, {"sdpa": 1.0, "int8": 2.0})
    assert other.path == "sdpa" and sorted(timer4.timed) == ["int8", "sdpa"]
    assert len(json.loads(AC.cache_file().read_text())["entries"]) == 2


def test_a_damaged_cache_file_is_measured_over():
    AC.cache_file().parent.mkdir(parents=True, exist_ok=True)
    key = AC.cache_key(CPU, SHAPE, torch.float32)
    AC.cache_file().write_text(json.dumps({"entries": {key: {"sdpa": {"ms": "fast"}, "int8": [1]}}}))
    pool = _pool(int8=FakeCandidate("int8"))
    choice, timer = _choose(pool, {"sdpa": 2.0, "int8": 1.0})
    assert choice.path == "int8" and len(timer.timed) == 2
    AC.cache_file().write_text("{not json")
    AC.clear()
    assert _choose(pool, {"sdpa": 2.0, "int8": 1.0})[0].path == "int8"


def test_the_setting_forces_a_path_where_it_can_run(setting):
    pool = _pool(int8=FakeCandidate("int8", noise=AC.BOUND * 5), fp8=FakeCandidate("fp8", why_not="fp8 is away"))
    setting(settings.ATTENTION, "int8")
    choice, timer = _choose(pool, {"sdpa": 1.0, "int8": 2.0})
    assert choice.path == "int8" and "forced by IDEOGRAM4_INT8_ATTENTION=int8" in choice.reason and timer.timed == []
    setting(settings.ATTENTION, "fp8")
    choice, _ = _choose(pool, {})
    assert choice.path == "sdpa" and choice.reason == "IDEOGRAM4_INT8_ATTENTION=fp8 asked for, but fp8 is away"
    setting(settings.ATTENTION, "sdpa")
    assert _choose(pool, {})[0].path == "sdpa"
    setting(settings.ATTENTION, None)  # the setting is part of the in-memory key: auto measures now
    choice, timer = _choose(pool, {"sdpa": 1.0, "int8": 0.5})
    assert choice.path == "sdpa" and "over the bound" in choice.reason and "fp8: fp8 is away" in choice.reason


def test_kitchen_or_cudnn_missing_means_sdpa_with_the_reason(monkeypatch):
    cuda = torch.device("cuda", 0)  # never touched: the answer comes before any measurement
    monkeypatch.setattr(fp8_cudnn, "capability", lambda device=None: (10, 0))  # a GPU cuDNN's FP8 attention runs on
    pool = {"sdpa": FakeCandidate("sdpa"), "int8": AC.KitchenInt8(), "fp8": AC.CudnnFp8()}
    monkeypatch.setitem(sys.modules, "comfy_kitchen", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "cudnn", None)
    choice = AC.choose(cuda, AC.Shape(4608, 18, 256), torch.bfloat16, candidates=pool)
    assert choice.path == "sdpa" and choice.reason.startswith("no 8-bit path can run here")
    assert "int8: comfy-kitchen is not installed" in choice.reason
    assert "fp8: nvidia-cudnn-frontend is not installed" in choice.reason
    assert "needs a CUDA GPU" in AC.KitchenInt8().unavailable(CPU)
    assert "up to 256" in AC.KitchenInt8().unavailable(cuda, AC.Shape(64, 2, 512), torch.bfloat16)


def test_what_the_kitchen_and_cudnn_modules_say_is_the_reason(monkeypatch):
    cuda = torch.device("cuda", 0)
    old = types.SimpleNamespace()  # a release without int8 attention
    monkeypatch.setitem(sys.modules, "comfy_kitchen", old)
    assert "has no int8_attention" in AC.KitchenInt8().unavailable(cuda)
    asked = []
    unable = types.SimpleNamespace(int8_attention=None, int8_attention_is_available=lambda d: asked.append(d))
    monkeypatch.setitem(sys.modules, "comfy_kitchen", unable)
    assert "cannot run on this GPU" in AC.KitchenInt8().unavailable(cuda) and asked == [cuda]
    ran = []
    able = types.SimpleNamespace(int8_attention=lambda q, k, v: ran.append(q) or q, int8_attention_is_available=bool)
    monkeypatch.setitem(sys.modules, "comfy_kitchen", able)
    assert AC.KitchenInt8().unavailable(cuda, AC.Shape(4608, 18, 256), torch.bfloat16) is None
    q = torch.ones(1)
    assert AC.KitchenInt8().run(q, q, q) is q and ran == [q]  # through the public function
    monkeypatch.setattr(fp8_cudnn, "capability", lambda device=None: (10, 0))  # a GPU cuDNN's FP8 attention runs on
    monkeypatch.setitem(sys.modules, "cudnn", types.SimpleNamespace())  # a frontend without the graph API
    assert "has no FP8 attention in its graph API" in AC.CudnnFp8().unavailable(cuda)


def test_a_path_that_fails_while_measured_or_asked_loses_with_the_reason():
    pool = _pool(int8=FakeCandidate("int8", fail=True))
    choice, _ = _choose(pool, {"sdpa": 2.0, "int8": 1.0})
    assert choice.path == "sdpa" and "int8 failed while measured: RuntimeError: int8 broke" in choice.reason
    assert not AC.cache_file().exists()  # a failure is not kept for the next process

    class Confused(FakeCandidate):
        def unavailable(self, device, shape=None, dtype=None):
            raise OSError("no answer")

    pool = _pool(int8=Confused("int8"))
    choice, _ = _choose(pool, {"sdpa": 2.0, "int8": 1.0}, shape=AC.Shape(8, 1, 8))
    assert choice.path == "sdpa" and "asking whether it can run failed (OSError: no answer)" in choice.reason


def test_a_failure_outside_the_candidates_still_answers_sdpa(monkeypatch):
    def broken(*args):
        raise MemoryError("probe")

    monkeypatch.setattr(AC, "probe_inputs", broken)
    choice, _ = _choose(_pool(int8=FakeCandidate("int8")), {"sdpa": 2.0, "int8": 1.0})
    assert choice.path == "sdpa" and "failed (MemoryError: probe)" in choice.reason


def test_nothing_is_measured_during_a_capture_or_a_trace_until_an_eager_call(monkeypatch):
    pool = _pool(int8=FakeCandidate("int8"))
    # a CUDA graph capture: the first use refuses (the capture fails, the pass runs eagerly), nothing decided
    monkeypatch.setattr(capture_guard, "capturing", lambda device: True)
    with pytest.raises(capture_guard.FirstUseInCapture, match="measuring the attention at L=48"):
        _choose(pool, {"sdpa": 2.0, "int8": 1.0})
    assert AC.lookup(CPU, *vars(SHAPE).values(), torch.float32) is None and AC.decided(CPU) == {}
    # a torch.compile trace: SDPA for now, not final
    monkeypatch.setattr(capture_guard, "capturing", lambda device: False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    choice, timer = _choose(pool, {"sdpa": 2.0, "int8": 1.0})
    assert choice.path == "sdpa" and not choice.final and timer.timed == [] and "trace" in choice.reason
    assert AC.lookup(CPU, *vars(SHAPE).values(), torch.float32) is choice
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    choice, timer = _choose(pool, {"sdpa": 2.0, "int8": 1.0})
    assert choice.path == "int8" and choice.final and len(timer.timed) == 2
    assert AC.decided(CPU) == {SHAPE: choice}
    # decided: a capture asks again and gets the answer (nothing refused)
    monkeypatch.setattr(capture_guard, "capturing", lambda device: True)
    assert _choose(pool, {"sdpa": 2.0, "int8": 1.0})[0] is choice


def test_a_failed_real_call_makes_sdpa_the_answer_for_that_key():
    pool = _pool(int8=FakeCandidate("int8"))
    assert _choose(pool, {"sdpa": 2.0, "int8": 1.0})[0].path == "int8"
    after = AC.give_way(CPU, SHAPE, torch.float32, "int8", RuntimeError("launch failed"))
    assert after.path == "sdpa" and "int8 failed at L=48" in after.reason
    assert _choose(pool, {"sdpa": 2.0, "int8": 1.0})[0] is after


def test_the_real_sdpa_candidate_is_measured_against_float32_on_probe_inputs():
    if AC.PRIORITY is None:
        pytest.skip("this torch cannot order SDPA backends")
    ms, errors, failed = AC.measure({"sdpa": AC.CANDIDATES["sdpa"]}, CPU, AC.Shape(64, 3, 32), torch.bfloat16)
    assert failed == {} and ms["sdpa"] > 0 and 0 < errors["sdpa"] < 2e-2


def test_probe_inputs_have_the_blocks_layout_and_outlier_channels():
    q, k, v = AC.probe_inputs(CPU, AC.Shape(256, 3, 64), torch.float32)
    assert q.shape == k.shape == v.shape == (1, 3, 256, 64)
    assert q.transpose(1, 2).is_contiguous() and not q.is_contiguous()  # a view of [B, L, H, D]
    ms = q.pow(2).mean(dim=(0, 1, 2))  # mean square per channel
    assert torch.allclose(q.pow(2).mean(-1), torch.ones(()), atol=1e-4)  # RMS-normalised per head
    assert (ms > 4).sum() == AC.OUTLIER_CHANNELS and (ms < 1).sum() == 64 - AC.OUTLIER_CHANNELS


def test_the_error_is_the_worst_heads():
    ref = torch.ones(1, 3, 10, 4)
    out = ref.clone()
    out[:, 1] *= 1.1
    assert AC.worst_head_error(out, ref) == pytest.approx(0.1, rel=1e-5)


def test_the_forcible_paths_are_the_candidates():
    assert settings.ATTENTION_PATHS == tuple(AC.CANDIDATES)
    assert all(AC.CANDIDATES[name].name == name for name in AC.CANDIDATES)


def test_a_compiled_call_looks_the_answer_up_without_measuring(monkeypatch):
    """Traced by torch.compile (fullgraph), the override's lookup is a dictionary read: an undecided shape runs SDPA."""
    if AC.PRIORITY is None:
        pytest.skip("this torch cannot order SDPA backends")
    from comfyui_ideogram4_int8.nodes.runtime import attention_override as A

    monkeypatch.setattr(A, "_serves", lambda q, k, v, mask, skip_reshape, kw: True)
    override = A.PackAttention("compiled")
    q, k, v = AC.probe_inputs(CPU, AC.Shape(32, 2, 16), torch.float32)
    fn = torch.compile(lambda q, k, v: override(None, q, k, v, 2, skip_reshape=True), fullgraph=True, backend="eager")
    out = fn(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 32, 32)
    assert torch.allclose(out, ref, atol=1e-5) and AC.decided() == {}


def test_the_families_measured_here_take_sdpa_and_others_still_measure(monkeypatch):
    """H100 / H200 (sm_90): the repository measured cuDNN's bf16 SDPA faster than every 8-bit path at these shapes,
    so the shipped pool answers SDPA there without measuring; another family measures (a fake timer here)."""
    cuda = torch.device("cuda", 0)
    shipped = {name: FakeCandidate(name, noise=AC.BOUND / 10) for name in ("sdpa", "int8")}
    monkeypatch.setattr(AC, "CANDIDATES", shipped)
    monkeypatch.setattr(AC, "capability", lambda device=None: (9, 0))
    timer = fake_timer(shipped, {"sdpa": 0.58, "int8": 0.41})
    choice = AC.choose(cuda, SHAPE, torch.float32, timer=timer)
    assert choice.path == "sdpa" and not choice.measured and not timer.timed
    assert choice.reason.startswith("measured on this GPU family: no 8-bit path is faster (against comfy-kitchen")
    # a path that cannot run there says why in the same answer
    shipped["fp8"] = FakeCandidate("fp8", why_not="on Hopper cuDNN's FP8 attention writes an FP8 output only")
    AC.clear()
    choice = AC.choose(cuda, SHAPE, torch.float32, timer=timer)
    assert choice.path == "sdpa" and not timer.timed
    assert choice.reason.endswith("; fp8: on Hopper cuDNN's FP8 attention writes an FP8 output only"), choice.reason
    del shipped["fp8"]
    AC.clear()
    monkeypatch.setattr(AC, "capability", lambda device=None: (8, 6))
    measured = []

    def measure(pool, device, shape, dtype, timer=None):  # this CPU cannot run CUDA probes: the numbers a GPU gave
        measured.append(sorted(pool))
        return {"sdpa": 0.58, "int8": 0.41}, {"sdpa": 1e-3, "int8": 1e-2}, {}

    monkeypatch.setattr(AC, "measure", measure)
    monkeypatch.setattr(AC, "gpu_name", lambda device=None: "a GPU of another family")
    choice = AC.choose(cuda, SHAPE, torch.float32, timer=timer)
    assert choice.path == "int8" and choice.measured and measured == [["int8", "sdpa"]]


def test_on_a_family_measured_here_fp8_is_still_measured_against_sdpa(monkeypatch):
    """On a family with paths measured slower there (sm_90: comfy-kitchen's INT8), a path not listed that can run
    (a stand-in FP8 here: the real one says it cannot run on Hopper) is still measured against SDPA, kept when
    faster within the bound and losing when over it."""
    cuda = torch.device("cuda", 0)
    shipped = {name: FakeCandidate(name) for name in ("sdpa", "int8", "fp8")}
    monkeypatch.setattr(AC, "CANDIDATES", shipped)
    monkeypatch.setattr(AC, "capability", lambda device=None: (9, 0))
    monkeypatch.setattr(AC, "gpu_name", lambda device=None: "an H200")
    measured, numbers = [], {}

    def measure(pool, device, shape, dtype, timer=None):  # the numbers a GPU gave
        measured.append(sorted(pool))
        return dict(numbers["ms"]), dict(numbers["err"]), {}

    monkeypatch.setattr(AC, "measure", measure)
    numbers.update(ms={"sdpa": 0.58, "fp8": 0.41}, err={"sdpa": 1e-3, "fp8": AC.BOUND / 2})
    choice = AC.choose(cuda, SHAPE, torch.bfloat16)
    assert choice.path == "fp8" and choice.measured and measured == [["fp8", "sdpa"]]
    assert "int8: measured slower on this GPU family (against comfy-kitchen" in choice.reason
    AC.clear()
    numbers.update(err={"sdpa": 1e-3, "fp8": AC.BOUND * 2})
    choice = AC.choose(cuda, AC.Shape(64, 2, 16), torch.bfloat16)
    assert choice.path == "sdpa" and "fp8 0.410 ms (error 4.0e-02 over the bound" in choice.reason
    AC.clear()
    shipped["fp8"].why_not = "nvidia-cudnn-frontend is not installed"  # as on every card without the frontend
    choice = AC.choose(cuda, AC.Shape(32, 2, 16), torch.bfloat16)
    assert choice.path == "sdpa" and not choice.measured and choice.reason.startswith("measured on this GPU family")
    assert len(measured) == 2


class _FakeFp8Kernel:
    """attention_fp8_cudnn.attention replaced by float32 attention plus ``noise`` (to give it an error), in q's dtype:
    what the real candidate calls, runnable on the CPU."""

    def __init__(self, noise):
        self.noise, self.calls = noise, 0

    def __call__(self, q, k, v, scale=None):
        self.calls += 1
        out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale)
        return (out + self.noise * out.abs().mean()).to(q.dtype)


@pytest.mark.parametrize(("noise", "kept"), [(0.0, True), (AC.BOUND * 3, False)])
def test_the_fp8_candidate_is_kept_when_faster_within_the_bound_and_keyed_by_its_versions(monkeypatch, noise, kept):
    kernel = _FakeFp8Kernel(noise)
    monkeypatch.setattr(fp8_cudnn, "available", lambda device, head_dim=None, dtype=None: (True, ""))
    monkeypatch.setattr(fp8_cudnn, "attention", kernel)
    monkeypatch.setattr(AC, "cudnn_frontend_version", lambda: "1.32.0")
    monkeypatch.setattr(fp8_cudnn, "backend_version", lambda: 91500)
    sdpa = FakeCandidate("sdpa")
    pool = {"sdpa": sdpa, "fp8": AC.CudnnFp8()}

    def timer(fn):  # fp8 twice as fast as SDPA
        before = kernel.calls
        fn()
        return 0.3 if kernel.calls > before else 0.6

    shape = AC.Shape(64, 2, 32)
    choice = AC.choose(CPU, shape, torch.bfloat16, candidates=pool, timer=timer)
    assert choice.measured and choice.ms == {"sdpa": 0.6, "fp8": 0.3}
    assert 1e-4 < choice.errors["fp8"] and (choice.errors["fp8"] <= AC.BOUND) == kept
    assert choice.path == ("fp8" if kept else "sdpa")
    (key,) = json.loads(AC.cache_file().read_text())["entries"]
    assert json.loads(key)["cudnn_frontend"] == "1.32.0" and json.loads(key)["cudnn_fp8"] == 91500
