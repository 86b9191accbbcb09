"""CPU tests (CI) of everything the ComfyUI nodes do that runs without ComfyUI.

* ``ideogram4.comfy_form``: the in-memory W8A8 form -> ComfyUI's comfy_quant form (what the loader hands to
  ComfyUI's Ideogram 4 model) and back through ``read_branch(state_dict)`` (what the patch node does).
* ``ideogram4.sampling_args``: sizes, presets / custom schedules, conditioning shape, sigma -> step lookup.
* ``ideogram4.load_plan``: which file each branch comes from, and the loader summary.
* The node modules themselves (static: they import ComfyUI): ids, names, categories, a tooltip on every input.
"""

from __future__ import annotations

import ast
import json
import math
import pathlib

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import PRESETS, load_plan, sigmas
from comfyui_ideogram4_int8.ideogram4 import sampling_args as sa
from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
from comfyui_ideogram4_int8.ideogram4.comfy_form import SMOOTH_KEY, linear_infos, to_comfy_state_dict
from comfyui_ideogram4_int8.ideogram4.errors import CheckpointError, TensorMismatchError
from comfyui_ideogram4_int8.ideogram4.load_plan import branch_report, format_summary, plan_branches
from comfyui_ideogram4_int8.ideogram4.synthetic import (
    default_protected,
    is_nonlinear_or_top,
    write_comfy_fp8,
    write_comfy_int8,
    write_float,
    write_w8a8,
)
from comfyui_ideogram4_int8.kernels.path_choice import labels_here
from ideogram4_checks import TINY, tiny_weights

ROOT = pathlib.Path(__file__).resolve().parents[2]
F32 = torch.float32


# -- comfy_form ---------------------------------------------------------------------------------------------------


def _marker(t: torch.Tensor) -> dict:
    assert t.dtype == torch.uint8 and t.dim() == 1
    return json.loads(bytes(t.tolist()).decode("utf-8"))


@pytest.mark.parametrize("fmt", ["w8a8", "comfy_int8_convrot", "comfy_fp8"])
def test_comfy_form_shares_tensors_and_marks_every_int8_layer(tmp_path, gen, fmt):
    weights = tiny_weights(gen)
    if fmt == "w8a8":
        path = write_w8a8(tmp_path / "w.safetensors", weights, TINY)
    elif fmt == "comfy_int8_convrot":
        path = write_comfy_int8(tmp_path / "w.safetensors", weights["conditional"], TINY, convrot_group=16)
    else:
        path = write_comfy_fp8(tmp_path / "w.safetensors", weights["conditional"], TINY)
    st = read_branch(path, "conditional", dtype=F32)
    out = to_comfy_state_dict(st, TINY)
    n_int8 = 0
    for spec in TINY.linears():
        m = spec.name
        w = st[f"{m}.weight"]
        assert out[f"{m}.weight"] is w  # no copy of any weight
        if w.dtype != torch.int8:
            assert f"{m}.comfy_quant" not in out and f"{m}.weight_scale" not in out
            continue
        n_int8 += 1
        scale = out[f"{m}.weight_scale"]
        assert scale.dtype == F32 and tuple(scale.shape) == (spec.out_features, 1)
        assert torch.equal(scale.reshape(-1), st[f"{m}.weight_scale"])
        assert scale.data_ptr() == st[f"{m}.weight_scale"].data_ptr()  # a view
        info = _marker(out[f"{m}.comfy_quant"])
        assert info["format"] == "int8_tensorwise"
        group = st.get(f"{m}.convrot_groupsize")
        if group is not None:
            assert info == {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": int(group)}
        else:
            assert "convrot" not in info
        if f"{m}.{SMOOTH_KEY}" in st:
            assert torch.equal(out[f"{m}.{SMOOTH_KEY}"], st[f"{m}.{SMOOTH_KEY}"])
        assert f"{m}.convrot_groupsize" not in out
    assert n_int8 == len(st.quantized_layers()) > 0
    for key in TINY.other_shapes():
        assert out[key] is st[key]
    if fmt == "comfy_int8_convrot":
        assert sum(i.convrot is not None for i in linear_infos(out, TINY)) > 0
    # back through the reader, as the patch node reads a native model's state_dict(): the same bits
    again = read_branch(dict(out), "conditional", config=TINY, dtype=F32)
    assert set(again) == set(st)
    for k, v in st.items():
        assert again[k].dtype == v.dtype and torch.equal(again[k], v), k


def test_comfy_form_refuses_incomplete_or_foreign_state(tmp_path, gen):
    st = dict(read_branch(write_w8a8(tmp_path / "w.safetensors", tiny_weights(gen), TINY), "conditional", dtype=F32))
    qkv = "layers.0.attention.qkv"
    for mutate, key in (
        (lambda d: d.pop(f"{qkv}.weight_scale"), f"{qkv}.weight_scale"),
        (lambda d: d.pop("layers.1.ffn_norm2.weight"), "layers.1.ffn_norm2.weight"),
        (lambda d: d.__setitem__("vae.decoder.weight", torch.zeros(2)), "vae.decoder.weight"),
        (lambda d: d.__setitem__(f"{qkv}.weight", torch.zeros(3, 3, dtype=torch.int8)), f"{qkv}.weight"),
        (lambda d: d.__setitem__("input_proj.weight_scale", torch.ones(TINY.emb_dim)), "input_proj.weight"),
    ):
        bad = dict(st)
        mutate(bad)
        with pytest.raises(TensorMismatchError) as err:
            to_comfy_state_dict(bad, TINY)
        assert key in str(err.value)


def test_read_branch_quantizes_a_native_fp8_state_dict_on_load(tmp_path, gen):
    """The patch node's input: a native model's state_dict() (comfy_quant fp8) read as a dict source."""
    from safetensors.torch import load_file

    weights = tiny_weights(gen)["conditional"]
    path = write_comfy_fp8(tmp_path / "fp8.safetensors", weights, TINY)
    from_dict = read_branch(load_file(str(path)), "conditional", config=TINY, dtype=F32)
    from_file = read_branch(path, "conditional", config=TINY, dtype=F32)
    assert from_dict.quantized_layers() == sorted(TINY.default_quantized())
    assert from_dict.file == "<checkpoint state dict>"
    for k, v in from_file.items():
        assert torch.equal(from_dict[k], v), k


# -- sampling_args ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("w,h", [(1024, 1024), (256, 1536), (2048, 2048), (1536, 256), (256, 256), (1344, 768)])
def test_valid_sizes_pass(w, h):
    sa.check_size(w, h)


@pytest.mark.parametrize(
    "w,h,needle",
    [
        (1000, 1024, "width=1000 is not a multiple of 16"),
        (1024, 1000, "height=1000"),
        (240, 1024, "256..2048"),
        (2064, 1024, "out of range"),
        (2048, 336, "6.10:1"),
        (1024.5, 1024, "integer"),
    ],
)
def test_bad_sizes_say_what_to_change(w, h, needle):
    with pytest.raises(sa.SamplingArgumentError) as err:
        sa.check_size(w, h)
    assert needle in str(err.value)
    if "multiple" in needle:
        assert "use 992 or 1008" in str(err.value)


def test_size_problem_names_the_side_at_fault_and_skips_linked_sides():
    assert sa.size_problem(1024, 768) is None
    assert sa.size_problem(None, 1000).startswith("height=1000 is not a multiple of 16")
    assert sa.size_problem(1000, None).startswith("width=1000")
    assert sa.size_problem(None, None) is None  # both linked: checked when the node runs
    assert sa.size_problem(None, 100000) == "height=100000 is out of range: use 256..2048 pixels"
    assert sa.size_problem(2048, 256) == (
        "width=2048 and height=256 make an aspect ratio of 8.00:1; Ideogram 4 "
        "supports at most 6:1 — make the width smaller or the height larger"
    )
    assert "make the height smaller or the width larger" in sa.size_problem(256, 2048)
    assert sa.size_problem(True, 1024).startswith("width=True")


def test_batch_size_and_negative_guidance_are_refused():
    sa.check_batch_size(1)
    sa.check_batch_size(sa.MAX_BATCH)
    for bad in (0, -1, sa.MAX_BATCH + 1, 1.5, True):
        with pytest.raises(sa.SamplingArgumentError, match="batch_size"):
            sa.check_batch_size(bad)
    for name in ("guidance", "polish_guidance"):
        with pytest.raises(sa.SamplingArgumentError, match=f"^{name}=-1 is negative"):
            sa.plan_sampling("custom", 1024, 1024, **{name: -1.0})
    with pytest.raises(sa.SamplingArgumentError, match="polish_steps=5 is more than steps=4") as err:
        sa.plan_sampling("custom", 1024, 1024, steps=4, polish_steps=5)
    assert "lower polish_steps or raise steps" in str(err.value)
    plan = sa.plan_sampling("Turbo 12", 1024, 1024, steps=4, polish_steps=5)  # custom inputs unused: no error
    assert plan.steps == 12


@pytest.mark.parametrize("name", list(PRESETS))
def test_named_presets_are_the_official_schedules(name, gen):
    w = 16 * int(torch.randint(16, 129, (1,), generator=gen))
    h = 16 * int(torch.randint(max(16, -(-w // 96)), min(128, 6 * w // 16) + 1, (1,), generator=gen))
    plan = sa.plan_sampling(name, w, h, steps=3, guidance=1.0, polish_steps=0, mu=9.0, std=9.0)  # ignored
    p = PRESETS[name]
    assert (plan.steps, plan.guidance, plan.mu, plan.std) == (p.steps, p.guidance, p.mu, p.std)
    assert torch.equal(plan.sigmas, sigmas(p.steps, w, h, p.mu, p.std))
    main, polish = {"Quality 48": (45, 3), "Default 20": (18, 2), "Turbo 12": (11, 1)}[name]
    assert plan.guidance == (7.0,) * main + (3.0,) * polish  # polish steps last
    assert plan.describe().startswith(f"{name}: {p.steps} steps, guidance {main}x7 then {polish}x3")


def test_custom_schedule_and_its_errors(gen):
    steps = int(torch.randint(2, 60, (1,), generator=gen))
    polish = int(torch.randint(0, steps + 1, (1,), generator=gen))
    g_main, g_pol = float(torch.rand(1, generator=gen)) * 9 + 1, float(torch.rand(1, generator=gen)) * 4
    plan = sa.plan_sampling(
        "custom", 768, 1344, steps=steps, guidance=g_main, polish_steps=polish, polish_guidance=g_pol, mu=0.3, std=1.2
    )
    assert len(plan.guidance) == steps and plan.sigmas.numel() == steps + 1
    assert list(plan.guidance) == [g_main] * (steps - polish) + [g_pol] * polish
    assert torch.equal(plan.sigmas, sigmas(steps, 768, 1344, 0.3, 1.2))
    default = sa.plan_sampling("custom", 1024, 1024)  # missing custom values come from Default 20
    assert default.guidance == PRESETS["Default 20"].guidance and default.std == PRESETS["Default 20"].std
    for kwargs, needle in (
        ({"steps": 0}, "steps=0"),
        ({"steps": 500}, "steps=500"),
        ({"steps": 4, "polish_steps": 5}, "polish_steps=5"),
        ({"std": 0.0}, "std=0.0"),
        ({"guidance": math.nan}, "guidance=nan"),
    ):
        with pytest.raises(sa.SamplingArgumentError) as err:
            sa.plan_sampling("custom", 1024, 1024, **kwargs)
        assert needle in str(err.value)
    with pytest.raises(sa.SamplingArgumentError, match="unknown"):
        sa.plan_sampling("Ultra 99", 1024, 1024)
    with pytest.raises(sa.SamplingArgumentError, match="multiple of 16"):
        sa.plan_sampling("Turbo 12", 1000, 1024)


def test_conditioning_shape_check():
    sa.check_text_features((1, 77, 53248))
    sa.check_text_features((2, 5, 128), expected_features=128)
    for shape in ((1, 77, 4096), (1, 77, 768), (77, 53248), (1, 0, 53248), (1, 3, 4, 53248)):
        with pytest.raises(sa.SamplingArgumentError) as err:
            sa.check_text_features(shape)
        assert str(list(shape)) in str(err.value) and "CLIPLoader of type ideogram4" in str(err.value)
        assert "53248" in str(err.value)


# -- load_plan ---------------------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path, gen):
    w = tiny_weights(gen)
    return {
        "two": write_w8a8(tmp_path / "two.safetensors", w, TINY),
        "cond_only": write_w8a8(tmp_path / "cond_only.safetensors", {"conditional": w["conditional"]}, TINY),
        "fp8": write_comfy_fp8(tmp_path / "fp8.safetensors", w["conditional"], TINY),
        "fp8_u": write_comfy_fp8(tmp_path / "fp8_unconditional.safetensors", w["unconditional"], TINY),
        "base2": write_w8a8(tmp_path / "base2.safetensors", w, TINY, quantized=False),
        "base_c": write_float(tmp_path / "base_c.safetensors", w["conditional"], TINY, only=is_nonlinear_or_top(TINY)),
        "vae": _write_other(tmp_path / "vae.safetensors"),
    }


def _write_other(path):
    from safetensors.torch import save_file

    save_file({"decoder.conv_in.weight": torch.zeros(4, 4, 3, 3), "decoder.conv_in.bias": torch.zeros(4)}, str(path))
    return path


def test_plan_branches_per_layout(files):
    c, u = plan_branches(files["two"])
    assert (c.branch, c.path, u.branch, u.path) == ("conditional", files["two"], "unconditional", files["two"])
    assert c.format == "transformerlab-w8a8" and c.base is None and u.base is None
    c, u = plan_branches(files["fp8"], files["fp8_u"])
    assert (c.path, u.path, c.format) == (files["fp8"], files["fp8_u"], "comfy-fp8")
    assert "single-branch" in c.note
    c, u = plan_branches(files["two"], files["fp8_u"])
    assert u.path == files["fp8_u"] and "overrides the unconditional branch" in u.note
    c, u = plan_branches(files["two"], base=files["base2"])
    assert c.base == u.base == files["base2"]  # a two-branch base serves both
    c, u = plan_branches(files["fp8"], files["fp8_u"], base=files["base_c"])
    assert c.base == files["base_c"] and u.base is None  # a single-branch base is the conditional one
    assert "fp8.safetensors [ComfyUI fp8_scaled" in c.describe() and "+ base base_c.safetensors" in c.describe()


def test_host_memory_for_both_branches_is_checked_before_loading(files):
    """The loader refuses before reading when the branches cannot fit the system memory, naming the minimum."""
    sources = plan_branches(files["two"])
    needed = load_plan.host_bytes_needed(sources)
    per_branch = int(TINY.linear_parameter_count() * load_plan.HOST_BYTES_PER_LINEAR_PARAMETER)
    assert needed == 2 * per_branch > 0
    minimum = needed + load_plan.HOST_HEADROOM
    load_plan.check_host_memory(needed, minimum)  # just enough: no error
    with pytest.raises(CheckpointError) as err:
        load_plan.check_host_memory(needed, minimum - 1)
    text = str(err.value)
    assert "not enough free system memory" in text and "system memory" in text
    assert f"at least {minimum / 1e9:.1f} GB free" in text and f"{(minimum - 1) / 1e9:.1f} GB free" in text
    assert "close other programs" in text


def test_plan_branches_errors_name_the_input(files, tmp_path):
    with pytest.raises(CheckpointError) as err:
        plan_branches(files["fp8"])
    assert "unconditional_weights" in str(err.value) and "ideogram4_unconditional_fp8_scaled" in str(err.value)
    with pytest.raises(CheckpointError) as err:
        plan_branches(files["cond_only"])
    assert "unconditional_weights" in str(err.value)
    with pytest.raises(CheckpointError) as err:
        plan_branches(files["vae"])
    assert "no Ideogram 4 DiT linears" in str(err.value) and "vae.safetensors" in str(err.value)
    with pytest.raises(CheckpointError) as err:
        plan_branches(tmp_path / "missing.safetensors")
    assert "does not exist" in str(err.value)
    with pytest.raises(CheckpointError) as err:
        plan_branches(files["two"], unconditional=files["cond_only"])
    assert "no unconditional branch" in str(err.value)
    with pytest.raises(CheckpointError):
        plan_branches(files["two"], base=tmp_path / "nope.safetensors")


def test_summary_lists_paths_protected_layers_and_reasons(files):
    st = read_branch(files["two"], "conditional", dtype=F32)
    quantized = set(st.quantized_layers())
    paths = {
        s.name: ("cublas-int8", "CPU tensors: no GPU") if s.name in quantized else ("bf16", "kept float")
        for s in TINY.linears()
    }
    rep = branch_report("conditional", "two.safetensors [W8A8]", "float32", paths, st, TINY)
    assert rep.protected == default_protected(TINY)
    assert sorted(rep.top_float) == sorted(
        s.name for s in TINY.linears() if not s.name.startswith("layers.") and s.name not in quantized
    )
    assert rep.int8_stored == len(quantized) and rep.quantized_on_load == []
    text = format_summary([rep], ["note line"])
    assert text.splitlines()[0] == "conditional: two.safetensors [W8A8]"
    # the paths in the panel's words for this device, each with the id IDEOGRAM4_INT8_GEMM_PATH takes: a CPU log
    # said "bf16 8" where the panel said "float (protected)"
    _, words = labels_here()
    cublas, bf16 = f"{words['cublas-int8']} [cublas-int8]", f"{words['bf16']} [bf16]"
    assert f"GEMM paths: {len(quantized)} on {cublas}, {len(paths) - len(quantized)} on {bf16}" in text
    assert f"bf16-protected layers ({len(rep.protected)}): layers.1.feed_forward.w2" in text
    assert f"why not faster ({len(quantized)} layers on {cublas}): CPU tensors: no GPU" in text
    assert text.endswith("note line")
    fp8 = read_branch(files["fp8"], "conditional", dtype=F32)
    rep = branch_report("conditional", "fp8", "bfloat16", paths, fp8, TINY)
    assert sorted(rep.quantized_on_load) == sorted(TINY.default_quantized()) and rep.int8_stored == 0
    assert fp8.load_seconds is not None and fp8.load_seconds > 0 and rep.load_seconds == fp8.load_seconds
    took = (
        f"quantized to W8A8 on load: {len(rep.quantized_on_load)} layers (the branch read in {fp8.load_seconds:.1f} s)"
    )
    assert took in format_summary([rep])


def test_summary_of_protected_layers_stored_fp8_says_where_they_run_float(files):
    """protected_layers = fp8: the summary lists them as stored fp8, and where a GPU runs them float (no fp8 tensor
    cores) says why — a bf16 layer's reason is otherwise not a 'why not faster'."""
    st = read_branch(files["two"], "conditional", dtype=F32, float_blocks_fp8=True)
    protected = default_protected(TINY)
    why = (
        "fp8 weight dequantized: GPU is sm_86: the fused FP8 GEMM runs on sm_89 / sm_90 (Ada, Hopper) fp8 tensor cores"
    )
    paths = {
        s.name: ("bf16", why)
        if s.name in protected
        else ("bf16", "kept float")
        if s.name not in st.quantized_layers()
        else ("triton-int8", "")
        for s in TINY.linears()
    }
    rep = branch_report("conditional", "two.safetensors [W8A8]", "bfloat16", paths, st, TINY)
    assert rep.protected == [] and rep.protected_fp8 == protected
    text = format_summary([rep])
    assert f"protected layers stored fp8 e4m3 ({len(protected)}): layers.1.feed_forward.w2" in text
    assert f"why not faster ({len(protected)} layers on {labels_here()[1]['bf16']} [bf16]): {why}" in text
    assert "kept float" not in text


# -- the node modules (static) -------------------------------------------------------------------------------------

NODE_FILES = ("loader_nodes.py", "patch_nodes.py", "sampler_nodes.py")


def _calls(tree, attr):
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
    ]


@pytest.mark.parametrize("name", NODE_FILES)
def test_node_schemas_have_ids_names_categories_and_tooltips(name):
    src = (ROOT / "nodes" / name).read_text()
    tree = ast.parse(src)
    inputs = _calls(tree, "Input")
    assert inputs, name
    for call in inputs:
        kws = {k.arg for k in call.keywords}
        assert "tooltip" in kws, f"{name}:{call.lineno} input without a tooltip"
    schemas = [c for c in _calls(tree, "Schema")]
    assert len(schemas) == 1
    kw = {k.arg: k.value for k in schemas[0].keywords}
    assert isinstance(kw["node_id"], ast.Constant) and kw["node_id"].value.startswith("Ideogram4Int8")
    assert "category" in kw and "description" in kw and "display_name" in kw
    consts = {
        n.targets[0].id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.targets[0], ast.Name)
    }
    assert consts["CATEGORY"].startswith("Ideogram 4 INT8/")
    assert consts["NODE_NAME"].startswith("Ideogram 4")


def test_demo_node_schemas_have_prefixed_ids_names_categories_and_tooltips():
    tree = ast.parse((ROOT / "nodes" / "demo_nodes.py").read_text())
    for call in _calls(tree, "Input"):
        assert "tooltip" in {k.arg for k in call.keywords}, f"demo_nodes.py:{call.lineno} input without a tooltip"
    ids = []
    for schema in _calls(tree, "Schema"):
        kw = {k.arg: k.value for k in schema.keywords}
        assert {"category", "description", "display_name"} <= set(kw), schema.lineno
        ids.append(kw["node_id"].value)
    assert ids == ["Ideogram4Int8DemoLoader", "Ideogram4Int8DemoText", "Ideogram4Int8DemoDecode"]
    consts = {
        n.targets[0].id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.targets[0], ast.Name)
    }
    assert consts["CATEGORY"].startswith("Ideogram 4 INT8/")
    assert all(consts[k].startswith("Ideogram 4") for k in ("LOADER_NAME", "TEXT_NAME", "DECODE_NAME"))


def test_only_nodes_import_comfyui():
    for pkg in ("ideogram4", "kernels"):
        for path in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                for n in names:
                    root = n.split(".")[0]
                    assert root not in (
                        "comfy",
                        "comfy_api",
                        "comfy_extras",
                        "folder_paths",
                        "server",
                        "latent_preview",
                        "nodes",
                    ), f"{path}: imports {n}"


# -- the benchmark's in-memory branch ------------------------------------------------------------------------------


def test_in_memory_w8a8_state_equals_the_file_read_back(tmp_path, gen):
    from comfyui_ideogram4_int8.ideogram4.synthetic import w8a8_state

    weights = tiny_weights(gen)
    path = write_w8a8(tmp_path / "w.safetensors", weights, TINY)
    for branch in ("conditional", "unconditional"):
        want = read_branch(path, branch, dtype=torch.bfloat16)
        got = w8a8_state(weights[branch], TINY, branch=branch)
        assert set(got) == set(want) and got.config == TINY
        for k, v in want.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), (branch, k)
        assert got.quantized_layers() == want.quantized_layers()


# -- the example workflow ----------------------------------------------------------------------------------------

WORKFLOW = ROOT / "example_workflows" / "api" / "ideogram4_int8_text_to_image_api.json"
CORE = {"CLIPLoader", "CLIPTextEncode", "VAELoader", "VAEDecode", "SaveImage", "PreviewAny"}
CAPTION_NODES = {
    "Ideogram4Int8StyleDescription",
    "Ideogram4Int8TextElement",
    "Ideogram4Int8ObjectElement",
    "Ideogram4Int8CaptionBuilder",
}  # checked in test_example_workflows.py


def _declared(name: str) -> tuple[str, set[str]]:
    """A node module's node_id and input names: the literal name of each ``.Input(...)`` call, and the name in each
    row of an input table (``(io.Float, "mu", ...)``, made into inputs by a comprehension)."""
    tree = ast.parse((ROOT / "nodes" / name).read_text())
    node_id = next(k.value.value for c in _calls(tree, "Schema") for k in c.keywords if k.arg == "node_id")
    inputs = {c.args[0].value for c in _calls(tree, "Input") if c.args and isinstance(c.args[0], ast.Constant)}
    for row in ast.walk(tree):
        if isinstance(row, ast.Tuple) and len(row.elts) > 1 and isinstance(row.elts[1], ast.Constant):
            kind = row.elts[0]
            if isinstance(kind, ast.Attribute) and isinstance(kind.value, ast.Name) and kind.value.id == "io":
                inputs.add(row.elts[1].value)
    return node_id, inputs


def test_example_workflow_uses_the_nodes_as_declared():
    import json

    declared = dict(_declared(n) for n in NODE_FILES)
    graph = json.loads(WORKFLOW.read_text())
    for key, node in graph.items():
        cls = node["class_type"]
        assert cls in declared or cls in CORE or cls in CAPTION_NODES, (key, cls)
        if cls in declared:
            assert set(node["inputs"]) == declared[cls], (cls, set(node["inputs"]) ^ declared[cls])
    key_of = {n["class_type"]: k for k, n in graph.items()}
    sampler = graph[key_of["Ideogram4Int8Sampler"]]["inputs"]
    assert sampler["positive"] == [key_of["CLIPTextEncode"], 0]
    assert sampler["model"] == [key_of["Ideogram4Int8Loader"], 0]
    assert sampler["model_negative"] == [key_of["Ideogram4Int8Loader"], 1]
    assert graph[key_of["CLIPLoader"]]["inputs"]["type"] == "ideogram4"
