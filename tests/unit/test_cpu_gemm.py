"""The CPU's GEMM path (kernels/cpu_gemm.py): the measured choice between torch._int_mm and the dequantized float
matmul, its cache, its labels, the switch back to torch._int_mm, and the float path's numerics. No timing is
asserted: every test fakes the measurement (one runs the real micro-benchmark, checking only its shape)."""

from __future__ import annotations

import json

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.ideogram4 import demo
from comfyui_ideogram4_int8.kernels import cpu_gemm, path_choice, settings
from comfyui_ideogram4_int8.kernels.registry import PATH_LABELS, path_labels
from kernel_checks import rel_err

CPU = torch.device("cpu")
SLOW_INT_MM = {"int8": 49.5, "float32": 1.43, "bfloat16": 13.7}  # measured on the 2-core Zen 3 (AVX2, no VNNI)
FAST_INT_MM = {"int8": 0.6, "float32": 1.43, "bfloat16": 13.7}  # a CPU with VNNI / AMX


def _forget():
    cpu_gemm.clear()
    path_choice._select_path_cached.cache_clear()


@pytest.fixture
def measured(monkeypatch, setting, tmp_path):
    """Unpin the suite's answer, cache in tmp_path; ``measured(ms)`` fakes the measurement and counts its calls."""
    setting(settings.EXPERIMENTS_VAR, None)
    setting(K.ENV_PATH, None)
    setting(settings.CACHE_DIR, str(tmp_path))
    calls = []

    def fake(ms):
        def measure():
            calls.append(dict(ms))
            return dict(ms)

        monkeypatch.setattr(cpu_gemm, "measure", measure)
        _forget()
        return calls

    yield fake
    _forget()


def test_a_slow_int_mm_gives_the_float_path_with_the_measurement_as_reason(measured):
    calls = measured(SLOW_INT_MM)
    path, reason = K.select_path(CPU, 768, 256)
    assert path == K.PATH_DEQUANT and len(calls) == 1
    assert "torch._int_mm took 49.50 ms against 1.43 ms for the dequantized float32 matmul" in reason
    assert "IDEOGRAM4_INT8_GEMM_PATH=cublas-int8 forces it" in reason
    assert path_choice.dequant_dtype(torch.zeros(1, dtype=torch.bfloat16)) == torch.float32
    K.select_path(CPU, 512, 256)
    assert len(calls) == 1  # measured once per process, not per shape


def test_a_fast_int_mm_keeps_cublas_int8_with_the_measurement_as_reason(measured):
    calls = measured(FAST_INT_MM)
    path, reason = K.select_path(CPU, 768, 256)
    assert path == K.PATH_CUBLAS and len(calls) == 1
    # the times it rests on, not only the GPU's absence (a CPU with VNNI showed just "needs a CUDA GPU")
    assert reason.startswith(path_choice.CPU_REASON), reason
    assert "torch._int_mm took 0.60 ms against 1.43 ms for the dequantized float32 matmul" in reason
    assert reason.endswith("so it runs") and "forces" not in reason


def test_bf16_is_the_float_dtype_only_where_it_measured_faster(measured):
    measured({"int8": 40.0, "float32": 2.0, "bfloat16": 1.0})  # a CPU with bf16 units
    assert cpu_gemm.choice().float_dtype == torch.bfloat16
    assert path_choice.dequant_dtype(torch.zeros(1, dtype=torch.bfloat16)) == torch.bfloat16
    assert path_choice.dequant_dtype(torch.zeros(1, dtype=torch.float16)) == torch.float32  # never fp16 -> bf16
    assert path_choice.dequant_dtype(torch.zeros(1)) == torch.float32


def test_the_answer_is_cached_on_disk_per_torch_and_cpu(measured, tmp_path, monkeypatch):
    calls = measured(SLOW_INT_MM)
    first = cpu_gemm.choice()
    doc = json.loads((tmp_path / cpu_gemm.CACHE_NAME).read_text())
    key = cpu_gemm.cache_key()
    assert doc["entries"][key] == SLOW_INT_MM and first.source == "measured on first use"

    def boom():
        raise AssertionError("measured again although the cache holds the answer")

    monkeypatch.setattr(cpu_gemm, "measure", boom)
    _forget()
    again = cpu_gemm.choice()
    assert again.ms == SLOW_INT_MM and again.source == "measured earlier on this CPU" and len(calls) == 1
    assert K.select_path(CPU, 768, 256)[0] == K.PATH_DEQUANT
    assert "measured earlier on this CPU" in K.select_path(CPU, 768, 256)[1]
    # another torch or CPU is another answer; a broken cache file is measured again, never an error
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    monkeypatch.setattr(cpu_gemm, "cpu_name", lambda: "Other CPU")
    assert cpu_gemm.cache_key() != key and "2.99.0+cpu|Other CPU|" in cpu_gemm.cache_key()
    measured(FAST_INT_MM)  # the same call list: one more measurement expected
    (tmp_path / cpu_gemm.CACHE_NAME).write_text("{not json")
    assert cpu_gemm.choice().int_mm_fast and len(calls) == 2


def test_an_unwritable_cache_keeps_the_answer_for_the_process(measured, tmp_path, setting):
    blocker = tmp_path / "file"
    blocker.write_text("")
    setting(settings.CACHE_DIR, str(blocker / "sub"))  # a folder under a file: cannot be made
    measured(SLOW_INT_MM)
    assert K.select_path(CPU, 768, 256)[0] == K.PATH_DEQUANT


def test_the_switch_gives_torch_int_mm_back(measured, setting, gen):
    measured(SLOW_INT_MM)
    setting(K.ENV_PATH, K.PATH_CUBLAS)
    path, reason = K.select_path(CPU, 64, 48)
    assert path == K.PATH_CUBLAS and reason == f"forced by {K.ENV_PATH}=cublas-int8"
    x = torch.randn(5, 48, generator=gen)
    w, ws = K.quantize_weight_ref(torch.randn(64, 48, generator=gen))
    K.REGISTRY.clear()
    before = K.REGISTRY.launches["int_mm"]
    K.w8a8_linear(x, w, ws, site="switch/x")
    assert K.REGISTRY.path_of("switch/x") == K.PATH_CUBLAS and K.REGISTRY.launches["int_mm"] == before + 1
    K.REGISTRY.clear()


def test_pins_state_the_answer_without_measuring(measured, setting):
    calls = measured(SLOW_INT_MM)
    setting(settings.EXPERIMENTS_VAR, "cpu-gemm=int8")
    assert K.select_path(CPU, 64, 48)[0] == K.PATH_CUBLAS
    setting(settings.EXPERIMENTS_VAR, "cpu-gemm=float")
    path, reason = K.select_path(CPU, 64, 48)
    assert path == K.PATH_DEQUANT and "IDEOGRAM4_INT8_EXPERIMENTS has cpu-gemm=float (stated, not measured)" in reason
    assert calls == []
    assert cpu_gemm.decided() is not None and cpu_gemm.choice().float_dtype == torch.float32


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_the_float_path_equals_a_float64_reference_of_the_same_quantized_operands(measured, gen, x_dtype):
    measured(SLOW_INT_MM)
    m, k, n = 37, 96, 80
    x = (torch.randn(m, k, generator=gen) * torch.linspace(0.1, 8, k)).to(x_dtype)
    x[3] = 0  # an all-zero row: exactly the bias
    w, ws = K.quantize_weight_ref(torch.randn(n, k, generator=gen))
    bias = torch.randn(n, generator=gen)
    K.REGISTRY.clear()
    y = K.w8a8_linear(x, w, ws, bias, site="fp32/x", out_dtype=torch.float32)
    assert K.REGISTRY.path_of("fp32/x") == K.PATH_DEQUANT
    q, s = K.quantize_per_token_ref(x)
    ref = (q.double() * s.double()[:, None]) @ (w.double() * ws.double()[:, None]).t() + bias.double()
    # float32 products of the dequantized operands: ~1e-7 relative; a bf16 matmul would be ~1e-2 off
    assert rel_err(y, ref) < 1e-5, f"seed {gen.initial_seed()}"
    assert torch.equal(y[3], bias)
    K.REGISTRY.clear()


def test_labels_name_what_runs_per_device():
    cpu, cuda = path_labels("cpu"), path_labels("cuda")
    assert set(cpu) == set(cuda) == set(K.PATHS)  # the stable ids, one label each
    assert "cuBLAS" not in cpu[K.PATH_CUBLAS] and "torch._int_mm" in cpu[K.PATH_CUBLAS]
    assert cpu[K.PATH_DEQUANT] == "CPU dequantized float32 matmul" and "phantom" not in cpu[K.PATH_DEQUANT]
    assert path_labels("cpu", "bfloat16")[K.PATH_DEQUANT] == "CPU dequantized bfloat16 matmul"
    assert "cuBLAS" in cuda[K.PATH_CUBLAS] and "phantom" in cuda[K.PATH_DEQUANT]
    assert path_labels("mps") == cpu and set(PATH_LABELS) == {"cuda", "cpu"}


def test_the_status_report_carries_the_cpu_labels_and_says_what_ran(measured):
    pytest.importorskip("jsonschema")
    import jsonschema
    from comfyui_ideogram4_int8.nodes import status_report as S

    if torch.cuda.is_available():
        pytest.skip("the CPU wording shows where torch sees no GPU")
    measured(SLOW_INT_MM)
    K.REGISTRY.clear()
    report = S.status_report()
    assert report["path_labels"]["device"] == "cpu"
    assert "decided at the first W8A8 call" in report["status"]["notes"][0]  # the report never measures
    w, ws = K.quantize_weight_ref(torch.randn(64, 48))
    K.w8a8_linear(torch.randn(4, 48), w, ws, site="conditional/layers.0.attention.qkv")
    report = S.status_report()
    jsonschema.validate(report, S.load_schema())
    assert report["path_labels"]["labels"][K.PATH_DEQUANT] == "CPU dequantized float32 matmul"
    assert report["status"]["code"] == "no_cuda"
    assert "dequantized float32 matmul (dequant-bf16), faster than torch._int_mm" in report["status"]["message"]
    K.REGISTRY.clear()


def test_the_real_measurement_is_complete_and_leaves_the_thread_count(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "REPEATS", 1)
    threads = torch.get_num_threads()
    seen = []
    real = cpu_gemm.reference.dequant_matmul
    monkeypatch.setattr(
        cpu_gemm.reference, "dequant_matmul", lambda *a: seen.append(torch.get_num_threads()) or real(*a)
    )
    ms = cpu_gemm.measure()
    assert set(ms) == set(cpu_gemm.CANDIDATES) and all(0 < v < float("inf") for v in ms.values())
    assert seen and set(seen) == {1} and torch.get_num_threads() == threads  # one thread while measuring, restored


CPUINFO = """processor	: 0
physical id	: 0
core id		: 0

processor	: 1
physical id	: 0
core id		: 0

processor	: 2
physical id	: 0
core id		: 1

processor	: 3
physical id	: 0
core id		: 1
"""


def test_demo_threads_default_to_physical_cores():
    assert demo.physical_cores(CPUINFO, {0, 1, 2, 3}) == 2  # two hyperthreads per core count once
    assert demo.physical_cores(CPUINFO, {0, 1}) == 1  # only one core's threads allowed
    two_sockets = CPUINFO.replace("physical id\t: 0\ncore id\t\t: 1", "physical id\t: 1\ncore id\t\t: 0")
    assert demo.physical_cores(two_sockets, {0, 2}) == 2  # core 0 of socket 0 and core 0 of socket 1
    assert demo.physical_cores("processor\t: 0\n\nprocessor\t: 1\n", {0, 1, 2}) == 3  # no core ids: allowed CPUs
    assert demo.physical_cores("", set()) == 1


def test_info_names_what_the_path_runs_here(measured, tmp_path):
    from comfyui_ideogram4_int8.machine_info import info_report

    if torch.cuda.is_available():
        pytest.skip("the CPU wording shows where torch sees no GPU")
    measured(SLOW_INT_MM)
    report = info_report()
    assert report["gemm_path"] == K.PATH_DEQUANT and report["path_label"] == "CPU dequantized float32 matmul"
    assert "dequantized to float32" in report["backend_reason"] and "49.50 ms" in report["gemm_path_reason"]
    (tmp_path / cpu_gemm.CACHE_NAME).unlink()  # else the cached answer stands
    measured(FAST_INT_MM)
    report = info_report()
    assert report["gemm_path"] == K.PATH_CUBLAS and report["path_label"] == "CPU INT8 matmul (torch._int_mm)"


@pytest.mark.parametrize(
    "cores, load, threads",
    [(2, 0.2, 2), (2, 0.99, 2), (2, 1.3, 1), (2, 5.7, 1), (8, 3.2, 5), (2, None, 2), (1, 0.0, 1), (4, -1.0, 4)],
)
def test_demo_threads_leave_out_the_cores_other_jobs_keep_busy(cores, load, threads):
    assert demo.default_threads(cores, load) == threads


def test_demo_sets_its_default_and_keeps_what_it_is_told(monkeypatch):
    before = torch.get_num_threads()
    args = type("Args", (), {"threads": None})()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(demo, "physical_cores", lambda: 3)
    monkeypatch.setattr(demo, "_load", lambda: 1.5)
    try:
        assert demo._threads(args, CPU) == 2
        args.threads = 1
        assert demo._threads(args, CPU) == 1
        args.threads = None
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(3)
        assert demo._threads(args, CPU) == 3  # OMP_NUM_THREADS set: the demo leaves torch's count alone
    finally:
        torch.set_num_threads(before)
