"""Every input the pack refuses, sent through ``POST /prompt`` to a real ComfyUI 0.33 (skipped without COMFYUI_DIR).

Two moments a refusal can come at, both checked the way a user meets them:

* before the run: ComfyUI answers ``POST /prompt`` with HTTP 400 and ``node_errors``. ComfyUI's own checks (the
  widgets' min / max, combo lists) must hold for every sampler input, width and height included, each error listed
  once, under the input at fault; the pack's own checks cover only what ComfyUI cannot express (element boxes with
  no width or with swapped edges, drawn boxes with no area). ComfyUI lists a failure of a node's ``validate_inputs``
  under every input that function names (execution.validate_inputs), so the tests pin which inputs those are and
  that the message names the one at fault.
* when the node runs: an ``execution_error`` in the history, on the node where the user fixes it (sizes that are
  not multiples of 16 or past 6:1, polish_steps > steps, a drawn box off the canvas, damaged or foreign model
  files, an empty desc named by its element node).

No error type or message may carry a filesystem path (the server runs from a temporary base folder, so any path
would contain it), and the pack's error types read ``comfyui_ideogram4_int8.<Name>``.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import urllib.error
import urllib.request
import uuid

import pytest
import torch
from caption_fixtures import drawn_box
from workflow_models import loader_node

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = int.from_bytes(os.urandom(3), "little")
SAMPLER = "8"


def _setup(base: pathlib.Path) -> None:
    from comfyui_ideogram4_int8.ideogram4 import synthetic
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
    from safetensors.torch import save_file
    from workflow_models import two_branch_weights

    models = base / "models" / "diffusion_models"
    models.mkdir(parents=True)
    cfg = Ideogram4Config.demo()
    good = synthetic.write_w8a8(models / "i4_w8a8.safetensors", two_branch_weights(cfg, SEED), cfg)
    data = pathlib.Path(good).read_bytes()
    (models / "damaged.safetensors").write_bytes(os.urandom(4096))
    (models / "cut_short.safetensors").write_bytes(data[: len(data) // 2])
    (models / "lfs_pointer.safetensors").write_bytes(
        b"version https://git-lfs.github.com/spec/v1\noid sha256:0123abcd\nsize 20400000000\n"
    )
    g = torch.Generator().manual_seed(SEED)
    save_file(
        {
            "layers.0.mlp.fc1.weight": torch.randn(64, 32, generator=g),
            "layers.0.mlp.fc2.weight": torch.randn(32, 64, generator=g),
        },
        str(models / "other_dit.safetensors"),
    )
    save_file({"cond": torch.randn(1, 6, cfg.llm_features_dim, generator=g)}, str(base / "cond.safetensors"))


@pytest.fixture(scope="module")
def srv():
    from comfyui_server import WITH_TEST_PACK, ComfyUIServer, started

    with started(ComfyUIServer(packs=WITH_TEST_PACK, setup=_setup)) as server:
        yield server


def _post(srv, graph: dict) -> tuple[int, dict]:
    body = json.dumps({"prompt": graph, "client_id": uuid.uuid4().hex}).encode()
    req = urllib.request.Request(
        srv.url + "/prompt", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _no_paths(srv, text: str) -> None:
    assert str(srv.base) not in text and "/custom_nodes/" not in text, text
    assert str(ROOT) not in text, text


def _refused(srv, graph: dict) -> dict:
    """node_errors of a prompt ComfyUI refuses before running anything (HTTP 400)."""
    status, body = _post(srv, graph)
    assert status == 400, (status, body)
    assert body["error"]["type"] == "prompt_outputs_failed_validation", body
    _no_paths(srv, json.dumps(body))
    return body["node_errors"]


def _run_error(srv, graph: dict) -> dict:
    """The execution_error of a prompt ComfyUI accepts and then stops on."""
    status, body = _post(srv, graph)
    assert status == 200 and not body.get("node_errors"), body
    entry = srv.wait_for_history(body["prompt_id"], timeout=300)
    errors = [d for kind, d in entry["status"]["messages"] if kind == "execution_error"]
    assert entry["status"]["status_str"] == "error" and len(errors) == 1, entry["status"]
    _no_paths(srv, errors[0]["exception_message"] + errors[0]["exception_type"])
    return errors[0]


def _ran(srv, graph: dict) -> dict:
    status, body = _post(srv, graph)
    assert status == 200 and not body.get("node_errors"), body
    entry = srv.wait_for_history(body["prompt_id"], timeout=300)
    assert entry["status"]["status_str"] == "success", entry["status"]
    return entry


def _where(errors: list[dict]) -> list[tuple[str, str]]:
    return [(e["type"], e["extra_info"]["input_name"]) for e in errors]


# -- the sampler --------------------------------------------------------------------------------------------------

CUSTOM = {"steps": 4, "guidance": 7.0, "polish_steps": 1, "polish_guidance": 3.0, "mu": 0.0, "std": 1.75}


def _sampler_graph(srv, **inputs) -> dict:
    sampler = {
        "model": ["1", 0],
        "model_negative": ["1", 1],
        "positive": ["2", 0],
        "seed": 1,
        "preset": "Turbo 12",
        "width": 256,
        "height": 256,
        "batch_size": 1,
        **CUSTOM,
        **inputs,
    }
    return {
        "1": loader_node(),
        "2": {"class_type": "Ideogram4TestConditioning", "inputs": {"path": str(srv.base / "cond.safetensors")}},
        SAMPLER: {"class_type": "Ideogram4Int8Sampler", "inputs": sampler},
        "9": {"class_type": "PreviewAny", "inputs": {"source": [SAMPLER, 0]}},
    }


def _sampler_widgets(srv) -> dict:
    info = srv.object_info("Ideogram4Int8Sampler")["input"]
    return {**info["required"], **info.get("optional", {})}


def test_every_sampler_widget_keeps_comfyuis_own_min_max_check(srv):
    """Out of range by one step below min and above max: exactly one error, ComfyUI's own, under that input."""
    widgets = _sampler_widgets(srv)
    checked = []
    for name, (kind, opts) in widgets.items():
        if kind not in ("INT", "FLOAT"):
            continue
        assert {"min", "max", "step"} <= set(opts), (name, opts)  # each number widget its own range and step
        step = 1 if kind == "INT" else 0.5
        for value, code in (
            (opts["min"] - step, "value_smaller_than_min"),
            (opts["max"] + step, "value_bigger_than_max"),
        ):
            if kind == "INT" and abs(value) > 2**63:
                continue  # the seed's bounds are the int64 range itself
            errors = _refused(srv, _sampler_graph(srv, **{name: value}))
            assert list(errors) == [SAMPLER], errors
            assert _where(errors[SAMPLER]["errors"]) == [(code, name)], (name, value, errors)
            checked.append(name)
    assert set(checked) >= {
        "steps",
        "guidance",
        "polish_steps",
        "polish_guidance",
        "mu",
        "std",
        "batch_size",
        "width",
        "height",
    }


@pytest.mark.parametrize(
    "name,value", [("guidance", -1.0), ("polish_guidance", -3.0), ("steps", 0), ("std", 0.0), ("batch_size", 0)]
)
def test_the_inputs_issue_22_saw_queued_are_refused_once_by_comfyui(srv, name, value):
    errors = _refused(srv, _sampler_graph(srv, **{name: value}))
    assert _where(errors[SAMPLER]["errors"]) == [("value_smaller_than_min", name)]


def test_an_unknown_preset_is_refused_by_comfyuis_combo_check(srv):
    errors = _refused(srv, _sampler_graph(srv, preset="Ultra 99"))
    assert _where(errors[SAMPLER]["errors"]) == [("value_not_in_list", "preset")]


@pytest.mark.parametrize(
    "name,value,code",
    [
        ("width", 0, "value_smaller_than_min"),
        ("width", 250, "value_smaller_than_min"),
        ("width", 2064, "value_bigger_than_max"),
        ("height", 100000, "value_bigger_than_max"),
    ],
)
def test_a_size_out_of_range_is_one_error_on_that_widget(srv, name, value, code):
    errors = _refused(srv, _sampler_graph(srv, **{name: value}))
    assert list(errors) == [SAMPLER], errors
    assert _where(errors[SAMPLER]["errors"]) == [(code, name)], errors  # not repeated under the other side


@pytest.mark.parametrize(
    "size,says",
    [
        ({"width": 1000}, "width=1000 is not a multiple of 16 (the latent is 1/16 of the image): use 992 or 1008"),
        ({"height": 1030}, "height=1030 is not a multiple of 16"),
        (
            {"width": 2048, "height": 256},
            "width=2048 and height=256 make an aspect ratio of 8.00:1; Ideogram 4 supports "
            "at most 6:1 — make the width smaller or the height larger",
        ),
    ],
)
def test_a_size_comfyui_cannot_check_stops_the_sampler_in_one_error(srv, size, says):
    err = _run_error(srv, _sampler_graph(srv, **size))  # one execution_error, before the sampler samples
    assert err["node_id"] == SAMPLER and err["exception_type"] == "comfyui_ideogram4_int8.SamplingArgumentError"
    assert err["exception_message"].strip().startswith(f"Ideogram 4 Sampler: {says}"), err["exception_message"]


def test_polish_steps_above_steps_stops_the_sampler_before_it_samples(srv):
    err = _run_error(srv, _sampler_graph(srv, preset="custom", steps=4, polish_steps=6))
    assert err["node_id"] == SAMPLER and err["node_type"] == "Ideogram4Int8Sampler"
    assert err["exception_type"] == "comfyui_ideogram4_int8.SamplingArgumentError"
    assert err["exception_message"].strip() == (
        "Ideogram 4 Sampler: polish_steps=6 is more than steps=4 (the polish "
        "steps are the last steps of the run): lower polish_steps or raise "
        "steps"
    )
    # the same values under a named preset are unused, so nothing is refused
    _ran(srv, _sampler_graph(srv, preset="Turbo 12", steps=4, polish_steps=6, width=256, height=256))


# -- caption nodes --------------------------------------------------------------------------------------------------


def _element(kind: str, **bbox) -> dict:
    inputs = {
        "desc": "a red bicycle",
        "placed": True,
        "y_min": 100,
        "x_min": 100,
        "y_max": 400,
        "x_max": 900,
        "color_palette": "",
    }
    if kind == "Ideogram4Int8TextElement":
        inputs["text"] = "OPEN"
    return {"class_type": kind, "inputs": {**inputs, **bbox}}


def _caption_graph(elements_node: dict) -> dict:
    return {
        "3": elements_node,
        "4": {
            "class_type": "Ideogram4Int8CaptionBuilder",
            "inputs": {
                "high_level_description": "A street at night.",
                "background": "a brick wall",
                "on_invalid": "error",
                "elements": ["3", 0],
            },
        },
        # the caption nodes are not output nodes (a broken model part must fail the prompt): what shows them
        CAPTION_SHOWN: {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
        REPORT_SHOWN: {"class_type": "PreviewAny", "inputs": {"source": ["4", 1]}},
    }


CAPTION_SHOWN, REPORT_SHOWN = "5", "6"


BBOX_WIDGETS = [("custom_validation_failed", k) for k in ("placed", "y_min", "x_min", "y_max", "x_max")]


@pytest.mark.parametrize("kind", ["Ideogram4Int8ObjectElement", "Ideogram4Int8TextElement"])
@pytest.mark.parametrize(
    "bbox,says",
    [
        (
            {"x_min": 900, "x_max": 100},
            "x_min=900 is greater than x_max=100: x_min is the box's left edge and x_max "
            "its right edge — swap the two values",
        ),
        ({"y_min": 700, "y_max": 300}, "y_min=700 is greater than y_max=300"),
        ({"x_min": 500, "x_max": 500}, "x_min = x_max = 500: the box has no width"),
        ({"y_max": 1200}, "y_max=1200 is off the image: the grid runs 0..1000"),
        ({"x_min": -20}, "x_min=-20 is off the image"),
    ],
)
def test_a_bad_element_box_is_refused_on_the_element_node_naming_the_widget(srv, kind, bbox, says):
    errors = _refused(srv, _caption_graph(_element(kind, **bbox)))
    assert list(errors) == ["3"], errors  # the element, not the Caption Builder
    assert errors["3"]["class_type"] == kind
    found = errors["3"]["errors"]
    assert _where(found) == BBOX_WIDGETS, found  # the bbox widgets the check reads, nothing else
    assert all(says in e["details"] for e in found), found


def test_an_unplaced_element_ignores_its_box_widgets(srv):
    entry = _ran(srv, _caption_graph(_element("Ideogram4Int8ObjectElement", placed=False, x_min=900, x_max=100)))
    assert '"bbox"' not in entry["outputs"][CAPTION_SHOWN]["text"][0]


def _boxes_graph(*boxes, width=1024, height=576) -> dict:
    layout = {
        "class_type": "Ideogram4Int8LayoutBoxes",
        "inputs": {"width": width, "height": height, "boxes": {"__value__": list(boxes)}},
    }
    return _caption_graph(layout)


_box = functools.partial(drawn_box, desc="a parked red bicycle")


@pytest.mark.parametrize(
    "bad,says",
    [
        (_box(600, 360, 0, 200), "box 2 (obj 'a parked red bicycle'): its width is 0 px: the box has no area"),
        (_box(600, 360, 300, 0, kind="text", text="OPEN"), "box 2 (text 'OPEN'): its height is 0 px"),
        (
            _box(600, 360, -300, 200),
            "box 2 (obj 'a parked red bicycle'): its width is -300 px: a box is its top-left "
            "corner (x, y) and a positive width and height — draw it again",
        ),
    ],
)
def test_a_drawn_box_with_no_area_is_refused_before_the_run_naming_the_box(srv, bad, says):
    errors = _refused(srv, _boxes_graph(_box(10, 10, 100, 100, desc="a lamp"), bad))
    assert list(errors) == ["3"], errors
    found = errors["3"]["errors"]
    assert _where(found) == [("custom_validation_failed", "boxes")], found  # once, on the boxes widget
    assert found[0]["details"].startswith(f"boxes - {says}"), found


def test_a_drawn_box_off_the_canvas_stops_the_layout_node_naming_the_box(srv):
    err = _run_error(srv, _boxes_graph(_box(10, 10, 100, 100, desc="a lamp"), _box(1100, 10, 50, 50)))
    assert err["node_id"] == "3" and err["node_type"] == "Ideogram4Int8LayoutBoxes"
    assert err["exception_type"] == "ValueError"
    assert err["exception_message"].strip() == (
        "node 3 (Ideogram 4 Layout Boxes), box 2 (obj 'a parked red bicycle'): it lies outside the 1024x576 canvas "
        "(x 1100..1150, y 10..60 px) — move it onto the canvas or delete it"
    )


def test_a_drawn_box_past_the_edge_is_clamped_and_the_report_says_so(srv):
    entry = _ran(srv, _boxes_graph(_box(900, 400, 300, 300)))
    report = entry["outputs"][REPORT_SHOWN]["text"][0]
    assert (
        "node 3 (Ideogram 4 Layout Boxes) box 1: reached past the bottom and right edges of the 1024x576 canvas; "
        "clamped to the canvas (bbox [694, 879, 1000, 1000])"
    ) in report
    assert '"bbox":[694,879,1000,1000]' in entry["outputs"][CAPTION_SHOWN]["text"][0]


def test_a_caption_problem_names_the_element_node_and_widget_to_fix(srv):
    err = _run_error(srv, _caption_graph(_element("Ideogram4Int8ObjectElement", desc="  ")))
    assert err["node_id"] == "4"  # the caption is checked where it is assembled ...
    # ... and the message says where to fix it: the element's node and widget, with the JSON path for reference
    assert (
        "- node 3 (Ideogram 4 Object Element), widget 'desc': is empty — fix: write what the element looks like"
        in err["exception_message"]
    )
    assert "($.compositional_deconstruction.elements[0].desc)" in err["exception_message"]


# -- model files ------------------------------------------------------------------------------------------------------


def _loader_graph(weights: str) -> dict:
    return {
        "1": {
            "class_type": "Ideogram4Int8Loader",
            "inputs": {
                "weights": weights,
                "unconditional_weights": "(second branch of the weights file)",
                "base": "none",
                "unconditional_base": "none",
                "compute_dtype": "fp32",
                "gemm_path": "auto",
            },
        },
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}},
    }


@pytest.mark.parametrize(
    "name,says",
    [
        (
            "damaged.safetensors",
            [
                "damaged.safetensors: the file is damaged: it is not readable as safetensors",
                "Fix: download the file again",
            ],
        ),
        (
            "cut_short.safetensors",
            [
                "cut_short.safetensors: the file is truncated (incomplete, e.g. an interrupted download)",
                "Fix: download the file again",
            ],
        ),
        ("lfs_pointer.safetensors", ["the file is a Git LFS pointer", "Fix: download the real file"]),
        (
            "other_dit.safetensors",
            [
                "other_dit.safetensors: this is not an Ideogram 4 diffusion model",
                "Fix: pick an Ideogram 4 diffusion model: the W8A8 file ideogram4-int8-w8a8.safetensors",
            ],
        ),
    ],
)
def test_a_bad_model_file_says_what_happened_and_the_one_fix(srv, name, says):
    err = _run_error(srv, _loader_graph(name))
    assert err["node_id"] == "1" and err["exception_type"] == "ValueError"
    message = err["exception_message"]
    assert message.startswith("Ideogram 4 INT8 Loader"), message
    for part in says:
        assert part in message, message
    assert "pass a .safetensors file" not in message and "config=" not in message


# -- the demo nodes -----------------------------------------------------------------------------------------------


def test_the_demo_decode_refuses_a_latent_of_another_model_naming_samples(srv):
    graph = {
        "1": {"class_type": "EmptyLatentImage", "inputs": {"width": 256, "height": 256, "batch_size": 1}},
        "2": {"class_type": "Ideogram4Int8DemoDecode", "inputs": {"samples": ["1", 0]}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }
    err = _run_error(srv, graph)
    assert err["node_id"] == "2" and err["exception_type"] == "ValueError"
    message = err["exception_message"]
    assert message.startswith("Ideogram 4 INT8 Demo Decode: 'samples': latent has 4 channels"), message
    assert "demo model's latents have 128" in message and "Ideogram 4 Sampler" in message


def test_a_demo_model_gemm_path_not_offered_is_refused_by_comfyuis_combo_check(srv):
    graph = {
        "1": {"class_type": "Ideogram4Int8DemoLoader", "inputs": {"compute_dtype": "fp32", "gemm_path": "fast"}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}},
    }
    errors = _refused(srv, graph)["1"]["errors"]
    assert _where(errors) == [("value_not_in_list", "gemm_path")], errors
