"""ConvRot inside the quantizer on the CPU interpreter: the rotating quantizer against its twin, the linear against
float64 of the unrotated weight, the gate/up pair rotating once."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends
from kernel_checks import activations, check_rotated_quantizer, cosine, launches, reference_f64, rel_err, weight

pytestmark = pytest.mark.skipif(
    backends.unavailable("triton", torch.device("cpu")) is not None,
    reason="Triton interpreter not available (needs triton + TRITON_INTERPRET=1)",
)


# -- ConvRot inside the quantizer (int8_convrot files) ----------------------------------------------


@pytest.mark.parametrize("m,k,group", [(1, 512, 256), (37, 4608, 256), (18, 256, 16), (5, 48, 16)])
def test_rotating_quantizer_matches_its_twin(m, k, group, gen):
    check_rotated_quantizer(m, k, group, gen)


@pytest.mark.parametrize("path", ["triton-int8", "cublas-int8", "dequant-bf16"])
def test_convrot_linear_vs_float64_of_the_unrotated_weight(path, gen):
    """A ConvRot weight (W rotated along K) with the activation rotated in the quantizer gives x W^T."""
    m, n, k, group = 23, 48, 512, 256
    x = activations(m, k, gen, dtype=torch.bfloat16)
    w_float = torch.randn(n, k, generator=gen) * 0.05
    wq, ws = K.quantize_weight_ref(K.reference.rotate_ref(w_float, group))
    bias = torch.randn(n, generator=gen)
    y = K.w8a8_linear(x, wq, ws, bias, path=path, site=f"convrot/{path}", convrot_group=group)
    ref = x.double() @ w_float.double().t() + bias.double()
    assert rel_err(y, ref) < 3e-2 and cosine(y, ref) > 0.999, f"{path} seed {gen.initial_seed()}"
    q, s = K.quantize_per_token(x, convrot_group=group)
    exact = reference_f64(q, s, wq, ws, bias)
    if path != "dequant-bf16":  # the same quantized operands: only the epilogue's rounding remains
        assert rel_err(y, exact) < 1e-2, path


def test_other_convrot_groups_rotate_then_quantize_and_bad_ones_are_named(gen):
    x = activations(9, 128, gen)
    before = launches("quant_rotated_triton")
    q, s = K.quantize_per_token(x, convrot_group=64)  # not a fused group size: rotation, then the plain kernel
    assert launches("quant_rotated_triton") == before
    qr, sr = K.quantize_per_token_ref(K.reference.rotate_ref(x, 64))
    assert torch.equal(q, qr) and torch.equal(s, sr)
    with pytest.raises(K.KernelInputError, match="power of 4"):
        K.quantize_per_token(x, convrot_group=32)
    with pytest.raises(K.KernelInputError, match="not a multiple of the ConvRot group size 256"):
        K.quantize_per_token(x, convrot_group=256)


@pytest.mark.parametrize("path", ["triton-int8", "cublas-int8", "dequant-bf16"])
def test_gate_up_pair_rotates_convrot_activations_once_in_its_quantizer(path, gen):
    """The gate/up pair of an int8_convrot file: one rotating quantization for both projections gives what the two
    ConvRot linears give (bit for bit on the unfused paths; the fused epilogue's float32 op order otherwise)."""
    m, f, k, group = 19, 64, 512, 256
    x = activations(m, k, gen, dtype=torch.bfloat16)
    (w1, s1), (w3, s3) = weight(f, k, gen), weight(f, k, gen)
    before = launches("quant_rotated_triton")
    h = K.swiglu_w8a8_pair(x, w1, s1, w3, s3, path=path, site=f"pairrot/{path}", convrot_group=group)
    if path == "triton-int8":
        assert launches("quant_rotated_triton") == before + 1  # one rotating quantization for both
    g = K.w8a8_linear(x, w1, s1, path=path, out_dtype=torch.float32, convrot_group=group)
    u = K.w8a8_linear(x, w3, s3, path=path, out_dtype=torch.float32, convrot_group=group)
    want = (torch.nn.functional.silu(g) * u).to(torch.bfloat16)
    if path == "triton-int8":
        assert rel_err(h, want) < 1e-2, f"seed {gen.initial_seed()}"
    else:
        assert torch.equal(h, want), f"seed {gen.initial_seed()}"
