"""First-use self-check: before a kernel family's first use on a device of a GPU family this repository has not
measured, the family runs small problems and is compared with its pure-torch twin; a mismatch demotes it there.

A kernel that compiles for an architecture may still compute wrong results on it, and nothing else checks results on
a device the GPU tests never ran on. So ``backends.unavailable`` (and ``fp8_gemm.fp8_unavailable``) ask
``verdict(family, device)`` after their own questions; the first ask runs the family's check, and a mismatch becomes
that backend's reason to be unavailable on that device: the path choice moves down the ladder (gluon -> triton ->
cublas -> reference), checking each backend it reaches the same way.

A family runs exactly the kernels Ideogram 4's own calls run on that device, on small problems (self_check_plan.py),
so its compiles are the ones the model's first pass needs anyway: ``triton`` (the quantizer; the portable GEMMs the
model's picks name or fall back to), ``gluon`` (the Gluon picks), ``fp8`` (the e4m3 quantizer and the fp8 GEMM),
``cublas`` (torch._int_mm's int32). A pick autotuning makes later is checked by the next process.

The contract (the twins, reference.py), element by element, outputs NaN-poisoned first: quantizer codes and scales
and cuBLAS's int32 accumulators equal bit for bit; a dequantized output y (out_dtype's unit roundoff eps) within
``eps |t| + 2^-22 (|p| + |bias|)`` of the twin's float32 value t (p = acc s_tok s_ch: the GPU's fused multiply-add
against the twin's two roundings); the SwiGLU pair within ``eps |t| + (|g| + 8) 2^-20 |t|`` (the kernel's exp
against torch's; plus float32's smallest normal times (|g| + 1)(|u| + 1), a sigmoid flushed to zero); the fp8 GEMM
within ``eps |t| + 2^-8 sum_k |q w| s_tok s_ch + 2^-22 |bias|`` (fp8 tensor cores add with fewer bits). The Triton
and Gluon GEMMs' int32 accumulators equal the twin's bit for bit through the model's own dequantizing kernel (their
raw int32 store is a variant the model never runs): a second launch of each linear case on ternary operands with
unit scales, whose outputs are small integers bf16 holds exactly (``_accumulators_exact``).

A check runs once per device. A pass is cached on disk per (GPU, driver, torch, Triton, kernel sources) next to the
autotune cache with a digest of its launches; a failure is not: the next process checks (and says so) again. The
experiment ``self-check=on`` checks every device, the measured families too (and the CPU interpreter); ``off`` none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import sys
import threading
import time

import torch
import torch.nn.functional as F

from . import backends, entry_cache, reference, settings
from .env import arch_name, capability, gpu_name, interpreter_mode, triton_version

log = logging.getLogger(__name__)

EXPERIMENT = "self-check"  # settings.EXPERIMENTS: on | off
# families whose kernels ran this repository's GPU tests and benchmarks: checked only with self-check=on
MEASURED_ARCHS = ("sm90",)
CACHE_NAME = "self_check.json"
_MAX_CACHE_ENTRIES = 32

# non-zero products per output row of the exact-accumulator case: integers up to 256 are exact in bf16
_EXACT_PRODUCTS = 128
# torch._int_mm's problem (cuBLAS: nothing for Triton to compile): M and N no multiple of a tile, K of two
_M, _N, _K = 144, 208, 512


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


def _plan(family: str, device: torch.device) -> str:
    """A digest of the launches ``family``'s check makes on ``device``: they follow the model's picks there, which
    autotuning may change (a pass stored before covers the launches it made)."""
    from . import self_check_plan

    return self_check_plan.digest(self_check_plan.target_of(device), family)


def _cached(family: str, device: torch.device) -> Result | None:
    """The pass stored for this family and device key, covering the launches its check makes now, or None."""
    entry = _read().get(device_cache_key(device), {}).get(family)
    if not isinstance(entry, dict) or entry.get("passed") is not True or entry.get("launches") != _plan(family, device):
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
    entries[key][family] = {"passed": True, "seconds": result.seconds, "launches": _plan(family, device)}
    entries = dict(list(entries.items())[-_MAX_CACHE_ENTRIES:])
    entry_cache.write(CACHE_NAME, entries, "self-check")


# -- the checks: each returns None or the first mismatch, in words -------------------------------------------------


def _activations(m: int, k: int, seed: int) -> torch.Tensor:
    """bf16 rows [m, k] with outlier channels (and, beyond two rows, a zero row and a NaN row), from a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 0.5
    x[:, torch.randperm(k, generator=gen)[: k // 64]] *= 30.0
    if m > 2:
        x[1] = 0.0
        x[2, k // 3] = float("nan")
    return x.bfloat16()


def _operands(device: torch.device, m: int, n: int, k: int, seed: int):
    """Activations (``_activations``), their twin quantization, an int8 weight with per-channel scales and a bf16
    bias: drawn on the CPU from a fixed seed, then moved to ``device``."""
    x = _activations(m, k, seed)
    q, s = reference.quantize_per_token_ref(x)
    gen = torch.Generator().manual_seed(seed + 1)
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


def _gemm_checks(device: torch.device, launch, cases) -> str | None:
    """The cases of one backend (self_check_plan.gemm_cases): ``launch(q, w, cfg, q_scale, w_scale, bias, out,
    raw_int32, up)`` runs one config; the first mismatch, or None."""
    for i, case in enumerate(cases):
        problem = _gemm_case(device, launch, case, seed=10 + 2 * i)
        if problem:
            return problem
    return None


def _gemm_case(device: torch.device, launch, case, seed: int) -> str | None:
    m, n, k = case.m, case.n, case.k
    (_, q, s, w, ws, bias), (_, qd, sd, wd, wsd, biasd) = _operands(device, m, n, k, seed)
    acc = reference.int8_matmul_int32_ref(q, w)
    out = _nan((m, n), torch.bfloat16, device)
    if case.pair:
        gen = torch.Generator().manual_seed(seed + 1)
        w3 = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        s3 = torch.rand(n, generator=gen) * 2e-4 + 2e-5
        out = launch(qd, wd, case.cfg, sd, wsd, None, out, False, (w3.to(device), s3.to(device)))
        want, bound = _pair_bound(acc, reference.int8_matmul_int32_ref(q, w3), s, ws, s3, torch.bfloat16)
        return _compare(case.name(), out, want, bound)
    if not case.bias:
        bias = biasd = None
    out = launch(qd, wd, case.cfg, sd, wsd, biasd, out, False, None)
    want, bound = _epilogue_bound(acc, s, ws, bias, torch.bfloat16)
    return _compare(case.name(), out, want, bound) or _accumulators_exact(device, launch, case, seed)


def _ternary(rows: int, k: int, nonzero: int, gen: torch.Generator) -> torch.Tensor:
    """int8 rows of -1, 0, 1 with ``nonzero`` non-zero entries each (the first and last of K always among them)."""
    q = torch.zeros(rows, k, dtype=torch.int8)
    for r in range(rows):
        cols = torch.cat([torch.tensor([0, k - 1]), torch.randperm(k, generator=gen)[: max(nonzero - 2, 0)]])
        q[r, cols] = (torch.randint(0, 2, (cols.numel(),), generator=gen) * 2 - 1).to(torch.int8)
    return q


def _accumulators_exact(device: torch.device, launch, case, seed: int) -> str | None:
    """The int32 accumulators bit for bit, through the model's own dequantizing kernel (no raw-store variant to
    compile): ternary operands whose rows hold at most ``_EXACT_PRODUCTS`` non-zero products, unit scales and a zero
    bias, so every output is an integer bf16 holds exactly, equal to the twin's accumulator."""
    m, n, k = case.m, case.n, case.k
    gen = torch.Generator().manual_seed(seed + 7)
    q = _ternary(m, k, min(k, _EXACT_PRODUCTS), gen)
    w = torch.randint(-1, 2, (n, k), generator=gen, dtype=torch.int8)
    acc = reference.int8_matmul_int32_ref(q, w)
    ones_m, ones_n = torch.ones(m, device=device), torch.ones(n, device=device)
    bias = torch.zeros(n, dtype=torch.bfloat16, device=device) if case.bias else None
    out = launch(
        q.to(device), w.to(device), case.cfg, ones_m, ones_n, bias, _nan((m, n), torch.bfloat16, device), False, None
    )
    return _compare(f"{case.name()} int32 accumulators", out, acc.to(torch.bfloat16))


def _quantizer_checks(device: torch.device, rows, codes=torch.int8) -> str | None:
    """The Triton quantizer on ``rows`` [(m, K)] against its twin: codes and scales bit for bit."""
    from . import quant_triton

    what = "e4m3 quantizer" if codes != torch.int8 else "quantizer"
    for m, k in rows:
        x = _activations(m, k, seed=k)
        q, s = quant_triton.quantize_rows_triton(x.to(device), codes=codes)
        qr, sr = reference.quantize_per_token_ref(x, codes=codes)
        if codes != torch.int8:  # compared as their bytes: e4m3 has no equality on every torch
            q, qr = q.view(torch.uint8), qr.view(torch.uint8)
        problem = _compare(f"{what} codes ({m}x{k})", q, qr) or _compare(f"{what} scales ({m}x{k})", s, sr)
        if problem:
            return problem
    return None


def _check_triton(device: torch.device) -> str | None:
    from . import gemm_triton, self_check_plan

    problem = _quantizer_checks(device, self_check_plan.quant_rows())
    if problem:
        return problem

    def launch(q, w, cfg, qs, ws, bias, out, raw, up):
        return gemm_triton.launch_gemm(q, w, cfg, qs, ws, bias, out, raw, up=up)

    cases = self_check_plan.gemm_cases(self_check_plan.target_of(device))["triton"]
    return _gemm_checks(device, launch, cases)


def _check_gluon(device: torch.device) -> str | None:
    from . import gemm_gluon, self_check_plan

    def launch(q, w, cfg, qs, ws, bias, out, raw, up):
        return gemm_gluon.launch_gemm(q, w, cfg, qs, ws, bias, out, raw, up=up)

    cases = self_check_plan.gemm_cases(self_check_plan.target_of(device))["gluon"]
    return _gemm_checks(device, launch, cases)


def _check_fp8(device: torch.device) -> str | None:
    from . import gemm_triton, self_check_plan

    codes = torch.float8_e4m3fn
    problem = _quantizer_checks(device, self_check_plan.quant_rows(fp8=True), codes)
    if problem:
        return problem
    case = self_check_plan.fp8_case(self_check_plan.target_of(device))
    m, n, k = case.m, case.n, case.k
    qr, sr = reference.quantize_per_token_ref(_activations(m, k, seed=4), codes=codes)
    gen = torch.Generator().manual_seed(5)
    w = (torch.randn(n, k, generator=gen) * 64).clamp(-448, 448).to(codes)
    ws = torch.rand(n, generator=gen) * 1e-3 + 1e-5
    bias = (torch.randn(n, generator=gen) * 0.1).bfloat16() if case.bias else None
    out = _nan((m, n), torch.bfloat16, device)
    biasd = bias.to(device) if bias is not None else None
    gemm_triton.launch_gemm(qr.to(device), w.to(device), case.cfg, sr.to(device), ws.to(device), biasd, out)
    t = reference.fp8_matmul_ref(qr, w, sr, ws, bias, torch.float32)
    mass = (qr.float().abs() @ w.float().abs().t()) * sr[:, None] * ws[None, :]
    bound = torch.finfo(torch.bfloat16).eps * t.abs() + 2.0**-8 * mass
    if bias is not None:
        bound = bound + 2.0**-22 * bias.float().abs()
    return _compare(case.name().replace("dequant", "fp8 GEMM", 1), out, t, bound + torch.finfo(torch.bfloat16).tiny)


def _check_cublas(device: torch.device) -> str | None:
    (_, q, _, w, _, _), _ = _operands(torch.device("cpu"), _M, _N, _K, 6)
    acc = torch._int_mm(q.to(device), w.to(device).t())
    return _compare("torch._int_mm int32 accumulator", acc, reference.int8_matmul_int32_ref(q, w))


_CHECKS = {"gluon": _check_gluon, "triton": _check_triton, "fp8": _check_fp8, "cublas": _check_cublas}


backends.set_first_use_check(sys.modules[__name__])
