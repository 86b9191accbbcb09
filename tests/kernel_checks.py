"""Shared helpers for kernel tests (CPU interpreter and GPU)."""

from __future__ import annotations

import torch
from comfyui_ideogram4_int8 import kernels as K

# Ideogram 4 linear shapes (N, K) and token counts (M).
IDEOGRAM_SHAPES = {
    "qkv": (13824, 4608),
    "o": (4608, 4608),
    "w1": (12288, 4608),
    "w2": (4608, 12288),
    "adaln_modulation": (18432, 512),
    "llm_cond_proj": (4608, 53248),
    "input_proj": (4608, 128),
}
M_COND, M_UNCOND, M_TEXT = 4608, 4096, 512


def e4m3_step(v: torch.Tensor) -> torch.Tensor:
    """The spacing of float8 e4m3 values at ``v`` (in code units): 3 mantissa bits, so 2^-3 of its binade above
    2^-6 and the subnormal step 2^-9 below."""
    return torch.where(v.abs() >= 2.0**-6, torch.exp2(torch.floor(torch.log2(v.abs().clamp_min(2.0**-6)))) / 8, 2.0**-9)


def activations(m, k, gen, dtype=torch.float32, device="cpu", outliers=True):
    """Random activations with a few outlier channels (as DiT activations have)."""
    x = torch.randn(m, k, generator=gen) * 0.5
    if outliers and k >= 8:
        idx = torch.randperm(k, generator=gen)[: max(1, k // 64)]
        x[:, idx] *= 40.0
    return x.to(device=device, dtype=dtype)


def int8(shape, gen, device="cpu"):
    return torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8).to(device)


def weight(n, k, gen, device="cpu", outliers=True):
    """A quantized weight with per-channel scales; some channels carry much larger scales."""
    w = int8((n, k), gen, device)
    scale = torch.rand(n, generator=gen) * 0.02 + 1e-3
    if outliers:
        scale[torch.randperm(n, generator=gen)[: max(1, n // 50)]] *= 30.0
    return w, scale.to(device)


def reference_f64(q, s, w, w_scale, bias=None):
    """float64 result of the same quantized operands."""
    y = (q.double() @ w.double().t()) * s.double()[:, None] * w_scale.double()[None, :]
    if bias is not None:
        y = y + bias.double()[None, :]
    return y


def rel_err(y, ref):
    y, ref = y.double(), ref.double()
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def cosine(y, ref):
    y, ref = y.double().flatten(), ref.double().flatten()
    return (y @ ref / (y.norm() * ref.norm()).clamp_min(1e-30)).item()


def launches(name):
    return K.REGISTRY.launches[name]


def check_quantize_edge_rows(k, gen, device="cpu", dtype=torch.float32):
    """Rows at the edges of float32 among healthy ones, quantized on ``device`` and by the twin:
    zero; NaN (one, and every 7th value); +Inf; -Inf; an absmax so small that 127 / amax overflows
    (zeros, tiny finite scale); values near float32 max (|x * inv| must still round inside +-127);
    +-2 x the row's absmax (exactly +-127); a linspace. Healthy rows drawn in ``dtype``, quantized
    in float32. Identical output and scales, rejected rows all zero."""
    from comfyui_ideogram4_int8 import kernels as K

    x = activations(12, k, gen, dtype, device).float()
    x[1] = 0.0
    x[3, 17] = float("nan")
    x[4, 5] = float("inf")
    x[5, k - 1] = float("-inf")
    x[6] = 0.0
    x[6, 3], x[6, 9] = 1e-38, -2e-39  # 127 / 1e-38 overflows
    x[7] *= 3e38 / x[7].abs().max()
    x[8, 0], x[8, 1] = x[8].abs().max() * 2, -x[8].abs().max() * 2
    x[9, ::7] = float("nan")
    x[10] = torch.linspace(-1, 1, k, device=device)
    q, s = K.quantize_per_token(x)
    qr, sr = K.quantize_per_token_ref(x)
    assert torch.equal(q, qr)
    assert torch.equal(s.isnan(), sr.isnan()) and torch.equal(s[~s.isnan()], sr[~sr.isnan()])
    for r in (1, 3, 4, 5, 6, 9):
        assert (q[r] == 0).all(), r
    assert s[6] > 0 and s[3].isnan() and s[4].isnan() and s[5].isnan() and s[9].isnan()
    assert q[8, 0] == 127 and q[8, 1] == -127 and q.abs().max() <= 127


def check_rotated_quantizer(m, k, group, gen, device="cpu", dtype=torch.bfloat16):
    """The rotating quantizer (ConvRot inside the quantizer) against its twin and a float64 rotation: the fused
    kernel ran, scales agree to float32 rounding, int8 values differ by at most one and rarely (the kernel sums
    the same exact products in another order), zero / NaN rows keep the contract, other rows untouched."""
    x = activations(m, k, gen, dtype=dtype, device=device)
    if m > 2:
        x[1] = 0.0
        x[2, k // 3] = float("nan")
    before = launches("quant_rotated_triton")
    q, s = K.quantize_per_token(x, convrot_group=group)
    assert launches("quant_rotated_triton") == before + 1, "the rotating Triton quantizer did not run"
    qr, sr = K.quantize_per_token_ref(K.reference.rotate_ref(x.float(), group).to(device))
    finite = torch.isfinite(sr)
    assert torch.equal(finite, torch.isfinite(s)), f"seed {gen.initial_seed()}"
    assert torch.allclose(s[finite], sr[finite], rtol=2e-6, atol=0), f"seed {gen.initial_seed()}"
    diff = (q.int() - qr.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 2e-3, f"seed {gen.initial_seed()}: {diff.max()}"
    if m > 2:
        assert s[1] == 0 and not q[1].any() and s[2].isnan() and not q[2].any()
    # dequantized against the float64 rotation of the same input
    rot = K.reference.rotate_ref(x.double(), group)
    ok = (finite & (sr > 0)).to(device)  # zero rows: scale 0, nothing to compare
    deq = q.double() * s.double()[:, None]
    err = (deq[ok] - rot[ok]).abs().amax(dim=1) / s.double()[ok]
    assert (err <= 0.5 + 1e-3).all(), f"seed {gen.initial_seed()}: {err.max()}"
    return q, s


def fp8_weight(n, k, gen, device="cpu", outliers=True):
    """An e4m3 weight with one scale (ComfyUI's float8_e4m3fn form): codes of a random float matrix whose channels
    span ~30x in magnitude, as checkpoints' do."""
    w = torch.randn(n, k, generator=gen) * 0.02
    if outliers:
        w[torch.randperm(n, generator=gen)[: max(1, n // 50)]] *= 30.0
    scale = w.abs().amax() / 448.0
    return (w / scale).to(torch.float8_e4m3fn).to(device), scale.to(device)


def check_fp8_linear(m, n, k, gen, device="cpu", dtype=torch.float32, tol=1e-5):
    """``kernels.fp8_linear`` on the fused path: recorded as triton-fp8, its output the float64 product of the same
    e4m3 operands (the twin quantizer's codes, bit for bit the kernel's) within ``tol``, every element written,
    and within fp8's own error of the unquantized product. Returns the relative errors."""
    x = activations(m, k, gen, dtype=dtype, device=device)
    w, s = fp8_weight(n, k, gen, device)
    bias = (torch.randn(n, generator=gen) * 0.1).to(device=device, dtype=dtype)
    site = f"test/fp8_{m}x{n}x{k}"
    before = launches("quant_fp8_triton")
    y = K.fp8_linear(x.reshape(1, m, k), w, s, bias, site=site).reshape(m, n)
    assert K.REGISTRY.path_of(site) == K.PATH_FP8, K.REGISTRY.note_of(site) if hasattr(K.REGISTRY, "note_of") else ""
    assert launches("quant_fp8_triton") == before + 1, "the Triton quantizer did not run"
    assert y.dtype == dtype and torch.isfinite(y).all()
    q, qs = K.quantize_per_token_ref(x, codes=torch.float8_e4m3fn)
    same = reference_f64(q, qs, w, s.reshape(1).expand(n), bias)
    exact = x.double() @ (w.double() * s.double()).t() + bias.double()
    err_same, err_exact = rel_err(y, same), rel_err(y, exact)
    assert err_same < tol, f"seed {gen.initial_seed()}: {err_same}"
    # against the unquantized product, element by element: the weight is e4m3 already, so only the activations were
    # rounded, each by at most half an e4m3 ulp (2^-4 of itself) or, below e4m3's normals, half its subnormal step
    # (2^-10 of the row's scale absmax / 448). A norm-wise bound flaked: a one-row draw where cancellation shrank the
    # output measured 13.8% against 12.5%.
    xd, wd = x.double(), w.double() * s.double()
    step = torch.maximum(xd.abs() * 2.0**-4, xd.abs().amax(dim=1, keepdim=True) / 448.0 * 2.0**-10)
    rounded = (q.double() * qs.double()[:, None] - xd).abs()  # the operands the kernel multiplied (err_same above)
    assert (rounded <= step * (1 + 1e-6)).all(), f"seed {gen.initial_seed()}: an activation off by more than its step"
    bound = step @ wd.abs().t() + (torch.finfo(dtype).eps + 1e-6) * exact.abs() + 1e-30
    over = (y.double() - exact).abs() - bound
    assert (over <= 0).all(), f"seed {gen.initial_seed()}: worst excess over e4m3's bound {over.max().item():.3g}"
    return err_same, err_exact


def broken_launch_gemm(fault: str):
    """``gemm_triton.launch_gemm`` computing wrong results, for the self-check's tests: "epilogue scale" (the
    channel scales perturbed by 1/16), "tile edge" (the last row never written), "SwiGLU pair" (the up scales
    perturbed), "accumulator off by one" (the last output's int32 accumulator one too high: within bf16's rounding
    of a dequantized output of real size)."""
    from comfyui_ideogram4_int8.kernels import gemm_triton

    real = gemm_triton.launch_gemm

    def launch_gemm(q, w, cfg, q_scale=None, w_scale=None, bias=None, out=None, raw_int32=False, *, up=None):
        if fault == "epilogue scale" and w_scale is not None:
            w_scale = w_scale * 1.0625
        if fault == "tile edge":
            real(q[:-1], w, cfg, None if q_scale is None else q_scale[:-1], w_scale, bias, out[:-1], raw_int32, up=up)
            return out
        if fault == "SwiGLU pair" and up is not None:
            up = (up[0], up[1] * 1.0625)
        if fault == "accumulator off by one" and up is None and not raw_int32:
            real(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, up=up)
            out[-1, -1] += (q_scale[-1].float() * w_scale[-1].float()).to(out.dtype)
            return out
        return real(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, up=up)

    return launch_gemm
