"""Caption builder nodes: style, text/object elements, boxes drawn on a canvas, the caption, validate/repair.

Thin ComfyUI V3 wrappers: every rule lives in ``ideogram4.captions``. Element lists are back to front (the first
element is drawn first, i.e. furthest back), as the official guidance and ComfyUI's CreateBoundingBoxes expect.
"""

from __future__ import annotations

from comfy_api.v0_0_2 import io, ui

from ..ideogram4.captions import builder as b
from ..ideogram4.captions import check_caption, serialize_caption
from ..ideogram4.captions.limits import BBOX_MAX, BBOX_MIN, MAX_ELEMENT_COLORS, MAX_STYLE_COLORS
from ..ideogram4.captions.repair import repair_caption
from ..ideogram4.captions.serialize import canonical_order, dumps_compact

CATEGORY = "Ideogram 4 INT8/captions"
Style = io.Custom("IDEOGRAM4_STYLE")
Elements = io.Custom("IDEOGRAM4_ELEMENTS")
ON_INVALID = ("error", "warn")
TEXT_BOX = {"multiline": True, "default": ""}
CANVAS_SIDE = {"default": 1024, "min": 64, "max": 16384, "step": 16}


def _chain_input(
    tooltip: str = "Elements that come before (further back than) the ones this node adds: another "
    "Ideogram 4 element node, or the 'elements' output of ComfyUI's Create Bounding Boxes.",
):
    return io.MultiType.Input("elements", [Elements, io.Array], optional=True, tooltip=tooltip)


def _chain(value, source: str) -> b.ElementList:
    return b.ElementList() if value is None else b.elements_from_native(value, source)


def _widget(name: str) -> str:
    return f"widget '{name}'"


# The Style Description's text widgets in the node's order: name -> (placeholder, tooltip).
STYLE_TEXTS = {
    "aesthetics": ("clean, editorial, uncluttered", "Aesthetic keywords (required)."),
    "lighting": ("soft window light from the left", "Lighting description (required)."),
    "medium": (
        "photograph / illustration / 3d_render / ...",
        "Medium (required): photograph, illustration, 3d_render, painting, graphic_design, ... Left empty with kind "
        "'photo' it becomes 'photograph'.",
    ),
    "photo": ("50mm lens, f/4, eye-level", "Camera and lens details; used when kind is 'photo'."),
    "art_style": ("flat vector illustration, bold outlines", "The art style; used when kind is 'art_style'."),
    "color_palette": (
        "#2B1D14, #C8A27A, #F2EDE4",
        f"Up to {MAX_STYLE_COLORS} colors as #RRGGBB, separated by commas or spaces. Lowercase and #RGB are "
        "normalized (listed in the report).",
    ),
}
STYLE_PLACES = {k: _widget(k) for k in STYLE_TEXTS}
ELEMENT_PLACES = {
    "desc": _widget("desc"),
    "text": _widget("text"),
    "color_palette": _widget("color_palette"),
    "bbox": tuple(_widget(k) for k in b.BBOX_WIDGETS),
}
BOX_PLACES = {
    "desc": "its desc field (click the box)",
    "text": "its text field (click the box)",
    "color_palette": "its colors field (click the box)",
    "bbox": "the box on the canvas",
    "type": "its type button (click the box)",
}
BUILDER_PLACES = {k: _widget(k) for k in ("high_level_description", "background")}


def _source(cls) -> b.Where:
    """This node as a report names it ("node 7 (Ideogram 4 Object Element)"), with the widget of each caption key."""
    return b.Where(f"node {cls.hidden.unique_id} ({cls.SCHEMA_TITLE})", getattr(cls, "PLACES", None))


def _on_invalid_input():
    return io.Combo.Input(
        "on_invalid",
        options=list(ON_INVALID),
        default="error",
        tooltip="error: stop the run and show every problem (JSON path + fix). warn: pass the "
        "caption on anyway and list the problems in the report output.",
    )


def _bbox_inputs():
    axis = {"y_min": "top edge", "x_min": "left edge", "y_max": "bottom edge", "x_max": "right edge"}
    default = {"y_min": 100, "x_min": 100, "y_max": 400, "x_max": 900}
    items = [
        io.Boolean.Input(
            "placed",
            default=True,
            tooltip="On: the element gets a bbox. Off: unplaced (no bbox), for dense things such "
            "as crowds, fireflies, star fields.",
        )
    ]
    for key in ("y_min", "x_min", "y_max", "x_max"):
        items.append(
            io.Int.Input(
                key,
                default=default[key],
                min=BBOX_MIN,
                max=BBOX_MAX,
                step=1,
                tooltip=f"bbox {axis[key]} on the 0..1000 grid (normalized per axis, origin top-left;"
                f" the caption stores [y_min, x_min, y_max, x_max]).",
            )
        )
    return items


def _bbox(cls, placed, y_min, x_min, y_max, x_max):
    problem = b.bbox_widgets_problem(placed, y_min, x_min, y_max, x_max)
    if problem:  # linked bbox values are only known here
        raise ValueError(f"{_source(cls)}: {problem}")
    return [y_min, x_min, y_max, x_max] if placed else None


def _validate_bbox(placed, y_min, x_min, y_max, x_max):
    """Before the run: a box with no width / height, edges swapped or off the 0..1000 grid is refused on the element
    node whose widgets hold it (not later, in the Caption Builder). ComfyUI skips its own min/max checks for the
    widgets a node's validate_inputs names and lists a failure under each of them, so this checks the range too and
    names the widget at fault in its message."""
    problem = b.bbox_widgets_problem(placed, y_min, x_min, y_max, x_max)
    return True if problem is None else problem


def _element_schema(cls, node_id, description, search_aliases, own_inputs, palette_placeholder):
    """A Text / Object Element node's schema: its own inputs, then the bbox, the palette and the chain input."""
    return io.Schema(
        node_id=node_id,
        display_name=cls.SCHEMA_TITLE,
        category=CATEGORY,
        description=description,
        search_aliases=search_aliases,
        inputs=[
            *own_inputs,
            *_bbox_inputs(),
            io.String.Input(
                "color_palette",
                default="",
                placeholder=palette_placeholder,
                tooltip=f"Up to {MAX_ELEMENT_COLORS} colors as #RRGGBB, separated by commas or spaces (optional).",
            ),
            _chain_input(),
        ],
        outputs=[Elements.Output(display_name="elements")],
        hidden=[io.Hidden.unique_id],
    )


class StyleDescription(io.ComfyNode):
    SCHEMA_TITLE = "Ideogram 4 Style Description"
    PLACES = STYLE_PLACES

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8StyleDescription",
            display_name=cls.SCHEMA_TITLE,
            category=CATEGORY,
            description="The caption's style_description: photo (camera details) or art_style, with aesthetics, "
            "lighting, medium and an optional palette of up to 16 colors.",
            search_aliases=["ideogram style", "caption style", "color palette"],
            inputs=[
                io.Combo.Input(
                    "kind",
                    options=list(b.STYLE_KINDS),
                    default="photo",
                    tooltip="photo: a photograph (uses the 'photo' text). art_style: anything else "
                    "(illustration, 3D render, graphic design...; uses the 'art_style' text).",
                ),
                *(
                    io.String.Input(name, default="", placeholder=placeholder, tooltip=tooltip)
                    for name, (placeholder, tooltip) in STYLE_TEXTS.items()
                ),
            ],
            outputs=[Style.Output(display_name="style")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, kind, aesthetics, lighting, medium, photo, art_style, color_palette) -> io.NodeOutput:
        return io.NodeOutput(
            b.make_style(kind, aesthetics, lighting, medium, photo, art_style, color_palette, _source(cls))
        )


class _Element:
    """What the Text and Object Element nodes share (mixed in front of ``io.ComfyNode``)."""

    PLACES = ELEMENT_PLACES

    @classmethod
    def validate_inputs(cls, placed, y_min, x_min, y_max, x_max):
        return _validate_bbox(placed, y_min, x_min, y_max, x_max)

    @classmethod
    def _output(cls, kind, desc, text, placed, y_min, x_min, y_max, x_max, color_palette, elements):
        src = _source(cls)
        new = b.make_element(kind, desc, text, _bbox(cls, placed, y_min, x_min, y_max, x_max), color_palette, src)
        return io.NodeOutput(_chain(elements, f"'elements' input of {src}") + new)


class TextElement(_Element, io.ComfyNode):
    SCHEMA_TITLE = "Ideogram 4 Text Element"

    @classmethod
    def define_schema(cls):
        return _element_schema(
            cls,
            node_id="Ideogram4Int8TextElement",
            description="Lettering to render: the verbatim text, where it goes (bbox) and what it looks like.",
            search_aliases=["ideogram text", "typography", "lettering"],
            own_inputs=[
                io.String.Input(
                    "text",
                    **TEXT_BOX,
                    tooltip="The exact characters to render, kept verbatim (case, accents, spacing). "
                    "Press Enter for a line break inside one block of text.",
                ),
                io.String.Input(
                    "desc",
                    **TEXT_BOX,
                    tooltip="What the lettering looks like: font, color, material, where it sits.",
                ),
            ],
            palette_placeholder="#1A1A1A",
        )

    @classmethod
    def execute(cls, text, desc, placed, y_min, x_min, y_max, x_max, color_palette, elements=None) -> io.NodeOutput:
        return cls._output("text", desc, text, placed, y_min, x_min, y_max, x_max, color_palette, elements)


class ObjectElement(_Element, io.ComfyNode):
    SCHEMA_TITLE = "Ideogram 4 Object Element"

    @classmethod
    def define_schema(cls):
        return _element_schema(
            cls,
            node_id="Ideogram4Int8ObjectElement",
            description="A subject or object: what it is and looks like, where it goes (bbox), its colors.",
            search_aliases=["ideogram object", "caption element"],
            own_inputs=[
                io.String.Input(
                    "desc",
                    **TEXT_BOX,
                    tooltip="What the element is and looks like, starting with what it is. Ground, sky "
                    "and weather belong in the caption's background instead.",
                ),
            ],
            palette_placeholder="#D9652B, #F2E6C9",
        )

    @classmethod
    def execute(cls, desc, placed, y_min, x_min, y_max, x_max, color_palette, elements=None) -> io.NodeOutput:
        return cls._output("obj", desc, None, placed, y_min, x_min, y_max, x_max, color_palette, elements)


class LayoutBoxes(io.ComfyNode):
    SCHEMA_TITLE = "Ideogram 4 Layout Boxes"
    PLACES = BOX_PLACES

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8LayoutBoxes",
            display_name=cls.SCHEMA_TITLE,
            category=CATEGORY,
            description="Draw, move and resize element boxes on a canvas shaped like the image (width x height). "
            "Each box is an obj or text element with its desc, text and colors; the first box is the "
            "furthest back. Coordinates go to the caption on the 0..1000 grid.",
            search_aliases=["ideogram bbox", "bounding boxes", "layout", "regions"],
            inputs=[
                io.Int.Input(
                    "width",
                    **CANVAS_SIDE,
                    tooltip="Target image width in pixels: sets the canvas shape (wire it to the latent).",
                ),
                io.Int.Input("height", **CANVAS_SIDE, tooltip="Target image height in pixels: sets the canvas shape."),
                io.BoundingBoxes.Input(
                    "boxes",
                    tooltip="Drag on empty canvas to draw a box; drag a box to move it, "
                    "its edges or corners to resize; click a box to edit its type, text, desc and "
                    "colors; Delete removes it. First box = furthest back.",
                ),
                _chain_input(
                    "Elements placed behind the drawn boxes (e.g. a background element), from another "
                    "Ideogram 4 element node or ComfyUI's Create Bounding Boxes."
                ),
            ],
            outputs=[
                Elements.Output(display_name="elements"),
                io.Int.Output(display_name="width"),
                io.Int.Output(display_name="height"),
            ],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def validate_inputs(cls, boxes):
        """Before the run: a box that is not numbers or has no area (zero or negative width / height) is refused,
        named by its number and what it shows. Boxes past the canvas edges are clamped when the node runs (the
        report says so); a box entirely off the canvas is refused then (the canvas size may be a linked input)."""
        if not isinstance(boxes, list):
            return True  # linked (None) or not a list: the node says what is wrong when it runs
        problems = [f"{b.box_label(i, box)}: {p}" for i, box in enumerate(boxes) if (p := b.box_shape_problem(box))]
        return "; ".join(problems) if problems else True

    @classmethod
    def execute(cls, width, height, boxes=None, elements=None) -> io.NodeOutput:
        src = _source(cls)
        drawn = b.elements_from_boxes(boxes if boxes is not None else [], width, height, src)
        upstream = _chain(elements, f"'elements' input of {src}")
        # The editor draws the connected elements behind the boxes (read-only), labelled like the caption.
        ui = {"ideogram4_upstream": [dict(e) for e in upstream.elements]}
        return io.NodeOutput(upstream + drawn, width, height, ui=ui)


def _finish(caption: dict, notes, sources, style_source: str, on_invalid: str, own: str = ""):
    """Serialize a built caption; on problems raise (``error``) or pass them on in the report (``warn``)."""
    report = check_caption(caption)
    text_report = report.text(notes, sources, style_source, own)
    if report.ok:
        return serialize_caption(caption), text_report, True
    if on_invalid == "error":
        raise ValueError(
            "Ideogram 4 caption is invalid (set on_invalid to 'warn' to pass it on anyway)\n" + text_report
        )
    return dumps_compact(canonical_order(caption)), text_report, False


class CaptionBuilder(io.ComfyNode):
    SCHEMA_TITLE = "Ideogram 4 Caption Builder"
    PLACES = BUILDER_PLACES

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8CaptionBuilder",
            display_name=cls.SCHEMA_TITLE,
            category=CATEGORY,
            description="Assemble a structured Ideogram 4 caption (JSON) from a high-level description, a "
            "background, a style and elements; validated, serialized canonically. Connect 'caption' "
            "to CLIP Text Encode.",
            search_aliases=["ideogram caption", "json prompt", "structured prompt"],
            inputs=[
                io.String.Input(
                    "high_level_description",
                    **TEXT_BOX,
                    tooltip="One or two sentences about the whole image, starting with the subject. "
                    "Optional but strongly recommended; omitted when empty.",
                ),
                io.String.Input(
                    "background",
                    **TEXT_BOX,
                    tooltip="The setting behind the elements: ground, sky, walls, weather, distant crowds "
                    "(required). Use 'transparent background' for a cut-out.",
                ),
                Style.Input(
                    "style", optional=True, tooltip="From Ideogram 4 Style Description. Unconnected: no style block."
                ),
                _chain_input(
                    "The caption's elements, back to front: from Ideogram 4 element / layout nodes, or the "
                    "'elements' output of ComfyUI's Create Bounding Boxes."
                ),
                _on_invalid_input(),
            ],
            outputs=[
                io.String.Output(
                    display_name="caption", tooltip="The caption as compact JSON: connect to CLIP Text Encode."
                ),
                io.String.Output(
                    display_name="report",
                    tooltip="Validation report: problems with JSON paths "
                    "and fixes, hints, and every normalization made.",
                ),
            ],
            hidden=[io.Hidden.unique_id],
            # Not an output node: a workflow whose model part fails validation must fail as a whole (ComfyUI runs
            # every valid output node and reports the prompt as a success). A captions-only graph ends in Preview
            # as Text; the report still shows on this node (its ui output) whenever it runs.
        )

    @classmethod
    def execute(cls, high_level_description, background, on_invalid, style=None, elements=None) -> io.NodeOutput:
        own = _source(cls)
        chain = _chain(elements, f"'elements' input of {own}")
        caption, notes = b.build_caption(high_level_description, background, style, chain)
        style_source = style.source if style is not None else ""
        text, report, _ = _finish(caption, notes, chain.sources, style_source, on_invalid, own)
        return io.NodeOutput(text, report, ui=ui.PreviewText(report + "\n\n" + text))


class CaptionValidate(io.ComfyNode):
    SCHEMA_TITLE = "Ideogram 4 Caption Validate / Repair"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Ideogram4Int8CaptionValidate",
            display_name=cls.SCHEMA_TITLE,
            category=CATEGORY,
            description="Check a hand- or LLM-written Ideogram 4 caption against the official rules. Repair fixes "
            "what is unambiguous (code fences, trailing commas, aspect_ratio, key order and case, hex "
            "case, 500.0 -> 500, \\u escapes) and refuses the rest, naming each JSON path.",
            search_aliases=["ideogram validate", "caption repair", "json repair", "verifier"],
            inputs=[
                io.String.Input(
                    "caption",
                    **TEXT_BOX,
                    tooltip="The caption JSON (typed, pasted, or from an LLM node). Surrounding prose "
                    "and code fences are tolerated in repair mode.",
                ),
                io.Combo.Input(
                    "mode",
                    options=["repair", "validate"],
                    default="repair",
                    tooltip="repair: fix unambiguous problems and list each change. validate: only "
                    "check; the caption passes through re-serialized if valid.",
                ),
                _on_invalid_input(),
            ],
            outputs=[
                io.String.Output(display_name="caption", tooltip="The canonical caption (compact JSON)."),
                io.String.Output(
                    display_name="report", tooltip="Problems with JSON paths and fixes, hints, and every change made."
                ),
                io.Boolean.Output(display_name="valid"),
            ],
            # not an output node, like CaptionBuilder: it must not let a broken model part run as a "success"
        )

    @classmethod
    def execute(cls, caption, mode, on_invalid) -> io.NodeOutput:
        if mode == "repair":
            result = repair_caption(caption)
            report, changes, fixed = result.report, result.changes, result.text
        else:
            report, changes = check_caption(caption), []
            fixed = serialize_caption(report.caption) if report.ok else None
        text_report = report.text(changes)
        if fixed is None:
            if on_invalid == "error":
                raise ValueError(
                    "Ideogram 4 caption is invalid (set on_invalid to 'warn' to pass it on anyway)\n" + text_report
                )
            fixed = caption
        return io.NodeOutput(fixed, text_report, report.ok, ui=ui.PreviewText(text_report + "\n\n" + fixed))


NODES = [StyleDescription, TextElement, ObjectElement, LayoutBoxes, CaptionBuilder, CaptionValidate]
