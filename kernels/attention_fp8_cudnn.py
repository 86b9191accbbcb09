"""cuDNN's FP8 attention through nvidia-cudnn-frontend (an optional dependency), and its pure-torch twin.

``attention(q, k, v, scale)`` takes bf16 / fp16 q, k, v in [B, H, L, D] (any strides: the blocks' q, k, v are views
of [B, L, H, D] tensors) and returns O in q's dtype and q's layout, as PyTorch SDPA does:

* q, k and v are quantized to float8 e4m3 one scale per tensor: amax on the device, scale 448 / amax, and the
  descale (amax / 448) handed to cuDNN as a device tensor, so nothing waits on the host and a CUDA graph can replay
  the call. A per-tensor scale is what cuDNN's FP8 attention takes; e4m3 being a float format, heads of smaller
  magnitude keep their relative precision down to its subnormals, 2^-15 of the largest value.
* softmax's P is quantized by cuDNN with scale_s = 448 (P <= 1 fills e4m3's range; the frontend's documented choice
  without dropout) and descale_s = 1 / 448.
* O is written in bf16 / fp16, with scale_o = 1. An e4m3 O would round every output element to 3 mantissa bits, a
  relative error of about 2-3% on its own, already over the attention choice's error bound; a half-precision O costs
  only its own write. cuDNN builds that graph on datacenter Blackwell from cuDNN 9.13 only: on Hopper it declines a
  half-precision O (measured on an H200, docs/performance.md, Attention), so there this path says it cannot run.

The graph is built once per (device, shapes, strides, dtypes, attention scale) and kept (``_GRAPHS``); one cuDNN
handle per device, set to the caller's current stream at every call; the workspace comes from torch's allocator at
every call (the caching allocator makes that cheap, and it stays valid inside a CUDA graph capture). A graph is
never built during a capture (building synchronizes): the call refuses (``capture_guard``), and the pass runs
eagerly first.

``attention_reference`` is the twin: the same e4m3 quantize-dequantize of q, k and v, then float32 attention (P and
O unquantized: the twin isolates the input quantization; cuDNN's P quantization is the difference between the two).

The frontend is imported inside the functions that need it, never at import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import threading

import torch
import torch.nn.functional as F

from . import capture_guard
from .env import capability

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite float8 e4m3fn
# Families whose cuDNN runs FP8 attention with a half-precision O: datacenter Blackwell (consumer Blackwell, sm_120,
# has FP8 attention only in the frontend's optional CuTe-DSL kernels, which this pack does not use). Hopper's cuDNN
# runs FP8 attention with an FP8 O only (module docstring).
CAPABILITIES = {(10, 0): "Blackwell (B200)", (10, 3): "Blackwell (B300)"}
FP8_O_ONLY = {(9, 0): "Hopper"}
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 16  # cuDNN's FP8 attention takes head dims in multiples of 16
MIN_CUDNN = 91300  # FP8 attention with a half-precision O; what a given 9.x builds is asked of cuDNN at the build
DTYPES = (torch.bfloat16, torch.float16)
DIST = "nvidia-cudnn-frontend"

_GRAPHS: dict[tuple, _Graph] = {}
_HANDLES: dict[int, object] = {}
_CONSTANTS: dict[int, dict[str, torch.Tensor]] = {}  # per device: descale_s, scale_s, scale_o as [1, 1, 1, 1] tensors
_LOCK = threading.Lock()


def frontend_version() -> str | None:
    """The installed nvidia-cudnn-frontend's version, or None (not installed)."""
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


def _frontend():
    return importlib.import_module("cudnn")


def backend_version() -> int | None:
    """The version of the cuDNN library the frontend loaded (e.g. 91500), or None (no frontend, or no cuDNN found)."""
    try:
        return int(_frontend().backend_version())
    except Exception:  # noqa: BLE001 - not installed, or it found no libcudnn: no version to key on
        return None


def available(device: torch.device, head_dim: int | None = None, dtype: torch.dtype | None = None) -> tuple[bool, str]:
    """(True, "") where cuDNN's FP8 attention can run on ``device`` for ``head_dim`` and ``dtype``, else (False, why).
    Never raises; imports the frontend (never at import)."""
    if device.type != "cuda":
        return False, f"cuDNN's FP8 attention needs a CUDA GPU (the model is on the {device.type.upper()})"
    if dtype is not None and dtype not in DTYPES:
        return False, f"cuDNN's FP8 attention here takes bf16 / fp16 q, k, v (these are {str(dtype)[6:]})"
    if head_dim is not None and (head_dim > MAX_HEAD_DIM or head_dim % HEAD_DIM_MULTIPLE):
        return False, (
            f"cuDNN's FP8 attention takes head dims up to {MAX_HEAD_DIM} in multiples of {HEAD_DIM_MULTIPLE} "
            f"(this is {head_dim})"
        )
    cc = capability(device)
    if cc in FP8_O_ONLY:
        return False, (
            f"on {FP8_O_ONLY[cc]} cuDNN's FP8 attention writes an FP8 output only, whose rounding alone is over the "
            "error bound 8-bit attention is held to (a bf16 / fp16 output needs datacenter Blackwell)"
        )
    if cc not in CAPABILITIES:
        families = ", ".join(f"sm_{a}{b} ({n})" for (a, b), n in CAPABILITIES.items())
        where = f"sm_{cc[0]}{cc[1]}" if cc else "this GPU"
        return False, f"cuDNN runs FP8 attention on {families}; not on {where}"
    torch.backends.cudnn.version()  # torch loads its libcudnn first: the frontend then finds the same library
    try:
        cudnn = _frontend()
    except ImportError:
        return False, f"{DIST} is not installed (pip install {DIST})"
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason, never a failed pass
        return False, f"{DIST} did not import ({type(exc).__name__}: {exc})"
    version = frontend_version() or "(unknown version)"
    if not hasattr(getattr(cudnn, "pygraph", None), "sdpa_fp8"):
        return False, f"{DIST} {version} has no FP8 attention in its graph API (a newer release has it)"
    found = backend_version()
    if found is None:
        return False, f"{DIST} {version} found no cuDNN library to run on"
    if found < MIN_CUDNN:
        return False, (
            f"cuDNN {found} is older than FP8 attention with a bf16 / fp16 output "
            f"(cuDNN {MIN_CUDNN // 10000}.{MIN_CUDNN // 100 % 100} or newer)"
        )
    return True, ""


# -- quantizing -----------------------------------------------------------------------------------------------------


def quantize_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8 float8 e4m3 in x's layout, descale float32 [1, 1, 1, 1] on x's device): x ~ x8 * descale, one scale for the
    whole tensor, its largest magnitude mapped to 448. Device-side only (no host sync)."""
    # the floor keeps 448 / amax finite (an all-zero tensor quantizes to zeros, not NaNs)
    amax = torch.linalg.vector_norm(x, ord=math.inf).float().clamp_min(1e-30)
    # x * (448 / amax) is computed in x's dtype: the largest element lands within one bf16 step of 448, and e4m3
    # rounds everything below 464 to at most 448, so nothing overflows
    x8 = (x * (E4M3_MAX / amax)).to(E4M3)
    return x8, (amax / E4M3_MAX).reshape(1, 1, 1, 1)


def dequantize_e4m3(x8: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    return x8.float() * descale.reshape(()).float()


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """The twin: q, k, v quantized to e4m3 per tensor and back, then float32 attention (float32 [B, H, L, D])."""
    qf, kf, vf = (dequantize_e4m3(*quantize_e4m3(t)) for t in (q, k, v))
    return F.scaled_dot_product_attention(qf, kf, vf, scale=scale)


# -- the cuDNN graph ------------------------------------------------------------------------------------------------


class _Graph:
    """One built FP8 attention graph, its tensors by role, and its workspace size."""

    def __init__(self, graph, tensors: dict, workspace: int):
        self.graph, self.tensors, self.workspace = graph, tensors, workspace


SCALARS = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")


def _handle(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _LOCK:
        if index not in _HANDLES:
            with torch.cuda.device(index):
                _HANDLES[index] = _frontend().create_handle()
        return _HANDLES[index]


def _constants(device: torch.device) -> dict[str, torch.Tensor]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _LOCK:
        if index not in _CONSTANTS:
            one = torch.ones(1, 1, 1, 1, device=device, dtype=torch.float32)
            _CONSTANTS[index] = {"descale_s": one / E4M3_MAX, "scale_s": one * E4M3_MAX, "scale_o": one}
        return _CONSTANTS[index]


def _cudnn_type(cudnn, dtype: torch.dtype):
    return {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF}[dtype]


def _build(q8, k8, v8, out, scale: float, handle) -> _Graph:
    cudnn = _frontend()
    graph = cudnn.pygraph(
        io_data_type=_cudnn_type(cudnn, out.dtype),
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )

    def fp8(name, t):
        return graph.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=cudnn.data_type.FP8_E4M3)

    def scalar(name):
        return graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT)

    tensors = {"q": fp8("q", q8), "k": fp8("k", k8), "v": fp8("v", v8), **{n: scalar(n) for n in SCALARS}}
    o, _, amax_s, amax_o = graph.sdpa_fp8(
        q=tensors["q"],
        k=tensors["k"],
        v=tensors["v"],
        **{n: tensors[n] for n in SCALARS},
        generate_stats=False,
        attn_scale=scale,
        name="attention",
    )
    o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride())).set_data_type(
        _cudnn_type(cudnn, out.dtype)
    )
    for t in (amax_s, amax_o):  # outputs nobody reads: declared, as every cuDNN release accepts them
        t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
    graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    tensors.update(o=o, amax_s=amax_s, amax_o=amax_o)
    return _Graph(graph, tensors, int(graph.get_workspace_size()))


def _graph_for(q8, k8, v8, out, scale: float) -> _Graph:
    key = (
        out.device.index,
        *((tuple(t.shape), tuple(t.stride())) for t in (q8, k8, v8, out)),
        out.dtype,
        scale,
    )
    found = _GRAPHS.get(key)
    if found is not None:
        return found
    capture_guard.refuse_first_use(out.device, "building cuDNN's FP8 attention graph for this shape")
    built = _build(q8, k8, v8, out, scale, _handle(out.device))
    with _LOCK:
        return _GRAPHS.setdefault(key, built)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v through cuDNN's FP8 attention (module docstring): [B, H, L, D] bf16 / fp16 CUDA
    q, k, v of one shape; O in q's dtype and layout. ``scale`` defaults to 1 / sqrt(D)."""
    if not (q.shape == k.shape == v.shape and q.dim() == 4):
        raise ValueError(
            f"q, k, v must be [B, H, L, D] of one shape (got {list(q.shape)}, {list(k.shape)}, {list(v.shape)})"
        )
    if not (q.is_cuda and q.dtype in DTYPES and q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must be bf16 or fp16 CUDA tensors of one dtype (got {q.dtype} on {q.device})")
    out = torch.empty_like(q)  # q's strides: the layout SDPA's output has
    return attention_quantized(quantize_e4m3(q), quantize_e4m3(k), quantize_e4m3(v), out, scale)


def attention_quantized(q, k, v, out: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """The cuDNN call alone: q, k, v as ``quantize_e4m3`` pairs (e4m3 tensor, descale), O written into ``out``
    (bf16 / fp16, [B, H, L, D]) and returned. ``attention`` is this after quantizing; a caller whose q, k, v
    arrive quantized (a fused producer, or the probe timing the kernel alone) calls it directly."""
    (q8, dq), (k8, dk), (v8, dv) = q, k, v
    scale = 1.0 / math.sqrt(q8.shape[-1]) if scale is None else float(scale)
    built = _graph_for(q8, k8, v8, out, scale)
    amax = torch.empty(2, 1, 1, 1, device=out.device, dtype=torch.float32)
    data = {
        "q": q8, "k": k8, "v": v8, "descale_q": dq, "descale_k": dk, "descale_v": dv, **_constants(out.device),
        "o": out, "amax_s": amax[0:1], "amax_o": amax[1:2],
    }  # fmt: skip
    workspace = torch.empty(max(built.workspace, 1), device=out.device, dtype=torch.uint8)
    handle = _handle(out.device)
    _frontend().set_stream(handle, torch.cuda.current_stream(out.device).cuda_stream)
    built.graph.execute({built.tensors[name]: t for name, t in data.items()}, workspace, handle=handle)
    return out


def clear() -> None:
    """Forget the built graphs (tests)."""
    with _LOCK:
        _GRAPHS.clear()


__all__ = [
    "CAPABILITIES",
    "E4M3_MAX",
    "MAX_HEAD_DIM",
    "attention",
    "attention_quantized",
    "attention_reference",
    "available",
    "backend_version",
    "clear",
    "dequantize_e4m3",
    "frontend_version",
    "quantize_e4m3",
]
