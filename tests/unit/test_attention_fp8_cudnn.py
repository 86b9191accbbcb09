"""cuDNN's FP8 attention module on the CPU (kernels/attention_fp8_cudnn.py): the e4m3 quantizer, the twin, and what
``available`` says for each reason it cannot run. The cuDNN graph itself runs in tests/cuda."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from comfyui_ideogram4_int8.kernels import attention_choice as AC
from comfyui_ideogram4_int8.kernels import attention_fp8_cudnn as A

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)  # never touched: every answer below comes before any device work


def _blocks_layout(gen, b=1, length=96, heads=3, dim=32, dtype=torch.bfloat16):
    return (torch.randn(b, length, heads, dim, generator=gen) * 3).to(dtype).transpose(1, 2)


def test_quantize_maps_the_largest_magnitude_to_448_and_keeps_the_layout(gen):
    x = _blocks_layout(gen)
    x8, descale = A.quantize_e4m3(x)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape and x8.stride() == x.stride()
    assert descale.shape == (1, 1, 1, 1) and descale.dtype == torch.float32
    assert x8.float().abs().max().item() == A.E4M3_MAX
    assert descale.item() == pytest.approx(x.float().abs().max().item() / A.E4M3_MAX, rel=1e-6)


def test_dequantized_values_are_within_e4m3s_rounding_of_the_input(gen):
    x = _blocks_layout(gen, dtype=torch.float32)
    back = A.dequantize_e4m3(*A.quantize_e4m3(x)).double()
    exact = x.double()
    normal = exact.abs() * A.E4M3_MAX / exact.abs().max() >= 2.0**-6  # e4m3's normal range
    rel = ((back - exact).abs() / exact.abs())[normal]
    assert rel.max().item() <= 2.0**-4 * (1 + 1e-3)  # half a step of a 3-bit mantissa
    assert 0.01 < ((back - exact).norm() / exact.norm()).item() < 0.04  # rounded, not copied


def test_quantizing_zeros_gives_zeros_not_nans():
    x8, descale = A.quantize_e4m3(torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16))
    assert torch.equal(x8.float(), torch.zeros(1, 2, 8, 16)) and torch.isfinite(descale).all()


def test_the_twin_is_float_attention_of_the_quantized_operands(gen):
    q, k, v = (_blocks_layout(gen, length=64, heads=2, dim=32) for _ in range(3))
    deq = [A.dequantize_e4m3(*A.quantize_e4m3(t)).double() for t in (q, k, v)]
    scores = deq[0] @ deq[1].transpose(-1, -2) * 0.3
    expected = torch.softmax(scores, dim=-1) @ deq[2]
    out = A.attention_reference(q, k, v, scale=0.3)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert ((out.double() - expected).norm() / expected.norm()).item() < 1e-5
    plain = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.3)
    assert AC.worst_head_error(out, plain) > 1e-3  # the quantization shows


def test_the_twin_on_the_choices_probe_inputs_errs_more_than_bf16_attention():
    """The e4m3 inputs alone put the FP8 path's error at several times bf16 SDPA's on the choice's probe inputs
    (outlier channels): the number the choice holds against ``BOUND`` is this plus cuDNN's quantized softmax."""
    shape = AC.Shape(256, 2, 64)
    q, k, v = AC.probe_inputs(CPU, shape, torch.bfloat16, seed=3)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    bf16 = AC.worst_head_error(torch.nn.functional.scaled_dot_product_attention(q, k, v), ref)
    twin = AC.worst_head_error(A.attention_reference(q, k, v), ref)
    assert 5 * bf16 < twin < 0.5


def test_attention_refuses_bad_input_naming_it():
    t = torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"\[B, H, L, D\] of one shape"):
        A.attention(t, t[:, :1], t)
    with pytest.raises(ValueError, match="bf16 or fp16 CUDA tensors"):
        A.attention(t, t, t)


def _frontend(version=91500, has_fp8=True):
    def backend_version():
        if version is None:
            raise RuntimeError("Unable to find symbol cudnnGetVersion")
        return version

    pygraph = type("pygraph", (), {"sdpa_fp8": lambda self: None} if has_fp8 else {})
    return types.SimpleNamespace(pygraph=pygraph, backend_version=backend_version)


@pytest.fixture
def blackwell(monkeypatch):
    monkeypatch.setattr(A, "capability", lambda device=None: (10, 0))
    monkeypatch.setattr(A, "frontend_version", lambda: "1.32.0")


def test_available_where_the_frontend_cudnn_gpu_and_shape_fit(monkeypatch, blackwell):
    monkeypatch.setitem(sys.modules, "cudnn", _frontend())
    assert A.available(CUDA, 256, torch.bfloat16) == (True, "")
    assert A.available(CUDA) == (True, "")
    assert A.backend_version() == 91500


@pytest.mark.parametrize(
    ("frontend", "cc", "head_dim", "dtype", "why"),
    [
        (None, (10, 0), 256, torch.bfloat16, "nvidia-cudnn-frontend is not installed"),
        (_frontend(has_fp8=False), (10, 0), 256, torch.bfloat16, "1.32.0 has no FP8 attention"),
        (_frontend(version=None), (10, 0), 256, torch.bfloat16, "found no cuDNN library"),
        (_frontend(version=8907), (10, 0), 256, torch.bfloat16, "cuDNN 8907 is older than FP8 attention"),
        (_frontend(version=91200), (10, 0), 256, torch.bfloat16, "older than FP8 attention with a bf16 / fp16 output"),
        (_frontend(), (9, 0), 256, torch.bfloat16, "on Hopper cuDNN's FP8 attention writes an FP8 output only"),
        (None, (9, 0), 256, torch.bfloat16, "on Hopper cuDNN's FP8 attention writes an FP8 output only"),
        (_frontend(version=91000), (8, 9), 256, torch.bfloat16, "not on sm_89"),
        (_frontend(), (8, 9), 256, torch.bfloat16, "not on sm_89"),
        (_frontend(), (12, 0), 256, torch.bfloat16, "not on sm_120"),
        (_frontend(), (10, 0), 512, torch.bfloat16, "head dims up to 256 in multiples of 16 (this is 512)"),
        (_frontend(), (10, 0), 72, torch.bfloat16, "(this is 72)"),
        (_frontend(), (10, 0), 256, torch.float32, "bf16 / fp16 q, k, v (these are float32)"),
    ],
)
def test_available_says_why_not(monkeypatch, blackwell, frontend, cc, head_dim, dtype, why):
    monkeypatch.setitem(sys.modules, "cudnn", frontend)  # None: the import raises ImportError
    monkeypatch.setattr(A, "capability", lambda device=None: cc)
    ok, reason = A.available(CUDA, head_dim, dtype)
    assert not ok and why in reason
    assert AC.CudnnFp8().unavailable(CUDA, AC.Shape(4608, 18, head_dim), dtype) == reason


def test_available_on_the_cpu_says_it_needs_a_gpu():
    assert A.available(CPU) == (False, "cuDNN's FP8 attention needs a CUDA GPU (the model is on the CPU)")


def test_a_graph_is_never_built_during_a_capture(monkeypatch):
    monkeypatch.setattr(A.capture_guard, "capturing", lambda device: True)
    built = []
    monkeypatch.setattr(A, "_build", lambda *args: built.append(args))
    A.clear()
    t8 = torch.zeros(1, 2, 8, 16, dtype=torch.float8_e4m3fn)
    with pytest.raises(A.capture_guard.FirstUseInCapture, match="building cuDNN's FP8 attention graph"):
        A._graph_for(t8, t8, t8, torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16), 0.25)
    assert built == []
