"""ComfyUI's Ideogram 4 attention with the q / k RMSNorm + split-half RoPE through the pack's fused kernel.

ComfyUI's ``Ideogram4Attention`` normalizes and rotates q and k with comfy-kitchen's ``rms_rope_split_half``, which
reads the rotation as a [.., D/2, 2, 2] float32 matrix per token: about twice the time of the pack's
``qk_norm_rope`` kernel (``kernels/qk_norm_rope_triton.py``), which the reference DiT runs, and the largest kernel
difference between the ComfyUI path and the reference DiT (docs/design/measurements.md).

``install`` swaps the class of each block's ``attention`` for ``FusedRopeAttention``, a subclass whose ``forward``
does what ComfyUI's does with that one step replaced: the same modules, parameters and state-dict keys, the norms'
weights fetched through ``comfy.ops.cast_bias_weight`` as ComfyUI fetches them (offload and casts unchanged). The
rotation's cos / sin come from ComfyUI's matrix ([[c, -s], [s, c]] per pair: ``precompute_freqs_cis`` duplicates
the frequencies over both halves), read once per forward and shared by the blocks.

ComfyUI's own step runs instead (the model note ``rope`` says why) when: training; a rotation that is not one
[N, D/2] table (a batch of different positions); the experiment ``rope=comfyui`` (A/B measurements). The pack's op
runs its pure-torch twin where the kernel cannot run (no Triton GPU) or failed to build or launch for this head size
and dtype (demoted once, ``kernels.dispatch.qk_rope_demotion``); the note says which and why.
"""

from __future__ import annotations

import comfy.ops
import torch
from comfy.ldm.ideogram4 import model as ideogram4_model
from torch.utils.weak import WeakIdKeyDictionary

from ...kernels import ops as kernel_ops
from ...kernels.dispatch import qk_rope_demotion
from . import swapped_blocks
from .swapped_blocks import swap_class, write_note

EXPERIMENT = "rope"  # rope=comfyui: ComfyUI's own q/k norm + RoPE (A/B measurements)
NOTE_KIND = "rope"
TOPIC = "q/k RMSNorm + RoPE"
FUSED_NOTE = f"{TOPIC}: the pack's fused kernel (qk_norm_rope)"
TWIN_NOTE = f"{TOPIC}: the pack's op (qk_norm_rope) as its pure-torch twin"  # + why the kernel cannot or did not run
_is_compiling = torch.compiler.is_compiling
_TABLES = WeakIdKeyDictionary()  # ComfyUI's rotation matrix (by identity) -> ((tokens, head_dim), (cos, sin))


def rope_tables(freqs_cis, tokens: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(cos, sin), contiguous float32 [tokens, head_dim / 2], of ComfyUI's split-half rotation matrix, or None when
    it is not one table for every row of the batch."""
    half = head_dim // 2
    if not isinstance(freqs_cis, torch.Tensor) or freqs_cis.shape[-3:] != (half, 2, 2):
        return None
    if freqs_cis.numel() != tokens * half * 4:
        return None
    m = freqs_cis.reshape(tokens, half, 2, 2)
    return m[..., 0, 0].float().contiguous(), m[..., 1, 0].float().contiguous()


def _tables(freqs_cis, tokens: int, head_dim: int):
    if _is_compiling():  # traced: computed in the graph (inductor fuses it)
        return rope_tables(freqs_cis, tokens, head_dim)
    hit = _TABLES.get(freqs_cis) if isinstance(freqs_cis, torch.Tensor) else None
    if hit is None or hit[0] != (tokens, head_dim):
        hit = ((tokens, head_dim), rope_tables(freqs_cis, tokens, head_dim))
        if isinstance(freqs_cis, torch.Tensor):
            _TABLES[freqs_cis] = hit
    return hit[1]


def comfyui_reason() -> str | None:
    return swapped_blocks.comfyui_reason(EXPERIMENT, "ComfyUI's rms_rope_split_half")


class FusedRopeAttention(ideogram4_model.Ideogram4Attention):
    """ComfyUI's Ideogram 4 attention whose q/k norm + RoPE runs the pack's fused kernel (module docstring)."""

    site_label: str | None = None

    def forward(self, x, attn_mask, freqs_cis, transformer_options={}):  # noqa: B006 - ComfyUI's signature
        batch, tokens, _ = x.shape
        why = comfyui_reason()
        tables = None if why else _tables(freqs_cis, tokens, self.head_dim)
        if why is None and tables is None:
            why = "the rotation is not one [tokens, D/2] table (a batch of different positions): ComfyUI's RoPE"
        if why is not None:
            self._note(why, x.device)
            return super().forward(x, attn_mask, freqs_cis, transformer_options=transformer_options)
        cos, sin = tables
        qkv = self.qkv(x).view(batch, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(dim=2)
        q_scale, _, q_stream = comfy.ops.cast_bias_weight(self.norm_q, q, offloadable=True)
        k_scale, _, k_stream = comfy.ops.cast_bias_weight(self.norm_k, k, offloadable=True)
        q = kernel_ops.qk_norm_rope(q, q_scale, cos, sin, self.norm_q.eps)
        k = kernel_ops.qk_norm_rope(k, k_scale, cos, sin, self.norm_k.eps)
        comfy.ops.uncast_bias_weight(self.norm_q, q_scale, None, q_stream)
        comfy.ops.uncast_bias_weight(self.norm_k, k_scale, None, k_stream)
        self._note(None, x.device)  # after the kernel ran: a variant it demoted just now shows in this note
        out = ideogram4_model.optimized_attention_masked(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            self.num_heads,
            attn_mask,
            skip_reshape=True,
            transformer_options=transformer_options,
        )
        return self.o(out)

    def _note(self, why: str | None, device: torch.device) -> None:
        """The model's ``rope`` note, written when it changes (the twin's, with the failure, once the kernel is
        demoted)."""
        if not _is_compiling():
            write_note(self.site_label, NOTE_KIND, TOPIC, why, device, FUSED_NOTE, TWIN_NOTE, qk_rope_demotion())


def install(diffusion_model: torch.nn.Module, label: str | None) -> int:
    """Make every block's ComfyUI attention a ``FusedRopeAttention`` labelled ``label``; returns how many."""
    return swap_class(diffusion_model, ideogram4_model.Ideogram4Attention, FusedRopeAttention, label)


__all__ = ["FusedRopeAttention", "install", "rope_tables", "EXPERIMENT", "NOTE_KIND", "FUSED_NOTE", "TWIN_NOTE"]
