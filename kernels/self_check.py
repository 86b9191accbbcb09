"""First-use self-check: before a kernel family's first use on a device of a GPU family this repository has not
measured, the family runs small problems and is compared with its pure-torch twin; a mismatch demotes it there.

A kernel that compiles for an architecture may still compute wrong results on it, and nothing else checks results on
a device the GPU tests never ran on. So ``backends.unavailable`` (and ``fp8_gemm.fp8_unavailable``) ask
``verdict(family, device)`` after their own questions; the first ask runs the family's check, and a mismatch becomes
that backend's reason to be unavailable on that device: the path choice moves down the ladder (gluon -> triton ->
cublas -> reference), checking each backend it reaches the same way. Families: ``triton`` (the quantizer; the GEMM's
int32 accumulator at edge tiles; dequant + bias on the family's large tile, a small-M tile and split K; the SwiGLU
pair; the persistent TMA kernels where the family's space has them), ``gluon`` (int32, dequant + bias, SwiGLU pair),
``fp8`` (the e4m3 quantizer and the fp8 GEMM), ``cublas`` (torch._int_mm's int32).

The contract (the twins, reference.py), element by element, outputs NaN-poisoned first: quantizer codes and scales
and int32 accumulators equal bit for bit; a dequantized output y (out_dtype's unit roundoff eps) within
``eps |t| + 2^-22 (|p| + |bias|)`` of the twin's float32 value t (p = acc s_tok s_ch: the GPU's fused multiply-add
against the twin's two roundings); the SwiGLU pair within ``eps |t| + (|g| + 8) 2^-20 |t|`` (the kernel's exp
against torch's; plus float32's smallest normal times (|g| + 1)(|u| + 1), a sigmoid flushed to zero); the fp8 GEMM
within ``eps |t| + 2^-8 sum_k |q w| s_tok s_ch + 2^-22 |bias|`` (fp8 tensor cores add with fewer bits).

A check runs a few small problems once per device, most of its time compiling kernels the model then runs. A pass is
cached on disk per (GPU, driver, torch, Triton, kernel sources) next to the autotune cache; a failure is not: the next
process checks (and says so) again. The experiment ``self-check=on`` checks every device, the measured families too
(and the CPU interpreter, for tests); ``self-check=off`` none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import threading
import time

import torch
import torch.nn.functional as F

from . import entry_cache, reference, settings
from .configs import CONFIG_SPACES, SMEM_LIMIT, GemmConfig, config_space, fp8_tile, heuristic_config
from .env import arch_name, capability, gpu_name, interpreter_mode, triton_version

log = logging.getLogger(__name__)

EXPERIMENT = "self-check"  # settings.EXPERIMENTS: on | off
# families whose kernels ran this repository's GPU tests and benchmarks: checked only with self-check=on
MEASURED_ARCHS = ("sm90",)
CACHE_NAME = "self_check.json"
_MAX_CACHE_ENTRIES = 32

# problem sizes: M and N no multiple of any tile (edge tiles in both), all multiples of 16 as the model's are (the
# same compiled kernel variants as Ideogram 4's shapes), K a multiple of every BLOCK_K and of two splits
_M, _N, _K, _M_SMALL, _M_SPLIT = 144, 208, 512, 5, 33


def setting() -> str:
    """The experiment ``self-check``: "on" (every GPU, the measured families too), "off" (none), else "auto"."""
    return settings.experiment(EXPERIMENT) or "auto"


def policy(arch: str, mode: str) -> str | None:
    """Why kernels on a GPU of family ``arch`` are checked under the setting ``mode``, or None when they are not."""
    if mode == "off":
        return None
    if arch not in MEASURED_ARCHS:
        return f"{arch} is not measured in this repository"
    return f"{settings.said(EXPERIMENT)} (measured {arch} checked too)" if mode == "on" else None


def applies(device: torch.device) -> str | None:
    """Why kernels on ``device`` are checked before first use (words for `info`), or None when they are not."""
    mode = setting()
    if device.type == "cuda":
        return policy(arch_name(capability(device)), mode)
    if mode == "on" and interpreter_mode():
        return f"{settings.said(EXPERIMENT)} (the Triton CPU interpreter)"
    return None


@dataclasses.dataclass
class Result:
    family: str
    passed: bool
    why: str | None  # the mismatch, or None
    seconds: float
    from_cache: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.verdicts: dict[tuple, str | None] = {}  # (family, device as asked) -> reason or None: read per call
        self.results: dict[tuple, Result] = {}  # (family, device key) -> what the check found
        self.running = threading.local()


_STATE = _State()


def verdict(family: str, device: torch.device) -> str | None:
    """Why ``family`` is demoted on ``device`` by its self-check, or None (it passed, or is not checked there). The
    first ask per device runs the check (or takes the cached result); later asks are a dictionary lookup."""
    try:
        return _STATE.verdicts[(family, device)]
    except KeyError:
        return _first_use(family, device)


def _first_use(family: str, device: torch.device) -> str | None:
    if family not in _CHECKS:
        raise ValueError(f"self-check family {family!r}: expected one of {tuple(_CHECKS)}")
    if applies(device) is None:
        _STATE.verdicts[(family, device)] = None
        return None
    if getattr(_STATE.running, "family", None) is not None:
        return None  # a kernel the check itself runs asked: no nested check
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None  # not now: a check inside a CUDA-graph capture would break it; the next eager call runs it
    with _STATE.lock:
        if (family, device) in _STATE.verdicts:
            return _STATE.verdicts[(family, device)]
        key = (family, _device_key(device))
        result = _STATE.results.get(key)
        if result is None:
            result = _cached(family, device) or _run(family, device)
            if result is None:  # short of memory now: asked again on the next call
                return None
            _STATE.results[key] = result
        why = None if result.passed else _reason(family, device, result.why)
        _STATE.verdicts[(family, device)] = why
        return why


def _reason(family: str, device: torch.device, mismatch: str | None) -> str:
    where = arch_name(capability(device)) if device.type == "cuda" else device.type
    return f"the {family} kernels failed their self-check on this device ({where}): {mismatch}"


def _run(family: str, device: torch.device) -> Result | None:
    start = time.perf_counter()
    _STATE.running.family = family
    try:
        mismatch = _CHECKS[family](device)
    except torch.cuda.OutOfMemoryError:
        return None
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot run its small problems fails its check
        text = [line.strip() for line in str(exc).splitlines() if line.strip()]
        mismatch = f"{type(exc).__name__}: {(text[-1] if text else '')[:300]}"
    finally:
        _STATE.running.family = None
    if device.type == "cuda":
        try:
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001 - a kernel that broke the context: its check failed above already
            pass
    result = Result(family, mismatch is None, mismatch, round(time.perf_counter() - start, 3))
    if result.passed:
        log.info(
            "Ideogram4 INT8: the %s kernels passed their self-check on %s in %.2f s", family, device, result.seconds
        )
    else:
        log.warning(
            "Ideogram4 INT8: %s; that backend is demoted on this device and the next one runs",
            _reason(family, device, mismatch),
        )
    _save(family, device, result)
    return result


def results(device: torch.device) -> list[dict]:
    """What each family's check found on ``device`` (`info`, the benchmark report): family, passed, why, seconds,
    from_cache; a family not checked (not used yet, or not checked there) is absent."""
    key = _device_key(device)
    with _STATE.lock:
        return [r.as_dict() for (family, k), r in _STATE.results.items() if k == key]


def reset() -> None:
    """Forget every verdict of this process (tests; a changed setting): the next ask checks again (or reads the disk
    cache). What the callers cached from the verdicts is forgotten with them (``on_reset``)."""
    with _STATE.lock:
        _STATE.verdicts.clear()
        _STATE.results.clear()
    for forget in _ON_RESET:
        forget()


_ON_RESET: list = []


def on_reset(forget) -> None:
    """Have ``reset`` call ``forget()``: a module that caches answers derived from the verdicts registers its clear."""
    _ON_RESET.append(forget)


# -- the cache ----------------------------------------------------------------------------------------------------


def _device_key(device: torch.device) -> tuple:
    if device.type == "cuda":
        return ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return (device.type, None)


def cache_key(gpu: str, driver: str, torch_version: str, triton: str | None, kernels: str) -> str:
    """The cache key of one device's results: what they depend on (the GPU, its driver, torch, Triton and the
    kernel sources)."""
    return f"{gpu}|driver {driver}|torch {torch_version}|triton {triton}|kernels {kernels}"


def device_cache_key(device: torch.device) -> str:
    if device.type == "cuda":
        cc = capability(device)
        gpu = f"{gpu_name(device)} sm_{cc[0]}{cc[1]}"
    else:
        gpu = "CPU interpreter" if interpreter_mode() else device.type
    return cache_key(gpu, driver_version(), torch.__version__, triton_version(), kernel_sources_digest())


def driver_version() -> str:
    """The NVIDIA driver's release (Linux: /proc/driver/nvidia/version), else the CUDA driver API version, else "?"."""
    try:
        line = pathlib.Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        return next(tok for tok in line.split() if tok[:1].isdigit() and "." in tok)
    except (OSError, IndexError, StopIteration):
        pass
    try:
        import ctypes

        lib = ctypes.CDLL("nvcuda.dll" if os.name == "nt" else "libcuda.so.1")
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"CUDA {version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    return "?"


def kernel_sources_digest() -> str:
    """A digest of every module of the kernels package: a change to any of them checks again."""
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_file() -> pathlib.Path:
    return entry_cache.path_of(CACHE_NAME)


def _read() -> dict:
    return entry_cache.read(CACHE_NAME)


def _cached(family: str, device: torch.device) -> Result | None:
    """The pass stored for this family and device key, or None."""
    entry = _read().get(device_cache_key(device), {}).get(family)
    if not isinstance(entry, dict) or entry.get("passed") is not True:
        return None
    seconds = entry.get("seconds")
    return Result(family, True, None, float(seconds) if isinstance(seconds, (int, float)) else 0.0, from_cache=True)


def _save(family: str, device: torch.device, result: Result) -> None:
    """Store a pass (a failure is checked again by the next process)."""
    if not result.passed:
        return
    entries = _read()
    key = device_cache_key(device)
    if not isinstance(entries.get(key), dict):
        entries[key] = {}
    entries[key][family] = {"passed": True, "seconds": result.seconds}
    entries = dict(list(entries.items())[-_MAX_CACHE_ENTRIES:])
    entry_cache.write(CACHE_NAME, entries, "self-check")


# -- the checks: each returns None or the first mismatch, in words -------------------------------------------------


def _operands(device: torch.device, m: int, n: int, k: int, seed: int):
    """Activations with outlier channels (a zero row, a NaN row), their twin quantization, an int8 weight with
    per-channel scales and a bf16 bias: drawn on the CPU from a fixed seed, then moved to ``device``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 0.5
    x[:, torch.randperm(k, generator=gen)[: k // 64]] *= 30.0
    if m > 2:
        x[1] = 0.0
        x[2, k // 3] = float("nan")
    x = x.bfloat16()
    q, s = reference.quantize_per_token_ref(x)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    ws = torch.rand(n, generator=gen) * 2e-4 + 2e-5  # outputs of a few units: the SwiGLU's curve, not its tails
    bias = (torch.randn(n, generator=gen) * 0.1).bfloat16()
    cpu = (x, q, s, w, ws, bias)
    return cpu, tuple(t.to(device) for t in cpu)


def _nan(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan") if dtype.is_floating_point else -(2**31) + 7, dtype=dtype, device=device)


def _compare(what: str, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor | None = None) -> str | None:
    """None when ``got`` equals ``want`` (bound None: bit for bit, NaN where the twin has NaN) or lies within
    ``bound`` of it element by element; else the mismatch in words."""
    got, want = got.cpu(), want.cpu()
    if bound is None:
        bad = ~((got == want) | (got.isnan() & want.isnan())) if got.dtype.is_floating_point else got != want
    else:
        diff = (got.double() - want.double()).abs()
        bad = ~((diff <= bound.double()) | (got.isnan() & want.isnan()))
    if not bad.any():
        return None
    where = tuple(int(i) for i in bad.nonzero()[0])
    return (
        f"{what}: {int(bad.sum())} of {bad.numel()} outputs differ from the twin's (first at {list(where)}: "
        f"{got[where].item():.6g} against {want[where].item():.6g})"
    )


def _epilogue_bound(acc, s, ws, bias, out_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(the twin's float32 dequantized output, the bound of the module docstring) of an int32 accumulator."""
    p = acc.float() * s.float()[:, None] * ws.float()[None, :]
    b = bias.float()[None, :] if bias is not None else torch.zeros(())
    t = reference.epilogue_ref(acc, s, ws, bias, torch.float32)
    eps = torch.finfo(out_dtype).eps
    return t, eps * t.abs() + 2.0**-22 * (p.abs() + b.abs()) + torch.finfo(out_dtype).tiny


def _pair_bound(acc1, acc3, s, s1, s3, out_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = reference.epilogue_ref(acc1, s, s1, None, torch.float32)
    u = reference.epilogue_ref(acc3, s, s3, None, torch.float32)
    t = F.silu(g) * u
    eps = torch.finfo(out_dtype).eps
    # a sigmoid below float32's normals may be flushed to zero: tiny |g u| more
    flushed = torch.finfo(torch.float32).tiny * (g.abs() + 1) * (u.abs() + 1)
    return t, (eps + (g.abs() + 8) * 2.0**-20) * t.abs() + flushed + torch.finfo(out_dtype).tiny


def _gemm_checks(device: torch.device, launch, configs: dict[str, GemmConfig], pair: GemmConfig | None):
    """The GEMM checks shared by the portable and the Gluon kernels: ``launch(q, w, cfg, q_scale, w_scale, bias,
    out, raw_int32, up)`` runs one config. ``configs``: {"raw": cfg, "linear": cfg, ...} by what each runs."""
    (_, q, s, w, ws, bias), (_, qd, sd, wd, wsd, biasd) = _operands(device, _M, _N, _K, 1)
    acc = reference.int8_matmul_int32_ref(q, w)
    for name, cfg in configs.items():
        if name == "raw":
            out = launch(qd, wd, cfg, None, None, None, _nan((_M, _N), torch.int32, device), True, None)
            problem = _compare(f"int32 accumulator ({cfg.key()})", out, acc)
        else:
            m = {"small-M": _M_SMALL, "split-K": _M_SPLIT}.get(name, _M)
            out = launch(qd[:m], wd, cfg, sd[:m], wsd, biasd, _nan((m, _N), torch.bfloat16, device), False, None)
            want, bound = _epilogue_bound(acc[:m], s[:m], ws, bias, torch.bfloat16)
            problem = _compare(f"dequant + bias ({cfg.key()}, {name})", out, want, bound)
        if problem:
            return problem
    if pair is not None:
        f = _N // 2
        w3 = torch.randint(-127, 128, (f, _K), generator=torch.Generator().manual_seed(2), dtype=torch.int8)
        s3 = torch.rand(f, generator=torch.Generator().manual_seed(3)) * 2e-4 + 2e-5
        out = _nan((_M, f), torch.bfloat16, device)
        out = launch(qd, wd[:f], pair, sd, wsd[:f], None, out, False, (w3.to(device), s3.to(device)))
        want, bound = _pair_bound(acc[:, :f], reference.int8_matmul_int32_ref(q, w3), s, ws[:f], s3, torch.bfloat16)
        return _compare(f"SwiGLU pair ({pair.key()})", out, want, bound)
    return None


def _arch_of(device: torch.device) -> str:
    return arch_name(capability(device)) if device.type == "cuda" else "cpu"


def _portable_configs(device: torch.device) -> tuple[dict[str, GemmConfig], list[GemmConfig]]:
    """The portable kernels' configs the check runs: the family's large tile (raw int32 and dequant + bias), a
    small-M tile, split K; and the persistent TMA kernel's first config where the family's space has it."""
    arch = _arch_of(device)
    large = heuristic_config(arch, 4096, 4096, 4096)
    configs = {
        "raw": large,
        "large tile": large,
        "small-M": heuristic_config(arch, _M_SMALL, 4096, 4096),
        "split-K": dataclasses.replace(large, split_k=2),
    }
    pairs = [large]
    cc = capability(device) if device.type == "cuda" else None
    if cc is not None and cc >= (9, 0):
        props = torch.cuda.get_device_properties(device)
        limit = getattr(props, "shared_memory_per_block_optin", None) or SMEM_LIMIT.get(arch)
        tma = next((c for c in config_space(arch, 4096, limit, ("triton-tma",))), None)
        if tma is not None:
            configs["TMA"] = tma
            if tma.problem(2, swiglu=True) is None:
                pairs.append(tma)
    return configs, pairs


def _check_triton(device: torch.device) -> str | None:
    from . import gemm_triton, quant_triton

    (x, *_), (xd, *_) = _operands(device, _M, _N, _K, 0)
    q, s = quant_triton.quantize_rows_triton(xd)
    qr, sr = reference.quantize_per_token_ref(x)
    problem = _compare("quantizer codes", q, qr) or _compare("quantizer scales", s, sr)
    if problem:
        return problem

    def launch(q, w, cfg, qs, ws, bias, out, raw, up):
        return gemm_triton.launch_gemm(q, w, cfg, qs, ws, bias, out, raw, up=up)

    configs, pairs = _portable_configs(device)
    for i, pair in enumerate(pairs):
        problem = _gemm_checks(device, launch, configs if i == 0 else {}, pair)
        if problem:
            return problem
    return None


def _check_gluon(device: torch.device) -> str | None:
    from . import gemm_gluon

    cfg = next(c for c in CONFIG_SPACES["sm90"] if c.is_gluon and c.split_k == 1)

    def launch(q, w, cfg, qs, ws, bias, out, raw, up):
        return gemm_gluon.launch_gemm(q, w, cfg, qs, ws, bias, out, raw, up=up)

    return _gemm_checks(device, launch, {"raw": cfg, "large tile": cfg}, cfg)


def _check_fp8(device: torch.device) -> str | None:
    from . import gemm_triton, quant_triton

    (x, *_), (xd, *_) = _operands(device, _M, _N, _K, 4)
    codes = torch.float8_e4m3fn
    q, s = quant_triton.quantize_rows_triton(xd, codes=codes)
    qr, sr = reference.quantize_per_token_ref(x, codes=codes)
    problem = _compare("e4m3 quantizer codes", q.view(torch.uint8), qr.view(torch.uint8))
    if problem or (problem := _compare("e4m3 quantizer scales", s, sr)):
        return problem
    gen = torch.Generator().manual_seed(5)
    w = (torch.randn(_N, _K, generator=gen) * 64).clamp(-448, 448).to(codes)
    ws, bias = torch.rand(_N, generator=gen) * 1e-3 + 1e-5, (torch.randn(_N, generator=gen) * 0.1).bfloat16()
    tile = fp8_tile(_arch_of(device))
    out = _nan((_M, _N), torch.bfloat16, device)
    gemm_triton.launch_gemm(q, w.to(device), tile, s, ws.to(device), bias.to(device), out)
    t = reference.fp8_matmul_ref(qr, w, sr, ws, bias, torch.float32)
    mass = (qr.float().abs() @ w.float().abs().t()) * sr[:, None] * ws[None, :]
    bound = torch.finfo(torch.bfloat16).eps * t.abs() + 2.0**-8 * mass + 2.0**-22 * bias.float().abs()
    return _compare(f"fp8 GEMM ({tile.key()})", out, t, bound + torch.finfo(torch.bfloat16).tiny)


def _check_cublas(device: torch.device) -> str | None:
    (_, q, _, w, _, _), _ = _operands(torch.device("cpu"), _M, _N, _K, 6)
    acc = torch._int_mm(q.to(device), w.to(device).t())
    return _compare("torch._int_mm int32 accumulator", acc, reference.int8_matmul_int32_ref(q, w))


_CHECKS = {"gluon": _check_gluon, "triton": _check_triton, "fp8": _check_fp8, "cublas": _check_cublas}
