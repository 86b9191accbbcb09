"""GPU checks of torch.compile and CUDA graphs with the pack's custom ops (issue 23; run on the device machine).

CUDA-graph capture of a full forward of the reference W8A8 DiT (fused triton-int8 path, q/k norm+RoPE kernel, fused
gate/up) keeps working, eager and compiled (the compiled graph calls the pack's registered ops); inductor compiles
the model in one graph without recompiling for the next step.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights, write_w8a8
from comfyui_ideogram4_int8.ideogram4.w8a8_module import w8a8_linears
from comfyui_ideogram4_int8.kernels import ops
from ideogram4_checks import TINY, cosine, seed_of

pytestmark = pytest.mark.cuda
DEMO = Ideogram4Config.demo()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


def _model(tmp_path, gen, branch, label, cfg=DEMO):
    weights = {b: RandomWeights(cfg, seed_of(gen)).materialize() for b in ("conditional", "unconditional")}
    path = write_w8a8(tmp_path / f"{label}.safetensors", weights, cfg)
    model = Ideogram4DiT.from_state_dict(
        read_branch(path, branch, device="cuda"),
        w8a8_linears(),
        config=cfg,
        dtype=torch.bfloat16,
        device="cuda",
        label=label,
    )
    assert model.fuse_gate_up() == cfg.num_layers
    return model


def _inputs(gen, cfg, branch, grid=16, n_text=24):
    x = torch.randn(1, cfg.in_channels, grid, grid, generator=gen).cuda()
    ctx = torch.randn(1, n_text, cfg.llm_features_dim, generator=gen).cuda() if branch == "conditional" else None
    return x, ctx, torch.rand(1, generator=gen).cuda() * 0.9 + 0.05


def _capture(fn, x, ctx, sigma, warmup=3):
    """(graph, static inputs, static output) of fn(x, sigma, context=ctx) captured after ``warmup`` runs on a side
    stream (autotuning, launch caches and compilation happen there, never inside the capture)."""
    sx, ssig = x.clone(), sigma.clone()
    sctx = None if ctx is None else ctx.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(warmup):
            fn(sx, ssig, context=sctx)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = fn(sx, ssig, context=sctx)
    return graph, (sx, sctx, ssig), out


def _replay(graph, static, out, x, ctx, sigma):
    sx, sctx, ssig = static
    sx.copy_(x)
    ssig.copy_(sigma)
    if ctx is not None:
        sctx.copy_(ctx)
    graph.replay()
    torch.cuda.synchronize()
    return out.clone()


@pytest.mark.parametrize("branch", ["conditional", "unconditional"])
def test_cuda_graph_capture_of_an_eager_forward(tmp_path, gen, branch):
    model = _model(tmp_path, gen, branch, f"cg-eager-{branch}")
    x, ctx, sigma = _inputs(gen, DEMO, branch)
    graph, static, out = _capture(model, x, ctx, sigma)
    for _ in range(2):  # new inputs each replay: the graph computes what eager computes on them
        x, ctx2, sigma = _inputs(gen, DEMO, branch)
        got = _replay(graph, static, out, x, ctx2, sigma)
        with torch.no_grad():
            want = model(x, sigma, context=ctx2)
        assert torch.equal(got, want)
    assert kernels.REGISTRY.path_of(f"cg-eager-{branch}/layers.0.attention.qkv") == kernels.PATH_TRITON


@pytest.mark.parametrize("branch", ["conditional", "unconditional"])
def test_cuda_graph_capture_of_a_compiled_forward_runs_the_custom_ops(tmp_path, gen, branch):
    """torch.compile (aot_eager: the traced graph run op by op, so the pack's ops run as registered) then capture:
    replay equals the compiled forward on the same inputs, bit for bit, and eager to bf16 rounding."""
    label = f"cg-compiled-{branch}"
    model = _model(tmp_path, gen, branch, label)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, ctx, sigma = _inputs(gen, DEMO, branch)
    kernels.REGISTRY.clear(label)
    with dynamo.config.patch(error_on_recompile=True):
        graph, static, out = _capture(compiled, x, ctx, sigma)
        for _ in range(2):
            x, ctx2, sigma = _inputs(gen, DEMO, branch)
            got = _replay(graph, static, out, x, ctx2, sigma)
            with torch.no_grad():
                want, ref = compiled(x, sigma, context=ctx2), model(x, sigma, context=ctx2)
            assert torch.equal(got, want)
            assert cosine(got, ref) >= 0.9999
    recs = {r.layer: r for r in kernels.REGISTRY.layers(label)}
    assert recs["layers.0.attention.qkv"].path == kernels.PATH_TRITON
    assert recs["layers.0.feed_forward.w1|w3"].path == kernels.PATH_TRITON


def test_dynamo_keeps_the_qk_norm_rope_kernel_as_one_op_on_cuda(tmp_path, gen):
    """On CUDA the attention prologue is the pack's q/k norm+RoPE kernel: dynamo keeps it as the registered op."""
    model = _model(tmp_path, gen, "conditional", "cg-explain", cfg=TINY)
    x, ctx, sigma = _inputs(gen, TINY, "conditional", grid=4, n_text=5)
    with torch.no_grad():
        report = dynamo.explain(model)(x, sigma, context=ctx)
    assert report.graph_break_count == 0 and report.graph_count == 1
    names = [
        n.target.name()
        for g in report.graphs
        for n in g.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    ]
    assert names.count(f"{ops.NAMESPACE}::qk_norm_rope") == 2 * TINY.num_layers


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_inductor_compiles_the_w8a8_dit_without_recompiles(tmp_path, gen, mode):
    """Inductor (default, and with its CUDA graphs): one graph, no recompile for the next step, output = eager to
    bf16 rounding (inductor fuses the elementwise ops around the pack's opaque GEMMs), paths recorded."""
    label = f"inductor-{mode}"
    model = _model(tmp_path, gen, "conditional", label, cfg=TINY)
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    with dynamo.config.patch(error_on_recompile=True), torch.no_grad():
        for _ in range(4):  # reduce-overhead warms up, records, then replays
            x, ctx, sigma = _inputs(gen, TINY, "conditional", grid=4, n_text=5)
            got = compiled(x, sigma, context=ctx).clone()
            assert cosine(got, model(x, sigma, context=ctx)) >= 0.999
    assert kernels.REGISTRY.path_of(f"{label}/layers.0.attention.qkv") == kernels.PATH_TRITON
