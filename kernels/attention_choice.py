"""Which attention the pack's MODELs run, per device and shape: SDPA (cuDNN first) or an 8-bit path, by measurement.

Candidates (``CANDIDATES``), each with ``unavailable(device, shape, dtype) -> str | None`` and ``run(q, k, v)`` in
[B, H, L, D] layout:
  sdpa  PyTorch SDPA with cuDNN attention first, then FlashAttention-2 (ComfyUI orders FlashAttention-2 first)
  int8  comfy-kitchen's ``int8_attention`` (ComfyUI's own dependency, used through its public functions)
  fp8   cuDNN's FP8 attention through nvidia-cudnn-frontend, an optional dependency (attention_fp8_cudnn.py)

``choose`` answers the first call of a shape on a device by measuring every candidate that can run there on probe
inputs of that shape (q and k with outlier channels, as the blocks' q / k after RMSNorm + RoPE have): the error of
each against float32 attention of the same inputs (relative Frobenius, worst head) and its time (CUDA events, or an
injected timer). The fastest whose error is within ``BOUND`` wins; SDPA wins a tie. The answer is kept in memory and,
with its numbers, in ``attention.json`` in the pack's cache folder, keyed by GPU, compute capability, torch,
comfy-kitchen, cuDNN (torch's and the one the frontend loaded) and cudnn-frontend versions, shape and dtype
(``key_fields``): a later process re-decides from the stored numbers without measuring. Nothing is measured while a
CUDA graph is captured (an undecided shape refuses: ``capture_guard``, and the pass runs eagerly first) or
torch.compile traces (an undecided shape runs SDPA then, labelled, until an eager call decides). An 8-bit path that
fails while measured or run gives way to SDPA for that shape, with the failure as the reason; a pass never fails
for it. On a family in ``MEASURED_HERE`` the paths measured slower there are not measured
again.

``IDEOGRAM4_INT8_ATTENTION`` = sdpa | int8 | fp8 forces a path where it can run (else SDPA, and the reason says
why); ``comfyui`` is handled by the override's installer (nodes/runtime/attention_override.py), which never asks here.
comfy_kitchen and cudnn are imported inside the functions that need them, never at import.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import attention_fp8_cudnn, capture_guard, entry_cache, settings
from .env import capability, gpu_name

log = logging.getLogger(__name__)

SDPA, INT8, FP8 = settings.ATTENTION_PATHS
# The largest relative Frobenius error (worst head, against float32 attention of the same inputs) an 8-bit path may
# have to be chosen. bf16 SDPA errs about a tenth of this at Ideogram 4's shapes; comfy-kitchen's INT8 attention
# errs just under it with outlier channels (docs/performance.md#attention). A path over it never runs by itself;
# the switch can still force it.
BOUND = 2e-2
CACHE_NAME = "attention.json"
OUTLIER_CHANNELS = 8  # per head, of the probe's q and k
OUTLIER_SCALE = 4.0  # before the probe's RMS normalisation: a q.k score spread of a few units, as the model's
WARMUP = 2  # calls before timing (kernel selection, first-call allocations)
ROUNDS = 3  # the time is the fastest round's mean
CALLS_PER_ROUND = 5

Timer = Callable[[Callable[[], object]], float]  # runs a function and returns its milliseconds per call


@dataclasses.dataclass(frozen=True)
class Shape:
    """One attention call: ``tokens`` (L), ``heads`` (H) and ``head_dim`` (D)."""

    tokens: int
    heads: int
    head_dim: int

    def __str__(self) -> str:
        return f"L={self.tokens}, {self.heads} heads of {self.head_dim}"


# -- the candidates ---------------------------------------------------------------------------------------------


def _priority_context():
    """SDPA restricted to cuDNN, then FlashAttention-2, then the rest, in that order; None where this torch
    cannot set a priority."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    if "set_priority" not in inspect.signature(sdpa_kernel).parameters:
        return None
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return lambda: sdpa_kernel(order, set_priority=True)


PRIORITY = _priority_context()


class SdpaCudnnFirst:
    """PyTorch SDPA with cuDNN attention first: the path every comparison is made against."""

    name = SDPA
    label = "SDPA, cuDNN first"

    def unavailable(self, device: torch.device, shape: Shape | None = None, dtype: torch.dtype | None = None):
        return "this torch cannot order SDPA backends" if PRIORITY is None else None

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with PRIORITY():
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)


def kitchen_version() -> str | None:
    """The installed comfy-kitchen's version, or None (not installed)."""
    try:
        return importlib.metadata.version("comfy-kitchen")
    except importlib.metadata.PackageNotFoundError:
        return None


class KitchenInt8:
    """comfy-kitchen's INT8 attention (Q, K, V quantized to int8, P to uint8; head dims up to 256)."""

    name = INT8
    label = "comfy-kitchen INT8 attention"
    MAX_HEAD_DIM = 256

    def unavailable(self, device: torch.device, shape: Shape | None = None, dtype: torch.dtype | None = None):
        if device.type != "cuda":
            return f"comfy-kitchen's INT8 attention needs a CUDA GPU (the model is on the {device.type.upper()})"
        if shape is not None and shape.head_dim > self.MAX_HEAD_DIM:
            return (
                f"comfy-kitchen's INT8 attention takes head dims up to {self.MAX_HEAD_DIM} (this is {shape.head_dim})"
            )
        try:
            kitchen = importlib.import_module("comfy_kitchen")
        except ImportError:
            return "comfy-kitchen is not installed (ComfyUI's requirements install it)"
        except Exception as exc:  # noqa: BLE001 - a broken install is a reason, never a failed pass
            return f"comfy-kitchen did not import ({type(exc).__name__}: {exc})"
        version = kitchen_version() or "(unknown version)"
        if not all(hasattr(kitchen, f) for f in ("int8_attention", "int8_attention_is_available")):
            return f"comfy-kitchen {version} has no int8_attention (a newer release has it)"
        try:
            ready = kitchen.int8_attention_is_available(device)
        except Exception as exc:  # noqa: BLE001
            return f"comfy-kitchen {version}: int8_attention_is_available failed ({type(exc).__name__}: {exc})"
        if not ready:
            return f"comfy-kitchen {version}: its INT8 attention cannot run on this GPU (its CUDA build, sm_75+)"
        return None

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return importlib.import_module("comfy_kitchen").int8_attention(q, k, v)


def cudnn_frontend_version() -> str | None:
    """The installed nvidia-cudnn-frontend's version, or None (not installed)."""
    return attention_fp8_cudnn.frontend_version()


class CudnnFp8:
    """cuDNN's FP8 attention through nvidia-cudnn-frontend, an optional dependency (kernels/attention_fp8_cudnn.py):
    q, k, v quantized to e4m3 per tensor on the device, O in bf16."""

    name = FP8
    label = "cuDNN FP8 attention"

    def unavailable(self, device: torch.device, shape: Shape | None = None, dtype: torch.dtype | None = None):
        ok, why = attention_fp8_cudnn.available(device, shape.head_dim if shape is not None else None, dtype)
        return None if ok else why

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention_fp8_cudnn.attention(q, k, v)


CANDIDATES = {c.name: c for c in (SdpaCudnnFirst(), KitchenInt8(), CudnnFp8())}
LABELS = {name: c.label for name, c in CANDIDATES.items()}


# -- the choice ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Choice:
    """The attention ``path`` of one shape on one device and ``reason`` (with the numbers where measured);
    ``ms`` and ``errors`` per measured candidate; ``measured``: whether the numbers are this process's own
    (False: from the cache file, or not measured at all); ``final``: False for an answer given while nothing
    could be measured (a capture), which an eager call replaces."""

    path: str
    reason: str
    ms: dict = dataclasses.field(default_factory=dict)
    errors: dict = dataclasses.field(default_factory=dict)
    measured: bool = False
    final: bool = True

    def describe(self) -> str:
        return f"{self.path} ({LABELS.get(self.path, self.path)}): {self.reason}"


_DECIDED: dict[tuple, Choice] = {}  # _key(...) -> Choice: the per-call lookup
_LOCK = threading.Lock()


def _key(device: torch.device, tokens: int, heads: int, head_dim: int, dtype: torch.dtype) -> tuple:
    """The in-process key of an answer: plain values only, so that a torch.compile trace can look one up."""
    return (device.type, device.index, tokens, heads, head_dim, dtype, settings.attention())


def lookup(device: torch.device, tokens: int, heads: int, head_dim: int, dtype: torch.dtype) -> Choice | None:
    """The answer already given for this call, or None: a dictionary lookup that never measures (the override asks
    this while torch.compile traces)."""
    return _DECIDED.get(_key(device, tokens, heads, head_dim, dtype))


def choose(
    device: torch.device,
    shape: Shape,
    dtype: torch.dtype,
    *,
    candidates: dict | None = None,
    timer: Timer | None = None,
) -> Choice:
    """The attention path for ``shape`` in ``dtype`` on ``device`` (module docstring); measured on the first call
    of that key, then a dictionary lookup. ``candidates`` and ``timer`` replace the real ones (tests, which
    ``clear`` the answers between pools)."""
    key = _key(device, shape.tokens, shape.heads, shape.head_dim, dtype)
    found = _DECIDED.get(key)
    if found is not None and found.final:
        return found
    pool = CANDIDATES if candidates is None else candidates
    setting = key[-1]
    try:
        if setting in pool:
            answer = _forced(pool, setting, device, shape, dtype)
        else:
            answer = _automatic(pool, device, shape, dtype, timer)
    except capture_guard.FirstUseInCapture:
        raise  # the capture fails; its eager retry measures
    except Exception as exc:  # noqa: BLE001 - choosing must never fail a pass: SDPA, with the failure
        answer = Choice(SDPA, f"choosing the attention at {shape} failed ({type(exc).__name__}: {exc}); SDPA runs")
        log.warning("Ideogram4 INT8: attention: %s", answer.reason)
    with _LOCK:
        _DECIDED[key] = answer
    return answer


def decided(device: torch.device | None = None) -> dict[Shape, Choice]:
    """The answers given so far (on ``device``, or anywhere), by shape: never measures (reports)."""
    return {
        Shape(*key[2:5]): c for key, c in _DECIDED.items() if device is None or key[:2] == (device.type, device.index)
    }


def give_way(device: torch.device, shape: Shape, dtype: torch.dtype, path: str, exc: BaseException) -> Choice:
    """After ``path`` failed on a real call: SDPA for this key from now on, the failure as the reason."""
    answer = Choice(SDPA, f"{path} failed at {shape} ({type(exc).__name__}: {exc}); SDPA runs instead")
    log.warning("Ideogram4 INT8: attention: %s", answer.reason)
    head = _key(device, shape.tokens, shape.heads, shape.head_dim, dtype)[:-1]
    with _LOCK:
        for key in [k for k in _DECIDED if k[:-1] == head]:
            _DECIDED[key] = answer
    return answer


def clear() -> None:
    """Forget this process's answers (tests; the cache file stays)."""
    with _LOCK:
        _DECIDED.clear()


def plan(device: torch.device) -> str:
    """What the pack's attention will do on ``device``, in words, before any shape is seen (never measures): the
    loader's summary line."""
    sdpa = LABELS[SDPA]
    setting = settings.attention()
    if setting in CANDIDATES and setting != SDPA:
        why = _why_not(CANDIDATES[setting], device, None, None)
        if why is None:
            return f"{setting} ({LABELS[setting]}), forced by {settings.ATTENTION}={setting}"
        return f"{sdpa}: {settings.ATTENTION}={setting} asked for, but {why}"
    if setting == SDPA:
        return f"{sdpa}, forced by {settings.ATTENTION}={SDPA}"
    why_not = {n: _why_not(c, device, None, None) for n, c in CANDIDATES.items() if n != SDPA}
    ready = [n for n, why in why_not.items() if why is None]
    unavailable = "; ".join(f"{n}: {why}" for n, why in why_not.items() if why)
    if not ready:
        return f"{sdpa} (no 8-bit path can run here: {unavailable})"
    named = " or ".join(f"{n} ({LABELS[n]})" for n in ready)
    return (
        f"{sdpa} or {named}, whichever measures faster within the error bound {BOUND:.0e} at the first pass of "
        f"each shape" + (f" ({unavailable})" if unavailable else "")
    )


def _why_not(candidate, device, shape, dtype) -> str | None:
    try:
        return candidate.unavailable(device, shape, dtype)
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot say is one that cannot run
        return f"asking whether it can run failed ({type(exc).__name__}: {exc})"


def _forced(pool: dict, path: str, device, shape, dtype) -> Choice:
    how = f"{settings.ATTENTION}={path}"
    why = _why_not(pool[path], device, shape, dtype)
    if why is None:
        return Choice(path, f"forced by {how}")
    return Choice(SDPA, f"{how} asked for, but {why}")


MEASURED_HERE = {
    (9, 0): {INT8: "against comfy-kitchen's INT8, cuDNN's bf16 SDPA was faster at 4608 tokens on H100 and H200"}
}
# per family, the 8-bit paths this repository measured slower than SDPA there (H100 / H200: docs/performance.md,
# Attention): not measured again at every new shape on every user's card. A path not listed that can run there is
# still measured against SDPA; a forced path or another family measures all.


def _automatic(pool: dict, device, shape, dtype, timer) -> Choice:
    why_not = {name: _why_not(c, device, shape, dtype) for name, c in pool.items()}
    if why_not.get(SDPA):  # the baseline cannot be ordered: still SDPA, the caller's plain call
        return Choice(SDPA, why_not[SDPA])
    known = MEASURED_HERE.get(capability(device), {}) if device.type == "cuda" and pool is CANDIDATES else {}
    ready = [name for name, why in why_not.items() if why is None and name not in known]
    unavailable = "; ".join(f"{name}: {why}" for name, why in why_not.items() if why)
    if ready == [SDPA]:
        if known:
            measured = "; ".join(known.values())
            rest = f"; {unavailable}" if unavailable else ""
            return Choice(
                SDPA, f"measured on this GPU family: no 8-bit path is faster ({measured}, 18 heads of 256){rest}"
            )
        return Choice(SDPA, f"no 8-bit path can run here ({unavailable})")
    slower = "; ".join(f"{name}: measured slower on this GPU family ({known[name]})" for name in known if name in pool)
    unavailable = "; ".join(x for x in (unavailable, slower) if x)
    key = cache_key(device, shape, dtype)
    stored = _read_cache().get(key, {})
    if all(isinstance(stored.get(name), dict) for name in ready):
        ms = {name: float(stored[name]["ms"]) for name in ready}
        errors = {name: float(stored[name]["err"]) for name in ready}
        return decide(ms, errors, shape, unavailable, source="measured earlier on this GPU")
    if torch.compiler.is_compiling():
        return Choice(SDPA, "not measured during a torch.compile trace: SDPA until an eager call measures", final=False)
    capture_guard.refuse_first_use(device, f"measuring the attention at {shape}")
    ms, errors, failed = measure({n: pool[n] for n in ready}, device, shape, dtype, timer)
    if SDPA in failed:
        return Choice(SDPA, f"SDPA could not be measured ({failed[SDPA]}); SDPA runs", ms, errors, measured=True)
    notes = "; ".join(x for x in (unavailable, *(f"{n} failed while measured: {w}" for n, w in failed.items())) if x)
    answer = decide(ms, errors, shape, notes, source="measured on first use")
    answer = dataclasses.replace(answer, measured=True)
    if not failed:
        _write_cache(key, ms, errors)
    log.info("Ideogram4 INT8: attention at %s: %s", shape, answer.describe())
    return answer


def decide(ms: dict, errors: dict, shape: Shape, notes: str = "", source: str = "") -> Choice:
    """The fastest candidate of ``ms`` whose error is within ``BOUND`` (SDPA always qualifies and wins a tie),
    with the numbers in the reason."""
    within = [n for n in ms if n == SDPA or errors[n] <= BOUND]
    best = min(within, key=lambda n: (ms[n], n != SDPA))

    def numbers(n):
        over = "" if n in within else f" over the bound {BOUND:.0e}"
        return f"{n} {ms[n]:.3f} ms (error {errors[n]:.1e}{over})"

    others = ", ".join(numbers(n) for n in ms if n != best)
    if best == SDPA:
        why = f"no 8-bit path is faster within the error bound {BOUND:.0e} at {shape}: {numbers(SDPA)}, {others}"
    else:
        why = f"the fastest within the error bound {BOUND:.0e} at {shape}: {numbers(best)} against {others}"
    tail = "; ".join(x for x in (source, notes) if x)
    return Choice(best, f"{why} ({tail})" if tail else why, dict(ms), dict(errors))


# -- measuring ------------------------------------------------------------------------------------------------------


def probe_inputs(device, shape: Shape, dtype, batch: int = 1, seed: int = 0):
    """q, k, v [batch, H, L, D] as views of [batch, L, H, D] tensors (the blocks' layout): q and k RMS-normalised
    per head with ``OUTLIER_CHANNELS`` channels ``OUTLIER_SCALE`` times the rest, v plain."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    size = (batch, shape.tokens, shape.heads, shape.head_dim)
    outliers = torch.randperm(shape.head_dim, generator=g)[:OUTLIER_CHANNELS]

    def qk():
        x = torch.randn(size, generator=g)
        x[..., outliers] *= OUTLIER_SCALE
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))
        return x.to(device, dtype).transpose(1, 2)

    q, k = qk(), qk()
    v = torch.randn(size, generator=g).to(device, dtype).transpose(1, 2)
    return q, k, v


def worst_head_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest relative Frobenius error over the heads of [B, H, L, D] outputs."""
    diff = (out.float() - ref).pow(2).sum(dim=(0, 2, 3))
    norm = ref.pow(2).sum(dim=(0, 2, 3)).clamp_min(1e-30)
    return (diff / norm).sqrt().max().item()


def measure(pool: dict, device, shape: Shape, dtype, timer: Timer | None = None):
    """({name: ms}, {name: error}, {name: why it failed}) of each candidate of ``pool`` on probe inputs."""
    q, k, v = probe_inputs(device, shape, dtype)
    # head by head: float32 SDPA may take the math kernel, whose [L, L] scores of all heads at once would not fit
    ref = torch.cat(
        [F.scaled_dot_product_attention(*(t[:, h : h + 1].float() for t in (q, k, v))) for h in range(shape.heads)],
        dim=1,
    )
    timer = timer or (cuda_event_timer if device.type == "cuda" else wall_timer)
    ms, errors, failed = {}, {}, {}
    for name, candidate in pool.items():
        try:
            errors[name] = worst_head_error(candidate.run(q, k, v), ref)
            ms[name] = float(timer(lambda c=candidate: c.run(q, k, v)))
        except Exception as exc:  # noqa: BLE001 - a path that fails here loses, with its failure as the reason
            errors.pop(name, None)
            failed[name] = f"{type(exc).__name__}: {exc}"
    return ms, errors, failed


def cuda_event_timer(fn: Callable[[], object]) -> float:
    """Milliseconds per call of ``fn`` on the current CUDA stream: the fastest of ``ROUNDS`` rounds' means."""
    for _ in range(WARMUP):
        fn()
    best = float("inf")
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS_PER_ROUND):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / CALLS_PER_ROUND)
    return best


def wall_timer(fn: Callable[[], object]) -> float:
    """Milliseconds per call of ``fn`` by the host clock (a device without events)."""
    fn()
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


# -- the cache file -------------------------------------------------------------------------------------------------


def key_fields(device: torch.device, shape: Shape, dtype: torch.dtype) -> dict:
    """What a measured answer depends on (``cudnn``: torch's cuDNN; ``cudnn_fp8``: the one the frontend loaded)."""
    cc = capability(device)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "gpu": gpu_name(device),
        "capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "torch": torch.__version__,
        "comfy_kitchen": kitchen_version(),
        "cudnn": cudnn,
        "cudnn_frontend": cudnn_frontend_version(),
        "cudnn_fp8": attention_fp8_cudnn.backend_version() if cudnn_frontend_version() else None,
        "shape": [shape.tokens, shape.heads, shape.head_dim],
        "dtype": str(dtype).replace("torch.", ""),
    }


def cache_key(device: torch.device, shape: Shape, dtype: torch.dtype) -> str:
    return json.dumps(key_fields(device, shape, dtype), sort_keys=True)


def cache_file():
    return entry_cache.path_of(CACHE_NAME)


def _read_cache() -> dict:
    entries = entry_cache.read(CACHE_NAME)
    good = {}
    for key, entry in entries.items():  # an entry that is not {name: {"ms": number, "err": number}} is skipped
        if isinstance(entry, dict) and all(
            isinstance(v, dict) and all(isinstance(v.get(f), (int, float)) for f in ("ms", "err"))
            for v in entry.values()
        ):
            good[key] = entry
    return good


def _write_cache(key: str, ms: dict, errors: dict) -> None:
    entries = _read_cache()
    entries[key] = {n: {"ms": round(ms[n], 5), "err": float(f"{errors[n]:.4g}")} for n in ms}
    entry_cache.write(CACHE_NAME, entries, "attention")


__all__ = [
    "BOUND",
    "CANDIDATES",
    "Choice",
    "CudnnFp8",
    "KitchenInt8",
    "LABELS",
    "PRIORITY",
    "SdpaCudnnFirst",
    "Shape",
    "cache_key",
    "choose",
    "clear",
    "decide",
    "decided",
    "give_way",
    "key_fields",
    "lookup",
    "measure",
    "plan",
    "probe_inputs",
    "worst_head_error",
]
