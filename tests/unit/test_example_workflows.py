"""The example workflows (``example_workflows/``), checked without ComfyUI.

Every node type exists (ours: the snapshot of this pack's ``/object_info``; native: the list pinned from ComfyUI
0.33.0; notes: the frontend's own types), every widget value fits its input's type and range, every link joins
matching types, each API twin equals what the frontend queues for its UI file, and each workflow is wired as the
issue asks. The same data is compared with a live ComfyUI in ``test_example_workflows_comfyui.py``.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import tomllib
from workflow_checks import (
    ALL_UI,
    API_DIR,
    EXAMPLES,
    NATIVE_FIXTURE,
    OUR_WORKFLOWS,
    PACK_PREFIX,
    TEMPLATES,
    check_ui,
    layout_problems,
    load_api,
    load_specs,
    load_ui,
    model_files_of,
    named_widget_values,
    opening_zoom,
    ui_file,
    ui_to_api,
)
from workflow_models import FP8, FP8_UNCOND, TEXT_ENCODER, VAE, W8A8

SPECS = load_specs()
SAME_FILE = "(second branch of the weights file)"


class Graph:
    """Queries over a UI-format workflow: nodes by type, what feeds an input, widget values by name."""

    def __init__(self, ui: dict):
        self.ui = ui
        self.nodes = {n["id"]: n for n in ui["nodes"]}
        self.links = {link[0]: link for link in ui["links"]}

    def of_type(self, node_type: str) -> list[dict]:
        return [n for n in self.ui["nodes"] if n["type"] == node_type]

    def one(self, node_type: str) -> dict:
        found = self.of_type(node_type)
        assert len(found) == 1, f"expected one {node_type}, found {len(found)}"
        return found[0]

    def values(self, node: dict) -> dict:
        return named_widget_values(node, SPECS[node["type"]])

    def source(self, node: dict, input_name: str) -> tuple[dict, int] | None:
        """(node, output slot) feeding ``input_name`` of ``node``; None when unconnected."""
        slot = next((s for s in node.get("inputs", []) if s["name"] == input_name), None)
        assert slot is not None, f"{node['type']} has no input '{input_name}'"
        if slot.get("link") is None:
            return None
        link = self.links[slot["link"]]
        return self.nodes[link[1]], link[2]

    def feeds(self, node: dict, input_name: str, source_type: str, slot: int = 0) -> dict:
        src = self.source(node, input_name)
        assert src is not None, f"{node['type']}.{input_name} is not connected"
        assert (src[0]["type"], src[1]) == (source_type, slot), (
            f"{node['type']}.{input_name} is fed by {src[0]['type']} output {src[1]}, expected {source_type} "
            f"output {slot}"
        )
        return src[0]


# -- the folder ---------------------------------------------------------------------------------------------------


def test_template_folder_holds_ui_files_with_api_twins_and_card_pictures():
    assert set(OUR_WORKFLOWS) <= set(ALL_UI)
    for name in ALL_UI:
        ui = load_ui(name)
        # the template browser lists every *.json here and loads it as a graph: UI format only
        assert {"nodes", "links"} <= set(ui), f"{ui_file(name).name} is not a UI-format workflow"
        assert (API_DIR / f"{name}_api.json").is_file(), f"{name} has no API twin in example_workflows/api/"
        picture = ui_file(name).with_suffix(".jpg")
        assert picture.is_file(), f"{name} has no card picture ({picture.name})"
    assert sorted(p.name for p in EXAMPLES.glob("*.json")) == sorted(f"{t}.json" for t in TEMPLATES.values())
    twins = sorted(p.name for p in API_DIR.glob("*.json"))
    assert twins == sorted(f"{n}_api.json" for n in ALL_UI), twins


def test_template_titles_read_as_titles_and_fit_a_card():
    """The Templates dialog (frontend 1.49.6 and 1.58.1) titles a custom pack's card with the file name, on one line
    of about 250 px: it showed ideogram4_int8_text_to_image and the like. A title is words, names the pack, fits, and
    the demo's says what sets it apart (no download)."""
    for title in TEMPLATES.values():
        assert title.startswith("Ideogram 4 ") and "_" not in title and title.isascii(), title
        assert len(title) <= 34, f"{title!r} is cut on a template card"
        assert not any(c in title for c in '/\\:*?"<>|'), f"{title!r} is no file name on Windows"
    assert "no download" in TEMPLATES["ideogram4_int8_demo"]
    assert len(set(TEMPLATES.values())) == len(TEMPLATES)


def test_card_pictures_are_drawn_cards_not_shrunken_graphs():
    from PIL import Image

    for name in ALL_UI:
        with Image.open(ui_file(name).with_suffix(".jpg")) as img:
            # a 512 px square: the builder's card, read at the dialog's size (a 900 px screenshot of the graph was
            # unreadable lines there)
            assert img.size == (512, 512) and img.format == "JPEG", (name, img.size)


def test_every_node_names_its_pack_for_comfyui_manager():
    """What the frontend writes on a node of a registry pack (with ComfyUI-Manager: cnr_id, ver), so that "Install
    Missing Custom Nodes" finds this pack from a shared workflow: the registry id and version of pyproject.toml's
    [project] for the pack's nodes, comfy-core and the ComfyUI version for native ones, none on frontend-only notes."""
    project = tomllib.loads((EXAMPLES.parent / "pyproject.toml").read_text())["project"]
    native = json.loads(NATIVE_FIXTURE.read_text(encoding="utf-8"))
    for name in ALL_UI:
        for node in load_ui(name)["nodes"]:
            props = node["properties"]
            where = f"{name}: {node['type']} #{node['id']}"
            if node["type"].startswith(PACK_PREFIX):
                assert (props.get("cnr_id"), props.get("ver")) == (project["name"], project["version"]), where
                assert props.get("Node name for S&R") == node["type"], where
            elif node["type"] in native["frontend_only"]:
                assert "cnr_id" not in props, where
            else:
                assert props.get("cnr_id") == "comfy-core", where
                assert props.get("ver") == native["comfyui_version"], where


def test_the_templates_category_is_named_after_the_pack_under_either_folder_name():
    """The dialog's category is the pack's folder in custom_nodes: comfyui_ideogram4_int8 (the README's clone) or
    comfyui-ideogram4-int8 (git's default, ComfyUI-Manager's); the pack's locale names it in the sidebar, where the
    folder name was cut."""
    locale = json.loads((EXAMPLES.parent / "locales" / "en" / "main.json").read_text(encoding="utf-8"))
    names = locale["templateWorkflows"]["category"]
    assert set(names) == {"comfyui_ideogram4_int8", "comfyui-ideogram4-int8"}
    assert set(names.values()) == {"Ideogram 4 INT8"}


def test_the_native_list_is_pinned_to_comfyui_0_33():
    pinned = json.loads(NATIVE_FIXTURE.read_text(encoding="utf-8"))
    assert pinned["comfyui_version"].startswith("0.33")
    assert pinned["frontend_version"] == "1.49.6"


# -- every workflow against the node definitions -------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_UI)
def test_nodes_widgets_and_links_fit_the_definitions(name):
    assert check_ui(load_ui(name), SPECS) == []


@pytest.mark.parametrize("name", ALL_UI)
def test_api_twin_is_what_the_frontend_queues_for_the_ui_file(name):
    assert load_api(name) == ui_to_api(load_ui(name), SPECS)


@pytest.mark.parametrize("name", ALL_UI)
def test_layout_opens_readable_without_overlaps(name):
    assert layout_problems(load_ui(name)) == []


def test_the_layout_check_catches_overlaps_and_a_sprawling_graph():
    ui = copy.deepcopy(load_ui("ideogram4_int8_text_to_image"))
    graph = Graph(ui)
    graph.one("VAEDecode")["pos"] = list(graph.one("VAELoader")["pos"])
    assert any("VAEDecode" in p and "overlaps" in p for p in layout_problems(ui))
    ui = copy.deepcopy(load_ui("ideogram4_int8_text_to_image"))
    graph = Graph(ui)
    graph.one("SaveImage")["pos"] = [graph.one("Ideogram4Int8TextElement")["pos"][0], 2000]  # below the Caption group
    caption = next(g for g in ui["groups"] if g["title"] == "Caption")
    caption["bounding"][3] = 2100  # ... which now reaches down to it
    problems = layout_problems(ui)
    assert any("SaveImage" in p and "reaches into group Caption" in p for p in problems), problems
    assert any("readable zoom" in p for p in problems), problems
    assert layout_problems(load_ui("ideogram4_int8_text_to_image")) == []


def test_text_to_image_opens_at_a_zoom_its_note_can_be_read_at():
    # the main example opened at 61 % (a note column of its own, the three element nodes in one column, sized for
    # Nodes 2.0's taller nodes); now four columns, the note under the models, fit a 1600 x 965 canvas at 70 % or more
    ui = load_ui("ideogram4_int8_text_to_image")
    assert opening_zoom(ui) >= 0.7, opening_zoom(ui)
    wide = copy.deepcopy(ui)
    Graph(wide).one("MarkdownNote")["pos"] = [-320, 84]  # a column of its own again, left of the graph
    assert opening_zoom(wide) < 0.7


@pytest.mark.parametrize("name", ALL_UI)
def test_every_workflow_has_a_note_that_says_what_to_do(name):
    g = Graph(load_ui(name))
    text = _note_text(g)
    assert text.startswith("## Ideogram 4"), text[:80]
    for vague in ("is not known", "not known", "unknown"):
        assert vague not in text, f"{name}: the note says {vague!r}; say what the nodes do"


def test_caption_builder_text_boxes_are_the_labelled_multiline_inputs():
    # the frontend draws no label for a multiline box; web/ideogram4_captions.js paints each input's name into it
    js = (EXAMPLES.parent / "web" / "ideogram4_captions.js").read_text(encoding="utf-8")
    assert "function labelTextareas(node)" in js and "labelTextareas(node);" in js
    builder = SPECS["Ideogram4Int8CaptionBuilder"]
    multiline = [name for name, spec, _ in _ordered(builder) if spec[0] == "STRING" and spec[1].get("multiline")]
    assert multiline == ["high_level_description", "background"]


def _ordered(spec):
    from workflow_checks import ordered_inputs

    return ordered_inputs(spec)


# -- the checks catch what they are for (each mutation must be reported) -------------------------------------------


def _mutated(change) -> list[str]:
    ui = copy.deepcopy(load_ui("ideogram4_int8_native_guider"))
    change(Graph(ui))
    return check_ui(ui, SPECS)


def _set(graph: Graph, node_type: str, widget: str, value) -> None:
    node = graph.one(node_type)
    index = list(graph.values(node)).index(widget)
    node["widgets_values"][index] = value
    node.get("widgets_values_named", {})[widget] = value


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (lambda g: _set(g, "Ideogram4Scheduler", "steps", 500), "outside [1, 200]"),
        (lambda g: _set(g, "Ideogram4Scheduler", "steps", 20.0), "not an integer"),
        (lambda g: _set(g, "EmptyFlux2LatentImage", "batch_size", True), "not an integer"),
        (lambda g: _set(g, "Ideogram4Int8Loader", "compute_dtype", "fp16"), "not one of"),
        (lambda g: _set(g, "Ideogram4Int8Loader", "weights", "ideogram4_bf16.safetensors"), "not a file this workflow"),
        (lambda g: _set(g, "CFGOverride", "start_percent", 1.5), "outside [0.0, 1.0]"),
        (lambda g: _set(g, "RandomNoise", "control_after_generate", "sometimes"), "control value"),
        (lambda g: g.one("KSamplerSelect").__setitem__("type", "KSamplerSelectX"), "unknown node type"),
        (lambda g: g.one("DualModelGuider")["widgets_values"].append(1.0), "widget values"),
        (lambda g: g.ui["links"].__setitem__(0, [*g.ui["links"][0][:5], "LATENT"]), "link says LATENT"),
        (lambda g: g.one("SamplerCustomAdvanced")["inputs"][0].__setitem__("link", None), "'noise' is not connected"),
    ],
)
def test_the_checks_report_bad_workflows(change, expect):
    problems = _mutated(change)
    assert any(expect in p for p in problems), problems


def test_a_changed_ui_file_no_longer_matches_its_api_twin():
    ui = copy.deepcopy(load_ui("ideogram4_int8_fp8_patch"))
    graph = Graph(ui)
    sampler = graph.one("Ideogram4Int8Sampler")
    sampler["widgets_values"][list(graph.values(sampler)).index("preset")] = "Turbo 12"
    assert ui_to_api(ui, SPECS) != load_api("ideogram4_int8_fp8_patch")


# -- what the issue asks of each workflow ----------------------------------------------------------------------


def _caption_chain(g: Graph) -> dict:
    """Text element + object element with boxes -> caption builder -> CLIPTextEncode with CLIPLoader(ideogram4);
    returns the CLIPTextEncode node. The caption the nodes build is valid."""
    from comfyui_ideogram4_int8.ideogram4 import validate_caption
    from comfyui_ideogram4_int8.ideogram4.captions import builder as b

    encode = g.one("CLIPTextEncode")
    builder = g.feeds(encode, "text", "Ideogram4Int8CaptionBuilder", 0)
    clip = g.feeds(encode, "clip", "CLIPLoader")
    assert g.values(clip) == {"clip_name": TEXT_ENCODER, "type": "ideogram4", "device": "default"}
    text = g.feeds(builder, "elements", "Ideogram4Int8TextElement")
    obj = g.feeds(text, "elements", "Ideogram4Int8ObjectElement")
    assert g.source(obj, "elements") is None
    style = g.feeds(builder, "style", "Ideogram4Int8StyleDescription")
    tv, ov, sv, bv = g.values(text), g.values(obj), g.values(style), g.values(builder)
    assert tv["placed"] and ov["placed"] and tv["text"].strip()

    def box(v):
        return [v["y_min"], v["x_min"], v["y_max"], v["x_max"]]

    elements = b.make_element("obj", ov["desc"], None, box(ov), ov["color_palette"]) + b.make_element(
        "text", tv["desc"], tv["text"], box(tv), tv["color_palette"]
    )
    style_block = b.make_style(
        sv["kind"], sv["aesthetics"], sv["lighting"], sv["medium"], sv["photo"], sv["art_style"], sv["color_palette"]
    )
    caption, _ = b.build_caption(bv["high_level_description"], bv["background"], style_block, elements)
    assert validate_caption(caption) == []
    assert bv["on_invalid"] == "error"
    return encode


def _decode_and_save(g: Graph, latent_source: str, slot: int = 0) -> None:
    decode = g.one("VAEDecode")
    g.feeds(decode, "samples", latent_source, slot)
    assert g.values(g.feeds(decode, "vae", "VAELoader")) == {"vae_name": VAE}
    g.feeds(g.one("SaveImage"), "images", "VAEDecode")


def _note_text(g: Graph) -> str:
    notes = g.of_type("MarkdownNote") + g.of_type("Note")
    assert len(notes) == 1, "one note node"
    return notes[0]["widgets_values"][0]


def _check_note(g: Graph, files: dict[str, str]) -> None:
    """The note names each file with its models/ folder, and the GPU it needs."""
    text = _note_text(g)
    for name, folder in files.items():
        line = next((ln for ln in text.splitlines() if name in ln), "")
        assert f"models/{folder}" in line, f"the note does not say where {name} goes"
    assert "8.0" in text and "NVIDIA" in text and "24 GB" in text, "the note does not name the GPU it needs"
    declared = {m["name"]: m["directory"] for n in g.ui["nodes"] for m in n.get("properties", {}).get("models", [])}
    assert declared == files, "properties.models (the frontend's missing-model downloads) differ from the note"
    for n in g.ui["nodes"]:
        for m in n.get("properties", {}).get("models", []):
            assert re.fullmatch(r"https://huggingface\.co/[\w.-]+/[\w.-]+/resolve/main/\S+\.safetensors", m["url"])
            assert m["url"].endswith("/" + m["name"])


def _sampler(g: Graph) -> dict:
    sampler = g.one("Ideogram4Int8Sampler")
    v = g.values(sampler)
    assert (v["preset"], v["width"], v["height"], v["batch_size"]) == ("Default 20", 1024, 1024, 1)
    return sampler


def _w8a8_text_to_image(name: str) -> tuple[Graph, dict, dict, dict]:
    """A text -> image workflow on the W8A8 file (both branches from it, GEMM path auto): the graph, its text encode
    node, its loader and its sampler."""
    g = Graph(load_ui(name))
    encode = _caption_chain(g)
    loader = g.one("Ideogram4Int8Loader")
    v = g.values(loader)
    assert (v["weights"], v["unconditional_weights"], v["gemm_path"]) == (W8A8, SAME_FILE, "auto")
    sampler = _sampler(g)
    return g, encode, loader, sampler


def test_text_to_image_w8a8():
    g, encode, loader, sampler = _w8a8_text_to_image("ideogram4_int8_text_to_image")
    g.feeds(sampler, "model", "Ideogram4Int8Loader", 0)
    g.feeds(sampler, "model_negative", "Ideogram4Int8Loader", 1)
    assert g.feeds(sampler, "positive", "CLIPTextEncode") is encode
    _decode_and_save(g, "Ideogram4Int8Sampler")
    _check_note(g, {W8A8: "diffusion_models", TEXT_ENCODER: "text_encoders", VAE: "vae"})
    text = _note_text(g)
    assert "What the loader does" in text and "base" in text and FP8 in text  # and what to pick if tensors are missing


def test_two_gpus_puts_the_unconditional_model_through_the_branch_device_node():
    """text -> image with Ideogram 4 Branch Device ("second GPU") between loader.unconditional and
    sampler.model_negative; everything else as in the text -> image workflow."""
    g, encode, loader, sampler = _w8a8_text_to_image("ideogram4_int8_two_gpus")
    assert g.feeds(sampler, "model", "Ideogram4Int8Loader", 0) is loader
    branch = g.feeds(sampler, "model_negative", "Ideogram4Int8BranchDevice", 0)
    assert g.feeds(branch, "model_negative", "Ideogram4Int8Loader", 1) is loader
    assert g.values(branch) == {"device": "second GPU"}
    assert g.feeds(sampler, "positive", "CLIPTextEncode") is encode
    _decode_and_save(g, "Ideogram4Int8Sampler")
    assert g.values(g.one("SaveImage"))["filename_prefix"] == "ideogram4_int8/two_gpus"
    # the same graph as text -> image apart from the node put in
    t2i = Graph(load_ui("ideogram4_int8_text_to_image"))
    assert sorted(n["type"] for n in g.ui["nodes"]) == sorted(
        [n["type"] for n in t2i.ui["nodes"]] + ["Ideogram4Int8BranchDevice"]
    )
    for node_type in ("Ideogram4Int8Loader", "Ideogram4Int8Sampler", "CLIPLoader", "VAELoader"):
        assert g.values(g.one(node_type)) == t2i.values(t2i.one(node_type)), node_type
    # the API twin: sampler.model_negative <- BranchDevice.model_negative <- loader.unconditional
    api = load_api("ideogram4_int8_two_gpus")
    ids = {n["class_type"]: k for k, n in api.items()}
    assert api[ids["Ideogram4Int8Sampler"]]["inputs"]["model_negative"] == [ids["Ideogram4Int8BranchDevice"], 0]
    assert api[ids["Ideogram4Int8BranchDevice"]]["inputs"]["model_negative"] == [ids["Ideogram4Int8Loader"], 1]
    assert api[ids["Ideogram4Int8Sampler"]]["inputs"]["model"] == [ids["Ideogram4Int8Loader"], 0]
    _check_note(g, {W8A8: "diffusion_models", TEXT_ENCODER: "text_encoders", VAE: "vae"})
    text = _note_text(g)
    for said in (
        "two GPUs",
        "NVIDIA",
        "sm_80",
        "Each card holds one CFG branch",
        "at the same time as the conditional",
        "**With one GPU** the node does nothing and says so",
        "as in the text → image example",
        "0.54× the one-card step at 1024²",
        "CUDA graph",
    ):
        assert said in text, said


def test_fp8_files_through_the_patch_node():
    g = Graph(load_ui("ideogram4_int8_fp8_patch"))
    encode = _caption_chain(g)
    sampler = _sampler(g)
    for input_name, label, file in (("model", "conditional", FP8), ("model_negative", "unconditional", FP8_UNCOND)):
        patch = g.feeds(sampler, input_name, "Ideogram4Int8Patch", 0)
        assert g.values(patch) == {"label": label, "gemm_path": "auto"}
        unet = g.feeds(patch, "model", "UNETLoader")
        assert g.values(unet) == {"unet_name": file, "weight_dtype": "default"}
    assert g.feeds(sampler, "positive", "CLIPTextEncode") is encode
    assert not g.of_type("Ideogram4Int8Loader")
    _decode_and_save(g, "Ideogram4Int8Sampler")
    _check_note(g, {FP8: "diffusion_models", FP8_UNCOND: "diffusion_models", TEXT_ENCODER: "text_encoders", VAE: "vae"})


def test_native_guider_graph_reproduces_the_default_20_schedule():
    from comfyui_ideogram4_int8.ideogram4 import PRESETS, sigmas

    g = Graph(load_ui("ideogram4_int8_native_guider"))
    encode = _caption_chain(g)
    guider = g.one("DualModelGuider")
    override = g.feeds(guider, "model", "CFGOverride")
    g.feeds(override, "model", "Ideogram4Int8Loader", 0)
    g.feeds(guider, "model_negative", "Ideogram4Int8Loader", 1)
    assert g.feeds(guider, "positive", "CLIPTextEncode") is encode
    assert g.source(guider, "negative") is None  # unconnected: the image-only unconditional pass
    sample = g.one("SamplerCustomAdvanced")
    g.feeds(sample, "guider", "DualModelGuider")
    assert g.values(g.feeds(sample, "sampler", "KSamplerSelect")) == {"sampler_name": "euler"}
    g.feeds(sample, "noise", "RandomNoise")
    scheduler = g.feeds(sample, "sigmas", "Ideogram4Scheduler")
    latent = g.feeds(sample, "latent_image", "EmptyFlux2LatentImage")
    size = {}
    for axis in ("width", "height"):
        prim = g.feeds(scheduler, axis, "PrimitiveInt")
        assert g.feeds(latent, axis, "PrimitiveInt") is prim, f"scheduler and latent {axis} differ"
        size[axis] = g.values(prim)["value"]
    assert size == {"width": 1024, "height": 1024}
    _decode_and_save(g, "SamplerCustomAdvanced", 0)
    _check_note(g, {W8A8: "diffusion_models", TEXT_ENCODER: "text_encoders", VAE: "vae"})

    # the official Default 20 schedule: same sigmas, guidance 7, the last 2 steps at 3 (CFGOverride's window,
    # sigma <= 1 - start_percent, covers exactly those steps at this size)
    preset = PRESETS["Default 20"]
    sv, ov = g.values(scheduler), g.values(override)
    assert (sv["steps"], sv["mu"], sv["std"]) == (preset.steps, preset.mu, preset.std)
    s = sigmas(preset.steps, size["width"], size["height"], preset.mu, preset.std).double()
    hi, lo = 1.0 - ov["start_percent"], 1.0 - ov["end_percent"]
    guidance = [ov["cfg"] if lo <= float(s[i]) <= hi else g.values(guider)["cfg"] for i in range(preset.steps)]
    assert tuple(guidance) == preset.guidance, guidance


def _override_guidance(preset, width, height, start, cfg=7.0, polish=3.0) -> tuple:
    from comfyui_ideogram4_int8.ideogram4 import sigmas

    s = sigmas(preset.steps, width, height, preset.mu, preset.std).double()
    return tuple(polish if float(s[i]) <= 1.0 - start else cfg for i in range(preset.steps))


def test_the_notes_cfg_override_settings_give_each_presets_schedule():
    """The native-guider note's start_percent for each preset, at the sizes it names, gives that preset's schedule
    (and an off-by-one start would not)."""
    from comfyui_ideogram4_int8.ideogram4 import PRESETS

    text = _note_text(Graph(load_ui("ideogram4_int8_native_guider")))
    default = re.search(r"start (0\.\d+)\): guidance 3 on the last 2 of 20 steps", text)
    others = dict(re.findall(r"(Quality 48|Turbo 12): steps \d+, .*?start (0\.\d+)", text))
    assert default and set(others) == {"Quality 48", "Turbo 12"}, text
    starts = {"Default 20": float(default.group(1)), **{k: float(v) for k, v in others.items()}}
    assert "from 768×1344 to 1024×1024" in text
    for name, start in starts.items():
        preset = PRESETS[name]
        for width, height in ((1024, 1024), (768, 1344), (1344, 768)):
            assert _override_guidance(preset, width, height, start) == preset.guidance, (name, width, height)
        assert _override_guidance(preset, 1024, 1024, start - 0.1) != preset.guidance, name


def test_demo_workflow_needs_no_model_file_and_marks_its_image_as_random_weights():
    from comfyui_ideogram4_int8.ideogram4 import demo_model

    g = Graph(load_ui("ideogram4_int8_demo"))
    assert model_files_of(g.ui) == {}, "the demo declares files to download"
    assert {n["type"] for n in g.ui["nodes"]} == {
        "MarkdownNote",
        "Ideogram4Int8DemoLoader",
        "Ideogram4Int8DemoText",
        "Ideogram4Int8Sampler",
        "Ideogram4Int8DemoDecode",
        "SaveImage",
    }
    sampler = g.one("Ideogram4Int8Sampler")  # the pack's own sampler, unchanged
    g.feeds(sampler, "model", "Ideogram4Int8DemoLoader", 0)
    g.feeds(sampler, "model_negative", "Ideogram4Int8DemoLoader", 1)
    g.feeds(sampler, "positive", "Ideogram4Int8DemoText")
    v = g.values(sampler)
    assert (v["preset"], v["width"], v["height"], v["batch_size"]) == ("Turbo 12", 256, 256, 1)
    assert g.values(g.one("Ideogram4Int8DemoLoader")) == {"compute_dtype": "auto", "gemm_path": "auto"}
    decode = g.feeds(g.one("SaveImage"), "images", "Ideogram4Int8DemoDecode")
    g.feeds(decode, "samples", "Ideogram4Int8Sampler")
    assert "random_weights" in g.values(g.one("SaveImage"))["filename_prefix"]
    text = _note_text(g)
    assert "No model files" in text and "RANDOM WEIGHTS" in text and "not a text encoder" in text
    assert "RANDOM WEIGHTS" in demo_model.BANNER
