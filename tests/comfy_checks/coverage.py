"""Every quantized linear runs through the pack's op; a bypass is named (also under CUDA-graph replay)."""

import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.kernels import model_notes
from comfyui_ideogram4_int8.nodes.runtime import int8_ops

from comfy_checks.common import inputs, latent_node, load, write_all


def check_coverage():
    """Every quantized linear runs through the pack's op in each forward (registry calls per forward = quantized
    linears; llm_cond_proj only with a text context), through the sampler too; a forward that routes around the op
    (a linear computed with F.linear on its dequantized weight, an FFN computed without its modules' forwards) gets
    the model labelled (registry note, status report, layer reasons) and logged once."""
    import logging

    import torch.nn.functional as F
    from comfyui_ideogram4_int8.nodes import status_report
    from comfyui_ideogram4_int8.nodes.runtime import op_coverage

    write_all()
    cond, uncond, _ = load("i4_w8a8.safetensors")
    x, ctx, sigma, mask = inputs()
    dm = cond.model.diffusion_model
    cov = op_coverage.coverage(dm)
    quantized = {n for n, m in int8_ops.int8_linears(dm).items() if int8_ops.is_int8_weight(m.weight)}

    def calls():
        return sum(r.calls for r in kernels.REGISTRY.layers("conditional") if r.layer in quantized)

    res = {"quantized": len(quantized), "all_linears": len(int8_ops.int8_linears(dm))}
    for case, kw in (("conditional", {"context": ctx}), ("image_only", {})):
        c0 = calls()
        with torch.no_grad():
            dm(x, sigma, **kw)
        res[f"{case}/registry_calls"] = calls() - c0
        res[f"{case}/coverage"] = cov.last
    f0 = cov.forwards
    latent_node(cond, uncond, ctx, 3, preset="custom", steps=2)
    res["sampler_forwards"] = cov.forwards - f0
    res["sampler_uncond_forwards"] = op_coverage.coverage(uncond.model.diffusion_model).forwards
    res["notes_before"] = model_notes.notes()
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Catch(logging.WARNING)
    logging.getLogger("comfyui_ideogram4_int8").addHandler(handler)
    o = dm.layers[2].attention.o
    o.forward = lambda inp: F.linear(inp, o.weight.dequantize().to(inp.dtype))
    ff = dm.layers[1].feed_forward

    def ffn_of_its_own(inp):
        g = F.linear(inp, ff.w1.weight.dequantize().to(inp.dtype))
        u = F.linear(inp, ff.w3.weight.dequantize().to(inp.dtype))
        return ff.w2(F.silu(g) * u)

    ff.forward = ffn_of_its_own
    try:
        for _ in range(2):
            with torch.no_grad():
                dm(x, sigma, context=ctx)
    finally:
        logging.getLogger("comfyui_ideogram4_int8").removeHandler(handler)
    res["bypass/coverage"] = cov.last
    res["bypass/counts"] = [cov.bypassed_forwards, cov.forwards]
    res["bypass/note"] = model_notes.notes("conditional").get(op_coverage.NOTE_KIND)
    res["bypass/logged"] = [m for m in seen if "did not run through the pack's op" in m]
    rec = {r.layer: r for r in kernels.REGISTRY.layers("conditional")}
    res["bypass/o_reason"] = rec["layers.2.attention.o"].reason
    res["bypass/qkv_reason"] = rec["layers.2.attention.qkv"].reason
    report = status_report.status_report()
    res["report_bypass"] = {m["label"]: m["bypass"] for m in report["models"]}
    res["report_notes"] = report["status"]["notes"]
    try:
        import jsonschema

        jsonschema.validate(report, status_report.load_schema(), cls=jsonschema.Draft202012Validator)
        res["report_valid"] = True
    except ImportError:
        res["report_valid"] = None
    return res


def check_coverage_replay():
    """A compiled forward checked while CUDA-graph trees live (TorchCompileModel's cudagraphs backend): layers whose
    counters did not move count as replayed when a compiled graph ran them through the op before, and as bypassed
    when none ever did; without graph trees the same forward is a bypass of every unmoved layer. Driven through the
    check's compiled entry (what the graph's after_forward op calls) with the op-call counters set by hand."""
    from comfyui_ideogram4_int8.kernels import ops as kernel_ops
    from comfyui_ideogram4_int8.nodes.runtime import op_coverage

    write_all()
    cond, _, _ = load("i4_w8a8.safetensors")
    dm = cond.model.diffusion_model
    cov = op_coverage.coverage(dm)
    quantized = [(n, m) for n, m in cov.linears if int8_ops.is_int8_weight(m.weight)]
    live = [False]
    op_coverage.graph_trees_live = lambda: live[0]

    def compiled_forward(skip=()):  # the registered ops' per-site counts of one compiled forward
        for name, m in quantized:
            if name not in skip:
                kernel_ops.OP_CALLS[m.site] += 1
        op_coverage._after_compiled(cov.key, True)
        return dict(cov.last, note=model_notes.notes(cov.label).get(op_coverage.NOTE_KIND))

    res = {"quantized": len(quantized), "sites": all(m.site for _, m in quantized)}
    res["ran_all"] = compiled_forward()
    r0 = cov.replayed
    live[0] = True
    res["replayed_all"] = compiled_forward(skip={n for n, _ in quantized})
    res["replayed_forwards"] = cov.replayed - r0
    never = quantized[5]
    kernel_ops.OP_CALLS[never[1].site] = 0  # no compiled graph ever ran this one through the op
    cov.done = cov.counts()  # (as the last check left the counters)
    res["never_ran"] = never[0]
    res["part_replayed"] = compiled_forward(skip={n for n, _ in quantized[3:]})
    model_notes.forget()
    live[0] = False
    res["strict"] = compiled_forward(skip={quantized[0][0]})
    return res
