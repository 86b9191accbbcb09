"""CUDA graphs for the pack's MODELs inside the pack's sampler: each branch's pass captured once, replayed after.

What it buys: the host work of a pass (Python and about 1700 launches) shrinks to the input copies and one replay.
With one branch per card (``branch_device_nodes.py``) the two passes then stop taking turns on one interpreter, which
is what lets them overlap. On one card it depends on the host: where a pass's Python is shorter than its GPU time,
graphs save little and their capture costs a pass's Python once; where it is not, every step waits for the launches.
So by default (``IDEOGRAM4_INT8_CUDA_GRAPHS`` unset) graphs run when the branches are on two cards, and on one card
once a timed pass of the model showed its host time reached ``LAUNCH_BOUND`` of its GPU time (its second pass: the
first one autotunes); that decision is kept with the model. ``=1`` turns them on everywhere, ``=0`` off.

Graphs outlive a run: a model's graphs (``ideogram4.graph_replay.PassGraphs``, kept on its diffusion model) replay
from the first pass of the next prompt while the inputs' shapes and the weights stay the same. Their key holds the
weights' addresses and the MODEL's patch set (``patches_uuid``): a LoRA or a move gets a new capture, never a stale
replay. Every graph on a card shares one memory pool; the pack's ModelPatcher releases it whenever ComfyUI moves the
weights (partial unload, unload, unpatch: ``streaming_patcher``), and while graphs hold memory its size is added to
ComfyUI's reserved VRAM (``comfy.model_management.EXTRA_RESERVED_VRAM``), so ComfyUI's loading decisions do not count
the pool's free blocks as free memory.

How, on ComfyUI's interfaces: for each run of the sampler, ``pass_graphs`` adds a ``DIFFUSION_MODEL`` wrapper
(ComfyUI's wrapper mechanism, the one TorchCompileModel's helpers use) to each of the pack's MODELs and takes it off
after.

When a pass stays eager, and the panel says why (model note ``cuda_graphs``): the setting (one card, or ``=0``);
low-VRAM streaming (blocks are copied in per pass by Python hooks); weights not all on the card; another node's block
patches (``patches`` / ``patches_replace``: their Python would run only at capture); torch.compile (TorchCompileModel's
wrapper); the panel's per-GEMM timing (events per call); an input that is not a tensor or a plain value; a capture
that failed. Natives (MODELs without the pack's linears) are never touched: they run as ComfyUI runs them.

The registry records the calls of the eager and captured passes only (no Python runs in a replay); the note says how
many passes were replayed, and the bypass check (``op_coverage``) skips replays (the captured pass, which ran the same
ops, was checked).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from time import perf_counter as _clock  # module-local: the CPU test replaces it

import comfy.model_management
import comfy.patcher_extension
import torch

from .. import kernels
from ..ideogram4 import graph_replay
from ..ideogram4.graph_replay import graphs_of
from . import op_coverage
from .native_model import model_labels

ENV_GRAPHS = "IDEOGRAM4_INT8_CUDA_GRAPHS"
NOTE_KIND = "cuda_graphs"
WRAPPER_KEY = "ideogram4_int8_cuda_graphs"
BLOCK_PATCHES = ("patches", "patches_replace")
COMPILE_KEY = "torch.compile"  # the key of ComfyUI's TorchCompileModel wrapper (comfy_api.torch_helpers)
LAUNCH_BOUND = 0.9  # host time / GPU time of a pass from which its launches, not the GPU, set the pace
TIMED_PASS = 2  # auto on one card: each branch times its second pass (the first autotunes and loads kernels)
ONE_CARD = "both passes on one card"
PACE_ATTR = "ideogram4_graph_pace"  # (host ms, GPU ms) of a diffusion model's timed pass, kept across runs


def launch_bound(host_ms: float, gpu_ms: float) -> bool:
    """Whether a pass was paced by its launches: its host time reached ``LAUNCH_BOUND`` of its GPU time (a GPU that
    waits for launches shows about as much GPU time as host time, idle included)."""
    return gpu_ms > 0 and host_ms >= LAUNCH_BOUND * gpu_ms


def setting() -> str:
    """``IDEOGRAM4_INT8_CUDA_GRAPHS``: "on" (1/on/true/yes), "off" (0/off/false/no), else "auto" (two cards only)."""
    value = os.environ.get(ENV_GRAPHS, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    if value in ("1", "on", "true", "yes"):
        return "on"
    return "auto"


def run_reason(models) -> str | None:
    """Why no pass of this run may use graphs, from the setting and the cards: None when they may. Auto on one card
    returns the reason that holds until a timed pass shows the launches set the pace (``one_card_auto``): when the
    GPU is the limit, a capture costs more than the graphs save."""
    mode = setting()
    if mode == "off":
        return f"{ENV_GRAPHS}={os.environ.get(ENV_GRAPHS)}"
    if mode == "on":
        return None
    if one_card_auto(models):
        return f"{ONE_CARD} and no pass timed yet (the GPU sets the pace until one is; {ENV_GRAPHS}=1 turns them on)"
    return None


def one_card_auto(models) -> bool:
    """Auto, with both branches on one card: graphs wait for a timed pass (module docstring)."""
    return setting() == "auto" and len({str(getattr(m, "load_device", "")) for m in models}) < 2


def _pace_reason(pace: tuple[float, float]) -> str | None:
    """The run's reason after a timed pass: None (graphs on) when the launches set the pace."""
    if launch_bound(*pace):
        return None
    return (
        f"{ONE_CARD} and the GPU sets the pace (host {pace[0]:.0f} ms for {pace[1]:.0f} ms of GPU per pass; "
        f"{ENV_GRAPHS}=1 turns them on)"
    )


def _off_reason(patcher, transformer_options: dict) -> str | None:
    """Why this pass must stay eager (see the module docstring), or None."""
    if kernels.REGISTRY.timing_enabled:
        return "the panel's per-GEMM timing is on (it records events around each GEMM call)"
    stream = getattr(patcher.model, "ideogram4_stream", None)
    if stream is not None and stream.plan.streamed:
        return f"low-VRAM streaming ({len(stream.plan.streamed)} blocks copied in by Python hooks each pass)"
    for kind in BLOCK_PATCHES:
        if any(transformer_options.get(kind, {}).values()):
            return f"another node patches the blocks (transformer_options '{kind}')"
    wrappers = transformer_options.get("wrappers", {})
    if COMPILE_KEY in wrappers.get(comfy.patcher_extension.WrappersMP.APPLY_MODEL, {}):
        return "torch.compile is on (TorchCompileModel)"
    return None


def fingerprint(patcher, diffusion_model: torch.nn.Module) -> tuple | None:
    """What a graph of this MODEL's pass is valid for beyond its inputs: the MODEL's patch set and the address of
    every weight and buffer (a graph reads them there). None when one is not on a GPU."""
    ptrs = [getattr(patcher, "patches_uuid", None)]
    for t in itertools.chain(diffusion_model.parameters(), diffusion_model.buffers()):
        if t.device.type != "cuda":
            return None
        ptrs.append(t.data_ptr())
    return tuple(ptrs)


_RESERVED_LOCK = threading.Lock()
_RESERVED: dict[str, int] = {}  # bytes this module added to ComfyUI's reserved VRAM, per device


def _count_pool(device: torch.device, delta: int) -> None:
    """A graph pool grew or was released: ComfyUI's reserved VRAM follows (ComfyUI counts a pool's free blocks as
    free memory; they are not free to anything else while the graphs live)."""
    with _RESERVED_LOCK:
        key = str(device)
        held = _RESERVED.get(key, 0)
        new = max(0, held + delta)
        comfy.model_management.EXTRA_RESERVED_VRAM += new - held
        _RESERVED[key] = new


graph_replay.on_pool_bytes(_count_pool)


def reserved_for_graphs() -> dict[str, int]:
    """Bytes of graph pools added to ComfyUI's reserved VRAM, per device."""
    with _RESERVED_LOCK:
        return {k: v for k, v in _RESERVED.items() if v}


class _GraphWrapper:
    """The ``DIFFUSION_MODEL`` wrapper of one MODEL for one run; its graphs and pace decision live on the model."""

    def __init__(self, patcher, label: str, run_off: str | None = None, probe: bool = False) -> None:
        self.patcher, self.label = patcher, label
        self.dm = patcher.model.diffusion_model
        self.graphs = graphs_of(self.dm)
        self.modes: dict[str, int] = {"eager": 0, "captured": 0, "replayed": 0}
        self.failures_before = len(self.graphs.stats.failures)
        self.run_off = run_off  # why no pass of this run uses graphs (run_reason), or None
        self.off: str | None = None
        pace = getattr(self.dm, PACE_ATTR, None)
        self.probe = probe and pace is None  # auto on one card, never timed: eager until a timed pass decides
        if probe and pace is not None:  # decided in an earlier run of this model
            self.run_off = _pace_reason(pace)
        self.probed = 0  # eager passes run while probing
        self.pending: tuple | None = None  # (host ms, start event, end event) of the timed pass, until read

    @property
    def timed(self) -> tuple[float, float] | None:
        """(host ms, GPU ms) of the model's timed pass, this run's or an earlier one's."""
        return getattr(self.dm, PACE_ATTR, None)

    def _timed(self, run, device):
        """Auto on one card: the pass runs eagerly; the ``TIMED_PASS``-th is timed (host wall time, GPU events), and
        once its events are done (read without waiting, at a later pass) graphs come on for this and later runs if the
        launches set its pace (``launch_bound``), else stay off with the numbers. Returns the pass's output, or None
        when this pass is the first after the decision (it then goes the normal way)."""
        if self.pending is not None and self.pending[2].query():
            host_ms, start, end = self.pending
            self.pending, self.probe = None, False
            pace = (host_ms, start.elapsed_time(end))
            setattr(self.dm, PACE_ATTR, pace)
            self.run_off = _pace_reason(pace)
            if self.run_off is None:
                self.off = None
            return None
        self.probed += 1
        self.modes["eager"] += 1
        self.off = self.run_off
        if self.probed != TIMED_PASS or self.pending is not None:
            return run()
        stream = torch.cuda.current_stream(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        t0 = _clock()
        out = run()
        host_ms = (_clock() - t0) * 1e3
        end.record(stream)
        self.pending = (host_ms, start, end)
        return out

    def __call__(self, executor, x, timesteps, context=None, attention_mask=None, transformer_options={}, **kwargs):  # noqa: B006 - ComfyUI's signature
        on_gpu = isinstance(x, torch.Tensor) and x.device.type == "cuda"
        if torch.compiler.is_compiling() or not on_gpu:  # a CPU pass: graphs do not apply, nothing to say
            return executor(x, timesteps, context, attention_mask, transformer_options, **kwargs)
        if self.probe and _off_reason(self.patcher, transformer_options) is None:
            out = self._timed(
                lambda: executor(x, timesteps, context, attention_mask, transformer_options, **kwargs), x.device
            )
            if out is not None:
                return out
        why = self.run_off or _off_reason(self.patcher, transformer_options)
        dm = executor.class_obj
        fp = None if why else fingerprint(self.patcher, dm)
        if why is None and fp is None:
            why = "weights not all on the card"
        if why is not None:
            self.off = why
            self.modes["eager"] += 1
            return executor(x, timesteps, context, attention_mask, transformer_options, **kwargs)

        def one_pass(x, timesteps, context, attention_mask, **kw):
            return executor(x, timesteps, context, attention_mask, transformer_options, **kw)

        try:
            out, mode = self.graphs.run(one_pass, (x, timesteps, context, attention_mask), kwargs, fp)
        except TypeError as exc:  # an input without a signature (signature() raised before anything ran)
            self.off = str(exc)
            self.modes["eager"] += 1
            return executor(x, timesteps, context, attention_mask, transformer_options, **kwargs)
        self.modes[mode] += 1
        if mode == "replayed":
            op_coverage.replayed(dm)
        return out

    def note(self) -> str:
        m, failures = self.modes, self.graphs.stats.failures[self.failures_before :]
        if m["replayed"]:
            captured = f"{m['captured']} captured" if m["captured"] else "no capture: graphs kept from an earlier run"
            eager = f", {m['eager']} eager" if m["eager"] else ""
            text = (
                f"CUDA graphs: {m['replayed']} of {sum(m.values())} passes replayed ({captured}{eager}); the layer "
                "records are from the eager and captured passes (a replay runs the same kernels without Python)"
            )
            if self.timed is not None and setting() == "auto":
                text += (
                    f"; on one card because the launches set the pace (host {self.timed[0]:.0f} ms for "
                    f"{self.timed[1]:.0f} ms of GPU in a timed pass)"
                )
        elif failures:
            text = f"CUDA graphs: capture failed ({failures[0]}): every pass ran eagerly"
        elif self.off:
            text = f"CUDA graphs off: {self.off}"
        else:
            return ""
        if self.off and m["replayed"]:
            text += f"; some passes eager: {self.off}"
        return text


@contextlib.contextmanager
def pass_graphs(models):
    """For one sampling run: the pack's MODELs among ``models`` replay each pass as a CUDA graph where they can
    (module docstring). The graphs stay with the models for later runs; the panel's note says what this run did."""
    installed: list[tuple[object, _GraphWrapper]] = []
    run_off, probe = run_reason(models), one_card_auto(models)
    for model in models:
        labels = model_labels(model)
        if not labels or any(model is m for m, _ in installed):
            continue
        wrapper = _GraphWrapper(model, labels[0], run_off, probe)
        if setting() == "off" and wrapper.graphs.graphs:  # switched off: the memory of earlier runs' graphs goes
            release(model)
        model.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY, wrapper)
        installed.append((model, wrapper))
    try:
        yield [w for _, w in installed]
    finally:
        for model, wrapper in installed:
            model.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY)
            kernels.REGISTRY.set_model_note(wrapper.label, NOTE_KIND, wrapper.note() or None)


def release(model) -> int:
    """Drop the graphs of ``model`` (a MODEL or a diffusion model) and of every model sharing its card's pool; returns
    the bytes their captures had reserved."""
    dm = getattr(getattr(model, "model", None), "diffusion_model", model)
    return graph_replay.release_graphs_of(dm)


__all__ = [
    "pass_graphs",
    "release",
    "graphs_of",
    "reserved_for_graphs",
    "ENV_GRAPHS",
    "NOTE_KIND",
    "setting",
    "run_reason",
    "one_card_auto",
    "launch_bound",
]
