"""Pure-torch twins of the Triton kernels.

They define the numerics contract the kernels must meet and serve as the CPU fallback and
the test oracle:

    q[m,k]  = clamp(rint(x[m,k] / smooth[k] * (127 / amax[m])), -127, 127)     (half-to-even)
    s[m]    = amax[m] / 127,   amax[m] = max_k |x[m,k] / smooth[k]|
    y[m,n]  = out_dtype((float(acc[m,n]) * s[m]) * w_scale[n] + bias[n]),  acc = sum_k q[m,k] w[n,k]

The quantizer can also give float8 e4m3 codes: q = e4m3(x / smooth * (448 / amax)), half to even, s = amax / 448.

Edge rows: an all-zero row gives s = 0 and q = 0, so y is exactly the bias (never NaN);
a row holding NaN/Inf gives q = 0 and s = NaN, so its output row is NaN and no other row
is touched.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

QMAX = 127.0
# |q|, |w| <= 127 -> |acc| <= K * 127**2 must stay below 2**31.
INT32_SAFE_MAX_K = (2**31 - 1) // (127 * 127)  # 133_144


FP8_MAX = 448.0  # e4m3's largest finite value


def quantize_per_token_ref(x: torch.Tensor, smooth: torch.Tensor | None = None, codes=torch.int8):
    """[M, K] float -> (codes [M, K], float32 [M]); see the module docstring for the contract. ``codes``
    torch.float8_e4m3fn: scale = absmax / 448 and the products rounded to e4m3, half to even."""
    fp8 = codes == torch.float8_e4m3fn
    xf = x.float()
    if smooth is not None:
        xf = xf / smooth.float()
    amax = xf.abs().amax(dim=1)
    finite = torch.isfinite(amax)
    # 127 / amax is computed once per row (IEEE division), the elements are then multiplied:
    # the Triton kernel does exactly the same two roundings. Tensor / tensor on purpose: torch
    # computes `scalar / tensor` as scalar * reciprocal(tensor), a second rounding.
    qmax = torch.full_like(amax, FP8_MAX if fp8 else QMAX)
    inv = qmax / torch.where(amax > 0, amax, torch.ones_like(amax))
    # a row whose qmax / amax overflows (amax < ~1e-36) quantizes to zeros, like an all-zero row
    inv = torch.where(finite & (amax > 0) & torch.isfinite(inv), inv, torch.zeros_like(amax))
    # rows without a scale (zero, non-finite, overflow) give +0 codes (e4m3 has a -0 code)
    v = torch.where(inv[:, None] > 0, xf * inv[:, None], torch.zeros_like(xf))
    # torch's e4m3 cast rounds half to even, and |v| <= 448 (1 + 2^-24)^2 rounds to at most 448
    q = v.to(codes) if fp8 else torch.round(v).clamp_(-QMAX, QMAX).to(torch.int8)
    scale = torch.where(finite, amax / qmax, torch.full_like(amax, float("nan")))
    return q, scale


def dequant_fp8_ref(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An e4m3 weight [N, K] times its scale ([] / [1] / [N] float32) in ``dtype``: the float path of an fp8 layer."""
    s = scale.float().reshape(-1)
    s = s.reshape(()) if s.numel() == 1 else s[:, None]
    return (w.float() * s).to(dtype)


def fp8_matmul_ref(q, w, q_scale, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """Twin of ``fp8_gemm.fp8_matmul``: out = out_dtype((acc * q_scale[m]) * w_scale[n] + bias[n]) with acc the
    float32 product of the e4m3 codes q [M, K], w [N, K] (exact products; the kernel's sums may round differently)."""
    acc = q.float() @ w.float().t()
    y = acc * q_scale.float()[:, None]
    y = y * w_scale.float().reshape(-1)[None, :]
    if bias is not None:
        y = y + bias.float()[None, :]
    return y.to(out_dtype)


# ConvRot (ComfyUI's int8_tensorwise + convrot): activations rotated group by group along K by the
# orthonormal, symmetric H_n = H4^{(x)k} / sqrt(n), n = 4**k, with the "regular" H4 below.
_H4 = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))


def hadamard(group: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """The [group, group] ConvRot rotation (group a power of 4: 16, 64, 256, ...), made once per group, dtype and
    device and shared: never modify it. Every ConvRot call checks its group through here and the unfused paths
    rotate with it: made per call, it was a CPU tensor conversion (on a GPU's fallback paths a host-to-device copy,
    which waits for the device) in every ConvRot linear."""
    return _hadamard(int(group), dtype, None if device is None else torch.device(device))


@functools.lru_cache(maxsize=32)
def _hadamard(group: int, dtype: torch.dtype, device: torch.device | None) -> torch.Tensor:
    return _hadamard64(group).to(dtype=dtype, device=device, copy=True)  # never the builder's own cached tensor


@functools.lru_cache(maxsize=8)
def _hadamard64(group: int) -> torch.Tensor:
    n, k = group, 0
    while n > 1 and n % 4 == 0:
        n, k = n // 4, k + 1
    if n != 1 or k == 0:
        raise ValueError(f"ConvRot group size must be a power of 4 (16, 64, 256, ...); got {group}")
    h = torch.ones(1, 1, dtype=torch.float64)
    for _ in range(k):
        h = torch.kron(h, torch.tensor(_H4, dtype=torch.float64))
    return h / float(group) ** 0.5


def rotate_ref(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., K] -> x_rot[..., g] = x[..., g] @ H per group of ``group`` columns, in float32 (float64 stays
    float64), returned in x's dtype. K must be a multiple of ``group``."""
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"ConvRot: K={k} is not a multiple of the group size {group}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xg = x.to(work).reshape(*x.shape[:-1], k // group, group)
    return (xg @ hadamard(group, work, x.device)).reshape(x.shape).to(x.dtype)


def quantize_rotated_ref(x: torch.Tensor, group: int):
    """Twin of the rotating quantizer: the float32 rotation of x [M, K], then per-token quantization
    (the kernel sums the same exact products in another order: its int8 values may differ by one where a
    product lands on a rounding boundary)."""
    return quantize_per_token_ref(rotate_ref(x.float(), group))


def int8_matmul_int32_ref(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact int32 accumulator of q [M,K] int8 times w [N,K] int8 transposed."""
    # float64 is exact here: every partial sum is an integer below K * 127**2 < 2**31 << 2**53.
    # (int64 matmul does not exist on CUDA and is slow on the CPU.)
    return (q.double() @ w.double().t()).to(torch.int32)


def epilogue_ref(acc, q_scale, w_scale, bias=None, out_dtype=torch.bfloat16):
    """(acc * s_tok) * s_ch + bias in float32, rounded once to out_dtype."""
    y = acc.float() * q_scale.float()[:, None]
    y = y * w_scale.float()[None, :]
    if bias is not None:
        y = y + bias.float()[None, :]
    return y.to(out_dtype)


def int8_matmul_ref(q, w, q_scale, w_scale, bias=None, out_dtype=torch.bfloat16):
    return epilogue_ref(int8_matmul_int32_ref(q, w), q_scale, w_scale, bias, out_dtype)


def dequant_linear_ref(x, w, w_scale, bias=None, smooth=None, compute_dtype=torch.bfloat16):
    """The 'phantom INT8' path: the same quantized operands, dequantized to compute_dtype
    and multiplied by a float matmul. Numerically a fake-quant W8A8."""
    q, s = quantize_per_token_ref(x, smooth)
    return dequant_matmul(q, s, w, w_scale, bias, compute_dtype)


def dequant_matmul(q, s, w, w_scale, bias=None, compute_dtype=torch.bfloat16):
    """The float matmul of dequantized operands: (q * s) . (w * w_scale)^T (+ bias) in compute_dtype."""
    xd = (q.float() * s[:, None]).to(compute_dtype)
    wd = (w.float() * w_scale.float()[:, None]).to(compute_dtype)
    y = torch.nn.functional.linear(xd, wd)
    if bias is not None:
        y = (y.float() + bias.float()).to(compute_dtype)
    return y


def quantize_weight_ref(weight: torch.Tensor, smooth: torch.Tensor | None = None):
    """Per-output-channel symmetric RTN (half-to-even) of a float weight [N, K].

    With ``smooth`` [K] the weight is first multiplied by it (SmoothQuant: activations are
    divided by the same vector). Returns (int8 [N, K], float32 [N]); an all-zero row gets scale 0.
    """
    wf = weight.float()
    if smooth is not None:
        wf = wf * smooth.float()[None, :]
    amax = wf.abs().amax(dim=1)
    qmax = torch.full_like(amax, QMAX)
    inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
    q = torch.round(wf * inv[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), (amax / qmax).float()


def qk_norm_rope_ref(x, weight, cos, sin, eps):
    """Twin of the fused q/k prologue: per-row RMSNorm (float32, times ``weight``) then split-half
    RoPE: out[..., i] = y_i c - y_{i+D/2} s, out[..., i+D/2] = y_{i+D/2} c + y_i s.

    x [B, N, H, D]; cos, sin float32 [N, D/2]. Returns x's dtype, rounded once."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    half = y.shape[-1] // 2
    y1, y2 = y[..., :half], y[..., half:]
    c, s = cos.float()[None, :, None, :], sin.float()[None, :, None, :]
    return torch.cat((y1 * c - y2 * s, y2 * c + y1 * s), dim=-1).to(x.dtype)


def rms_norm_modulate_ref(x, weight, scale, eps):
    """Twin of the block's pre-norm: ``F.rms_norm(x) * scale`` (x [B, N, C], scale [B or 1, 1, C]), the ops an
    Ideogram 4 block runs before its attention and its FFN, with their roundings."""
    return F.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps) * scale


def rms_norm_gated_residual_ref(x, y, weight, gate, eps):
    """Twin of the block's residual: ``x + gate * F.rms_norm(y)`` (x, y [B, N, C], gate [B or 1, 1, C])."""
    return x + gate * F.rms_norm(y, (y.shape[-1],), weight.to(y.dtype), eps)
