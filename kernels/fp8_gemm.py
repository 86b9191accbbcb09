"""The ``triton-fp8`` path: a linear with a float8 e4m3 weight on the GPU's fp8 tensor cores.

For the layers a checkpoint keeps out of INT8 (Ideogram 4's 17 protected FFN w2, whose SwiGLU inputs carry outlier
channels that per-token int8 rows lose more of than e4m3 rows; docs/design/measurements.md):

    q[m, k]   = e4m3(x[m, k] * (448 / amax[m])),  s[m] = amax[m] / 448          (the pack's quantizer, fp8 codes)
    out[m, n] = out_dtype((acc[m, n] * s[m]) * w_scale[n] + bias[n]),  acc = sum_k q[m, k] w[n, k] in float32

``w`` is e4m3 [N, K] with a per-tensor or per-channel scale (ComfyUI's ``float8_e4m3fn`` layers are per-tensor).
The GEMM is the portable W8A8 kernel fed e4m3 codes (gemm_triton_kernels.py, a float32 accumulator; Hopper's fp8
MMA adds its products with fewer mantissa bits inside the chain, an error that grows with K): one 8-bit GEMM
kernel for both code types, with a fixed tile per architecture family (``configs.FP8_TILES``). Where the path cannot
run (no fp8 tensor cores, no Triton, a CPU, a failed kernel, a forced dequant-bf16) the unquantized input multiplies
the e4m3 codes in its own dtype (exact: e4m3 values are bf16 values) and the scale is applied to the product: path
``bf16``, with the reason. Twin: ``reference.fp8_matmul_ref``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import self_check, settings
from .backends import DEMOTIONS, unavailable
from .configs import FP8_TILES, fp8_tile, m_bucket
from .env import arch_name, capability, triton_line, version_tuple
from .operands import _FLOAT_DTYPES, KernelInputError, _vector
from .path_choice import ENV_PATH
from .registry import PATH_BF16, PATH_DEQUANT, PATH_FP8, REGISTRY

FP8_CODES = torch.float8_e4m3fn
# The oldest Triton line whose PTX for a family holds e4m3 MMA (the offline compile checks it on every line):
# Triton 3.4 widens e4m3 to f16 for sm_120's mma.sync, so the layers run float there.
FP8_MIN_TRITON = {"sm120": (3, 5)}
TILE_SOURCE = "fixed fp8 tile (kernels/configs.py)"
KERNEL_NAME = "Triton FP8 GEMM"
FP8_FAMILIES = "sm_89, sm_90, sm_100, sm_120 (Ada, Hopper, Blackwell)"


def fp8_tile_problem(arch: str, line: str) -> str | None:
    """Why the fused FP8 GEMM does not run on family ``arch`` with Triton ``line`` ("3.6"), else None. Pure: the
    offline compile asks it for every family and line."""
    if arch not in FP8_TILES:
        return f"the fused FP8 GEMM runs on {FP8_FAMILIES} fp8 tensor cores"
    oldest = FP8_MIN_TRITON.get(arch)
    if oldest is not None and version_tuple(line) < oldest:
        return (
            f"Triton {line} has no e4m3 tensor-core MMA for {arch} (it widens the codes to f16); "
            f"Triton {oldest[0]}.{oldest[1]} or newer has"
        )
    return None


def fp8_unavailable(device: torch.device) -> str | None:
    """None when the ``triton-fp8`` path can run on ``device``, else why not (the panel's words)."""
    why = unavailable("triton", device)
    if device.type != "cuda":  # None: the CPU interpreter (tests)
        if why:
            return f"{device.type.upper()} tensors: the fused FP8 GEMM needs a GPU with fp8 tensor cores"
        return self_check.verdict("fp8", device)
    if why:
        return why
    cc = capability(device)
    if cc is None:
        return "no CUDA capability reported"
    why = fp8_tile_problem(arch_name(cc), triton_line())
    if why:
        return f"GPU is sm_{cc[0]}{cc[1]}: {why}"
    return self_check.verdict("fp8", device)


FLOAT_REASON = "fp8 weight dequantized"


def select_fp8_path(device: torch.device, float_only: str | None = None) -> tuple[str, str]:
    """(path, reason) of an fp8 layer on ``device``: ``triton-fp8``, or ``bf16`` and why (``float_only``: a reason
    to run float regardless, a forced path; ``IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16`` forces it too). The one answer
    the calls, the loader's prediction and ``info`` give."""
    if float_only is None and settings.gemm_path() == PATH_DEQUANT:
        float_only = f"forced by {ENV_PATH}={PATH_DEQUANT}"
    why = float_only or fp8_unavailable(device)
    return (PATH_FP8, "") if why is None else (PATH_BF16, f"{FLOAT_REASON}: {why}")


def _tile(device: torch.device):
    return fp8_tile(arch_name(capability(device)) if device.type == "cuda" else "cpu")


def fp8_matmul(q, w, q_scale, w_scale, bias=None, out_dtype=torch.bfloat16, out=None) -> torch.Tensor:
    """The fused kernel on e4m3 operands q [M, K], w [N, K] with scales q_scale [M], w_scale [N] (float32):
    out = out_dtype((acc * q_scale[m]) * w_scale[n] + bias[n]). Raises where it cannot run (``fp8_unavailable``)."""
    from .gemm_triton import launch_gemm

    why = fp8_unavailable(q.device)
    if why:
        raise KernelInputError(f"fp8_matmul: the fused FP8 GEMM cannot run here: {why}")
    if q.dtype != FP8_CODES or w.dtype != FP8_CODES or q.dim() != 2 or w.dim() != 2 or q.shape[1] != w.shape[1]:
        raise KernelInputError(
            f"fp8_matmul: q [M, K] and w [N, K] must be float8_e4m3fn with one K; got {q.dtype} {tuple(q.shape)}, "
            f"{w.dtype} {tuple(w.shape)}"
        )
    m, n = q.shape[0], w.shape[0]
    if isinstance(w_scale, torch.Tensor) and w_scale.numel() == 1 and n != 1:  # one scale for the tensor
        w_scale = w_scale.reshape(1).expand(n)
    q_scale = _vector(q_scale, m, "fp8_matmul: q_scale", q.device)
    w_scale = _vector(w_scale, n, "fp8_matmul: w_scale", q.device)
    bias = _vector(bias, n, "fp8_matmul: bias", q.device, keep_half=True)
    if q_scale is None or w_scale is None:
        raise KernelInputError("fp8_matmul: q_scale and w_scale are required")
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=q.device)
    elif out.shape != (m, n) or out.dtype not in _FLOAT_DTYPES or out.device != q.device or out.stride(-1) != 1:
        raise KernelInputError(
            f"fp8_matmul: out must be a float [M, N] = [{m}, {n}] tensor on {q.device} with unit column stride; "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    if m == 0:
        return out
    return launch_gemm(q.contiguous(), w.contiguous(), _tile(q.device), q_scale, w_scale, bias, out)


def fp8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    site: str | None = None,
    float_only: str | None = None,
) -> torch.Tensor:
    """y = x . dequant(w)^T + bias for x [..., K] float and an e4m3 weight w [N, K] (``w_scale``: [] / [1] / [N]).

    The ``triton-fp8`` path where it runs, else the dequantized weight in x's dtype (path ``bf16``, the reason
    recorded). ``float_only``: a reason to take the float path regardless (a forced path). Output in x's dtype."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT_DTYPES:
        raise KernelInputError(f"fp8_linear: x must be float32/float16/bfloat16; got {getattr(x, 'dtype', x)}")
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != FP8_CODES:
        raise KernelInputError(f"fp8_linear: w must be a float8_e4m3fn [N, K] matrix; got {getattr(w, 'dtype', w)}")
    n, k = w.shape
    if x.dim() < 1 or x.shape[-1] != k:
        raise KernelInputError(f"fp8_linear: x is {tuple(x.shape)} but w is [N={n}, K={k}]; x's last dim must be K")
    if x.device != w.device:
        raise KernelInputError(f"fp8_linear: x on {x.device}, w on {w.device}; move the weight to the input's device")
    scale = w_scale.to(device=x.device, dtype=torch.float32).reshape(-1)
    if scale.numel() not in (1, n):
        raise KernelInputError(f"fp8_linear: w_scale has {scale.numel()} values; expected 1 or N={n}")
    bias = _vector(bias, n, "fp8_linear: bias", x.device, keep_half=True)  # checked before either path runs
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    path, reason = select_fp8_path(x.device, float_only)
    if path == PATH_FP8:
        y = _fused(x2, w, scale, bias, n, k, m)
        if y is not None:
            REGISTRY.record(
                site, PATH_FP8, "", m, n, k, dtype=x.dtype, config=_tile(x.device).key(), config_source=TILE_SOURCE
            )
            return y.reshape(*lead, n)
        reason = f"{FLOAT_REASON}: {_demotion(n, k, m)}"
    with REGISTRY.timed(PATH_BF16, x.device):
        y = _float_product(x2, w, scale, bias)
    REGISTRY.record(site, PATH_BF16, reason, m, n, k, dtype=x.dtype)
    return y.reshape(*lead, n)


def _float_product(x2, w, scale, bias) -> torch.Tensor:
    """x2 . (w * scale)^T + bias in x2's dtype, without a dequantized float32 copy of the weight: the codes in x2's
    dtype (exact), the scale applied to the float32 product (one rounding more than the dequantized weight's)."""
    y = F.linear(x2, w.to(x2.dtype)).float() * (scale.reshape(()) if scale.numel() == 1 else scale)
    if bias is not None:
        y = y + bias.float()
    return y.to(x2.dtype)


def _shape(n: int, k: int, m: int) -> tuple:
    return ("fp8_gemm", n, k, m_bucket(m))


def _demotion(n: int, k: int, m: int) -> str:
    return DEMOTIONS.get("triton", _shape(n, k, m)) or "the fused FP8 GEMM failed"


def _fused(x2, w, w_scale, bias, n, k, m) -> torch.Tensor | None:
    """Quantize x2 to e4m3 rows and run the kernel (which takes the scale and bias as given); None where the GEMM
    failed for this shape (demoted with its reason). The quantizer has its own demotion (to its twin), as on the INT8
    path."""
    from .dispatch import _quantize_rows, _unless_demoted

    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    with REGISTRY.timed(PATH_FP8, x2.device):
        q, s = _quantize_rows(x2, None, None, codes=FP8_CODES)
        return _unless_demoted(
            _shape(n, k, m), KERNEL_NAME, lambda: fp8_matmul(q, w, s, w_scale, bias, out_dtype=x2.dtype), x2.device
        )
