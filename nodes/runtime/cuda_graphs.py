"""CUDA graphs for the pack's MODELs inside the pack's sampler: each branch's pass captured once, replayed after.

A replay shrinks a pass's host work (Python, about 1700 launches) to the input copies and one call: two cards stop
taking turns on one interpreter, and on one card a host slower than the GPU stops setting the pace. Graphs are on
wherever a pass can run as one; ``IDEOGRAM4_INT8_CUDA_GRAPHS=off`` turns them off.

A model's graphs (``ideogram4.graph_replay.PassGraphs``, kept on its diffusion model) replay from the first pass of
the next prompt while the inputs' shapes and the weights stay the same. Their key holds the weights' addresses and
the MODEL's patch set (``patches_uuid``): a LoRA or a move gets a new capture, never a stale replay, at the first
pass where that resolution and streaming plan ran before (its warm-up is done). The graphs of a card share one
memory pool; the pack's ModelPatcher releases it when ComfyUI moves the weights (``streaming_patcher``) and, while it
lives, its size is in ComfyUI's reserved VRAM (``model_management.EXTRA_RESERVED_VRAM``) outside the pack's own
runs: ComfyUI would otherwise count the pool's free blocks as free memory (``_apply_reserve_locked``).

For each run, ``pass_graphs`` adds a ``DIFFUSION_MODEL`` wrapper (ComfyUI's wrapper mechanism, as TorchCompileModel's
helpers use it) to each of the pack's MODELs and takes it off after; natives (MODELs without the pack's linears) are
never touched.

A pass stays eager, and the panel says why (model note ``cuda_graphs``), under: the setting; the first pass of a
model at a resolution or streaming plan (it autotunes: nothing may benchmark during a capture); weights off the card
outside the pack's streaming (ComfyUI's own partial load); another node's block patches (their Python would run only
at capture); torch.compile; the panel's per-GEMM timing; an input that is not a tensor or a plain value; a failed
capture. Low-VRAM streaming does not keep a pass eager: while graphs are on, each pass streams on its own
(``BlockStreamer.per_pass``), so its copies from pinned memory are captured with its kernels; only weights streamed
from pageable memory (past ComfyUI's pinned-memory limit) keep it eager.

The registry records the calls of the eager and captured passes only (no Python runs in a replay); the note says how
many passes were replayed, and the bypass check (``op_coverage``) skips replays.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time

import comfy.model_management
import comfy.patcher_extension
import torch

from ... import kernels
from ...ideogram4 import graph_replay
from ...ideogram4.graph_replay import graphs_of
from ...kernels import model_notes, settings
from . import op_coverage
from .native_model import model_labels

log = logging.getLogger("comfyui_ideogram4_int8")

ENV_GRAPHS = settings.CUDA_GRAPHS
NOTE_KIND = "cuda_graphs"
WRAPPER_KEY = "ideogram4_int8_cuda_graphs"
BLOCK_PATCHES = ("patches", "patches_replace")
COMPILE_KEY = "torch.compile"  # the key of ComfyUI's TorchCompileModel wrapper (comfy_api.torch_helpers)


def setting() -> str:
    """``IDEOGRAM4_INT8_CUDA_GRAPHS``: "off", else "on" (auto and on: graphs wherever a pass can run as one)."""
    return "off" if settings.cuda_graphs() == "off" else "on"


def run_reason() -> str | None:
    """Why no pass of this run may use graphs (the setting), or None."""
    return settings.said(ENV_GRAPHS) if setting() == "off" else None


def _off_reason(patcher, transformer_options: dict) -> str | None:
    """Why this pass must stay eager (see the module docstring), or None."""
    if kernels.REGISTRY.timing_enabled:
        return "the panel's per-GEMM timing is on (it records events around each GEMM call)"
    stream = _stream_of(patcher)
    if stream is not None and stream.streamer.stats.pageable:
        return (
            f"low-VRAM streaming from pageable memory ({stream.streamer.stats.pageable} tensors past the pinned-memory "
            "limit: a graph copies from pinned memory only)"
        )
    for kind in BLOCK_PATCHES:
        if any(transformer_options.get(kind, {}).values()):
            return f"another node patches the blocks (transformer_options '{kind}')"
    wrappers = transformer_options.get("wrappers", {})
    if COMPILE_KEY in wrappers.get(comfy.patcher_extension.WrappersMP.APPLY_MODEL, {}):
        return "torch.compile is on (TorchCompileModel)"
    return None


def _stream_of(patcher):
    """The model's low-VRAM streaming state (``streaming_patcher``) while blocks stream, else None."""
    stream = getattr(patcher.model, "ideogram4_stream", None)
    return stream if stream is not None and stream.plan.streamed else None


def fingerprint(patcher, diffusion_model: torch.nn.Module) -> tuple | None:
    """What a graph of this MODEL's pass is valid for beyond its inputs: the MODEL's patch set and the address of
    every weight and buffer (a graph reads them there). While blocks stream, their weights are host memory the graph
    copies from, and the streamer's slots what it copies into: both addresses count. None when a weight is off the
    GPU otherwise (ComfyUI's own partial load casts it in Python at each call)."""
    ptrs: list = [getattr(patcher, "patches_uuid", None)]
    stream = _stream_of(patcher)
    if stream is not None:
        ptrs += [id(stream.streamer)] + [b.data_ptr() for b in stream.streamer.buffers]
    for t in itertools.chain(diffusion_model.parameters(), diffusion_model.buffers()):
        if t.device.type != "cuda" and stream is None:
            return None
        ptrs.append(t.data_ptr())
    return tuple(ptrs)


_RESERVED_LOCK = threading.Lock()
_RESERVED: dict[str, int] = {}  # bytes of the graph pools, per device, while their graphs live
_APPLIED = [0]  # bytes this module has added to ComfyUI's reserved VRAM now
_RUNS = [0]  # the pack's sampling runs in progress (pass_graphs)


def _apply_reserve_locked() -> None:
    """ComfyUI's reserved VRAM holds the pools' bytes, except while the pack's own sampling runs.

    ComfyUI counts a pool's free blocks as free memory, and outside the pack's runs they are not free to anything
    else while the graphs live. During a run they are the passes' activations, which the run's memory requests ask
    for anyway: counting them as reserved too made ComfyUI unload part of a streaming branch at the next prompt
    (more blocks streamed and both branches captured again; docs/performance.md, "Low VRAM")."""
    target = 0 if _RUNS[0] else sum(_RESERVED.values())
    comfy.model_management.EXTRA_RESERVED_VRAM += target - _APPLIED[0]
    _APPLIED[0] = target


def _count_pool(device: torch.device, delta: int) -> None:
    """A graph pool grew or was released."""
    with _RESERVED_LOCK:
        key = str(device)
        _RESERVED[key] = max(0, _RESERVED.get(key, 0) + delta)
        _apply_reserve_locked()


@contextlib.contextmanager
def _pack_run():
    with _RESERVED_LOCK:
        _RUNS[0] += 1
        _apply_reserve_locked()
    try:
        yield
    finally:
        with _RESERVED_LOCK:
            _RUNS[0] -= 1
            _apply_reserve_locked()


graph_replay.on_pool_bytes(_count_pool)


def reserved_for_graphs() -> dict[str, int]:
    """Bytes of graph pools counted in ComfyUI's reserved VRAM outside the pack's runs, per device."""
    with _RESERVED_LOCK:
        return {k: v for k, v in _RESERVED.items() if v}


class _GraphWrapper:
    """The ``DIFFUSION_MODEL`` wrapper of one MODEL for one run; its graphs live on the model."""

    def __init__(self, patcher, label: str, run_off: str | None = None) -> None:
        self.patcher, self.label = patcher, label
        self.graphs = graphs_of(patcher.model.diffusion_model)
        self.modes: dict[str, int] = {"eager": 0, "captured": 0, "replayed": 0}
        self.failures_before = len(self.graphs.stats.failures)
        self.retried_before = len(self.graphs.stats.retried)
        self.run_off = run_off  # why no pass of this run uses graphs (run_reason), or None
        self.off: str | None = None
        self.streams: set = set()  # streamers set to per-pass streaming for this run (set back after it)

    def __call__(self, executor, x, timesteps, context=None, attention_mask=None, transformer_options={}, **kwargs):  # noqa: B006 - ComfyUI's signature
        on_gpu = isinstance(x, torch.Tensor) and x.device.type == "cuda"
        if torch.compiler.is_compiling() or not on_gpu:  # a CPU pass: graphs do not apply, nothing to say
            return executor(x, timesteps, context, attention_mask, transformer_options, **kwargs)
        why = self.run_off or _off_reason(self.patcher, transformer_options)
        dm = executor.class_obj
        fp = None if why else fingerprint(self.patcher, dm)
        if why is None and fp is None:
            why = "weights not all on the card"
        if why is not None:
            self.off = why
            self.modes["eager"] += 1
            return executor(x, timesteps, context, attention_mask, transformer_options, **kwargs)

        stream = _stream_of(self.patcher)
        if stream is not None and stream.streamer not in self.streams:  # each pass streams on its own: it may be
            stream.streamer.per_pass = True  # captured with its copies
            self.streams.add(stream.streamer)

        def one_pass(x, timesteps, context, attention_mask, **kw):
            return executor(x, timesteps, context, attention_mask, transformer_options, **kw)

        inputs = (x, timesteps, context, attention_mask)
        warm_key = stream.plan if stream is not None else None  # a warm-up counts for the same streaming plan only
        started = time.perf_counter()
        try:
            try:
                out, mode = self.graphs.run(one_pass, inputs, kwargs, fp, warm_key)
            except torch.OutOfMemoryError:
                # a new input shape's eager pass, on a card whose graph pool holds the activations of the shapes
                # captured before (out of ComfyUI's reserve during the run, so ComfyUI counted it as free): the pool
                # goes and the pass runs again (its next call captures anew)
                if not release(self.patcher):
                    raise
                log.info("ideogram4-int8: CUDA graphs released for a pass that ran out of memory; running it again")
                torch.cuda.empty_cache()
                out, mode = self.graphs.run(one_pass, inputs, kwargs, fp, warm_key)
        except TypeError as exc:  # an input without a signature (signature() raised before anything ran)
            self.off = str(exc)
            self.modes["eager"] += 1
            return executor(x, timesteps, context, attention_mask, transformer_options, **kwargs)
        self.modes[mode] += 1
        if mode == "replayed":
            op_coverage.replayed(dm)
        elif self.modes[mode] == 1:  # where a run's first step goes: its first eager pass and its capture
            log.debug(
                "ideogram4-int8: %s: first %s pass of this run, %.3f s on the host",
                self.label,
                mode,
                time.perf_counter() - started,
            )
        return out

    def note(self) -> str:
        m, failures = self.modes, self.graphs.stats.failures[self.failures_before :]
        retried = self.graphs.stats.retried[self.retried_before :]
        retry = (
            f"a capture with no warm-up under these weights failed ({retried[0]}): one eager pass first"
            if retried
            else ""
        )
        if m["replayed"]:
            captured = f"{m['captured']} captured" if m["captured"] else "no capture: graphs kept from an earlier run"
            eager = f", {m['eager']} eager" if m["eager"] else ""
            text = (
                f"CUDA graphs: {m['replayed']} of {sum(m.values())} passes replayed ({captured}{eager}); the layer "
                "records are from the eager and captured passes (a replay runs the same kernels without Python)"
            )
        elif failures:
            text = f"CUDA graphs: capture failed ({failures[0]}): every pass ran eagerly"
        elif self.off:
            text = f"CUDA graphs off: {self.off}"
        else:
            return f"CUDA graphs: {retry}" if retry else ""
        if self.off and m["replayed"]:
            text += f"; some passes eager: {self.off}"
        return f"{text}; {retry}" if retry else text


@contextlib.contextmanager
def pass_graphs(models):
    """For one sampling run: the pack's MODELs among ``models`` replay each pass as a CUDA graph where they can
    (module docstring). The graphs stay with the models for later runs; the panel's note says what this run did."""
    installed: list[tuple[object, _GraphWrapper]] = []
    run_off = run_reason()
    for model in models:
        labels = model_labels(model)
        if not labels or any(model is m for m, _ in installed):
            continue
        wrapper = _GraphWrapper(model, labels[0], run_off)
        if run_off is not None and wrapper.graphs.graphs:  # switched off: the memory of earlier runs' graphs goes
            release(model)
        model.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY, wrapper)
        installed.append((model, wrapper))
    try:
        with _pack_run():
            yield [w for _, w in installed]
    finally:
        for model, wrapper in installed:
            model.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY)
            for streamer in wrapper.streams:  # eager runs prefetch the next pass's first weights again
                streamer.per_pass = False
            model_notes.set_note(wrapper.label, NOTE_KIND, wrapper.note() or None)


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
]
