"""No silent bypass: after each forward of the pack's MODELs, check that every quantized linear ran through the
pack's op, and label the model (registry -> panel, log once) when one did not.

Why this is needed: the pack overrides ``Linear._forward`` (and each FFN's gate/up pair); a ComfyUI that computes a
layer its own way never calls them (newer ComfyUI has fused INT8 FFN / norm functions that read the int8 weights
directly), and the GEMM then runs on ComfyUI's kernel while the panel would still list the pack's path.

How: each of the pack's Linears counts the calls that reach the op (``op_calls``; the fused gate/up call counts on
both projections; in a torch.compile'd graph the registered ops count them per call site). Forward hooks on the
diffusion model read the counters of its quantized linears before and after the forward; a linear that should have
run and did not is a bypass. ``llm_cond_proj`` runs only when the forward has a text context. Under torch.compile
the check runs inside the graph as the op ``after_forward`` on the forward's output; under CUDA-graph replay a layer
that did not move counts as replayed where a graph ran it through the op before.

Label after the fact, not refuse at load: whether ComfyUI takes its own route depends on run-time facts a probe at
load cannot show, and its route computes the same linear, only not on the pack's kernel. The first bypass is logged
once per model; the model's note in the registry (a warning in the panel) lists the layers and counts the forwards.
The details: docs/design/comfyui-ops.md.
"""

from __future__ import annotations

import itertools
import logging
import weakref

import torch

from ... import kernels
from ...kernels import model_notes
from .after_forward import after_forward, on_after_forward
from .int8_ops import compiled_calls, int8_linears, op_calls, runs_packs_op

log = logging.getLogger("comfyui_ideogram4_int8")

NOTE_KIND = "bypass"
_STATE = "_ideogram4_int8_coverage"
CONTEXT_ONLY = ("llm_cond_proj",)  # linears that run only when the forward has a text context
LAYER_NOTE = "not run through the pack's op in a forward: ComfyUI computed this layer its own way"
_KEYS = itertools.count()
_BY_KEY: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # the compiled graphs' after_forward key -> tally


class Coverage:
    """Per diffusion model: its linears (name, module) and the running tally (read by tests and the panel)."""

    def __init__(self, label: str, linears: list[tuple[str, torch.nn.Module]]) -> None:
        self.label = label
        self.linears = linears
        self.key = f"op_coverage:{label}:{next(_KEYS)}"  # names this tally in a compiled graph's after_forward op
        self.before: list[int] | None = None
        self.done = self.counts()  # the counters after the last checked forward (a compiled forward's "before")
        self.context = True
        self.forwards = 0
        self.bypassed_forwards = 0
        self.last: dict | None = None  # {"expected", "ran", "missing"} of the last forward
        self.logged = False
        self.replayed = 0  # forwards that ran as a replayed CUDA graph, in full (replayed()) or in part (_check)

    def counts(self) -> list[int]:
        return [op_calls(m) for _, m in self.linears]


def install(diffusion_model: torch.nn.Module, label: str) -> Coverage:
    """Attach the check to ``diffusion_model`` (forward pre-hook and hook); returns its tally."""
    state = Coverage(label, list(int8_linears(diffusion_model).items()))
    setattr(diffusion_model, _STATE, state)
    _BY_KEY[state.key] = state
    diffusion_model.register_forward_pre_hook(_before, with_kwargs=True)
    diffusion_model.register_forward_hook(_after, with_kwargs=True)
    return state


def coverage(diffusion_model: torch.nn.Module) -> Coverage | None:
    return getattr(diffusion_model, _STATE, None)


def _before(module, args, kwargs):
    if torch.compiler.is_compiling():  # traced: the check runs after the forward, in the graph (module docstring)
        return
    state = coverage(module)
    if state is not None:
        state.before = state.counts()
        context = kwargs.get("context", args[2] if len(args) > 2 else None)
        state.context = context is not None


def _after(module, args, kwargs, output):
    state = coverage(module)
    if state is None:
        return None
    if torch.compiler.is_compiling():
        if not isinstance(output, torch.Tensor):
            return None
        context = kwargs.get("context", args[2] if len(args) > 2 else None)
        return after_forward(output, state.key, context is not None)
    if state.before is not None:
        _check(state, state.before)
    return None


def replayed(diffusion_model: torch.nn.Module) -> None:
    """The forward under way ran as a replayed CUDA graph (``cuda_graphs.py``): no op ran in Python, so the check
    would call every linear bypassed. It is skipped; the captured forward, which ran the same ops, was checked."""
    state = coverage(diffusion_model)
    if state is not None:
        state.before = None
        state.replayed += 1


def _after_compiled(key: str, context: bool) -> None:
    """``after_forward``'s callback: the check of a compiled forward, against the counters of the last check."""
    state = _BY_KEY.get(key)
    if state is not None:
        state.context = context
        _check(state, state.done, compiled=True)


on_after_forward(_after_compiled)


def graph_trees_live() -> bool:
    """True while torch's CUDA-graph trees (the ``cudagraphs`` backend, inductor's ``reduce-overhead``) hold graphs
    for the current card: a compiled forward may then have replayed some of its layers."""
    if not torch.cuda.is_available():
        return False
    try:
        from torch._inductor import cudagraph_trees

        return cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False) is not None
    except Exception:  # noqa: BLE001 - a torch without this internal: the strict check stays
        return False


def _check(state: Coverage, before: list[int], compiled: bool = False) -> None:
    now = state.counts()
    expected, missing, replayed = 0, [], []
    trees = None  # looked up only when a compiled forward left a layer unmoved
    for (name, m), n0, n in zip(state.linears, before, now, strict=True):
        if not runs_packs_op(m.weight) or (not state.context and name.startswith(CONTEXT_ONLY)):
            continue
        expected += 1
        if n != n0:
            continue
        if compiled and compiled_calls(m):  # a compiled graph ran it through the op before
            if trees is None:
                trees = graph_trees_live()
            if trees:  # replayed, not routed around
                replayed.append(name)
                continue
        missing.append(name)
    state.before = None
    state.done = now
    state.forwards += 1
    state.replayed += bool(replayed)
    ran = expected - len(missing) - len(replayed)
    state.last = {"expected": expected, "ran": ran, "missing": missing, "replayed": replayed}
    if missing:
        state.bypassed_forwards += 1
        _label(state, missing, expected)


def _label(state: Coverage, missing: list[str], expected: int) -> None:
    shown = ", ".join(missing[:4]) + (f" … (+{len(missing) - 4})" if len(missing) > 4 else "")
    message = (
        f"{len(missing)} of {expected} quantized linears did not run through the pack's op ({shown}): this ComfyUI "
        f"computed them its own way (a fused or dequantizing route of its own), so their GEMM path is not what this "
        f"panel lists; seen in {state.bypassed_forwards} of {state.forwards} forwards"
    )
    model_notes.set_note(state.label, NOTE_KIND, message)
    for name in missing:
        kernels.REGISTRY.annotate(f"{state.label}/{name}", LAYER_NOTE)
    if not state.logged:
        state.logged = True
        log.warning("Ideogram4 INT8: %s: %s", state.label, message)


__all__ = ["install", "coverage", "replayed", "graph_trees_live", "Coverage", "NOTE_KIND", "LAYER_NOTE"]
