"""The example workflows in a real ComfyUI 0.33 (skipped without COMFYUI_DIR).

The server gets this pack, the test-only pack (tests/comfy_test_pack) and small synthetic stand-ins for every model
file the workflows name, under the real names (tests/workflow_models.py): a tiny Ideogram 4 W8A8 file, tiny native
fp8_scaled files for both branches (ComfyUI's own UNETLoader reads them; the test pack gives ComfyUI the tiny sizes),
a tiny Flux2-layout VAE, and an empty placeholder for the text encoder.

* the Templates browser lists exactly the UI files, and serves them and their card pictures;
* the pinned node definitions (tests/fixtures) equal what this server reports;
* each shipped API workflow passes ComfyUI's prompt validation unchanged;
* each workflow runs through ComfyUI's own execution code down to a saved image. The 8B text encoder's weights are
  absent here, so the test replaces CLIPLoader + CLIPTextEncode in a copy of the API workflow with the test-only node
  ``Ideogram4TestConditioning`` (text features from a file, same node id, so every link stays as shipped); every other
  node and value is the shipped one (1024x1024, Default 20). The native DualModelGuider graph gives the same image as
  the pack's sampler node (same seed, models, conditioning and schedule);
* each UI workflow opens from the Templates browser in headless Chromium with no missing node types, widget value
  changes, flagged nodes, error overlays or console errors, at a zoom where node text is drawn, with every node in
  view and nothing overlapping (screenshots in EXAMPLE_SHOTS_DIR, default a pytest tmp folder: look at them);
  without the model files the frontend lists exactly the workflow's files to download.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import pathlib
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest
import torch
from browser_checks import shots_dir
from comfyui_server import PACK_NAME, ComfyUIServer, history_errors
from workflow_checks import (
    ALL_UI,
    NATIVE_FIXTURE,
    OUR_WORKFLOWS,
    PACK_FIXTURE,
    TEMPLATES,
    live_snapshot,
    load_api,
    load_ui,
    model_files_of,
    pack_node_types,
    ui_file,
)
from workflow_models import COND, example_server

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK_SCRIPT = ROOT / "tests" / "browser" / "example_workflow_check.mjs"
SHARED_SCRIPT = ROOT / "tests" / "browser" / "shared_workflow_check.mjs"
SEED = int.from_bytes(os.urandom(3), "little")


def _start(with_models: bool) -> ComfyUIServer:
    server = example_server(with_models, SEED).start()
    assert server.import_failures() == [], server.log_tail()
    return server


@pytest.fixture(scope="module")
def srv():
    server = _start(with_models=True)
    try:
        yield server
    finally:
        server.stop()


def _get(srv, path: str) -> tuple[bytes, str]:
    with urllib.request.urlopen(srv.url + path, timeout=30) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


# -- what the server offers -----------------------------------------------------------------------------------------


def test_templates_browser_lists_the_ui_files_and_serves_them(srv):
    listed = srv.get_json("/workflow_templates")
    assert sorted(listed[PACK_NAME]) == sorted(TEMPLATES.values())  # API twins (in api/) are not templates
    for name in ALL_UI:
        title = urllib.parse.quote(TEMPLATES[name])  # as the frontend fetches it: a file name with spaces
        body, _ = _get(srv, f"/api/workflow_templates/{PACK_NAME}/{title}.json")
        assert json.loads(body) == load_ui(name)
        picture, kind = _get(srv, f"/api/workflow_templates/{PACK_NAME}/{title}.jpg")
        assert kind == "image/jpeg" and picture[:3] == b"\xff\xd8\xff"


def test_pinned_native_definitions_equal_this_comfyui(srv):
    pinned = json.loads(NATIVE_FIXTURE.read_text(encoding="utf-8"))
    assert srv.get_json("/system_stats")["system"]["comfyui_version"] == pinned["comfyui_version"]
    assert live_snapshot(srv.url, pinned["nodes"]) == pinned["nodes"]


def test_pack_definition_snapshot_equals_this_comfyui(srv):
    pinned = json.loads(PACK_FIXTURE.read_text(encoding="utf-8"))["nodes"]
    live = live_snapshot(srv.url, pack_node_types(srv.url))
    assert live == pinned, "the pack's nodes changed: regenerate with `python tests/workflow_checks.py pin <url>`"


@pytest.mark.parametrize("name", OUR_WORKFLOWS)
def test_shipped_api_workflow_passes_comfyui_validation(srv, name):
    # queued unchanged: every node validates (node_errors empty); it then runs until CLIPLoader meets the empty
    # text-encoder placeholder
    queued = srv.post_json("/prompt", {"prompt": load_api(name), "client_id": "validation"})
    assert queued["node_errors"] == {}, queued["node_errors"]
    entry = srv.wait_for_history(queued["prompt_id"], timeout=600)
    assert entry["status"]["status_str"] == "error"
    failed = [
        (d.get("node_type"), d.get("node_id")) for kind, d in entry["status"]["messages"] if kind == "execution_error"
    ]
    clip = next(k for k, n in load_api(name).items() if n["class_type"] == "CLIPLoader")
    assert failed == [("CLIPLoader", clip)], history_errors(entry)


# A broken model part must fail the prompt. ComfyUI 0.33 runs every output node whose inputs validate and answers
# 200 + node_errors for the rest; while the caption nodes were output nodes, a missing model file or a bad sampler
# value ran the captions alone and the history said "success" with no image. (field, value) per broken prompt:
BROKEN = {
    "loader weights file missing": ("Ideogram4Int8Loader", "weights", "ideogram4-int8-w8a8-MISSING.safetensors"),
    "loader second weights file missing": (
        "Ideogram4Int8Loader",
        "unconditional_weights",
        "ideogram4-int8-w8a8-MISSING.safetensors",
    ),
    "sampler preset not offered": ("Ideogram4Int8Sampler", "preset", "Fast 4"),
    "sampler steps past max": ("Ideogram4Int8Sampler", "steps", 100000),
    "unet file missing": ("UNETLoader", "unet_name", "ideogram4_fp8_scaled-MISSING.safetensors"),
    "patch gemm_path not offered": ("Ideogram4Int8Patch", "gemm_path", "fastest"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_model_part_fails_the_prompt_naming_node_and_field(srv, case):
    node_type, field, value = BROKEN[case]
    name = next(n for n in OUR_WORKFLOWS if any(x["class_type"] == node_type for x in load_api(n).values()))
    prompt = runnable_copy(load_api(name), str(srv.base / COND))  # runnable apart from the broken value
    node_id = next(k for k, n in prompt.items() if n["class_type"] == node_type)
    assert field in prompt[node_id]["inputs"], (node_type, field)
    prompt[node_id]["inputs"][field] = value
    req = urllib.request.Request(
        srv.url + "/prompt",
        data=json.dumps({"prompt": prompt, "client_id": "broken"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:  # 200 = queued: the captions would run as a "success"
        urllib.request.urlopen(req, timeout=60)
    assert refused.value.code == 400
    body = json.loads(refused.value.read())
    assert body["error"]["type"] == "prompt_outputs_failed_validation", body
    errors = body["node_errors"]
    assert node_id in errors, errors
    assert errors[node_id]["class_type"] == node_type
    named = [e.get("extra_info", {}).get("input_name") for e in errors[node_id]["errors"]]
    assert field in named, errors[node_id]
    # nothing of the prompt ran: no caption-only "success" in the history
    history = srv.get_json("/history")
    assert not [e for e in history.values() if e.get("prompt", [None, None, {}])[2] == prompt]


# -- running each workflow ------------------------------------------------------------------------------------------


def runnable_copy(api: dict, cond_path: str, tag: str = "") -> dict:
    """The API workflow with the text encoder replaced: CLIPTextEncode becomes the test-only conditioning node
    (same id, so its consumers stay wired as shipped) and CLIPLoader, which fed only it, goes."""
    graph = copy.deepcopy(api)
    encode = [k for k, n in graph.items() if n["class_type"] == "CLIPTextEncode"]
    loaders = [k for k, n in graph.items() if n["class_type"] == "CLIPLoader"]
    assert len(encode) == 1 and len(loaders) == 1
    users = [k for k, n in graph.items() for v in n["inputs"].values() if v == [loaders[0], 0]]
    assert users == encode, "CLIPLoader feeds something besides CLIPTextEncode"
    del graph[loaders[0]]
    graph[encode[0]] = {
        "class_type": "Ideogram4TestConditioning",
        "inputs": {"path": cond_path, "text": api[encode[0]]["inputs"]["text"], "tag": tag},
        "_meta": {"title": "test-only text conditioning (no 8B text encoder here)"},
    }
    return graph


@functools.cache
def _run(srv, name: str) -> dict:
    entry = srv.run_prompt(runnable_copy(load_api(name), str(srv.base / COND), tag=name), timeout=900)
    tracebacks = [
        "".join(d.get("traceback", [])) for kind, d in entry["status"]["messages"] if kind == "execution_error"
    ]
    assert entry["status"]["status_str"] == "success", "\n".join(tracebacks)
    return entry


def _saved_image(srv, name: str) -> torch.Tensor:
    import numpy as np
    from PIL import Image

    api = load_api(name)
    save = next(k for k, n in api.items() if n["class_type"] == "SaveImage")
    images = _run(srv, name)["outputs"][save]["images"]
    assert len(images) == 1
    info = images[0]
    assert info["type"] == "output" and info["subfolder"] == "ideogram4_int8"
    path = srv.base / "output" / info["subfolder"] / info["filename"]
    with Image.open(path) as img:
        assert img.format == "PNG" and img.mode == "RGB"
        return torch.from_numpy(np.asarray(img).copy())


@pytest.mark.parametrize("name", OUR_WORKFLOWS)
def test_workflow_runs_through_comfyui_down_to_an_image(srv, name):
    from comfyui_ideogram4_int8.ideogram4 import validate_caption

    image = _saved_image(srv, name)
    assert tuple(image.shape) == (1024, 1024, 3)  # the shipped size, decoded by the Flux2-layout VAE (x16)
    assert image.float().std() > 5  # not a constant picture
    # the caption chain ran too (it feeds the text encoder, whose stand-in shows what it was given): valid caption
    encoder = next(k for k, n in load_api(name).items() if n["class_type"] == "CLIPTextEncode")
    caption = _run(srv, name)["outputs"][encoder]["text"][0]
    assert validate_caption(caption) == [], caption
    assert "FRESH BREAD" in json.loads(caption)["compositional_deconstruction"]["elements"][-1]["text"]


def test_native_guider_graph_gives_the_same_image_as_the_sampler_node(srv):
    ours = _saved_image(srv, "ideogram4_int8_text_to_image")
    native = _saved_image(srv, "ideogram4_int8_native_guider")
    # same models, seed, conditioning, sigmas and per-step guidance (CFGOverride = the preset's polish steps)
    assert (ours.int() - native.int()).abs().max().item() <= 1
    # and different from the fp8-derived INT8 models (another quantization of other weights: a real difference)
    patched = _saved_image(srv, "ideogram4_int8_fp8_patch")
    assert (ours.float() - patched.float()).abs().mean().item() > 0


def test_two_gpus_workflow_on_a_cpu_leaves_the_model_in_place_says_so_and_gives_the_text_to_image_image(srv):
    """On this --cpu server the Branch Device node ("second GPU") has no second card: it passes the unconditional
    MODEL on unchanged, says so on the node, and the run gives text -> image's picture."""
    name = "ideogram4_int8_two_gpus"
    api = load_api(name)
    branch = next(k for k, n in api.items() if n["class_type"] == "Ideogram4Int8BranchDevice")
    (note,) = _run(srv, name)["outputs"][branch]["text"]
    assert "does nothing" in note and "second GPU" in note, note
    assert (_saved_image(srv, name).int() - _saved_image(srv, "ideogram4_int8_text_to_image").int()).abs().max() <= 1


DEMO = "ideogram4_int8_demo"


def test_demo_workflow_runs_as_shipped_with_no_model_file_and_the_panel_shows_its_int8_paths():
    """The shipped API form of the demo, unchanged, on a server with no model file at all: it runs to a saved image
    of colour noise stamped RANDOM WEIGHTS, and the status route (the GEMM paths panel's source) lists both demo
    branches with every layer run on the pack's paths."""
    import numpy as np
    from comfyui_ideogram4_int8 import kernels
    from comfyui_ideogram4_int8.ideogram4 import demo_model
    from PIL import Image

    api = load_api(DEMO)
    assert model_files_of(load_ui(DEMO)) == {}
    server = _start(with_models=False)
    try:
        assert not any((server.base / "models").rglob("*.safetensors"))
        entry = server.run_prompt(api, timeout=600)
        assert entry["status"]["status_str"] == "success", history_errors(entry) + [server.log_tail()]
        save = next(k for k, n in api.items() if n["class_type"] == "SaveImage")
        (info,) = entry["outputs"][save]["images"]
        assert info["subfolder"] == "ideogram4_int8" and info["filename"].startswith("demo_random_weights")
        with Image.open(server.base / "output" / info["subfolder"] / info["filename"]) as img:
            image = np.asarray(img.convert("RGB")).astype(np.float32)
        assert image.shape == (256, 256, 3)
        assert image[60:].std() > 5  # the sampled latent's colours, not one value
        banner = image[:30]
        assert (banner > 230).mean() > 0.02 and (banner < 30).mean() > 0.5  # white text on the dark strip
        report = server.get_json("/ideogram4_int8/status")
        labels = [m["label"] for m in report["models"]]
        assert sorted(labels) == sorted(demo_model.LABELS.values()), labels
        cfg = demo_model.config()
        n_int8 = len(demo_model.branch_state("conditional").quantized_layers())
        for branch, label in demo_model.LABELS.items():
            (model,) = server.get_json(f"/ideogram4_int8/status?model={label}")["models"]
            # the unconditional branch is image-only: its text projection (an int8 layer) never runs
            unrun = {"conditional": set(), "unconditional": {"llm_cond_proj"}}[branch]
            assert model["layers_total"] == len(list(cfg.linears())), model
            assert {r["layer"] for r in model["layers"] if r["calls"] == 0} == unrun
            assert model["layers_run"] == model["layers_total"] - len(unrun) and model["calls"] > 0
            # a --cpu server: the labelled cublas-int8 fallback for every int8 layer (triton-int8 on a CUDA GPU)
            assert model["counts_run"][kernels.PATH_CUBLAS] == n_int8 - len(unrun), model["counts_run"]
            assert model["counts_run"][kernels.PATH_BF16] == model["layers_total"] - n_int8
            qkv = next(r for r in model["layers"] if r["layer"] == "layers.0.attention.qkv")
            assert qkv["path"] == kernels.PATH_CUBLAS and "CUDA" in qkv["reason"] and qkv["calls"] > 0, qkv
    finally:
        server.stop()


# -- the frontend ---------------------------------------------------------------------------------------------------


@pytest.fixture
def shots(tmp_path):
    return shots_dir(tmp_path, "EXAMPLE_SHOTS_DIR")


CATEGORY = json.loads((ROOT / "locales" / "en" / "main.json").read_text())["templateWorkflows"]["category"][PACK_NAME]


def _open_in_browser(server, out: pathlib.Path, names) -> dict[str, dict]:
    """What the check script reports per workflow key, opening each from the pack's category (the sidebar shows the
    locale's label for the pack's folder) by its card (titled with the file name)."""
    proc = subprocess.run(
        ["node", str(CHECK_SCRIPT), server.url, str(out), PACK_NAME, CATEGORY, *(TEMPLATES[n] for n in names)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + server.log_tail()
    key = {title: name for name, title in TEMPLATES.items()}
    return {key[r["name"]]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}


def test_each_workflow_opens_from_the_templates_browser_cleanly(srv, shots):
    results = _open_in_browser(srv, shots, ALL_UI)
    for name in ALL_UI:
        r = results[name]
        assert r["listed"], f"{name} is not in the Templates browser"
        assert r["cut"] == [], (name, r["cut"])  # the card's title and the category's label read whole
        assert r["nodes"] == len(load_ui(name)["nodes"]) and r["links"] == len(load_ui(name)["links"]), r
        for key in ("missingTypes", "widgetProblems", "errorNodes", "overlays", "consoleProblems"):
            assert r[key] == [], (name, key, r[key])
        # it opens where LiteGraph draws node text (not the 34-42 % of issue 22), every node's title bar on the
        # canvas and clear of the frontend's panels (sidebar, run bar, minimap), nothing overlapping
        view = r["view"]
        assert view["lowQuality"] is False and view["scale"] >= 0.58, (name, view)
        if name == "ideogram4_int8_text_to_image":  # the main example: at 61 % its note could not be read
            assert view["scale"] >= 0.7, view
        assert view["hidden"] == [] and view["overlaps"] == [], (name, view)
    assert (shots / "templates-comfyui_ideogram4_int8.png").is_file()


def test_without_the_model_files_the_frontend_lists_exactly_what_to_download(shots):
    server = _start(with_models=False)
    try:
        results = _open_in_browser(server, shots / "no-models", OUR_WORKFLOWS)
    finally:
        server.stop()
    for name in OUR_WORKFLOWS:
        r = results[name]
        files = model_files_of(load_ui(name))
        count = sum(len(v) for v in files.values())
        assert r["missingTypes"] == [] and r["consoleProblems"] == [], r
        assert f"{count} errors found" in r["overlays"], r["overlays"]
        details = r.get("errorDetails", "")
        assert "Missing Models" in details
        for folder, names in files.items():
            for file in names:
                assert file in details and folder in details, (name, file)


def test_a_shared_workflow_names_this_pack_where_it_is_not_installed(shots):
    """A workflow shared with someone who lacks the pack: the frontend groups its missing nodes by their cnr_id and
    offers that pack for install (through ComfyUI-Manager); without cnr_id they were an "Unknown pack"."""
    import tomllib

    pack_id = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    server = ComfyUIServer(packs={}).start()  # a ComfyUI without this pack
    try:
        files = [str(ui_file(n)) for n in ("ideogram4_int8_demo", "ideogram4_int8_text_to_image")]
        proc = subprocess.run(
            ["node", str(SHARED_SCRIPT), server.url, str(shots), *files], capture_output=True, text=True, timeout=600
        )
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(files)
    for r in results:
        assert pack_id in r["panel"] and "Unknown pack" not in r["panel"], r
