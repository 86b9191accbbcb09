"""The GEMM-path status report (nodes/status_report.py): the schema, reports of real runs, scrubbing.

"Real models built from synthetic checkpoints": ``load_and_run`` (tests/status_checks.py) writes a tiny two-branch
W8A8 checkpoint (``ideogram4.synthetic.write_w8a8``, fresh random weights), loads each branch the way the pack does
(``read_branch`` -> ``Ideogram4DiT`` with ``w8a8_linears()``, labelled "conditional" / "unconditional") and samples
a few steps on the CPU (``tests/panel_model.py``); the report is then checked against what ran. The same checks
against the real ComfyUI nodes are in tests/comfyui/test_status_comfyui.py; the route and publish() in
test_status_route.py, timing in test_status_timing.py.
"""

from __future__ import annotations

import json
import os
import pathlib

import jsonschema
import panel_model
import pytest
import torch
from comfyui_ideogram4_int8.kernels import PATHS, REGISTRY, model_notes
from comfyui_ideogram4_int8.kernels.path_choice import ENV_PATH
from comfyui_ideogram4_int8.kernels.tuning import PICKER
from comfyui_ideogram4_int8.nodes import status_report as status
from status_checks import clean_registry_around, load_and_run, validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "gemm_status_sample.json"


@pytest.fixture(autouse=True)
def clean_registry(setting):
    yield from clean_registry_around(setting)


# -- schema ---------------------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(status.load_schema())
    assert status.load_schema()["properties"]["schema_version"]["const"] == status.SCHEMA_VERSION


def test_schema_file_ships_with_the_package():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["comfyui_ideogram4_int8.kernels"]
    assert any(status.SCHEMA_PATH.match(g) for g in globs), globs


def test_every_web_file_ships_in_the_wheel():
    """web/lib/*.mjs are imported by the entry at run time: a wheel without them breaks the panel."""
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for g in globs["comfyui_ideogram4_int8"] for p in ROOT.glob(g) if p.is_file()}
    web = {p for p in (ROOT / "web").rglob("*") if p.is_file()}
    assert web - shipped == set()


def test_shared_fixture_is_schema_valid_and_consistent():
    report = json.loads(FIXTURE.read_text())
    validate(report)
    for m in report["models"]:
        layers = m["layers"]
        assert m["layers_total"] == len(layers)
        assert m["layers_run"] == sum(1 for layer in layers if layer["calls"])
        assert m["counts"] == {p: sum(1 for layer in layers if layer["path"] == p) for p in PATHS}
        assert m["counts_run"] == {
            p: sum(1 for layer in layers if layer["path"] == p and layer["calls"]) for p in PATHS
        }
        assert sum(s["layers"] for s in m["shapes"]) == len(layers)


def test_schema_rejects_what_it_should():
    report = json.loads(FIXTURE.read_text())
    bad = json.loads(json.dumps(report))
    bad["models"][0]["layers"][0]["path"] = "int8-ish"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = json.loads(json.dumps(report))
    bad["models"][0]["counts"].pop("bf16")
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = json.loads(json.dumps(report))
    bad["environment"]["checkpoint"] = "/home/me/models/x.safetensors"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


# -- reports of real runs -------------------------------------------------------------------------


def test_no_model_yet(monkeypatch):
    report = status.status_report()
    validate(report)
    assert report["models"] == []
    assert report["status"]["code"] == "no_models_yet"
    assert "No Ideogram 4 INT8 model has run yet" in report["status"]["message"]


def test_no_cuda_is_said_clearly(monkeypatch, tmp_path, gen):
    env = {
        "torch": torch.__version__,
        "triton": None,
        "cuda_available": False,
        "gpu": None,
        "compute_capability": None,
        "arch": "cpu",
    }
    monkeypatch.setattr(status, "environment_report", lambda: dict(env))
    idle = status.status_report()
    assert idle["status"]["code"] == "no_models_yet"
    assert any("No CUDA GPU" in n for n in idle["status"]["notes"])
    load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    ran = status.status_report()
    validate(ran)
    assert ran["status"]["code"] == "no_cuda"
    assert "No CUDA GPU" in ran["status"]["message"]


def test_gpu_present_status_ok(monkeypatch, tmp_path, gen):
    env = {
        "torch": "2.11.0+cu130",
        "triton": "3.6.0",
        "cuda_available": True,
        "gpu": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
        "arch": "sm90",
    }
    monkeypatch.setattr(status, "environment_report", lambda: dict(env))
    load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    report = status.status_report()
    validate(report)
    assert report["status"]["code"] == "ok"
    assert report["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert report["environment"]["compute_capability"] == "9.0"


def test_report_matches_what_ran_automatic_path(tmp_path, gen):
    steps = 1 + gen.initial_seed() % 3
    ran = load_and_run(tmp_path, gen, steps=steps)
    report = status.status_report()
    validate(report)
    assert [m["label"] for m in report["models"]] == ["conditional", "unconditional"]
    auto = REGISTRY.path_of("conditional/layers.0.attention.qkv")  # what dispatch chose on this machine
    assert auto == ("triton-int8" if torch.cuda.is_available() else "cublas-int8")  # CPU tensors here
    for model in report["models"]:
        expect = ran[model["label"]]
        n_float = sum(1 for lin in expect.values() if lin.kind != "w8a8")
        assert model["layers_total"] == len(expect) == len(panel_model.CFG.linear_names())
        assert model["layers_run"] == sum(1 for lin in expect.values() if lin.calls)
        assert model["counts"] == {**{p: 0 for p in PATHS}, "bf16": n_float, auto: len(expect) - n_float}
        assert model["counts_run"]["bf16"] == sum(1 for lin in expect.values() if lin.kind != "w8a8" and lin.calls)
        assert model["calls"] == sum(lin.calls for lin in expect.values())
        by_layer = {row["layer"]: row for row in model["layers"]}
        assert set(by_layer) == set(expect)
        for name, lin in expect.items():
            row = by_layer[name]
            assert (row["N"], row["K"], row["M_last"], row["calls"]) == (lin.n, lin.k, lin.m, lin.calls), name
            assert row["path"] == (auto if lin.kind == "w8a8" else "bf16"), name
            if lin.kind == "protected":
                assert row["reason"] == panel_model.REASON_PROTECTED
            elif lin.kind == "top":
                assert row["reason"] == panel_model.REASON_TOP
            elif model["role"] == "unconditional" and name == "llm_cond_proj":  # the image-only pass never runs it
                assert row["reason"] == status.IMAGE_ONLY_WHY and model["idle"] == {name: status.IMAGE_ONLY_WHY}
            elif auto == "cublas-int8":  # the report says why the fused kernel did not run
                assert "CUDA GPU" in row["reason"], row
        # forward order: projections, then the blocks by index, each listing its linears in one order (which order
        # is pinned by test_layer_table_is_in_forward_order_whatever_order_layers_were_seen), final layer
        names = [row["layer"] for row in model["layers"]]
        top = ["input_proj", "llm_cond_proj", "t_embedding.mlp_in", "t_embedding.mlp_out", "adaln_proj"]
        assert names[: len(top)] == top
        block = [name.removeprefix("layers.0.") for name in names if name.startswith("layers.0.")]
        blocks = panel_model.CFG.num_layers
        assert names[len(top) : -2] == [f"layers.{i}.{name}" for i in range(blocks) for name in block]
        assert sorted(names[-2:]) == ["final_layer.adaln_modulation", "final_layer.linear"]
        assert sum(s["layers"] for s in model["shapes"]) == len(expect)
    # the image-only unconditional pass never runs the text projection: declared at load, 0 calls
    unc = {r["layer"]: r for r in report["models"][1]["layers"]}
    assert unc["llm_cond_proj"]["calls"] == 0 and unc["llm_cond_proj"]["M_last"] == 0
    cond = {r["layer"]: r for r in report["models"][0]["layers"]}
    assert cond["llm_cond_proj"]["calls"] == steps


def test_forced_dequant_by_env_shows_in_report(tmp_path, gen, setting):
    setting(ENV_PATH, "dequant-bf16")
    ran = load_and_run(tmp_path, gen, branches=("unconditional",), steps=1)
    report = status.status_report(model="unconditional")
    validate(report)
    (model,) = report["models"]
    n_quant = sum(1 for lin in ran["unconditional"].values() if lin.kind == "w8a8")
    assert model["counts"]["dequant-bf16"] == n_quant > 0
    assert model["counts"]["triton-int8"] == model["counts"]["cublas-int8"] == 0
    dq = [r for r in model["layers"] if r["path"] == "dequant-bf16" and r["layer"] not in model["idle"]]
    assert dq and all(r["reason"] == f"forced by {ENV_PATH}=dequant-bf16" for r in dq)
    assert report["environment"]["forced_path"] == {"variable": ENV_PATH, "value": "dequant-bf16", "valid": True}
    assert any(ENV_PATH in n for n in report["status"]["notes"])


def test_invalid_forced_path_is_reported_not_hidden(tmp_path, gen, setting):
    setting(ENV_PATH, "fastest-please")
    load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    report = status.status_report()
    assert report["environment"]["forced_path"] == {"variable": ENV_PATH, "value": "fastest-please", "valid": False}
    assert any(n.startswith(f"{ENV_PATH}='fastest-please' is not understood") for n in report["status"]["notes"])
    row = next(r for r in report["models"][0]["layers"] if r["layer"] == "layers.0.attention.qkv")
    assert f"{ENV_PATH}='fastest-please' is not understood" in row["reason"]


def test_fused_path_reports_autotune_pick_per_shape(tmp_path, gen):
    # The path argument forces the fused kernel: Triton's CPU interpreter here, the GPU on a GPU.
    PICKER.clear()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ran = load_and_run(tmp_path, gen, branches=("conditional",), steps=1, path="triton-int8", device=device)
    report = status.status_report()
    validate(report)
    (model,) = report["models"]
    n_quant = sum(1 for lin in ran["conditional"].values() if lin.kind == "w8a8")
    assert model["counts"]["triton-int8"] == n_quant
    fused_rows = [r for r in model["layers"] if r["path"] == "triton-int8"]
    assert all(r["config"] and r["config_source"] for r in fused_rows)
    assert all(r["reason"] == "" for r in fused_rows)  # the fastest path ran: nothing to explain
    for shape in model["shapes"]:
        if shape["paths"]["triton-int8"]:
            assert shape["autotune"], shape
            picked = {p["config"] for p in shape["autotune"]}
            used = {r["config"] for r in fused_rows if (r["N"], r["K"]) == (shape["N"], shape["K"])}
            assert used <= picked
        else:
            assert shape["autotune"] == []


def test_model_filter_and_layers_flag(tmp_path, gen):
    load_and_run(tmp_path, gen, steps=1)
    only = status.status_report(model="unconditional", include_layers=False)
    validate(only)
    assert [m["label"] for m in only["models"]] == ["unconditional"]
    assert only["models"][0]["layers"] is None
    assert only["models"][0]["layers_total"] > 0
    # without the table, the per-(path, reason) counts still say why: the table's own groups, most first
    full = status.status_report(model="unconditional")["models"][0]
    counted: dict = {}
    for layer in full["layers"]:
        if layer["layer"] not in full["idle"]:  # idle by design: its path did not run, so it has no why-not
            counted[(layer["path"], layer["reason"])] = counted.get((layer["path"], layer["reason"]), 0) + 1
    reasons = only["models"][0]["reasons"]
    assert {(r["path"], r["reason"]): r["layers"] for r in reasons} == counted and len(reasons) == len(counted)
    assert [r["layers"] for r in reasons] == sorted((r["layers"] for r in reasons), reverse=True)
    assert sum(r["layers"] for r in reasons) == only["models"][0]["layers_total"] - len(full["idle"]) > 0
    with pytest.raises(status.StatusQueryError) as err:
        status.status_report(model="conditional#2")
    assert err.value.status == 404 and err.value.parameter == "model"
    assert err.value.as_dict()["known"] == ["conditional", "unconditional"]


def test_models_are_grouped_by_label_and_ordered(tmp_path, gen):
    load_and_run(tmp_path, gen, label_suffix="#2", steps=1)
    load_and_run(tmp_path, gen, steps=1)
    labels = [m["label"] for m in status.status_report(include_layers=False)["models"]]
    assert labels == ["conditional", "conditional#2", "unconditional", "unconditional#2"]


def test_layer_table_is_in_forward_order_whatever_order_layers_were_seen(gen):
    forward = [
        "input_proj",
        "llm_cond_proj",
        "t_embedding.mlp_in",
        "adaln_proj",
        "some_new_top",
        "layers.2.adaln_modulation",
        "layers.2.attention.qkv",
        "layers.2.attention.o",
        "layers.2.feed_forward.w1|w3",
        "layers.2.feed_forward.w2",
        "layers.10.attention.qkv",
        "layers.10.feed_forward.w1",
        "layers.10.feed_forward.w3",
        "layers.10.feed_forward.w2",
        "final_layer.adaln_modulation",
        "final_layer.linear",
    ]
    order = torch.randperm(len(forward), generator=gen).tolist()
    for i in order:
        REGISTRY.declare(f"conditional/{forward[i]}", "bf16", "", 8, 8)
    (model,) = status.status_report()["models"]
    assert [row["layer"] for row in model["layers"]] == forward, order


def test_a_bypass_note_and_the_gate_up_pair_reach_the_report(gen):
    """A model note of op_coverage (a forward routed around the pack's op) is the model's ``bypass`` and a status
    note; the FFN pair's two projections say how the pair ran (``fusion``); schema-valid; clearing the model's
    layers leaves the note, clearing its notes drops it."""
    from comfyui_ideogram4_int8 import kernels as K

    k, f = 64, 32
    x = torch.randn(5, k, generator=gen)
    w1, w3 = (torch.randint(-127, 128, (f, k), dtype=torch.int8, generator=gen) for _ in range(2))
    s1, s3 = torch.rand(f, generator=gen) / 50, torch.rand(f, generator=gen) / 50
    sites = ("conditional/layers.0.feed_forward.w1", "conditional/layers.0.feed_forward.w3")
    K.swiglu_w8a8_pair(x, w1, s1, w3, s3, path="cublas-int8", site=sites)
    REGISTRY.declare("conditional/layers.0.attention.o", "triton-int8", "", k, k)
    message = "1 of 3 quantized linears did not run through the pack's op (layers.0.attention.o): seen in 1 of 1"
    assert model_notes.set_note("conditional", "bypass", message)
    assert not model_notes.set_note("conditional", "bypass", message)  # unchanged
    report = status.status_report()
    validate(report)
    (model,) = report["models"]
    assert model["bypass"] == message
    assert f"conditional: {message}" in report["status"]["notes"]
    rows = {r["layer"]: r for r in model["layers"]}
    for name in ("layers.0.feed_forward.w1", "layers.0.feed_forward.w3"):
        assert rows[name]["fusion"].startswith("gate/up pair: one activation quantization") and rows[name]["N"] == f
    assert rows["layers.0.attention.o"]["fusion"] is None
    REGISTRY.clear("conditional")
    REGISTRY.declare("conditional/layers.0.attention.o", "triton-int8", "", k, k)
    assert status.status_report()["models"][0]["bypass"] == message  # the notes are not the registry's
    model_notes.clear("conditional")
    assert status.status_report()["models"][0]["bypass"] is None


def test_streaming_and_device_notes_reach_the_report_apart_from_bypass():
    """What the streaming patcher and the Branch Device node say about a model is in its entry (``notes``), for the
    panel; the bypass note stays in ``bypass`` only; schema-valid."""
    REGISTRY.declare("unconditional/layers.0.attention.o", "triton-int8", "", 64, 64)
    streaming = (
        "low-VRAM streaming: 1.84 GiB on the card (5 blocks resident, 29 streamed as 87 pieces through 3 slots of "
        "108 MiB)"
    )
    model_notes.set_note("unconditional", "streaming", streaming)
    model_notes.set_note("unconditional", "device", "unconditional branch on cuda:1")
    model_notes.set_note("unconditional", "bypass", "1 of 1 quantized linears did not run through the pack's op")
    report = status.status_report()
    validate(report)
    (model,) = report["models"]
    assert model["notes"] == {"device": "unconditional branch on cuda:1", "streaming": streaming}
    assert model["bypass"].startswith("1 of 1")
    model_notes.set_note("unconditional", "streaming", None)
    assert status.status_report()["models"][0]["notes"] == {"device": "unconditional branch on cuda:1"}
    REGISTRY.clear("unconditional")
    model_notes.clear("unconditional")


def test_layers_declared_at_load_count_as_not_run(tmp_path, gen):
    REGISTRY.declare("conditional/layers.0.attention.qkv", "triton-int8", "", 192, 64)
    report = status.status_report()
    validate(report)
    (model,) = report["models"]
    assert (model["layers_total"], model["layers_run"], model["calls"]) == (1, 0, 0)
    assert model["counts"]["triton-int8"] == 1 and model["counts_run"]["triton-int8"] == 0


def test_the_image_only_passes_text_projection_is_idle_by_design_not_waiting_to_run():
    # the official negative pass has no text tokens: its llm_cond_proj never runs, which the panel listed as "not run
    # in the last pass" with the GEMM path's reason (the CUDA GPU one on a CPU) as its why
    sites = ("llm_cond_proj", "layers.0.attention.qkv")
    for model in ("conditional", "unconditional"):
        for layer in sites:
            REGISTRY.declare(f"{model}/{layer}", "cublas-int8", "the path's reason", 64, 48)
    before = {m["label"]: m for m in status.status_report()["models"]}
    assert before["unconditional"]["idle"] == {}  # nothing ran yet: every layer is still to run
    for layer in sites:
        REGISTRY.record(f"conditional/{layer}", "cublas-int8", "the path's reason", 5, 64, 48)
    REGISTRY.record("unconditional/layers.0.attention.qkv", "cublas-int8", "the path's reason", 5, 64, 48)
    report = status.status_report()
    validate(report)
    cond, uncond = report["models"]
    assert cond["idle"] == {} and uncond["idle"] == {"llm_cond_proj": status.IMAGE_ONLY_WHY}
    assert (uncond["layers_total"], uncond["layers_run"]) == (2, 1)
    (proj,) = [row for row in uncond["layers"] if row["layer"] == "llm_cond_proj"]
    assert proj["reason"] == status.IMAGE_ONLY_WHY and proj["calls"] == 0
    assert uncond["reasons"] == [{"path": "cublas-int8", "reason": "the path's reason", "layers": 1}]
    # a negative pass with text (ConditioningZeroOut wired in) runs it: then it is an ordinary layer
    REGISTRY.record("unconditional/llm_cond_proj", "cublas-int8", "the path's reason", 5, 64, 48)
    assert status.status_report()["models"][1]["idle"] == {}


def test_the_reason_every_cpu_layer_shares_is_named_once_for_the_device(tmp_path, gen):
    if torch.cuda.is_available():
        pytest.skip("the shared reason is the CPU's")
    from comfyui_ideogram4_int8.kernels.backends import no_cuda_reason

    load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    report = status.status_report()
    validate(report)
    shared = report["path_labels"]["device_reason"]
    assert shared == no_cuda_reason("cpu")
    quantized = [row for row in report["models"][0]["layers"] if row["path"] != "bf16"]
    # the panel cuts it out of these reasons (web/lib/gemm_status.mjs withoutDeviceReason): they must carry it as is
    assert quantized and all(row["reason"].startswith(shared + "; ") for row in quantized)


# -- no paths, no tokens --------------------------------------------------------------------------


def test_report_leaks_no_paths_or_tokens(tmp_path, gen, setting):
    secret = "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4"
    home = os.path.expanduser("~")
    ckpt_dir = tmp_path / "private models"
    ckpt_dir.mkdir()
    load_and_run(ckpt_dir, gen, branches=("conditional",), steps=1)
    # a careless loader could put a file path and a token into a reason or a label
    REGISTRY.record(
        f"{home}/x/conditional/leak", "bf16", f"read {ckpt_dir}/ideogram4.safetensors with token={secret}", 1, 8, 8
    )
    REGISTRY.record(
        "conditional/win", "bf16", rf"C:\Users\me\ComfyUI\models\unet\ig4.safetensors Bearer {secret}", 1, 8, 8
    )
    setting(ENV_PATH, f"{home}/weird")
    text = json.dumps(status.status_report())
    for needle in (secret, home, str(tmp_path), str(ROOT), os.getcwd(), "C:\\\\Users", "private models"):
        assert needle not in text, needle
    assert "ideogram4.safetensors" in text and "ig4.safetensors" in text  # basenames survive
    assert "token=***" in text and "Bearer ***" in text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("forced by IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16", "forced by IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16"),
        (
            "cuBLASLt int8 needs K and N multiples of 8 (got K=3, N=5)",
            "cuBLASLt int8 needs K and N multiples of 8 (got K=3, N=5)",
        ),
        ("N/K split", "N/K split"),
        ("conditional/layers.0.attention.qkv", "conditional/layers.0.attention.qkv"),
        ("loaded /home/u/m/ig4.safetensors ok", "loaded ig4.safetensors ok"),
        ("see ~/.cache/comfyui_ideogram4_int8/autotune.json", "see autotune.json"),
        (r"D:\models\unet\a.safetensors", "a.safetensors"),
        ("key hf_abcdefgh12345678 here", "key hf_*** here"),
        ("api_key: xyz123", "api_key: ***"),
    ],
)
def test_scrub_text(raw, expected):
    assert status.scrub_text(raw) == expected
