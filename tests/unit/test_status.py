"""The GEMM-path status report (nodes/status_report.py): schema, real runs, parameters, scrubbing, publish().

"Real models built from synthetic checkpoints": ``_load_and_run`` writes a tiny two-branch W8A8 checkpoint
(``ideogram4.synthetic.write_w8a8``, fresh random weights), loads each branch the way the pack does
(``read_branch`` -> ``Ideogram4DiT`` with ``w8a8_linears()``, labelled "conditional" / "unconditional") and
samples a few steps on the CPU (``tests/panel_model.py``); the report is then checked against what ran. The
same checks against the real ComfyUI nodes are in test_status_comfyui.py.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import sys
import types

import jsonschema
import panel_model
import pytest
import torch
from comfyui_ideogram4_int8.kernels import PATHS, REGISTRY, settings
from comfyui_ideogram4_int8.kernels.path_choice import ENV_PATH
from comfyui_ideogram4_int8.kernels.tuning import PICKER
from comfyui_ideogram4_int8.nodes import status_report as status

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "gemm_status_sample.json"


@pytest.fixture(autouse=True)
def clean_registry(setting):
    setting(ENV_PATH, None)
    setting(settings.GEMM_TIMING, None)
    REGISTRY.clear()
    REGISTRY.enable_timing(False)
    status.forget_nodes()
    yield
    status.forget_nodes()
    REGISTRY.clear()
    REGISTRY.enable_timing(False)
    status.switch_timing(False, None)


def validate(report: dict) -> None:
    jsonschema.validate(report, status.load_schema(), cls=jsonschema.Draft202012Validator)


def _load_and_run(tmp_path, gen, **kw):
    """Loader + sampler without ComfyUI (CPU, well under a second): {label: {module: panel_model.Linear}}."""
    return panel_model.load_and_run(tmp_path, gen.initial_seed(), **kw)


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
    _load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
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
    _load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    report = status.status_report()
    validate(report)
    assert report["status"]["code"] == "ok"
    assert report["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert report["environment"]["compute_capability"] == "9.0"


def test_report_matches_what_ran_automatic_path(tmp_path, gen):
    steps = 1 + gen.initial_seed() % 3
    ran = _load_and_run(tmp_path, gen, steps=steps)
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
            elif auto == "cublas-int8":  # the report says why the fused kernel did not run
                assert "CUDA GPU" in row["reason"], row
        # forward order: projections, blocks by index (layers.2 before layers.10), final layer
        names = [row["layer"] for row in model["layers"]]
        top = ["input_proj", "llm_cond_proj", "t_embedding.mlp_in", "t_embedding.mlp_out", "adaln_proj"]
        assert names[: len(top)] == top
        block = [
            "adaln_modulation",
            "attention.qkv",
            "attention.o",
            "feed_forward.w1",
            "feed_forward.w3",
            "feed_forward.w2",
        ]
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
    ran = _load_and_run(tmp_path, gen, branches=("unconditional",), steps=1)
    report = status.status_report(model="unconditional")
    validate(report)
    (model,) = report["models"]
    n_quant = sum(1 for lin in ran["unconditional"].values() if lin.kind == "w8a8")
    assert model["counts"]["dequant-bf16"] == n_quant > 0
    assert model["counts"]["triton-int8"] == model["counts"]["cublas-int8"] == 0
    dq = [r for r in model["layers"] if r["path"] == "dequant-bf16"]
    assert all(r["reason"] == f"forced by {ENV_PATH}=dequant-bf16" for r in dq)
    assert report["environment"]["forced_path"] == {"variable": ENV_PATH, "value": "dequant-bf16", "valid": True}
    assert any(ENV_PATH in n for n in report["status"]["notes"])


def test_invalid_forced_path_is_reported_not_hidden(tmp_path, gen, setting):
    setting(ENV_PATH, "fastest-please")
    _load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    report = status.status_report()
    assert report["environment"]["forced_path"] == {"variable": ENV_PATH, "value": "fastest-please", "valid": False}
    assert any(n.startswith(f"{ENV_PATH}='fastest-please' is not understood") for n in report["status"]["notes"])
    row = next(r for r in report["models"][0]["layers"] if r["layer"] == "layers.0.attention.qkv")
    assert f"{ENV_PATH}='fastest-please' is not understood" in row["reason"]


def test_fused_path_reports_autotune_pick_per_shape(tmp_path, gen):
    # The path argument forces the fused kernel: Triton's CPU interpreter here, the GPU on a GPU.
    PICKER.clear()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ran = _load_and_run(tmp_path, gen, branches=("conditional",), steps=1, path="triton-int8", device=device)
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
    _load_and_run(tmp_path, gen, steps=1)
    only = status.status_report(model="unconditional", include_layers=False)
    validate(only)
    assert [m["label"] for m in only["models"]] == ["unconditional"]
    assert only["models"][0]["layers"] is None
    assert only["models"][0]["layers_total"] > 0
    # without the table, the per-(path, reason) counts still say why: the table's own groups, most first
    full = status.status_report(model="unconditional")["models"][0]
    counted: dict = {}
    for layer in full["layers"]:
        counted[(layer["path"], layer["reason"])] = counted.get((layer["path"], layer["reason"]), 0) + 1
    reasons = only["models"][0]["reasons"]
    assert {(r["path"], r["reason"]): r["layers"] for r in reasons} == counted and len(reasons) == len(counted)
    assert [r["layers"] for r in reasons] == sorted((r["layers"] for r in reasons), reverse=True)
    assert sum(r["layers"] for r in reasons) == only["models"][0]["layers_total"]
    with pytest.raises(status.StatusQueryError) as err:
        status.status_report(model="conditional#2")
    assert err.value.status == 404 and err.value.parameter == "model"
    assert err.value.as_dict()["known"] == ["conditional", "unconditional"]


def test_models_are_grouped_by_label_and_ordered(tmp_path, gen):
    _load_and_run(tmp_path, gen, label_suffix="#2", steps=1)
    _load_and_run(tmp_path, gen, steps=1)
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
    note; the FFN pair's two projections say how the pair ran (``fusion``); schema-valid; cleared with the model."""
    from comfyui_ideogram4_int8 import kernels as K

    k, f = 64, 32
    x = torch.randn(5, k, generator=gen)
    w1, w3 = (torch.randint(-127, 128, (f, k), dtype=torch.int8, generator=gen) for _ in range(2))
    s1, s3 = torch.rand(f, generator=gen) / 50, torch.rand(f, generator=gen) / 50
    sites = ("conditional/layers.0.feed_forward.w1", "conditional/layers.0.feed_forward.w3")
    K.swiglu_w8a8_pair(x, w1, s1, w3, s3, path="cublas-int8", site=sites)
    REGISTRY.declare("conditional/layers.0.attention.o", "triton-int8", "", k, k)
    message = "1 of 3 quantized linears did not run through the pack's op (layers.0.attention.o): seen in 1 of 1"
    assert REGISTRY.set_model_note("conditional", "bypass", message)
    assert not REGISTRY.set_model_note("conditional", "bypass", message)  # unchanged
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
    assert REGISTRY.model_notes("conditional") == {}
    REGISTRY.declare("conditional/layers.0.attention.o", "triton-int8", "", k, k)
    assert status.status_report()["models"][0]["bypass"] is None


def test_streaming_and_device_notes_reach_the_report_apart_from_bypass():
    """What the streaming patcher and the Branch Device node say about a model is in its entry (``notes``), for the
    panel; the bypass note stays in ``bypass`` only; schema-valid; gone with the model."""
    REGISTRY.declare("unconditional/layers.0.attention.o", "triton-int8", "", 64, 64)
    streaming = (
        "low-VRAM streaming: 1.84 GiB on the card (5 blocks resident, 29 streamed as 87 pieces through 3 slots of "
        "108 MiB)"
    )
    REGISTRY.set_model_note("unconditional", "streaming", streaming)
    REGISTRY.set_model_note("unconditional", "device", "unconditional branch on cuda:1")
    REGISTRY.set_model_note("unconditional", "bypass", "1 of 1 quantized linears did not run through the pack's op")
    report = status.status_report()
    validate(report)
    (model,) = report["models"]
    assert model["notes"] == {"device": "unconditional branch on cuda:1", "streaming": streaming}
    assert model["bypass"].startswith("1 of 1")
    REGISTRY.set_model_note("unconditional", "streaming", None)
    assert status.status_report()["models"][0]["notes"] == {"device": "unconditional branch on cuda:1"}
    REGISTRY.clear("unconditional")


def test_layers_declared_at_load_count_as_not_run(tmp_path, gen):
    REGISTRY.declare("conditional/layers.0.attention.qkv", "triton-int8", "", 192, 64)
    report = status.status_report()
    validate(report)
    (model,) = report["models"]
    assert (model["layers_total"], model["layers_run"], model["calls"]) == (1, 0, 0)
    assert model["counts"]["triton-int8"] == 1 and model["counts_run"]["triton-int8"] == 0


# -- no paths, no tokens --------------------------------------------------------------------------


def test_report_leaks_no_paths_or_tokens(tmp_path, gen, setting):
    secret = "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4"
    home = os.path.expanduser("~")
    ckpt_dir = tmp_path / "private models"
    ckpt_dir.mkdir()
    _load_and_run(ckpt_dir, gen, branches=("conditional",), steps=1)
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


# -- query parameters and responses ---------------------------------------------------------------


class MultiDict:
    """The part of aiohttp's MultiDictProxy the validator uses (repeated keys kept)."""

    def __init__(self, pairs):
        self.pairs = list(pairs)

    def keys(self):
        return [k for k, _ in self.pairs]

    def __contains__(self, key):
        return key in self.keys()

    def __len__(self):
        return len(self.pairs)

    def getall(self, key):
        return [v for k, v in self.pairs if k == key]


@pytest.mark.parametrize(
    ("query", "model", "layers"),
    [
        ({}, None, True),
        (None, None, True),
        ({"layers": "0"}, None, False),
        ({"layers": "False"}, None, False),
        ({"layers": " on "}, None, True),
        ({"model": "conditional", "layers": "yes"}, "conditional", True),
        (MultiDict([("model", "unconditional#2")]), "unconditional#2", True),
    ],
)
def test_good_params(query, model, layers):
    assert status.validate_status_params(query) == status.StatusParams(model=model, include_layers=layers)


@pytest.mark.parametrize(
    ("query", "parameter", "fragment"),
    [
        ({"layer": "1"}, "layer", "unknown query parameter 'layer'"),
        ({"x" * 5000: "1"}, "x" * 40 + "...", "unknown query parameter 'xxxx"),
        ({"layers": "maybe"}, "layers", "'layers' must be 1 or 0"),
        ({"layers": ""}, "layers", "'layers' must be 1 or 0"),
        ({"model": ""}, "model", "'model' is empty"),
        ({"model": "x" * 500}, "model", "at most 200"),
        ({"model": "a\nb"}, "model", "printable"),
        (MultiDict([("model", "a"), ("model", "b")]), "model", "given 2 times"),
        (MultiDict([("layers", "1"), ("layers", "0")]), "layers", "given 2 times"),
    ],
)
def test_bad_params_name_the_parameter(query, parameter, fragment):
    with pytest.raises(status.StatusQueryError) as err:
        status.validate_status_params(query)
    assert err.value.status == 400
    assert err.value.parameter == parameter
    assert fragment in str(err.value)
    body = err.value.as_dict()
    assert body["parameter"] == parameter and fragment in body["error"]


def test_status_response_codes(tmp_path, gen, monkeypatch):
    code, body = status.status_response({"layers": "perhaps"})
    assert code == 400 and body["parameter"] == "layers"
    code, body = status.status_response({"model": "conditional"})
    assert code == 404 and body["parameter"] == "model" and body["known"] == []
    _load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    code, body = status.status_response({"model": "conditional", "layers": "0"})
    assert code == 200
    validate(body)

    def boom(*a, **k):
        raise RuntimeError("secret internals at /home/x")

    monkeypatch.setattr(status, "status_report", boom)
    code, body = status.status_response({})
    assert code == 500
    assert "Traceback" not in json.dumps(body) and "/home/x" not in json.dumps(body)
    assert "RuntimeError" in body["error"]


# -- timing ---------------------------------------------------------------------------------------


class StubRegistry:
    """Registry with a finished timed run (CUDA events are not available on a CPU test machine)."""

    def __init__(self, per_path, wall_ms, enabled=True):
        self._last = {"gemm_ms_per_path": per_path, "wall_ms": wall_ms}
        self.timing_enabled = enabled

    def models(self):
        return []

    def layers(self, model=None):
        return []

    def last_run(self):
        return self._last


def test_timing_shares_of_the_run(gen):
    g = torch.Generator().manual_seed(gen.initial_seed())
    ms = {p: float(torch.rand(1, generator=g)) * 100 for p in PATHS}
    wall = sum(ms.values()) * 2.5
    report = status.status_report(registry=StubRegistry(ms, wall))
    validate(report)
    last = report["timing"]["last_run"]
    for p in PATHS:
        assert last["per_path"][p]["ms"] == pytest.approx(ms[p])
        assert last["per_path"][p]["share"] == pytest.approx(ms[p] / wall)
    assert last["gemm_ms"] == pytest.approx(sum(ms.values()))
    assert last["gemm_share"] == pytest.approx(0.4)
    # no wall time (end_run without begin_run): shares are unknown, not invented
    no_wall = status.status_report(registry=StubRegistry(ms, None))
    validate(no_wall)
    assert no_wall["timing"]["last_run"]["gemm_share"] is None


def test_timing_switch_and_note(tmp_path, gen):
    report = status.status_report()
    assert report["timing"]["enabled"] is False and report["timing"]["last_run"] is None
    status.switch_timing(True, "api")
    REGISTRY.begin_run()
    _load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    REGISTRY.end_run()
    report = status.status_report()
    validate(report)
    assert report["timing"]["enabled"] is True and report["timing"]["switched_by"] == "api"
    if not torch.cuda.is_available():  # CPU GEMMs are not timed: the report says so instead of 0 ms
        assert report["timing"]["last_run"] is None
        assert "not timed" in report["timing"]["note"]


@pytest.mark.cuda
def test_timing_of_a_real_gpu_run(tmp_path, gen, setting):
    """On a GPU: CUDA-event timing between begin_run()/end_run() lands in the report per path."""
    setting.experiments("no-autotune")  # toy shapes: the heuristic, no minutes of tuning
    status.switch_timing(True, "api")
    REGISTRY.begin_run()
    _load_and_run(tmp_path, gen, steps=2, device="cuda")
    REGISTRY.end_run()
    report = status.status_report()
    validate(report)
    last = report["timing"]["last_run"]
    assert last is not None, report["timing"]
    ran = {p for m in report["models"] for p in PATHS if m["counts_run"][p]}
    for p in PATHS:
        assert (last["per_path"][p]["ms"] > 0) == (p in ran), (p, last["per_path"][p])
    assert 0 < last["gemm_ms"] <= last["wall_ms"]
    assert 0 < last["gemm_share"] <= 1
    assert report["status"]["code"] == "ok" and report["environment"]["gpu"]


@pytest.mark.parametrize(("raw", "flag"), [("1", True), ("on", True), ("0", False), ("", None), ("sometimes", None)])
def test_timing_switch_and_a_value_not_understood_in_the_notes(raw, flag, setting):
    setting(settings.GEMM_TIMING, raw)
    assert settings.gemm_timing() is flag
    notes = status.status_report()["status"]["notes"]
    assert any(settings.GEMM_TIMING in n and "not understood" in n for n in notes) == (raw == "sometimes")


def test_timing_body_validation():
    assert status.validate_timing_body({"enabled": True}) is True
    assert status.validate_timing_body({"enabled": False}) is False
    bad_bodies = [(None, "enabled"), ([], "enabled"), ({"enabled": "yes"}, "enabled"), ({"enabled": 1}, "enabled")]
    bad_bodies.append(({"enabled": True, "x": 1}, "x"))
    for body, param in bad_bodies:
        with pytest.raises(status.StatusQueryError) as err:
            status.validate_timing_body(body)
        assert err.value.parameter == param and err.value.status == 400


# -- publish() and route registration (nodes/status_nodes.py, with a stand-in PromptServer) ------


class FakeServer:
    def __init__(self, fail=False):
        self.sent = []
        self.fail = fail
        self.routes = None

    def send_sync(self, event, data, sid=None):
        if self.fail:
            raise RuntimeError("loop closed")
        self.sent.append((event, json.loads(json.dumps(data))))


@pytest.fixture
def fake_server(monkeypatch):
    server = FakeServer()
    module = types.ModuleType("server")
    module.PromptServer = types.SimpleNamespace(instance=server)
    monkeypatch.setitem(sys.modules, "server", module)
    return server


def test_publish_sends_schema_valid_compact_report(fake_server, tmp_path, gen):
    from comfyui_ideogram4_int8.nodes import status_nodes

    _load_and_run(tmp_path, gen, steps=1)
    assert status_nodes.publish("run", ["conditional", "unconditional"], node_id=7) is True
    ((event, payload),) = fake_server.sent
    assert event == "ideogram4_int8.status"
    assert payload["event"] == "run" and payload["node_id"] == "7"
    assert payload["models"] == ["conditional", "unconditional"]
    validate(payload["report"])
    assert all(m["layers"] is None for m in payload["report"]["models"])
    assert [m["label"] for m in payload["report"]["models"]] == ["conditional", "unconditional"]


def test_calls_of_the_last_run_are_counted_apart_from_the_total(tmp_path, gen, monkeypatch):
    # two runs of the same models (ComfyUI: two prompts): 'calls' adds them up, 'calls_last_run' is the last one
    run = {"id": "prompt-A"}
    monkeypatch.setattr(REGISTRY, "run_key_source", lambda: run["id"])
    _load_and_run(tmp_path, gen, steps=3)
    run["id"] = "prompt-B"
    _load_and_run(tmp_path, gen, steps=2)
    report = status.status_report()
    validate(report)
    for model in report["models"]:
        ran = [x for x in model["layers"] if x["calls"]]
        assert ran, model["label"]
        for layer in ran:
            assert layer["last_run"] == "prompt-B" and 2 * layer["calls"] == 5 * layer["calls_last_run"], layer
        assert model["last_run"] == "prompt-B"
        assert model["calls"] == sum(x["calls"] for x in ran)
        assert model["calls_last_run"] == sum(x["calls_last_run"] for x in ran) < model["calls"]
    assert report["last_prompt_id"] == "prompt-B"


def test_without_comfyui_runs_are_numbered_by_begin_run(tmp_path, gen):
    REGISTRY.begin_run()
    _load_and_run(tmp_path, gen, steps=1)
    REGISTRY.begin_run()
    _load_and_run(tmp_path, gen, steps=1)
    model = status.status_report()["models"][0]
    assert model["last_run"] == REGISTRY.run_key() and model["calls"] == 2 * model["calls_last_run"] > 0


def test_publish_ties_each_node_to_its_type_run_and_files(fake_server, monkeypatch):
    from comfyui_ideogram4_int8.nodes import status_nodes

    monkeypatch.setattr(status_nodes, "current_prompt_id", lambda: "prompt-A")
    source = {"weights": "a.safetensors", "unconditional_weights": "b.safetensors"}
    status_nodes.publish("load", ["conditional", "unconditional"], node_id=8, node_type="Ideogram4Int8Loader",
                         source=source)  # fmt: skip
    monkeypatch.setattr(status_nodes, "current_prompt_id", lambda: "prompt-B")
    status_nodes.publish("run", ["conditional"], node_id=9, node_type="Ideogram4Int8Sampler")
    payload = fake_server.sent[-1][1]
    assert payload["prompt_id"] == "prompt-B"
    report = payload["report"]
    validate(report)
    assert report["nodes"]["8"] == {
        "node_type": "Ideogram4Int8Loader",
        "event": "load",
        "prompt_id": "prompt-A",
        "models": ["conditional", "unconditional"],
        "source": source,
    }
    assert report["nodes"]["9"]["prompt_id"] == "prompt-B" and report["nodes"]["9"]["source"] is None
    assert report["last_prompt_id"] == "prompt-B"
    status_nodes.publish("load", None, node_id=None)  # no node: nothing remembered
    assert set(status.status_report()["nodes"]) == {"8", "9"}


def test_publish_never_raises(fake_server, monkeypatch, caplog):
    from comfyui_ideogram4_int8.nodes import status_nodes

    fake_server.fail = True
    assert status_nodes.publish("load") is False
    assert "could not push the GEMM status" in caplog.text
    monkeypatch.setitem(sys.modules, "server", None)  # no ComfyUI at all
    assert status_nodes.publish("run") is False

    def boom(**kw):
        raise MemoryError("report")

    monkeypatch.setattr(status_nodes._status, "status_report", boom)
    assert status_nodes.publish("run") is False


def test_publish_is_quiet_without_a_prompt_server(monkeypatch, caplog):
    """In-process use (scripts, benchmarks): no server, nothing to push, nothing to warn about (issue 27)."""
    from comfyui_ideogram4_int8.nodes import status_nodes

    no_class, no_instance = types.ModuleType("server"), types.ModuleType("server")
    no_instance.PromptServer = types.SimpleNamespace(instance=None)
    for module in (None, no_class, no_instance):  # not importable / a ComfyUI that serves nothing
        monkeypatch.setitem(sys.modules, "server", module)
        assert status_nodes.publish("run") is False
    monkeypatch.delitem(sys.modules, "server")  # never imported: publish must not import it either
    assert status_nodes.publish("run") is False and "server" not in sys.modules
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == [], caplog.text


def test_on_load_survives_a_missing_server(monkeypatch, setting, caplog):
    import asyncio

    from comfyui_ideogram4_int8.nodes import status_nodes

    module = types.ModuleType("server")  # a ComfyUI without PromptServer.instance
    module.PromptServer = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "server", module)
    setting(settings.GEMM_TIMING, "1")
    asyncio.run(status_nodes.on_load())
    assert "routes not registered" in caplog.text
    assert REGISTRY.timing_enabled and status.status_report()["timing"]["switched_by"] == "env"


def test_routes_register_once():
    aiohttp_web = pytest.importorskip("aiohttp.web")
    from comfyui_ideogram4_int8.nodes import status_nodes

    routes = aiohttp_web.RouteTableDef()
    assert status_nodes.register_routes(routes) == ["GET /ideogram4_int8/status", "POST /ideogram4_int8/timing"]
    assert status_nodes.register_routes(routes) == []
    assert len(list(routes)) == 2


class FakeRoutes:
    """The two things register_routes uses of aiohttp's RouteTableDef: iteration and .route()."""

    def __init__(self):
        self.defs = []

    def __iter__(self):
        return iter(self.defs)

    def route(self, method, path):
        def deco(handler):
            self.defs.append(types.SimpleNamespace(method=method, path=path, handler=handler))
            return handler

        return deco


def test_routes_register_once_without_aiohttp():
    from comfyui_ideogram4_int8.nodes import status_nodes

    routes = FakeRoutes()
    routes.route("GET", "/other")(lambda r: None)
    assert status_nodes.register_routes(routes) == ["GET /ideogram4_int8/status", "POST /ideogram4_int8/timing"]
    assert status_nodes.register_routes(routes) == []
    assert [(d.method, d.path) for d in routes] == [
        ("GET", "/other"),
        ("GET", "/ideogram4_int8/status"),
        ("POST", "/ideogram4_int8/timing"),
    ]


def test_route_handlers_answer_json_over_http(tmp_path, gen):
    """The aiohttp handlers end to end (aiohttp comes with the test extra, as with ComfyUI)."""
    pytest.importorskip("aiohttp")
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    from comfyui_ideogram4_int8.nodes import status_nodes

    _load_and_run(tmp_path, gen, branches=("conditional",), steps=1)

    async def scenario():
        routes = web.RouteTableDef()
        status_nodes.register_routes(routes)
        app = web.Application()
        app.add_routes(routes)
        async with TestClient(TestServer(app)) as client:
            ok = await client.get("/ideogram4_int8/status?layers=1")
            body = await ok.json()
            bad = await client.get("/ideogram4_int8/status?layers=maybe")
            missing = await client.get("/ideogram4_int8/status?model=nope")
            timing_bad = await client.post("/ideogram4_int8/timing", data="not json")
            timing_on = await client.post("/ideogram4_int8/timing", json={"enabled": True})
            after = await (await client.get("/ideogram4_int8/status?layers=0")).json()
            return (
                ok.status,
                body,
                bad.status,
                await bad.json(),
                missing.status,
                timing_bad.status,
                timing_on.status,
                after,
            )

    ok, body, bad, bad_body, missing, timing_bad, timing_on, after = asyncio.run(scenario())
    assert ok == 200
    validate(body)
    assert body["models"][0]["label"] == "conditional"
    assert bad == 400 and bad_body["parameter"] == "layers" and "Traceback" not in json.dumps(bad_body)
    assert missing == 404 and timing_bad == 400 and timing_on == 200
    assert after["timing"]["enabled"] is True and after["timing"]["switched_by"] == "setting"
