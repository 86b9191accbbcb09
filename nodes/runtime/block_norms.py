"""ComfyUI's Ideogram 4 block with its four modulated RMSNorms through the pack's fused kernel.

ComfyUI's ``Ideogram4TransformerBlock`` normalizes, then multiplies by ``1 + scale`` before its attention and its FFN,
and normalizes, multiplies by ``tanh(gate)`` and adds the residual after them: per site two or three elementwise
kernels, each a round trip of a [tokens, 4608] bf16 tensor: together the largest share of a step after the GEMMs and
the attention (docs/design/measurements.md).
``kernels.rms_norm_modulate`` / ``rms_norm_gated_residual`` read each row once, with the unfused ops' roundings.

``install`` swaps the class of each block for ``FusedNormBlock``, a subclass whose ``forward`` does what ComfyUI's
does with those sites replaced: the same modules, parameters, state-dict keys and call order of the linears (the
low-VRAM streamer binds its pieces from hooks on them), the norms' weights fetched through
``comfy.ops.cast_bias_weight`` as ComfyUI's RMSNorm fetches them.

The two pre-norms also quantize their output per token in the same pass and hand it to the linear they feed
(``attention.qkv``; ``feed_forward.w1`` / the gate/up pair), when that linear quantizes plain rows
(``int8_ops.quantizes_plain_rows``: smoothing folded, no ConvRot, no float path): the linear then skips its
quantizer's read of the row and its launch, with the same int8 values (``kernels/handoff.py``). Only where nothing
can write the row in between (``_reaches_untouched``): ComfyUI inference tensors carry no version counter to tell.

ComfyUI's own forward runs (the model note ``block_norms`` says why) when: training; the experiment
``block-norms=comfyui`` (A/B measurements). ``block-norms=no-handoff``: the fused norms without the quantization
(A/B). Under torch.compile ComfyUI's forward is traced as it is (inductor fuses these elementwise ops itself).
"""

from __future__ import annotations

import comfy.ops
import torch
from comfy.ldm.ideogram4 import model as ideogram4_model
from comfy.ldm.lumina.model import FeedForward

from ... import kernels
from ...kernels import handoff, settings
from ...kernels.dispatch import block_norm_demotion
from . import swapped_blocks
from .ffn_fusion import GateUpFeedForward
from .int8_ops import quantizes_plain_rows
from .qk_rope import FusedRopeAttention
from .swapped_blocks import swap_class, write_note

# block-norms=comfyui: ComfyUI's own norms and multiplies; =no-handoff: the fused norms, the linears quantize (A/B)
EXPERIMENT = "block-norms"
NO_HANDOFF = "no-handoff"
NOTE_KIND = "block_norms"
TOPIC = "block RMSNorms with their modulation and residual"
FUSED_NOTE = f"{TOPIC}: the pack's fused kernel (rms_modulate)"
HANDOFF_NOTE = f"{FUSED_NOTE}, quantizing the qkv and gate/up inputs in the same pass"
NO_HANDOFF_NOTE = (
    f"{FUSED_NOTE}; {settings.EXPERIMENTS_VAR} has {EXPERIMENT}={NO_HANDOFF}: the linears quantize their inputs"
)
TWIN_NOTE = f"{TOPIC}: ComfyUI's ops (the twin)"  # + why no kernel
_is_compiling = torch.compiler.is_compiling
_RUN_EVERY_OP = getattr(comfy.ops, "run_every_op", None)


def comfyui_reason() -> str | None:
    return swapped_blocks.comfyui_reason(EXPERIMENT, "ComfyUI's own")


# forwards whose first op is the linear a pre-norm feeds (attention: qkv(x); FFN: w1, or the gate/up pair on x)
_PLAIN_FORWARDS = (
    ideogram4_model.Ideogram4Attention.forward,
    FusedRopeAttention.forward,
    FeedForward.forward,
    GateUpFeedForward.forward,
)
_MODULE = torch.nn.modules.module


def _reaches_untouched(container: torch.nn.Module, linear: torch.nn.Module) -> bool:
    """Whether the pre-norm's output reaches ``linear`` through ``container`` (the block's attention or FFN) with
    nothing able to write it first: a forward of ComfyUI's or the pack's (not replaced on the instance), no forward
    pre-hook but the pack's streaming binds, none global; and ``linear`` quantizes plain rows."""
    if type(container).forward not in _PLAIN_FORWARDS or "forward" in container.__dict__:
        return False
    if _MODULE._global_forward_pre_hooks:
        return False
    for m in (container, linear):
        if not all(getattr(h, "leaves_input_alone", False) for h in m._forward_pre_hooks.values()):
            return False
    return quantizes_plain_rows(linear)


def _eps(norm, x: torch.Tensor) -> float:
    return norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps  # F.rms_norm's default


class FusedNormBlock(ideogram4_model.Ideogram4TransformerBlock):
    """ComfyUI's Ideogram 4 block whose modulated norms run the pack's fused kernel (module docstring)."""

    site_label: str | None = None

    def forward(self, x, attn_mask, freqs_cis, adaln_input, transformer_options={}):  # noqa: B006 - ComfyUI's signature
        if _is_compiling():
            return super().forward(x, attn_mask, freqs_cis, adaln_input, transformer_options=transformer_options)
        why = comfyui_reason()
        no_handoff = settings.experiment(EXPERIMENT) == NO_HANDOFF
        hand_attn = hand_ffn = False
        if why is None and not no_handoff:
            hand_attn = _reaches_untouched(self.attention, self.attention.qkv)
            hand_ffn = _reaches_untouched(self.feed_forward, self.feed_forward.w1)
        self._note(why, x.device, no_handoff, hand_attn or hand_ffn)
        if why is not None:
            return super().forward(x, attn_mask, freqs_cis, adaln_input, transformer_options=transformer_options)
        if _RUN_EVERY_OP is not None:  # what each of ComfyUI's RMSNorm calls does first (an interrupt check)
            _RUN_EVERY_OP()
        mod = self.adaln_modulation(adaln_input)
        scale_msa, gate_msa, scale_mlp, gate_mlp = mod.chunk(4, dim=-1)
        gate_msa = torch.tanh(gate_msa)
        gate_mlp = torch.tanh(gate_mlp)
        scale_msa = 1.0 + scale_msa
        scale_mlp = 1.0 + scale_mlp
        try:
            h = self._pre_norm(self.attention_norm1, x, scale_msa, hand_attn)
            attn_out = self.attention(h, attn_mask, freqs_cis, transformer_options=transformer_options)
        finally:
            handoff.clear()  # an offer qkv did not take (another path ran) dies with its block step
        x = self._residual_norm(self.attention_norm2, attn_out, gate_msa, x)
        try:
            h = self._pre_norm(self.ffn_norm1, x, scale_mlp, hand_ffn)
            ffn_out = self.feed_forward(h)
        finally:
            handoff.clear()
        return self._residual_norm(self.ffn_norm2, ffn_out, gate_mlp, x)

    @staticmethod
    def _pre_norm(norm, x, scale, hand_off: bool):
        weight, _, stream = comfy.ops.cast_bias_weight(norm, x, offloadable=True)
        out = kernels.rms_norm_modulate(x, weight, scale, _eps(norm, x), hand_off=hand_off)
        comfy.ops.uncast_bias_weight(norm, weight, None, stream)
        return out

    @staticmethod
    def _residual_norm(norm, y, gate, residual):
        weight, _, stream = comfy.ops.cast_bias_weight(norm, y, offloadable=True)
        out = kernels.rms_norm_gated_residual(residual, y, weight, gate, _eps(norm, y))
        comfy.ops.uncast_bias_weight(norm, weight, None, stream)
        return out

    def _note(self, why: str | None, device: torch.device, no_handoff: bool, handing_off: bool) -> None:
        fused = NO_HANDOFF_NOTE if no_handoff else HANDOFF_NOTE if handing_off else FUSED_NOTE
        write_note(self.site_label, NOTE_KIND, TOPIC, why, device, fused, TWIN_NOTE, block_norm_demotion())


def install(diffusion_model: torch.nn.Module, label: str | None) -> int:
    """Make every ComfyUI Ideogram 4 block of ``diffusion_model`` a ``FusedNormBlock`` labelled ``label``."""
    return swap_class(diffusion_model, ideogram4_model.Ideogram4TransformerBlock, FusedNormBlock, label)


__all__ = [
    "FusedNormBlock",
    "install",
    "EXPERIMENT",
    "NO_HANDOFF",
    "NOTE_KIND",
    "FUSED_NOTE",
    "HANDOFF_NOTE",
    "NO_HANDOFF_NOTE",
    "TWIN_NOTE",
]
