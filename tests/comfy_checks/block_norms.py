"""The blocks' modulated RMSNorms through the pack's ops, and their quantized handoff to the linears."""

import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.kernels import model_notes, settings
from comfyui_ideogram4_int8.nodes import loader_nodes

from comfy_checks.common import GPU, G, env_var, experiments, inputs, latent_node, load, write_all


def check_block_norms():
    """The blocks' modulated RMSNorms through the pack's ops (nodes/runtime/block_norms.py): every block of a pack MODEL
    swapped; a forward of the model equals ComfyUI's own block forward bit for bit on the CPU (the ops run their
    twins, ComfyUI's own ops, there), in fp32 and bf16, with each block calling the pre-norm and the gated residual
    twice; the model note says which ran and why; the experiment block-norms=comfyui runs ComfyUI's forward,
    labelled; the streamed path is the same code (the streaming checks run it)."""
    from comfy.ldm.ideogram4.model import Ideogram4TransformerBlock
    from comfyui_ideogram4_int8.nodes.runtime import block_norms

    write_all()
    x, ctx, sigma, _ = inputs(batch=2)
    res = {"fused_note": block_norms.FUSED_NOTE, "twin_note": block_norms.TWIN_NOTE}
    for dtype in ("fp32", "bf16"):
        cond, _, _ = load("i4_w8a8.safetensors", dtype=dtype)
        dm = cond.model.diffusion_model
        res[f"{dtype}/swapped"] = [type(b) is block_norms.FusedNormBlock for b in dm.layers]
        calls = []
        real = (block_norms.kernels.rms_norm_modulate, block_norms.kernels.rms_norm_gated_residual)
        pre, res_ = real
        block_norms.kernels.rms_norm_modulate = lambda *a, c=calls, f=pre, **kw: c.append("pre") or f(*a, **kw)
        block_norms.kernels.rms_norm_gated_residual = lambda *a, c=calls, f=res_, **kw: c.append("res") or f(*a, **kw)
        cast = torch.bfloat16 if dtype == "bf16" else torch.float32
        model_notes.forget()
        try:
            with torch.no_grad():
                ours = dm(x.to(cast), sigma, context=ctx.to(cast))
        finally:
            block_norms.kernels.rms_norm_modulate, block_norms.kernels.rms_norm_gated_residual = real
        res[f"{dtype}/calls"] = [calls.count("pre"), calls.count("res")]
        res[f"{dtype}/note"] = model_notes.notes("conditional").get(block_norms.NOTE_KIND)
        for b in dm.layers:
            b.__class__ = Ideogram4TransformerBlock
        with torch.no_grad():
            theirs = dm(x.to(cast), sigma, context=ctx.to(cast))
        for b in dm.layers:
            b.__class__ = block_norms.FusedNormBlock
        res[f"{dtype}/equal"] = bool(torch.equal(ours, theirs))
        with experiments("block-norms=comfyui"), torch.no_grad():
            switched = dm(x.to(cast), sigma, context=ctx.to(cast))
        res[f"{dtype}/switch_equal"] = bool(torch.equal(switched, theirs))
        res[f"{dtype}/switch_note"] = model_notes.notes("conditional").get(block_norms.NOTE_KIND)
    return res


def check_block_norm_handoff():
    """The pre-norms hand their quantized output to the linears they feed (nodes/runtime/block_norms.py,
    kernels/handoff.py). Anywhere: which linears take plain rows (W8A8 with its smoothing folded, bf16 quantized on
    load: qkv and w1 of every block; int8_convrot: none, its quantizer rotates), the blocks ask the pre-norm for the
    handoff exactly for those, the experiment block-norms=no-handoff for none, and no offer outlives a forward. With
    COMFY_GPU=1 (bf16 MODELs: the kernels run): sampled latents with and without the handoff are equal bit for bit, each
    block's two handoffs were taken in every pass, and the model note says so."""
    from comfyui_ideogram4_int8.kernels import handoff
    from comfyui_ideogram4_int8.nodes.runtime import block_norms
    from comfyui_ideogram4_int8.nodes.runtime.int8_ops import quantizes_plain_rows

    write_all()
    x, ctx, sigma, _ = inputs(batch=1)
    res = {"handoff_note": block_norms.HANDOFF_NOTE}
    files = {
        "w8a8": ("i4_w8a8.safetensors", loader_nodes.SAME_FILE),
        "int8_convrot": ("i4_int8_convrot.safetensors", "i4_unconditional_int8_convrot.safetensors"),
        "bf16": ("i4_bf16.safetensors", "i4_unconditional_bf16.safetensors"),
    }
    real = block_norms.kernels.rms_norm_modulate
    for fmt, names in files.items():
        cond, uncond, _ = load(*names, dtype="bf16")
        dm = cond.model.diffusion_model
        res[f"{fmt}/plain_rows"] = [
            [quantizes_plain_rows(b.attention.qkv), quantizes_plain_rows(b.feed_forward.w1)] for b in dm.layers
        ]
        for setting in ("", block_norms.NO_HANDOFF):
            asked = []
            listed = f"{block_norms.EXPERIMENT}={setting}" if setting else ""
            block_norms.kernels.rms_norm_modulate = lambda *a, f=real, c=asked, **kw: (
                c.append(kw["hand_off"]) or f(*a, **kw)
            )
            try:
                with experiments(listed), torch.inference_mode():  # as ComfyUI runs nodes
                    dm(x.bfloat16(), sigma, context=ctx.bfloat16())
            finally:
                block_norms.kernels.rms_norm_modulate = real
            res[f"{fmt}/{setting or 'default'}/asked"] = asked
            res[f"{fmt}/{setting or 'default'}/pending"] = handoff.pending()
        if fmt == "w8a8":  # where something could write the row first, or the pack's streaming binds run before qkv
            from comfyui_ideogram4_int8.ideogram4.streaming import _Bind

            b0, b1 = dm.layers[0], dm.layers[1]
            handles = [
                b0.attention.qkv.register_forward_pre_hook(lambda m, args: None),  # another node's hook
                b1.attention.qkv.register_forward_pre_hook(_Bind(None, 1, "qkv")),
            ]
            b1.feed_forward.forward = b1.feed_forward.forward  # an instance-level forward (a patch)
            try:
                res["w8a8/hooked/reaches"] = [
                    block_norms._reaches_untouched(b.attention, b.attention.qkv) for b in (b0, b1)
                ] + [block_norms._reaches_untouched(b.feed_forward, b.feed_forward.w1) for b in (b0, b1)]
            finally:
                for h in handles:
                    h.remove()
                del b1.feed_forward.forward
        if GPU and fmt == "w8a8":
            s = int(torch.randint(0, 2**31, (1,), generator=G))
            model_notes.forget()
            # every pass runs Python (no graphs): the handoffs can be counted; inference mode as ComfyUI's executor
            with env_var(settings.CUDA_GRAPHS, "0"), torch.inference_mode():
                with experiments(f"block-norms={block_norms.NO_HANDOFF}"):
                    off = latent_node(cond, uncond, ctx[:1], s, preset="Turbo 12", w=512, h=512)
                res["gpu/off_note"] = model_notes.notes("conditional").get(block_norms.NOTE_KIND)
                res["gpu/off_handoffs"] = kernels.REGISTRY.launches["quant_handoff"]
                model_notes.forget()
                on = latent_node(cond, uncond, ctx[:1], s, preset="Turbo 12", w=512, h=512)
            res["gpu/note"] = model_notes.notes("conditional").get(block_norms.NOTE_KIND)
            res["gpu/handoffs"] = kernels.REGISTRY.launches["quant_handoff"]
            res["gpu/equal"] = bool(torch.equal(on, off))
            res["gpu/max_abs"] = (on.double() - off.double()).abs().max().item()
            res["gpu/layers"] = len(dm.layers)
            res["gpu/pending"] = handoff.pending()
    return res
