"""Checks for the example workflows against node definitions, without ComfyUI (CI) — and the tool that pins them.

Node definitions come from ComfyUI's ``/object_info`` in a normalized form (``normalize_node``): tooltips and
descriptions dropped, and a combo that lists the files of a model folder replaced by ``{"files": folder, "other":
[...]}`` (the file list depends on what a machine has; ``other`` keeps the fixed entries such as "none").

* ``tests/fixtures/comfyui_0_33_native_nodes.json``: the native node types the example workflows use, pinned from a
  ComfyUI 0.33.0 server, plus the frontend-only node types (notes) of its frontend 1.49.6;
* ``tests/fixtures/pack_nodes_object_info.json``: this pack's node types as that server reports them.
Regenerate both (and diff!) with ``python tests/workflow_checks.py pin <server url>`` against a ComfyUI 0.33 with the
pack and the example model files installed (``python tests/workflow_models.py <base dir>`` writes small stand-ins).
The ``comfyui``-marked tests compare both files with a live server, so drift is caught.

How the frontend turns definitions into widgets (what a UI file's ``widgets_values`` hold, in order): every input of
``input_order`` (required, then optional) whose type has a widget — INT, FLOAT, STRING, BOOLEAN, COMBO (or a list of
options), BOUNDING_BOXES — unless ``forceInput``; an INT with ``control_after_generate`` is followed by a control combo
(named ``control_after_generate`` when the flag is ``true``, else named after its string value, e.g. "fixed").
"""

from __future__ import annotations

import json
import pathlib
import sys
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
NATIVE_FIXTURE = FIXTURES / "comfyui_0_33_native_nodes.json"
PACK_FIXTURE = FIXTURES / "pack_nodes_object_info.json"
EXAMPLES = ROOT / "example_workflows"
API_DIR = EXAMPLES / "api"
# Every example workflow: its key (the name of its API twin, api/<key>_api.json, for scripts) and the title its UI file
# is named after (<title>.json, <title>.jpg). The Templates dialog of ComfyUI 0.33's frontend 1.49.6, and of the newest
# (1.58.1), titles a custom node pack's card with the file name and nothing else: a title must read as one, fit one
# line of a card (about 34 characters) and tell the pack's workflows apart from ComfyUI's own Ideogram 4 templates.
TEMPLATES = {
    "ideogram4_int8_text_to_image": "Ideogram 4 INT8 text to image",
    "ideogram4_int8_two_gpus": "Ideogram 4 INT8 on two GPUs",
    "ideogram4_int8_fp8_patch": "Ideogram 4 INT8 from fp8 files",
    "ideogram4_int8_native_guider": "Ideogram 4 INT8 native sampling",
    "ideogram4_int8_demo": "Ideogram 4 INT8 demo, no download",
    "ideogram4_captions": "Ideogram 4 captions, no model",
}
OUR_WORKFLOWS = (  # the example workflows built around this pack's nodes (each with an API twin)
    "ideogram4_int8_text_to_image",
    "ideogram4_int8_fp8_patch",
    "ideogram4_int8_native_guider",
    "ideogram4_int8_two_gpus",
)
ALL_UI = sorted(TEMPLATES)  # every UI-format example workflow, by key

MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae")
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "BOUNDING_BOXES"}
CONTROL_VALUES = ("fixed", "increment", "decrement", "randomize")
PACK_PREFIX = "Ideogram4Int8"
KEEP_OPTIONS = (
    "default",
    "min",
    "max",
    "step",
    "round",
    "multiline",
    "forceInput",
    "control_after_generate",
    "socketless",
    "advanced",
    "optional",
)


# -- definitions ----------------------------------------------------------------------------------------------------


def ui_file(name: str) -> pathlib.Path:
    """The UI-format example workflow of key ``name``: ``example_workflows/<its title>.json``."""
    return EXAMPLES / f"{TEMPLATES[name]}.json"


def load_ui(name: str) -> dict:
    """The UI-format example workflow of key ``name`` (see TEMPLATES)."""
    return json.loads(ui_file(name).read_text(encoding="utf-8"))


def load_api(name: str) -> dict:
    """The API twin ``example_workflows/api/<name>_api.json``."""
    return json.loads((API_DIR / f"{name}_api.json").read_text(encoding="utf-8"))


def _combo_options(spec) -> list | None:
    kind = spec[0]
    if isinstance(kind, list):
        return kind
    if kind == "COMBO":
        return list(spec[1].get("options", [])) if len(spec) > 1 else []
    return None


def normalize_node(info: dict, listings: dict[str, list[str]]) -> dict:
    """The parts of one ``/object_info`` entry the checks use; model-folder file lists replaced by a marker."""

    def norm_input(spec):
        kind = spec[0]
        opts = dict(spec[1]) if len(spec) > 1 and isinstance(spec[1], dict) else {}
        options = _combo_options(spec)
        kept = {k: v for k, v in opts.items() if k in KEEP_OPTIONS}
        if options is None:
            return [kind, kept]
        for folder in MODEL_FOLDERS:
            files = listings.get(folder) or []
            if files and set(files) <= set(options):
                kept["options"] = {"files": folder, "other": [o for o in options if o not in files]}
                break
        else:
            kept["options"] = options
        return ["COMBO", kept]

    section = info.get("input", {})
    return {
        "display_name": info.get("display_name") or info.get("name"),  # the frontend's default title
        "input": {
            part: {name: norm_input(spec) for name, spec in section.get(part, {}).items()}
            for part in ("required", "optional")
            if section.get(part)
        },
        "input_order": {part: list(v) for part, v in info.get("input_order", {}).items() if part != "hidden"},
        "output": list(info.get("output", [])),
        "output_name": list(info.get("output_name", [])),
    }


def load_specs() -> dict[str, dict]:
    """node type -> normalized definition: the pinned native ones, the frontend's, and this pack's snapshot."""
    native = json.loads(NATIVE_FIXTURE.read_text(encoding="utf-8"))
    pack = json.loads(PACK_FIXTURE.read_text(encoding="utf-8"))
    specs = {**native["nodes"], **pack["nodes"]}
    for name, spec in native["frontend_only"].items():
        specs[name] = dict(spec, frontend_only=True)
    return specs


def ordered_inputs(spec: dict) -> list[tuple[str, list, bool]]:
    """(name, [type, options], required) in the frontend's order."""
    order = spec.get("input_order") or {p: list(spec["input"].get(p, {})) for p in ("required", "optional")}
    out = []
    for part in ("required", "optional"):
        for name in order.get(part, []):
            out.append((name, spec["input"][part][name], part == "required"))
    return out


def has_widget(input_spec: list) -> bool:
    kind, opts = input_spec[0], input_spec[1]
    return (kind in WIDGET_TYPES or isinstance(kind, list)) and not opts.get("forceInput")


def widget_layout(spec: dict) -> list[tuple[str, str | None]]:
    """[(widget name, input name or None for a control widget)] in the order of a UI file's widgets_values."""
    if spec.get("frontend_only"):
        return [(w, None) for w in spec["widgets"]]
    out = []
    for name, input_spec, _ in ordered_inputs(spec):
        if not has_widget(input_spec):
            continue
        out.append((name, name))
        control = input_spec[1].get("control_after_generate")
        if control:
            out.append(("control_after_generate" if control is True else str(control), None))
    return out


# -- values ---------------------------------------------------------------------------------------------------------


def value_problems(where: str, input_spec: list, value, model_files: dict[str, set[str]]) -> list[str]:
    """Why ``value`` does not fit the input (empty when it does). ``model_files``: folder -> acceptable names."""
    kind, opts = input_spec[0], input_spec[1]
    lo, hi = opts.get("min"), opts.get("max")

    def in_range(v):
        return (lo is None or v >= lo) and (hi is None or v <= hi)

    if kind == "INT":
        if type(value) is not int:
            return [f"{where}: {value!r} is not an integer"]
        out = [] if in_range(value) else [f"{where}: {value} outside [{lo}, {hi}]"]
        step = opts.get("step")
        if step and step > 1 and (value - (lo or 0)) % step:
            out.append(f"{where}: {value} is not on the widget's step {step} from {lo or 0}")
        return out
    if kind == "FLOAT":
        if type(value) not in (int, float):
            return [f"{where}: {value!r} is not a number"]
        return [] if in_range(value) else [f"{where}: {value} outside [{lo}, {hi}]"]
    if kind == "STRING":
        return [] if isinstance(value, str) else [f"{where}: {value!r} is not a string"]
    if kind == "BOOLEAN":
        return [] if isinstance(value, bool) else [f"{where}: {value!r} is not a boolean"]
    if kind == "BOUNDING_BOXES":
        ok = isinstance(value, list) and all(
            isinstance(b, dict) and {"x", "y", "width", "height"} <= set(b) for b in value
        )
        return [] if ok else [f"{where}: {value!r} is not a list of boxes"]
    if kind == "COMBO":
        options = opts.get("options")
        if isinstance(options, dict):  # a model folder's file list
            if value in options["other"]:
                return []
            allowed = model_files.get(options["files"], set())
            if value not in allowed:
                return [
                    f"{where}: {value!r} is not a file this workflow names for models/{options['files']} "
                    f"({sorted(allowed) or 'none'})"
                ]
            return []
        return [] if value in options else [f"{where}: {value!r} is not one of {options}"]
    return [f"{where}: no widget check for type {kind}"]


def model_files_of(ui: dict) -> dict[str, set[str]]:
    """folder -> file names the workflow's nodes declare in ``properties.models`` (what the frontend offers to
    download when a file is missing)."""
    out: dict[str, set[str]] = {}
    for node in ui["nodes"]:
        for m in node.get("properties", {}).get("models", []):
            out.setdefault(m["directory"], set()).add(m["name"])
    return out


# -- UI file -> what the frontend queues ---------------------------------------------------------------------------


def links_by_id(ui: dict) -> dict[int, tuple]:
    """link id -> (origin id, origin slot, target id, target slot, type)."""
    return {link[0]: tuple(link[1:6]) for link in ui["links"]}


def named_widget_values(node: dict, spec: dict) -> dict:
    layout = widget_layout(spec)
    values = node.get("widgets_values") or []
    return {name: values[i] for i, (name, _) in enumerate(layout) if i < len(values)}


def ui_to_api(ui: dict, specs: dict[str, dict]) -> dict:
    """The API-format prompt the frontend builds from a UI file (``app.graphToPrompt``), for plain graphs: no
    subgraphs, reroutes or bypassed nodes (the examples have none; ``check_ui`` says so if one appears)."""
    links = links_by_id(ui)
    prompt = {}
    for node in ui["nodes"]:
        spec = specs[node["type"]]
        if spec.get("frontend_only"):
            continue
        values = named_widget_values(node, spec)
        inputs = {}
        for name, input_name in widget_layout(spec):
            if input_name is not None:
                v = values[name]
                inputs[name] = {"__value__": v} if isinstance(v, list) else v
        for slot in node.get("inputs", []):
            if slot.get("link") is not None:
                origin, origin_slot = links[slot["link"]][:2]
                inputs[slot["name"]] = [str(origin), origin_slot]
        prompt[str(node["id"])] = {
            "inputs": inputs,
            "class_type": node["type"],
            "_meta": {"title": node.get("title") or spec["display_name"]},
        }
    return prompt


def _accepts(input_type: str, output_type: str) -> bool:
    if "*" in (input_type, output_type):
        return True
    return output_type in input_type.split(",")


def check_ui(ui: dict, specs: dict[str, dict]) -> list[str]:
    """Every problem of a UI-format workflow against the node definitions (empty when it is sound)."""
    problems = []
    if ui.get("definitions", {}).get("subgraphs"):
        problems.append("subgraphs are not supported by these checks")
    model_files = model_files_of(ui)
    links = links_by_id(ui)
    nodes = {n["id"]: n for n in ui["nodes"]}
    for node in ui["nodes"]:
        where = f"{node['type']} #{node['id']}"
        spec = specs.get(node["type"])
        if spec is None:
            problems.append(f"{where}: unknown node type (not ours, not in the pinned ComfyUI 0.33 list)")
            continue
        if node.get("mode", 0) != 0:
            problems.append(f"{where}: mode {node['mode']} (muted / bypassed) in an example")
        layout = widget_layout(spec)
        values = node.get("widgets_values") or []
        if len(values) != len(layout):
            problems.append(
                f"{where}: {len(values)} widget values, the definition has {len(layout)} widgets "
                f"{[n for n, _ in layout]}"
            )
            continue
        named = node.get("widgets_values_named")
        if named is not None and named != dict(zip([n for n, _ in layout], values, strict=True)):
            problems.append(f"{where}: widgets_values_named disagrees with widgets_values by position")
        if spec.get("frontend_only"):
            continue
        inputs = {name: (input_spec, required) for name, input_spec, required in ordered_inputs(spec)}
        for (name, input_name), value in zip(layout, values, strict=True):
            if input_name is None:
                if value not in CONTROL_VALUES:
                    problems.append(f"{where} '{name}': control value {value!r} not one of {CONTROL_VALUES}")
                continue
            problems += value_problems(f"{where} '{name}'", inputs[name][0], value, model_files)
        linked = set()
        for slot_index, slot in enumerate(node.get("inputs", [])):
            if slot["name"] not in inputs:
                problems.append(f"{where}: input slot '{slot['name']}' is not in the definition")
                continue
            if slot.get("link") is None:
                continue
            origin, origin_slot, target, target_slot, kind = links[slot["link"]]
            if (target, target_slot) != (node["id"], slot_index):
                problems.append(f"{where} '{slot['name']}': link {slot['link']} points elsewhere")
            source = nodes.get(origin)
            source_spec = specs.get(source["type"]) if source else None
            if source_spec is None:
                problems.append(f"{where} '{slot['name']}': link from a missing node {origin}")
                continue
            out_type = source_spec["output"][origin_slot]
            if out_type != kind or not _accepts(inputs[slot["name"]][0][0], out_type):
                problems.append(
                    f"{where} '{slot['name']}' ({inputs[slot['name']][0][0]}) linked to "
                    f"{source['type']} output {origin_slot} ({out_type}, link says {kind})"
                )
            linked.add(slot["name"])
        for name, (input_spec, required) in inputs.items():
            if required and not has_widget(input_spec) and name not in linked:
                problems.append(f"{where}: required input '{name}' is not connected")
    return problems


# -- layout ---------------------------------------------------------------------------------------------------------

TITLE_HEIGHT = 30  # LiteGraph.NODE_TITLE_HEIGHT: a node's title bar sits above its pos
# The Templates browser opens a workflow fitted to 75 % of the window and LiteGraph draws node text only from ~57 %
# zoom on (min font size 8 px / 14 px text): on a 1600 x 965 px canvas the nodes must span at most this (60 % zoom).
MAX_NODE_BOUNDS = (2000, 1205)


def _node_rect(node: dict) -> tuple[float, float, float, float]:
    (x, y), (w, h) = node["pos"], node["size"]
    return x, y - TITLE_HEIGHT, w, h + TITLE_HEIGHT


def _overlap(a, b) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def _inside(a, b) -> bool:
    return b[0] <= a[0] and b[1] <= a[1] and a[0] + a[2] <= b[0] + b[2] and a[1] + a[3] <= b[1] + b[3]


def node_span(ui: dict) -> tuple[float, float]:
    """Width and height of the nodes' bounds, title bars included."""
    rects = [_node_rect(n) for n in ui["nodes"]]
    x0, y0 = min(r[0] for r in rects), min(r[1] for r in rects)
    return max(r[0] + r[2] for r in rects) - x0, max(r[1] + r[3] for r in rects) - y0


def opening_zoom(ui: dict, canvas: tuple[int, int] = (1600, 965)) -> float:
    """The zoom the Templates browser opens ``ui`` at on a ``canvas`` (px): its nodes fitted into 75 % of it."""
    width, height = node_span(ui)
    return min(0.75 * canvas[0] / width, 0.75 * canvas[1] / height, 1.0)


def layout_problems(ui: dict) -> list[str]:
    """Overlapping nodes or groups, a node reaching into a group it is not in, and node bounds too large to open at a
    readable zoom (empty when the layout is sound)."""
    problems = []
    nodes = ui["nodes"]
    rects = {f"{n['type']} #{n['id']}": _node_rect(n) for n in nodes}
    names = list(rects)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if _overlap(rects[a], rects[b]):
                problems.append(f"{a} overlaps {b}")
    groups = [(g["title"], tuple(g["bounding"])) for g in ui.get("groups", [])]
    for i, (ta, ra) in enumerate(groups):
        for tb, rb in groups[i + 1 :]:
            if _overlap(ra, rb):
                problems.append(f"group {ta} overlaps group {tb}")
        for name, r in rects.items():
            if _overlap(r, ra) and not _inside(r, ra):
                problems.append(f"{name} reaches into group {ta}")
    if nodes:
        span = node_span(ui)
        if span[0] > MAX_NODE_BOUNDS[0] or span[1] > MAX_NODE_BOUNDS[1]:
            problems.append(
                f"the nodes span {span[0]:.0f} x {span[1]:.0f}, more than {MAX_NODE_BOUNDS[0]} x "
                f"{MAX_NODE_BOUNDS[1]}: the workflow would open below a readable zoom"
            )
    return problems


# -- pinning --------------------------------------------------------------------------------------------------------


def _get(url: str):
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - a local ComfyUI the developer names
        return json.loads(resp.read())


def example_node_types() -> set[str]:
    return {
        n["type"] for path in EXAMPLES.glob("*.json") for n in json.loads(path.read_text(encoding="utf-8"))["nodes"]
    }


def live_listings(url: str) -> dict[str, list[str]]:
    return {folder: _get(f"{url}/models/{folder}") for folder in MODEL_FOLDERS}


def live_snapshot(url: str, node_types) -> dict[str, dict]:
    """Normalized definitions of ``node_types`` from a running server."""
    everything = _get(f"{url}/object_info")
    listings = live_listings(url)
    missing = sorted(set(node_types) - set(everything))
    if missing:
        raise SystemExit(f"{url} does not know {missing}")
    return {t: normalize_node(everything[t], listings) for t in sorted(node_types)}


def pack_node_types(url: str) -> list[str]:
    return sorted(t for t in _get(f"{url}/object_info") if t.startswith(PACK_PREFIX))


# Frontend-only node types (LiteGraph.registered_node_types with isVirtualNode, frontend 1.49.6): they never reach
# the server, so /object_info does not list them; their one widget is the text.
FRONTEND_ONLY = {
    "MarkdownNote": {"display_name": "Markdown Note", "widgets": ["text"]},
    "Note": {"display_name": "Note", "widgets": ["text"]},
}


def pin(url: str) -> None:
    stats = _get(f"{url}/system_stats")["system"]
    version = stats["comfyui_version"]
    if not version.startswith("0.33"):
        raise SystemExit(f"{url} runs ComfyUI {version}; the fixture is pinned to 0.33")
    native_types = {t for t in example_node_types() if not t.startswith(PACK_PREFIX) and t not in FRONTEND_ONLY}
    frontend = next(
        (p["installed"] for p in stats.get("comfy_package_versions", []) if p["name"] == "comfyui-frontend-package"),
        None,
    )
    native = {
        "comfyui_version": version,
        "frontend_version": frontend,
        "source": "/object_info of that server, normalized by tests/workflow_checks.py",
        "nodes": live_snapshot(url, native_types),
        "frontend_only": FRONTEND_ONLY,
    }
    pack = {
        "source": "/object_info of a ComfyUI 0.33 with this pack, normalized by tests/workflow_checks.py",
        "nodes": live_snapshot(url, pack_node_types(url)),
    }
    for path, data in ((NATIVE_FIXTURE, native), (PACK_FIXTURE, pack)):
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)} ({len(data['nodes'])} node types)")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "pin":
        raise SystemExit("usage: python tests/workflow_checks.py pin <ComfyUI url, e.g. http://127.0.0.1:8188>")
    pin(sys.argv[2].rstrip("/"))
