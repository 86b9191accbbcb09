"""The SwiGLU FFN of ComfyUI's native Ideogram 4 blocks with w1|w3 as ONE fused call (one activation quantization,
one GEMM with the SwiGLU in its epilogue: ``kernels.swiglu_w8a8_pair``), without changing the model.

ComfyUI's ``FeedForward`` (comfy/ldm/lumina/model.py) computes ``w2(silu(w1 x) * w3 x)``: two quantizer passes and
two GEMMs, plus the gate and up intermediates in memory. ``install`` swaps the class of each block's
``feed_forward`` for ``GateUpFeedForward``, a subclass whose ``forward`` runs the pair kernel on the two modules'
own int8 weights, read where they are, at call time. Nothing else changes: the same ``w1`` / ``w2`` / ``w3``
modules and parameters, the same state-dict keys (LoRA key mapping, saving), the same offload and LoRA machinery
(ModelPatcher moves, casts and patches each module as before). ``w2`` stays its own linear.

The fused call serves only when it computes exactly what the two modules would (``split_reason``); otherwise the
modules' own forwards run, unchanged, and the registry (and so the panel) records on both projections how the
pair ran, or why it did not. It does not serve when:
* a module is not the pack's int8 Linear any more (an object patch replaced it), or its weight is not an int8
  ``TensorWiseINT8Layout`` tensor (a protected float layer, another format);
* ComfyUI would not hand the int8 weight to the op: weight / bias functions (a LoRA applied on the fly in
  lowvram mode), a forced cast, ``_full_precision_mm``, autograd;
* a weight is not on the input's device (offloaded in lowvram / partial load, DynamicVRAM streaming): then each
  module casts its own weight through its cast buffer, which two casts in flight at once could share;
* w1 and w3 divide the input by different SmoothQuant vectors, or rotate it differently (ConvRot), or have a
  bias or a ``pre_quant_scale``;
* either module has forward hooks (their forwards are expected to run);
* the experiment ``no-fuse-gate-up`` (A/B measurements).
A LoRA merged in full-load mode is requantized into the int8 weight by ``set_weight``: the pair stays fused and
reads the merged weights.
"""

from __future__ import annotations

import weakref

import comfy.model_management
import comfy.ops
import torch
from comfy.ldm.lumina.model import FeedForward, clamp_fp16

from ... import kernels
from ...kernels import ops as kernel_ops
from ...kernels import settings
from .int8_ops import is_int8_weight

_is_compiling = torch.compiler.is_compiling
EXPERIMENT = "no-fuse-gate-up"  # w1 and w3 run as their own linears (A/B measurements)
SPLIT_NOTE = "w1|w3 not fused"


class GateUpFeedForward(FeedForward):
    """ComfyUI's FeedForward whose w1 / w3 run as one fused call where it can serve (module docstring).

    ``fused_calls`` / ``split_calls`` count the calls of each kind; ``last_split`` is why the last split call split
    (None after a fused call)."""

    fused_calls = 0
    split_calls = 0
    last_split: str | None = None
    ideogram4_pair = True  # found by int8_ops.label_sites, which sets site_label
    site_label: str | None = None  # the model's label (the prefix of its sites): one value for all its blocks

    def forward(self, x):
        why = split_reason(self, x)
        if _is_compiling():
            return self._traced_forward(x, why)
        if why is None:
            comfy.ops.run_every_op()
            self.fused_calls += 1
            self.last_split = None
            return self.w2(_gate_up(self, x))
        self.split_calls += 1
        self.last_split = why
        for m in (self.w1, self.w3):  # a hint left by a compiled graph would add its own reason to these records
            kernels.REGISTRY.set_split_hint(getattr(m, "site", None), None)
        y = super().forward(x)  # ComfyUI's own: w2(silu(w1 x) * w3 x), each module through its own forward
        for m, other in ((self.w1, "w3"), (self.w3, "w1")):
            kernels.REGISTRY.note_fusion(
                getattr(m, "site", None), f"not fused with {other}: {why}", f"{SPLIT_NOTE}: {why}"
            )
        return y

    def _traced_forward(self, x, why):
        """``forward`` while dynamo traces (torch.compile): the same computation without the counters (module state
        read in traced code would be a guard that fails on every call); the split decision is a constant of the
        traced graph, so a split pair's registry note is given once, when the graph is traced (``_hint_split``), and
        the registry puts it on every record the graph's ops make."""
        if why is None:
            comfy.ops.run_every_op()
            return self.w2(_gate_up(self, x))
        _hint_split(why, self.site_label)
        return super().forward(x)


def install(diffusion_model: torch.nn.Module) -> int:
    """Make every FeedForward whose w1 and w3 are the pack's Linears a ``GateUpFeedForward``; returns how many.

    Whether w1 and w3 divide by the same smoothing vector is compared here, once (a traced graph reads that
    answer: a comparison of tensor values cannot be traced without a graph break)."""
    n = 0
    for m in diffusion_model.modules():
        if type(m) is FeedForward and _ours(m.w1) and _ours(m.w3):
            m.__class__ = GateUpFeedForward
            _PAIRS.add(m)
            _same_smooth(m, getattr(m.w1, "input_divisor", None), getattr(m.w3, "input_divisor", None))
            n += 1
    return n


_PAIRS: weakref.WeakSet = weakref.WeakSet()  # every GateUpFeedForward installed (for _hint_split)


@torch.compiler.assume_constant_result
def _hint_split(why: str, label: str | None) -> bool:
    """Tell the registry how a split pair runs in a graph being traced: dynamo runs this once, at trace time (its
    arguments are constants of the graph), and the registry applies the note to every record of the sites of the
    model ``label``'s pairs that carries no fusion of its own (a pair that runs fused records its fusion). The sites
    are not arguments: they differ per block, and blocks compiled one by one share one traced forward (a recompile
    per block); the label is the same for every block of a model.

    A side effect under ``assume_constant_result`` is sound here because it is idempotent, depends only on the
    graph's constants (a changed reason means a failed guard, so a new trace that sets the new hint) and is only read
    when the ops record at run time. What it cannot cover: a graph run without a trace in this process (a compiled
    artifact loaded from a cache that skips dynamo) leaves the split records without the note (a label, not a path:
    the ops still record the path they ran)."""
    for ff in [ff for ff in list(_PAIRS) if ff.site_label == label]:
        for m, other in ((ff.w1, "w3"), (ff.w3, "w1")):
            kernels.REGISTRY.set_split_hint(
                getattr(m, "site", None), f"not fused with {other}: {why}", f"{SPLIT_NOTE}: {why}"
            )
    return True


def load_summary(diffusion_model: torch.nn.Module) -> str | None:
    """One line for the loader's summary: in how many blocks w1|w3 will run as one fused call, and why the others
    will not (as far as the weights tell at load: device, patches and hooks are decided per call)."""
    ffs = [m for m in diffusion_model.modules() if type(m) is GateUpFeedForward]
    if not ffs:
        return None
    reasons: dict[str | None, int] = {}
    for ff in ffs:
        why = split_reason(ff, torch.empty(0, device=ff.w1.weight.device))
        reasons[why] = reasons.get(why, 0) + 1
    fused = reasons.pop(None, 0)
    line = f"FFN w1|w3 as one fused call (one activation quantization, SwiGLU epilogue): {fused}/{len(ffs)} blocks"
    if reasons:
        line += "; as two linears: " + "; ".join(f"{n} block{'s' * (n > 1)} ({why})" for why, n in reasons.items())
    return line


def _ours(m) -> bool:
    return getattr(m, "ideogram4_int8", False)


def split_reason(ff, x: torch.Tensor) -> str | None:
    """None when w1 / w3 of ``ff`` can run as one fused call on ``x``; else why not (for the registry / panel)."""
    if settings.flag(EXPERIMENT):
        return settings.said(EXPERIMENT)
    w1, w3 = ff.w1, ff.w3
    if not (_ours(w1) and _ours(w3)):
        return "w1 or w3 is not the pack's INT8 linear (replaced by an object patch?)"
    if x.requires_grad and torch.is_grad_enabled():
        return "autograd is on (training): the modules' own forwards run"
    for name, m in (("w1", w1), ("w3", w3)):
        if len(m.weight_function) or len(m.bias_function):
            return f"a weight patch (LoRA) is applied on the fly to {name} (lowvram): its forward dequantizes"
        if getattr(m, "comfy_force_cast_weights", False) or m._full_precision_mm:
            return f"ComfyUI casts {name}'s weight to float (forced cast / full-precision matmul)"
        if not is_int8_weight(m.weight):
            return f"{name}'s weight is not an int8 TensorWiseINT8Layout tensor"
        if getattr(m.weight._params, "transposed", False):
            return f"{name}'s int8 weight is stored transposed"
        if hasattr(m, "_v"):
            return f"{name}'s weight is streamed by DynamicVRAM: each projection casts its own"
        if m.weight.device != x.device:
            return (
                f"{name}'s weight is offloaded (on {m.weight.device}, input on {x.device}): each projection "
                "casts its own"
            )
        if m.bias is not None or getattr(m, "pre_quant_scale", None) is not None:
            return f"{name} has a bias or a pre_quant_scale"
        if m._forward_hooks or m._forward_pre_hooks:
            return f"{name} has forward hooks: its own forward must run"
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return "global module forward hooks are registered: the modules' own forwards must run"
    if _group(w1) != _group(w3):
        return "w1 and w3 rotate their input differently (ConvRot)"
    if not _same_smooth(ff, w1.input_divisor, w3.input_divisor):
        return "w1 and w3 divide their input by different SmoothQuant vectors (two quantizer passes)"
    return None


def _group(m) -> int | None:
    params = m.weight._params
    return params.convrot_groupsize if getattr(params, "convrot", False) else None


def _same_smooth(ff, s1, s3) -> bool:
    """Whether w1 and w3 divide their input by the same vector. A comparison of two device tensors waits for the
    device, so it is made once per pair of tensors (their storage and version) and kept; moving the module makes
    new tensors, compared once again. Tensors made under ``torch.inference_mode`` (a model loaded inside
    ComfyUI's executor) have no version counter: for those the storage alone is the key."""
    if s1 is None or s3 is None:
        return s1 is s3
    if s1 is s3:
        return True
    if _is_compiling():  # the answer of the last eager comparison (install() makes one): values, not storage
        memo = ff.__dict__.get("_smooth_memo")
        return memo is not None and memo[1]
    key = (_tensor_key(s1), _tensor_key(s3))
    memo = ff.__dict__.get("_smooth_memo")
    if memo is not None and memo[0] == key:
        return memo[1]
    same = s1.shape == s3.shape and s1.device == s3.device and bool(torch.equal(s1, s3))
    ff._smooth_memo = (key, same)
    return same


def _tensor_key(t: torch.Tensor) -> tuple:
    try:
        version = t._version
    except RuntimeError:  # an inference tensor
        version = None
    return t.data_ptr(), version, t.device


def _gate_up(ff, x: torch.Tensor) -> torch.Tensor:
    """silu(w1 x) * w3 x through ``kernels.swiglu_w8a8_pair`` on the modules' int8 weights (conditions checked)."""
    w1, w3 = ff.w1, ff.w3
    q1, q3 = w1.weight, w3.weight
    # what the GEMM path divides by: s / f, nothing once the fold moved the whole vector into ffn_norm1 (the
    # module's input then arrives divided already)
    smooth = w1.input_divisor
    if smooth is not None and smooth.device != x.device:
        smooth = comfy.model_management.cast_to_device(smooth, x.device, None)
    group = _group(w1)  # ConvRot: rotated inside the one quantization of both projections (noted on both records)
    # the registered op while dynamo traces (counted there per site; the sites found by the weights, not passed:
    # per-layer constants would recompile every block, kernels/sites.py), the direct call in eager mode
    sites = (None, None) if _is_compiling() else (w1.site, w3.site)
    h = kernel_ops.swiglu_w8a8_pair(
        x, q1._qdata, q1._params.scale, q3._qdata, q3._params.scale, smooth, w1.gemm_path, *sites, x.dtype, group
    )
    if not _is_compiling():
        w1.op_calls += 1
        w3.op_calls += 1
    return clamp_fp16(h)


__all__ = ["GateUpFeedForward", "install", "split_reason", "load_summary", "EXPERIMENT"]
