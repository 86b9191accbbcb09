"""torch.compile on ComfyUI's native Ideogram 4 with the pack's ops: no graph breaks, no recompiles over sampling
steps, every layer still seen by the registry and the bypass check."""

import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.kernels import model_notes
from comfyui_ideogram4_int8.nodes import loader_nodes, sampler_nodes
from comfyui_ideogram4_int8.nodes.runtime import int8_ops

from comfy_checks.common import CFG, G, experiments, inputs, latent_node, load, write_all


def _records(label):
    return {r.layer: (r.path, r.reason, r.fusion, r.calls) for r in kernels.REGISTRY.layers(label)}


def _compile_case(dm, opts, label, steps, kw, quantized):
    """One model and input kind: dynamo's explain of the forward (ComfyUI's args), then eager and
    torch.compile(fullgraph=True, aot_eager) over ``steps`` sampling steps (new noise and sigma, same shapes), never
    recompiling; the registry records and the coverage tally after each."""
    import torch._dynamo as dynamo
    from comfyui_ideogram4_int8.nodes.runtime import op_coverage
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    out = {}
    cov = op_coverage.coverage(dm)
    x0, ctx, _, mask = inputs()
    kw = {k: {"context": ctx, "attention_mask": mask}[k] for k in kw}
    xs = [torch.randn(x0.shape, generator=G) for _ in range(steps)]
    sigmas = [torch.rand(x0.shape[0], generator=G) * 0.9 + 0.05 for _ in range(steps)]
    dynamo.reset()
    counters.clear()
    with torch.no_grad():
        report = dynamo.explain(dm)(xs[0], sigmas[0], transformer_options=opts, **kw)
    # explain's graph_break_count is its graph count - 1: the forward hooks run as frames of their own (called from
    # nn.Module's __call__, which dynamo skips), so op_coverage's hook is a second graph (its after_forward op alone)
    # without any break; the breaks are the reasons dynamo gave (and its graph_break counter)
    out["graphs"] = report.graph_count
    out["break_reasons"] = [str(b.reason).splitlines()[0] for b in report.break_reasons[:3]]
    out["graph_break_counter"] = sum(counters["graph_break"].values())
    out["graph_ops"] = [
        sorted({str(n.target) for n in g.graph.nodes if n.op == "call_function"})[:3]
        if len(g.graph.nodes) < 8
        else len(g.graph.nodes)
        for g in report.graphs
    ]
    dynamo.reset()
    with torch.no_grad():
        eager = [dm(x, s, transformer_options=opts, **kw) for x, s in zip(xs, sigmas, strict=True)]
    rec_eager = _records(label)
    f0, b0 = cov.forwards, cov.bypassed_forwards
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(dm, backend=counter, fullgraph=True)
    with torch.no_grad(), dynamo.config.patch(error_on_recompile=True):
        got = [compiled(x, s, transformer_options=opts, **kw) for x, s in zip(xs, sigmas, strict=True)]
    rec = _records(label)
    out["frames"] = counter.frame_count
    out["max_abs"] = max((a - b).abs().max().item() for a, b in zip(got, eager, strict=True))
    out["eager_norm"] = min(e.norm().item() for e in eager)
    # every quantized linear recorded each compiled forward, with eager's path, reason and fusion
    out["records_equal"] = {k: v[:3] for k, v in rec.items()} == {k: v[:3] for k, v in rec_eager.items()}
    out["calls_per_layer"] = sorted({rec[n][3] - rec_eager[n][3] for n in quantized})
    out["coverage_forwards"] = cov.forwards - f0
    out["coverage_bypassed"] = cov.bypassed_forwards - b0
    out["coverage_last"] = cov.last
    out["ops_in_graph"] = sorted(
        {
            str(n.target)
            for g in counter.graphs
            for n in g.graph.nodes
            if n.op == "call_function" and "ideogram4_int8" in str(n.target)
        }
    )
    return out, got[0], (xs[0], sigmas[0], kw)


def _per_block_case(dm, opts, label, kw, quantized):
    """Each block compiled on its own (KJNodes' "transformer blocks only"; also what a graph break between blocks
    leaves): the blocks share one forward, so a per-layer constant among the ops' arguments would recompile it for
    every block. Frames compiled over 2 steps, output and registry records against eager."""
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    x0, ctx, _, mask = inputs()
    kw = {k: {"context": ctx, "attention_mask": mask}[k] for k in kw}
    steps = [(torch.randn(x0.shape, generator=G), torch.rand(x0.shape[0], generator=G) * 0.9 + 0.05) for _ in range(2)]
    dynamo.reset()
    with torch.no_grad():
        eager = [dm(x, s, transformer_options=opts, **kw) for x, s in steps]
    rec_eager = _records(label)
    counter = CompileCounterWithBackend("aot_eager")
    blocks = list(dm.layers)
    for i, block in enumerate(blocks):
        dm.layers[i] = torch.compile(block, backend=counter)
    try:
        with torch.no_grad():
            got = [dm(x, s, transformer_options=opts, **kw) for x, s in steps]
    finally:
        for i, block in enumerate(blocks):
            dm.layers[i] = block
    rec = _records(label)
    return {
        "blocks": len(blocks),
        "frames": counter.frame_count,
        "max_abs": max((a - b).abs().max().item() for a, b in zip(got, eager, strict=True)),
        "records_equal": {k: v[:3] for k, v in rec.items()} == {k: v[:3] for k, v in rec_eager.items()},
        "calls_per_layer": sorted({rec[n][3] - rec_eager[n][3] for n in quantized}),
    }


def _sampling_options(patcher):
    """The transformer_options a sampler hands apply_model: the MODEL's own, with its wrappers."""
    return dict(patcher.model_options.get("transformer_options", {}), wrappers=patcher.wrappers)


def check_compile():
    """torch.compile and ComfyUI's native Ideogram 4 with the pack's ops, loaded by the pack's loader from the
    transformerlab W8A8 layout (smoothing folded at load: w1|w3 fused; and with w1/w3 mode 'ratio': split) and the
    int8_convrot layout: zero graph breaks, fullgraph aot_eager equal to eager, no recompiles over sampling steps, the
    registry and the bypass check still see every layer; ComfyUI's own torch.compile wrapper (TorchCompileModel's)
    over a sampler run; a bypass inside a compiled graph is still caught."""
    import torch._dynamo as dynamo
    import torch.nn.functional as F
    from comfy_api.torch_helpers import set_torch_compile_wrapper
    from comfy_extras.nodes_torch_compile import skip_torch_compile_dict
    from comfyui_ideogram4_int8.nodes.runtime import op_coverage
    from torch._dynamo.testing import CompileCounterWithBackend

    write_all()
    res = {"torch": torch.__version__}
    for fmt, cf, uf, mode in (
        ("w8a8", "i4_w8a8.safetensors", loader_nodes.SAME_FILE, ""),
        ("w8a8_ratio", "i4_w8a8.safetensors", loader_nodes.SAME_FILE, "ratio"),
        ("int8_convrot", "i4_int8_convrot.safetensors", "i4_unconditional_int8_convrot.safetensors", ""),
        ("w8a8_fp8_protected", "i4_w8a8.safetensors", loader_nodes.SAME_FILE, ""),  # the fp8 op in the graph
    ):
        extra = {"protected_layers": "fp8"} if fmt.endswith("fp8_protected") else {}
        with experiments(f"smooth-fold={mode}" if mode else ""):
            cond, uncond, _ = load(cf, uf, **extra)
        for branch, patcher, cases in (
            (
                "conditional",
                cond,
                (("conditional", ("context",)), ("conditional_masked", ("context", "attention_mask"))),
            ),
            ("unconditional", uncond, (("image_only", ()),)),
        ):
            dm = patcher.model.diffusion_model
            opts = dict(patcher.model_options.get("transformer_options", {}))  # the pack's attention override
            label = op_coverage.coverage(dm).label
            quantized = {
                n
                for n, m in int8_ops.int8_linears(dm).items()
                if int8_ops.is_int8_weight(m.weight) or int8_ops.is_fp8_weight(m.weight)
            }
            if not any(kw for _, kw in cases):
                quantized -= {"llm_cond_proj"}
            res[f"{fmt}/{branch}/quantized"] = len(quantized)
            res[f"{fmt}/{branch}/fp8"] = sum(
                int8_ops.is_fp8_weight(m.weight) for m in int8_ops.int8_linears(dm).values()
            )
            res[f"{fmt}/{branch}/override"] = sorted(opts)
            for case, kw in cases:
                r, _, _ = _compile_case(dm, opts, label, 3, kw, quantized)
                for k, v in r.items():
                    res[f"{fmt}/{case}/{k}"] = v
            for k, v in _per_block_case(dm, opts, label, cases[0][1], quantized).items():
                res[f"{fmt}/{branch}/per_block/{k}"] = v
            if fmt == "w8a8" and branch == "conditional":
                # a linear computed around the pack's op inside the compiled graph is still seen
                o = dm.layers[2].attention.o
                o.forward = lambda inp, o=o: F.linear(inp, o.weight.dequantize().to(inp.dtype))
                try:
                    r, _, _ = _compile_case(dm, opts, label, 2, ("context",), quantized)
                finally:
                    del o.forward
                res["bypass/break_reasons"] = r["break_reasons"]
                res["bypass/coverage_last"] = r["coverage_last"]
                res["bypass/compiled_forwards"] = [r["coverage_forwards"], r["coverage_bypassed"]]
                res["bypass/note"] = model_notes.notes(label).get(op_coverage.NOTE_KIND)
    # ComfyUI's own torch.compile wrapper (what its TorchCompileModel node sets, with its guard filter) on a clone of
    # each branch, through ComfyUI's apply_model: the two models share ComfyUI's forward code, so dynamo compiles it
    # once per model (text context / image-only) and never again over the steps; each step equals eager
    cond, uncond, _ = load("i4_w8a8.safetensors")
    counter = CompileCounterWithBackend("aot_eager")
    x0, ctx, _, _ = inputs()
    steps = [(torch.randn(x0.shape, generator=G), torch.rand(x0.shape[0], generator=G) * 0.9 + 0.05) for _ in range(3)]
    dynamo.reset()
    diffs, norms, forwards, clones = [], [], [], {}
    for patcher, context in ((cond, ctx), (uncond, None)):
        m = clones[context is None] = patcher.clone()
        set_torch_compile_wrapper(model=m, backend=counter, options={"guard_filter_fn": skip_torch_compile_dict})
        cov = op_coverage.coverage(patcher.model.diffusion_model)
        f0 = cov.forwards
        for i, (x, sigma) in enumerate(steps):
            with torch.no_grad():
                want = patcher.model.apply_model(
                    x, sigma, c_crossattn=context, transformer_options=_sampling_options(patcher)
                )
                with dynamo.config.patch(error_on_recompile=i > 0):
                    got = m.model.apply_model(x, sigma, c_crossattn=context, transformer_options=_sampling_options(m))
            diffs.append((got - want).abs().max().item())
            norms.append(want.norm().item())
        forwards.append(cov.forwards - f0)
        res[f"wrapper/{'image_only' if context is None else 'conditional'}/coverage_last"] = cov.last
    res["wrapper/frames"] = counter.frame_count
    res["wrapper/max_abs"] = max(diffs)
    res["wrapper/eager_norm"] = min(norms)
    res["wrapper/coverage_forwards"] = forwards
    res["wrapper/ops_in_graph"] = sorted(
        {
            str(n.target)
            for g in counter.graphs
            for n in g.graph.nodes
            if n.op == "call_function" and "ideogram4_int8" in str(n.target)
        }
    )
    # and through ComfyUI's sampling loop (comfy.sample, euler, cfg 1: the conditional model alone): the compiled
    # clone's latent equals eager's; a second run (new seed) compiles nothing (error_on_recompile)
    import comfy.sample

    dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    m = cond.clone()
    set_torch_compile_wrapper(model=m, backend=counter, options={"guard_filter_fn": skip_torch_compile_dict})
    latents = []
    for run in range(2):
        noise = torch.randn(1, CFG.in_channels, 8, 8, generator=G)
        latent = torch.zeros_like(noise)
        positive = [[torch.randn(1, 5, CFG.llm_features_dim, generator=G), {}]]
        kw = dict(
            steps=3,
            cfg=1.0,
            sampler_name="euler",
            scheduler="simple",
            positive=positive,
            negative=positive,
            latent_image=latent,
            seed=run,
            disable_pbar=True,
        )
        want = comfy.sample.sample(cond, noise, **kw)
        with dynamo.config.patch(error_on_recompile=run > 0):
            got = comfy.sample.sample(m, noise, **kw)
        latents.append([(got - want).abs().max().item(), want.norm().item()])
    res["sample/frames"] = counter.frame_count
    res["sample/max_abs_and_norm"] = latents

    # the pack's sampler node (dual-model CFG) with TorchCompileModel's wrapper on the positive MODEL only, and on
    # both: eager's latent. ComfyUI's own dual-model guider hands the negative pass the positive MODEL's options,
    # so its compile wrapper swapped in the positive compiled model there: reproduced by giving the negative pass
    # the run's options unchanged (what the sampler did before)
    def compiled(patcher):
        m = patcher.clone()
        set_torch_compile_wrapper(model=m, backend="aot_eager", options={"guard_filter_fn": skip_torch_compile_dict})
        return m

    dynamo.reset()
    text = torch.randn(1, 5, CFG.llm_features_dim, generator=G)
    want = latent_node(cond, uncond, text, 11)
    res["sampler_node/eager_norm"] = want.norm().item()
    res["sampler_node/positive_compiled"] = (latent_node(compiled(cond), uncond, text, 11) - want).abs().max().item()
    res["sampler_node/both_compiled"] = (
        (latent_node(compiled(cond), compiled(uncond), text, 11) - want).abs().max().item()
    )
    fixed = sampler_nodes.own_model_options
    sampler_nodes.own_model_options = lambda run_options, patcher, run_patcher: run_options
    try:
        res["sampler_node/positive_compiled_run_options"] = (
            (latent_node(compiled(cond), uncond, text, 11) - want).abs().max().item()
        )
    finally:
        sampler_nodes.own_model_options = fixed
    return res
