"""The q/k RMSNorm + RoPE kernel inside ComfyUI's attention, and its demotion when it fails."""

import torch
from comfyui_ideogram4_int8.kernels import model_notes

from comfy_checks.common import env_var, experiments, inputs, load, rel, write_all


def check_rope():
    """The blocks' q/k RMSNorm + RoPE through the pack's kernel (nodes/runtime/qk_rope.py): every attention of a pack
    MODEL swapped, ComfyUI's rotation matrix is [[c, -s], [s, c]] per pair (what the tables read), the swapped forward
    equals ComfyUI's own (fp32: to rounding; bf16: close), went through kernels.qk_norm_rope twice per block, and
    says so in the model note; the experiment rope=comfyui runs ComfyUI's exactly, labelled."""
    from comfyui_ideogram4_int8.nodes.runtime import qk_rope

    write_all()
    x, ctx, sigma, _ = inputs(batch=1)
    res = {"fused_note": qk_rope.FUSED_NOTE, "twin_note": qk_rope.TWIN_NOTE}
    for dtype in ("fp32", "bf16"):
        res.update({f"{dtype}/{k}": v for k, v in _rope_case(dtype, x, ctx, sigma).items()})
    return res


def _rope_errors(att, xa, freqs):
    """q after norm + RoPE, the pack's kernel and ComfyUI's, each against float64 of the same q."""
    import comfy.quant_ops
    from comfyui_ideogram4_int8.nodes.runtime import qk_rope

    b, n, _ = xa.shape
    with torch.no_grad():
        q, k, _ = att.qkv(xa).view(b, n, 3, att.num_heads, att.head_dim).unbind(dim=2)
        wq, wk = att.norm_q.weight.to(q.dtype), att.norm_k.weight.to(q.dtype)
        cos, sin = qk_rope.rope_tables(freqs, n, att.head_dim)
        ours = qk_rope.kernel_ops.qk_norm_rope(q, wq, cos, sin, att.norm_q.eps)
        theirs, _ = comfy.quant_ops.ck.rms_rope_split_half(q, k, freqs, wq, wk, att.norm_q.eps)
        y = q.double() * torch.rsqrt(q.double().pow(2).mean(-1, keepdim=True) + att.norm_q.eps) * wq.double()
        h = y.shape[-1] // 2
        c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
        exact = torch.cat((y[..., :h] * c - y[..., h:] * s, y[..., h:] * c + y[..., :h] * s), dim=-1)
    return {"q_err_ours": rel(ours, exact), "q_err_comfyui": rel(theirs, exact)}


def _rope_case(dtype, x, ctx, sigma):
    from comfy.ldm.ideogram4.model import Ideogram4Attention
    from comfyui_ideogram4_int8.nodes.runtime import qk_rope

    res = {}
    cond, _, _ = load("i4_w8a8.safetensors", dtype=dtype)
    dm = cond.model.diffusion_model
    atts = [b.attention for b in dm.layers]
    res["swapped"] = [type(a) is qk_rope.FusedRopeAttention for a in atts]
    seen, calls = {}, []
    hook = atts[0].register_forward_pre_hook(lambda m, a: seen.update(args=a))
    real = qk_rope.kernel_ops.qk_norm_rope
    qk_rope.kernel_ops.qk_norm_rope = lambda *a: calls.append(a[0].shape) or real(*a)
    try:
        model_notes.forget()
        cast = torch.bfloat16 if dtype == "bf16" else torch.float32
        with torch.no_grad():
            dm(x.to(cast), sigma, context=ctx.to(cast))
    finally:
        qk_rope.kernel_ops.qk_norm_rope = real
        hook.remove()
    res["kernel_calls"] = len(calls)
    res["note"] = model_notes.notes("conditional").get(qk_rope.NOTE_KIND)
    xa, mask, freqs = seen["args"]
    m = freqs.reshape(-1, freqs.shape[-3], 2, 2)
    rotation = torch.equal(m[..., 0, 1], -m[..., 1, 0]) and torch.equal(m[..., 1, 1], m[..., 0, 0])
    res["matrix_is_rotation"] = bool(rotation)
    res.update(_rope_errors(atts[0], xa, freqs))
    with torch.no_grad():
        ours = atts[0](xa, mask, freqs)
        comfy_own = Ideogram4Attention.forward(atts[0], xa, mask, freqs)
        with experiments("rope=comfyui"):
            switched = atts[0](xa, mask, freqs)
    res["vs_comfyui"] = rel(ours.float(), comfy_own.float())
    res["switch_equal"] = bool(torch.equal(switched, comfy_own))
    res["switch_note"] = model_notes.notes("conditional").get(qk_rope.NOTE_KIND)
    res["tables_of_a_batch"] = qk_rope.rope_tables(torch.cat([freqs, freqs]), xa.shape[1], atts[0].head_dim)
    return res


def check_rope_demotion():
    """The q/k norm + RoPE kernel failing to build or launch inside ComfyUI's attention (nodes/runtime/qk_rope.py): with
    Triton said to run here (its CPU interpreter) and the kernel made to raise, the attention returns what its twin
    gives, the failing variant is tried once and demoted, and the model note names the failure."""
    from comfyui_ideogram4_int8.kernels import backends
    from comfyui_ideogram4_int8.kernels import qk_norm_rope_triton as R
    from comfyui_ideogram4_int8.nodes.runtime import qk_rope

    write_all()
    x, ctx, sigma, _ = inputs(batch=1)
    # dequant-bf16: the linears quantize no activations, so under TRITON_INTERPRET below only the rope step asks for
    # a Triton kernel (this process's kernels were built for a GPU: any other would fail on its own)
    cond, _, _ = load("i4_w8a8.safetensors", dtype="bf16", path="dequant-bf16")
    dm = cond.model.diffusion_model
    att, seen = dm.layers[0].attention, {}
    hook = att.register_forward_pre_hook(lambda m, a: seen.update(args=a))
    try:
        with torch.no_grad():
            dm(x.to(torch.bfloat16), sigma, context=ctx.to(torch.bfloat16))
    finally:
        hook.remove()
    xa, mask, freqs = seen["args"]
    real, tries = R.qk_norm_rope_triton, []

    def fails(*a, **kw):
        tries.append(a[0].shape)
        raise RuntimeError("out of resources: shared memory")

    res = {"twin_note": qk_rope.TWIN_NOTE}
    R.qk_norm_rope_triton = fails
    backends.DEMOTIONS.clear()
    model_notes.forget()
    try:
        with torch.no_grad():
            twin = att(xa, mask, freqs)  # no interpreter: the twin without trying the kernel
            res["cpu_note"] = model_notes.notes("conditional").get(qk_rope.NOTE_KIND)
            res["cpu_tries"] = len(tries)
            with env_var("TRITON_INTERPRET", "1"):
                outs = [att(xa, mask, freqs)]  # the forward whose kernel fails: its own note says so
                res["note"] = model_notes.notes("conditional").get(qk_rope.NOTE_KIND)
                outs.append(att(xa, mask, freqs))
                res["later_note"] = model_notes.notes("conditional").get(qk_rope.NOTE_KIND)
    finally:
        R.qk_norm_rope_triton = real
        res["demoted"] = backends.DEMOTIONS.items()
        backends.DEMOTIONS.clear()
    res["tries"] = len(tries)
    res["equal"] = [bool(torch.equal(o, twin)) for o in outs]
    return res
