"""torch.compile and the pack's W8A8 model (issue 23): dynamo traces the reference DiT with W8A8 modules in one graph
(no graph break), does not recompile for the next sampling step or a second model, runs the pack's own ops in the
compiled graph (not a decomposition), and the registry still records every layer's path. CPU: the cuBLAS-int8 and
twin paths run here, and the Triton kernels on the interpreter (tests/conftest.py sets TRITON_INTERPRET).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
from comfyui_ideogram4_int8.ideogram4.synthetic import write_comfy_int8, write_w8a8
from comfyui_ideogram4_int8.ideogram4.w8a8_module import CONVROT_NOTE, w8a8_linears
from comfyui_ideogram4_int8.kernels import ops, reference
from comfyui_ideogram4_int8.nodes.runtime import after_forward as af
from ideogram4_checks import TINY, inputs, tiny_weights
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

BRANCHES = ("conditional", "unconditional")
OUR_OPS = {
    f"{ops.NAMESPACE}::{name}"
    for name in ("w8a8_linear", "float_linear", "fp8_linear", "swiglu_w8a8_pair", "qk_norm_rope")
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


def _model(tmp_path, gen, branch, *, label, fused=False, path=None, fmt="w8a8"):
    weights = tiny_weights(gen)
    if fmt == "convrot":
        file = write_comfy_int8(tmp_path / f"{label}.safetensors", weights[branch], TINY, convrot_group=16)
        sd = read_branch(file, "conditional", dtype=torch.float32)
    else:
        file = write_w8a8(tmp_path / f"{label}.safetensors", weights, TINY)
        sd = read_branch(file, branch, dtype=torch.float32)
    model = Ideogram4DiT.from_state_dict(sd, w8a8_linears(path=path), config=TINY, label=label)
    if fused:
        assert model.fuse_gate_up() == TINY.num_layers
    return model


def _context(branch, ctx):
    return ctx if branch == "conditional" else None


def _name(node) -> str:
    """'ideogram4_int8::w8a8_linear' for a call of an op overload, else the target's str."""
    return node.target.name() if isinstance(node.target, torch._ops.OpOverload) else str(node.target)


def _sites(model) -> set[str]:
    sites = {m.site for m in model.linear_modules().values()}
    sites |= {layer.feed_forward.gate_up.site for layer in model.layers if hasattr(layer.feed_forward, "gate_up")}
    return sites - {None}


@pytest.mark.parametrize("fused", [False, True], ids=["split-ffn", "fused-gate-up"])
@pytest.mark.parametrize("branch", BRANCHES)
def test_dynamo_traces_a_w8a8_dit_in_one_graph(tmp_path, gen, branch, fused):
    model = _model(tmp_path, gen, branch, label=f"explain-{branch}", fused=fused)
    x, ctx, sigma = inputs(gen)
    with torch.no_grad():
        report = dynamo.explain(model)(x, sigma, context=_context(branch, ctx))
    reasons = [r.reason.splitlines()[0] for r in report.break_reasons]
    assert report.graph_break_count == 0, f"{report.graph_break_count} graph breaks: {reasons[:5]}"
    assert report.graph_count == 1
    # the linears are the pack's ops in that graph, one call per linear (the fused pair: one per block)
    targets = [_name(n) for g in report.graphs for n in g.graph.nodes if n.op == "call_function"]
    per_op = {op: targets.count(op) for op in OUR_OPS}
    n_linears = len(model.linear_modules()) + (TINY.num_layers if fused else 0)  # w1|w3 fused: one module per block
    n_linears -= 0 if branch == "conditional" else 1  # the image-only pass never runs llm_cond_proj
    assert sum(per_op.values()) == n_linears, per_op
    assert per_op[f"{ops.NAMESPACE}::swiglu_w8a8_pair"] == (TINY.num_layers if fused else 0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("branch", BRANCHES)
def test_fullgraph_compile_equals_eager_and_never_recompiles(tmp_path, gen, branch, backend):
    """Compiled output == eager output, bit for bit (the same ops run); the next sampling step (another sigma, the
    same shapes) and a second model instance with other weights reuse the one compiled graph."""
    label = f"compiled-{branch}"
    model = _model(tmp_path, gen, branch, label=label, fused=branch == "conditional")
    x, ctx, sigma = inputs(gen)
    c = _context(branch, ctx)
    counter = CompileCounter() if backend == "eager" else None
    graphs0 = counters["stats"]["unique_graphs"]
    with torch.no_grad(), dynamo.config.patch(error_on_recompile=True):
        compiled = torch.compile(model, fullgraph=True, backend=counter or backend)
        for step_sigma in (sigma, sigma * 0.5, torch.rand(sigma.shape, generator=gen)):
            assert torch.equal(compiled(x, step_sigma, context=c), model(x, step_sigma, context=c))
        (tmp_path / "other").mkdir()
        other = _model(tmp_path / "other", gen, branch, label=label, fused=branch == "conditional")
        out = torch.compile(other, fullgraph=True, backend=counter or backend)(x, sigma, context=c)
        assert torch.equal(out, other(x, sigma, context=c))
        assert not torch.equal(out, model(x, sigma, context=c))  # other weights really ran
    assert counters["stats"]["unique_graphs"] - graphs0 == 1
    if counter is not None:
        assert counter.frame_count == 1 and counter.op_count > 0


def _aot_graph_capture():
    """An aot_eager-like backend that keeps the forward graphs AOT autograd hands to its compiler."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen = []

    def compiler(gm, example_inputs):
        seen.append(gm)
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=compiler), seen


def test_compiled_graph_runs_the_packs_ops_and_the_registry_stays_honest(tmp_path, gen):
    """After AOT autograd (what inductor receives), the linears are still the pack's ops, not a decomposition into
    aten (no _int_mm, no quantizer arithmetic), and a compiled forward records every layer with its path, as eager
    does, counting its calls."""
    label = "compiled-registry"
    model = _model(tmp_path, gen, "conditional", label=label, fused=True)
    x, ctx, sigma = inputs(gen)
    with torch.no_grad():
        model(x, sigma, context=ctx)
        eager = {r.site: (r.path, r.reason, r.config, r.fusion) for r in kernels.REGISTRY.layers(label)}
        kernels.REGISTRY.clear(label)
        backend, graphs = _aot_graph_capture()
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        compiled(x, sigma, context=ctx)
        compiled(x, sigma * 0.5, context=ctx)
    assert len(graphs) == 1
    targets = {_name(n) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert targets & OUR_OPS == {f"{ops.NAMESPACE}::{op}" for op in ("w8a8_linear", "float_linear", "swiglu_w8a8_pair")}
    assert not any("_int_mm" in t or "round" in t for t in targets), sorted(targets)
    recs = {r.site: r for r in kernels.REGISTRY.layers(label)}
    assert set(recs) == _sites(model) == set(eager)
    assert all(r.calls == 2 for r in recs.values()), {s: r.calls for s, r in recs.items()}
    assert {s: (r.path, r.reason, r.config, r.fusion) for s, r in recs.items()} == eager
    assert recs[f"{label}/layers.0.attention.qkv"].path == kernels.PATH_CUBLAS  # CPU: the labelled fallback
    assert recs[f"{label}/layers.1.feed_forward.w2"].path == kernels.PATH_BF16  # protected


@pytest.mark.parametrize("path,fmt", [(kernels.PATH_TRITON, "w8a8"), (kernels.PATH_DEQUANT, "w8a8"), (None, "convrot")])
def test_every_path_compiles_in_one_graph(tmp_path, gen, path, fmt):
    """Forced paths (the fused kernel on Triton's interpreter, the phantom dequant path) and ConvRot layers (the
    convrot group as an op argument): one graph, compiled == eager, the registry notes kept."""
    label = f"paths-{path}-{fmt}"
    model = _model(tmp_path, gen, "conditional", label=label, fused=fmt == "w8a8", path=path, fmt=fmt)
    x, ctx, sigma = inputs(gen, batch=1, gh=3, gw=4, n_text=3)
    counter = CompileCounter()
    with torch.no_grad(), dynamo.config.patch(error_on_recompile=True):
        compiled = torch.compile(model, fullgraph=True, backend=counter)
        for s in (sigma, 1 - sigma):
            assert torch.equal(compiled(x, s, context=ctx), model(x, s, context=ctx))
    assert counter.frame_count == 1
    recs = {r.layer: r for r in kernels.REGISTRY.layers(label)}
    assert recs["layers.0.attention.qkv"].path == (path or kernels.PATH_CUBLAS)
    if fmt == "convrot":
        assert CONVROT_NOTE in recs["layers.0.attention.qkv"].reason


@pytest.mark.parametrize("path", [kernels.PATH_TRITON, kernels.PATH_DEQUANT])
def test_compiled_convrot_layers_make_their_rotation_once(tmp_path, gen, monkeypatch, path):
    """A ConvRot layer's op checks its group on every call, and the unfused paths rotate with ConvRot's Hadamard
    matrix: the matrix is made once per group, dtype and device, never per call. Made per call it was a CPU tensor
    conversion (on a GPU's fallback paths a host-to-device copy, which waits for the device) in every ConvRot linear
    of a compiled step, where no CUDA graph hides host time (H100 2026-11-26 s17: int8_convrot compiled 388 ms per
    step against 216 ms eager, W8A8 faster compiled)."""
    model = _model(tmp_path, gen, "conditional", label=f"convrot-rotation-{path}", path=path, fmt="convrot")
    x, ctx, sigma = inputs(gen, batch=1, gh=3, gw=4, n_text=3)
    asked, real = [], reference.hadamard

    def counting(*args, **kwargs):
        h = real(*args, **kwargs)
        asked.append((repr((args, kwargs)), h))  # kept alive: a freed matrix's id could be reused
        return h

    monkeypatch.setattr(reference, "hadamard", counting)
    with torch.no_grad(), dynamo.config.patch(error_on_recompile=True):
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        for s in (sigma, 1 - sigma):
            compiled(x, s, context=ctx)
    made = {id(h) for _, h in asked}
    assert len(made) <= len({key for key, _ in asked}), f"{len(made)} matrices made for {len(asked)} calls"
    assert len(asked) > 2 * len(made)  # every ConvRot call of both steps asked for it


# -- the ops themselves: fake implementations against the real ones ----------------------------------------------


def _quantized(gen, n, k):
    return kernels.quantize_weight_ref(torch.randn(n, k, generator=gen))


def _op_cases(gen, dtype):
    k, n, f = 64, 48, 32
    x = torch.randn(2, 3, k, generator=gen).to(dtype)
    w, ws = _quantized(gen, n, k)
    w1, s1 = _quantized(gen, f, k)
    w3, s3 = _quantized(gen, f, k)
    smooth = torch.rand(k, generator=gen) + 0.5
    bias = torch.randn(n, generator=gen)
    cases = []
    for path in (kernels.PATH_TRITON, kernels.PATH_CUBLAS, kernels.PATH_DEQUANT, None):
        cases += [
            ("w8a8_linear", (x, w, ws, bias, smooth, path, "opcheck/lin", None, None)),
            ("w8a8_linear", (x, w, ws, None, None, path, None, torch.float32, 16)),  # ConvRot, another out dtype
            ("swiglu_w8a8_pair", (x, w1, s1, w3, s3, smooth, path, "opcheck/w1", "opcheck/w3", None, None)),
            ("swiglu_w8a8_pair", (x, w1, s1, w3, s3, None, path, "opcheck/w1|w3", None, torch.float32, 16)),
            # one site for both, as the reference DiT's FusedGateUp calls it
            ("swiglu_w8a8_pair", (x, w1, s1, w3, s3, smooth, path, "opcheck/w13", None, None, None)),
        ]
    cases.append(("float_linear", (x, torch.randn(n, k, generator=gen), bias, "opcheck/float", "protected")))
    w8 = (torch.randn(n, k, generator=gen) * 8).to(torch.float8_e4m3fn)  # a protected layer stored fp8
    for float_only in (None, "forced for the test"):  # the fused path (the interpreter here), its float fallback
        cases.append(("fp8_linear", (x, w8, torch.tensor(0.01), bias, "opcheck/fp8", float_only)))
    qkv = torch.randn(2, 5, 3, 2, 32, generator=gen).to(dtype)  # q/k as strided views of a qkv output
    cos, sin = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    for view in qkv.unbind(2)[:2]:
        cases.append(("qk_norm_rope", (view, torch.rand(32, generator=gen) + 0.5, cos, sin, 1e-5)))
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_implementations_match_the_real_outputs(gen, dtype):
    """Every op on every path: the fake output has the real output's shape, dtype, device and strides
    (torch.library.opcheck also checks the schema and that no input is mutated or aliased)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name, args in _op_cases(gen, dtype):
        op = ops.op(name)
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fake_args)
        where = f"{name} path={args[5] if name != 'qk_norm_rope' and len(args) > 5 else '-'} {dtype}"
        assert (fake.shape, fake.dtype, fake.device, fake.stride()) == (
            real.shape,
            real.dtype,
            real.device,
            real.stride(),
        ), where
        assert real.is_contiguous() and not torch.isnan(real).any(), where
        # opcheck's schema test multiplies the inputs, which CPU torch cannot do in float8 (the fake test still runs)
        utils = ("test_faketensor",) if name == "fp8_linear" else ("test_schema", "test_faketensor")
        torch.library.opcheck(op, args, test_utils=utils)


def test_ops_equal_the_eager_functions(gen):
    """Each op's real implementation is the eager function (the compiled graph computes what eager mode does)."""
    for name, args in _op_cases(gen, torch.float32):
        direct = {
            "w8a8_linear": ops.w8a8_linear_impl,
            "swiglu_w8a8_pair": ops.swiglu_w8a8_pair_impl,
            "float_linear": kernels.float_linear,
            "fp8_linear": kernels.fp8_linear,
            "qk_norm_rope": kernels.qk_norm_rope,
        }[name]
        if name == "float_linear":
            x, w, b, site, reason = args
            want = direct(x, w, b, site=site, reason=reason)
        elif name == "fp8_linear":
            x, w, s, b, site, float_only = args
            want = direct(x, w, s, b, site=site, float_only=float_only)
        else:
            want = direct(*args)
        assert torch.equal(ops.op(name)(*args), want), name


def test_the_registry_reads_no_state_in_traced_code():
    """The helpers module forwards call emit the op while dynamo traces: their traced body is one op call."""
    x = torch.randn(3, 64)
    w, ws = kernels.quantize_weight_ref(torch.randn(16, 64))
    counter = CompileCounter()

    def f(x):
        return ops.w8a8_linear(x, w, ws, None, None, None, "traced/one") * 2

    torch.compile(f, fullgraph=True, backend=counter)(x)
    assert counter.frame_count == 1 and counter.op_count == 2  # the op and the multiplication
    assert kernels.REGISTRY.path_of("traced/one") == kernels.PATH_CUBLAS


def test_after_forward_runs_its_callbacks_at_run_time_and_counts_op_calls():
    """``after_forward`` (how op_coverage checks a compiled forward): in a compiled graph its callbacks run on every
    call, with the graph's constants, after the output exists, and the op returns a copy; eager mode calls them
    directly. The registered ops count their calls per call site (``OP_CALLS``): what the ComfyUI path's
    op_coverage reads for a compiled forward."""
    seen = []

    def callback(key, flag):
        seen.append((key, flag))

    af.on_after_forward(callback)
    af.on_after_forward(callback)  # registered once
    try:
        w, ws = kernels.quantize_weight_ref(torch.randn(16, 64))

        def f(x):
            y = ops.w8a8_linear(x, w, ws, None, None, None, "traced/counted")
            return af.after_forward(y, "test-key", True)

        counter = CompileCounter()
        compiled = torch.compile(f, fullgraph=True, backend=counter)
        n0 = ops.OP_CALLS["traced/counted"]
        with dynamo.config.patch(error_on_recompile=True):
            outs = [compiled(torch.randn(3, 64)) for _ in range(3)]
        assert counter.frame_count == 1 and seen == [("test-key", True)] * 3
        assert ops.OP_CALLS["traced/counted"] - n0 == 3
        y = torch.randn(2, 5)
        got = af.op()(y, "k", False)
        assert torch.equal(got, y) and got.data_ptr() != y.data_ptr() and seen[-1] == ("k", False)
        torch.library.opcheck(af.op(), (y, "k", False), test_utils=("test_schema", "test_faketensor"))
        seen.clear()
        assert af.after_forward(y, "eager", False) is y and seen == [("eager", False)]
        assert ops.OP_CALLS["traced/counted"] - n0 == 3 and all(o.shape == (3, 16) for o in outs)
        f(torch.randn(3, 64))  # eager: the direct call, not counted by the op
        assert ops.OP_CALLS["traced/counted"] - n0 == 3
    finally:
        af._CALLBACKS.remove(callback)
