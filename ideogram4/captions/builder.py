"""Build captions from node inputs: style blocks, elements (typed in, drawn as boxes, or from ComfyUI's native
``CreateBoundingBoxes``), and the caption itself. Builders normalize where the intent is clear and note it;
they never drop input: whatever is still wrong is reported by validation with its JSON path."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .colors import parse_palette
from .limits import BBOX_MAX, BBOX_MIN, ELEMENT_TYPES

STYLE_KINDS = ("photo", "art_style")


class Where(str):
    """Where a style block or an element came from: a label (a ``str``, so it prints and compares as one) that also
    knows where the user edits each caption key, so a report can say "node 7 (Ideogram 4 Object Element), widget
    'desc'" instead of a JSON path.

    ``places`` maps a caption key (``"desc"``, ``"bbox"``, ...) to a phrase such as ``"widget 'desc'"``;
    ``"bbox"`` may map to a tuple of four phrases, one per value (``[ymin, xmin, ymax, xmax]``)."""

    places: dict

    def __new__(cls, label: str, places: dict | None = None) -> Where:
        obj = super().__new__(cls, label)
        obj.places = dict(places or {})
        return obj

    def place(self, key: Any, index: Any = None) -> str | None:
        """The phrase for caption key ``key`` (and list index ``index``, e.g. a bbox value or a color)."""
        found = self.places.get(key)
        if isinstance(found, tuple):
            return found[index] if isinstance(index, int) and 0 <= index < len(found) else " / ".join(found)
        if found and key == "color_palette" and isinstance(index, int):
            return f"{found}, color {index + 1}"
        return found


def _at(source: Any, suffix: str) -> Any:
    """``source`` + " " + ``suffix``, keeping a ``Where``'s places."""
    label = f"{source} {suffix}"
    return Where(label, source.places) if isinstance(source, Where) else label


@dataclass(frozen=True)
class StyleBlock:
    """A ``style_description`` dict (official key order) plus notes on normalizations and where it came from."""

    style: dict
    notes: tuple[str, ...] = ()
    source: str = ""


@dataclass(frozen=True)
class ElementList:
    """Caption elements in list order (back to front), each with a label of where it came from."""

    elements: tuple[dict, ...] = ()
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def __add__(self, other: ElementList) -> ElementList:
        return ElementList(self.elements + other.elements, self.sources + other.sources, self.notes + other.notes)

    def __len__(self) -> int:
        return len(self.elements)


def _prose(value: Any) -> Any:
    """Descriptions lose surrounding whitespace (a multiline widget's trailing newline); non-strings stay for
    validation to report."""
    return value.strip() if isinstance(value, str) else value


def make_style(
    kind: str,
    aesthetics: str,
    lighting: str,
    medium: str,
    photo: str = "",
    art_style: str = "",
    color_palette: Any = "",
    source: str = "style",
) -> StyleBlock:
    """A style block for ``kind`` ``"photo"`` or ``"art_style"``; the other kind's text must be empty (else noted,
    not emitted). A blank ``medium`` with ``kind="photo"`` becomes ``"photograph"`` (noted)."""
    notes: list[str] = []
    if kind not in STYLE_KINDS:
        raise ValueError(f"{source}: style kind {kind!r} must be one of {', '.join(STYLE_KINDS)}")
    medium = _prose(medium)
    if kind == "photo" and medium == "":
        medium = "photograph"
        notes.append(f"{source}: medium was empty; set to 'photograph' for a photo style")
    style: dict = {"aesthetics": _prose(aesthetics), "lighting": _prose(lighting)}
    if kind == "photo":
        style["photo"] = _prose(photo)
        style["medium"] = medium
        unused = ("art_style", art_style)
    else:
        style["medium"] = medium
        style["art_style"] = _prose(art_style)
        unused = ("photo", photo)
    if isinstance(unused[1], str) and unused[1].strip():
        notes.append(
            f"{source}: the {unused[0]} text is not used because the style kind is {kind!r} "
            f"(a caption has exactly one of photo / art_style): {unused[1].strip()[:60]!r}"
        )
    palette, pnotes = parse_palette(color_palette)
    notes += [f"{source}: color {n}" for n in pnotes]
    if palette:
        style["color_palette"] = palette
    return StyleBlock(style, tuple(notes), source)


def make_element(
    kind: str, desc: Any, text: Any = None, bbox: Any = None, color_palette: Any = "", source: str = "element"
) -> ElementList:
    """One element in official key order. ``text`` is kept verbatim (no trimming); ``bbox`` is
    ``[ymin, xmin, ymax, xmax]`` on the 0..1000 grid or ``None`` for an unplaced element."""
    if kind not in ELEMENT_TYPES:
        raise ValueError(f"{source}: element type {kind!r} must be one of {', '.join(ELEMENT_TYPES)}")
    element: dict = {"type": kind}
    if bbox is not None:
        element["bbox"] = list(bbox)
    notes: list[str] = []
    if kind == "text":
        element["text"] = text
    elif isinstance(text, str) and text.strip():
        notes.append(
            f"{source}: type is 'obj', so its text {text.strip()[:40]!r} is not rendered (switch the box to "
            "'text' to render it)"
        )
    element["desc"] = _prose(desc)
    palette, pnotes = parse_palette(color_palette)
    if palette:
        element["color_palette"] = palette
    notes += [f"{source}: color {n}" for n in pnotes]
    return ElementList((element,), (source,), tuple(notes))


def _grid(value: float | int, size: float | int) -> int:
    """Pixel coordinate -> 0..1000 grid: round half up (the JS mirror does the same), clamped."""
    if isinstance(value, int) and isinstance(size, int) and not isinstance(value, bool):
        g = (2 * value * BBOX_MAX + size) // (2 * size)  # exact half-up for integers
    else:
        g = math.floor(value * BBOX_MAX / size + 0.5)
    return max(BBOX_MIN, min(BBOX_MAX, int(g)))


def pixel_box_to_bbox(box: dict, width: int, height: int) -> list[int]:
    """``{x, y, width, height}`` in pixels of a ``width`` x ``height`` image -> ``[ymin, xmin, ymax, xmax]``.

    The plain conversion (mirrored in web/lib/bbox.mjs): negative sizes are flipped and values clamped to the grid.
    ``elements_from_boxes`` refuses such boxes first (``box_problem``)."""
    x, y, w, h = (box.get(k, 0) for k in ("x", "y", "width", "height"))
    if w < 0:
        x, w = x + w, -w
    if h < 0:
        y, h = y + h, -h
    return [_grid(y, height), _grid(x, width), _grid(y + h, height), _grid(x + w, width)]


BBOX_WIDGETS = ("y_min", "x_min", "y_max", "x_max")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def bbox_widgets_problem(placed: Any, y_min: Any, x_min: Any, y_max: Any, x_max: Any) -> str | None:
    """What is wrong with a Text / Object Element's bbox widgets, naming the widgets; None when fine.

    Unplaced elements have no bbox, so their widgets are not checked; a widget that is None (a linked input,
    unknown before the run) is skipped."""
    if placed is False:
        return None
    values = {"y_min": y_min, "x_min": x_min, "y_max": y_max, "x_max": x_max}
    problems = []
    for name, v in values.items():
        if v is None:
            continue
        if not _is_number(v) or int(v) != v:
            problems.append(f"{name}={v!r} is not a whole number on the 0..1000 grid")
        elif not BBOX_MIN <= v <= BBOX_MAX:
            problems.append(
                f"{name}={v} is off the image: the grid runs {BBOX_MIN}..{BBOX_MAX} (0 = top / left edge, "
                f"{BBOX_MAX} = bottom / right edge)"
            )
    if problems:
        return "; ".join(problems)
    for lo, hi, axis, edges in (
        ("x_min", "x_max", "width", ("left", "right")),
        ("y_min", "y_max", "height", ("top", "bottom")),
    ):
        a, b = values[lo], values[hi]
        if a is None or b is None:
            continue
        if a > b:
            problems.append(
                f"{lo}={a} is greater than {hi}={b}: {lo} is the box's {edges[0]} edge and {hi} its "
                f"{edges[1]} edge — swap the two values"
            )
        elif a == b:
            problems.append(f"{lo} = {hi} = {a}: the box has no {axis} — make {hi} larger than {lo}")
    return "; ".join(problems) or None


def box_label(index: int, box: Any) -> str:
    """How a drawn box is named to the user: ``box 2 (obj 'A parked red bicycle')``."""
    meta = box.get("metadata") if isinstance(box, dict) and isinstance(box.get("metadata"), dict) else {}
    kind = meta.get("type") if meta.get("type") in ELEMENT_TYPES else "obj"
    what = meta.get("text") if kind == "text" else meta.get("desc")
    what = " ".join(what.split()) if isinstance(what, str) else ""
    if len(what) > 32:
        what = what[:31] + "…"
    return f"box {index + 1} ({kind} {what!r})" if what else f"box {index + 1} ({kind})"


def box_shape_problem(box: Any) -> str | None:
    """What makes one frontend box unusable whatever the canvas size (not numbers, no area); None when fine."""
    if not isinstance(box, dict) or not all(_is_number(box.get(k)) for k in ("x", "y", "width", "height")):
        return f"expected {{x, y, width, height, metadata}} with finite numbers (pixels), got {box!r:.80}"
    for key in ("width", "height"):
        v = box[key]
        if v == 0:
            return f"its {key} is 0 px: the box has no area — drag it larger or delete it"
        if v < 0:
            return (
                f"its {key} is {v:g} px: a box is its top-left corner (x, y) and a positive width and height "
                "— draw it again"
            )
    return None


def box_problem(box: Any, width: int, height: int) -> tuple[str | None, str | None]:
    """``(problem, note)`` for one frontend box on a ``width`` x ``height`` canvas.

    ``problem`` (the box is refused): not numbers, no area, entirely off the canvas, or thinner than one step
    of the 0..1000 grid. ``note`` (the box is used, clamped): the part past the canvas edges is cut off."""
    problem = box_shape_problem(box)
    if problem:
        return problem, None
    x, y, w, h = (box[k] for k in ("x", "y", "width", "height"))
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, width), min(y + h, height)
    if x1 <= x0 or y1 <= y0:
        return (
            f"it lies outside the {width}x{height} canvas (x {x:g}..{x + w:g}, y {y:g}..{y + h:g} px) — move it "
            "onto the canvas or delete it"
        ), None
    edges = [
        name
        for name, past in (("top", y < 0), ("left", x < 0), ("bottom", y + h > height), ("right", x + w > width))
        if past
    ]
    bbox = pixel_box_to_bbox({"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0}, width, height)
    if bbox[0] == bbox[2] or bbox[1] == bbox[3]:
        return (
            f"it is {x1 - x0:g}x{y1 - y0:g} px on the {width}x{height} canvas, less than one step of the "
            "0..1000 grid on one side — make it larger or delete it"
        ), None
    note = None
    if edges:
        note = (
            f"reached past the {' and '.join(edges)} edge{'s' if len(edges) > 1 else ''} of the {width}x{height} "
            f"canvas; clamped to the canvas (bbox {bbox})"
        )
    return None, note


def elements_from_boxes(boxes: Any, width: int, height: int, source: Any = "boxes") -> ElementList:
    """Elements from the frontend's bounding-box widget value (``[{x, y, width, height, metadata: {type, text,
    desc, palette}}]`` in pixels of ``width`` x ``height``), in list order.

    A box with no area, off the canvas or not made of numbers raises ``ValueError`` naming it (``box_label``); a box
    reaching past the canvas is clamped to it and the note says so. ``source`` (a str, or a ``Where`` whose
    ``widget()`` tells where boxes are edited) names the node."""
    if width <= 0 or height <= 0:
        raise ValueError(f"{source}: width and height must be positive, got {width}x{height}")
    if not isinstance(boxes, list):
        raise ValueError(f"{source}: expected a list of boxes, got {type(boxes).__name__}")
    out = ElementList()
    for i, box in enumerate(boxes):
        label = box_label(i, box)
        problem, note = box_problem(box, width, height)
        if problem:
            raise ValueError(f"{source}, {label}: {problem}")
        x0, y0 = max(box["x"], 0), max(box["y"], 0)
        clamped = {
            "x": x0,
            "y": y0,
            "width": min(box["x"] + box["width"], width) - x0,
            "height": min(box["y"] + box["height"], height) - y0,
        }
        meta = box.get("metadata") if isinstance(box.get("metadata"), dict) else {}
        kind = meta.get("type", "obj")
        where = _at(source, f"box {i + 1}")
        out = out + make_element(
            kind if kind in ELEMENT_TYPES else "obj",
            meta.get("desc", ""),
            meta.get("text", ""),
            pixel_box_to_bbox(clamped, width, height),
            meta.get("palette") or [],
            where,
        )
        extra = []
        if kind not in ELEMENT_TYPES:
            extra.append(f"{where}: type {kind!r} read as 'obj'")
        if note:
            extra.append(f"{where}: {note}")
        if extra:
            out = ElementList(out.elements, out.sources, out.notes + tuple(extra))
    return out


def elements_from_native(value: Any, source: str = "native elements") -> ElementList:
    """Elements from ComfyUI's ``CreateBoundingBoxes`` ``elements`` output (a list of caption elements) or
    any list of caption-element dicts. Palettes are normalized (noted); everything else is kept as given."""
    if isinstance(value, ElementList):
        return value
    if not isinstance(value, list):
        raise ValueError(
            f"{source}: expected a list of elements (CreateBoundingBoxes 'elements' output), got {type(value).__name__}"
        )
    out = ElementList()
    for i, el in enumerate(value):
        label = f"{source}, item {i}"
        if not isinstance(el, dict):
            raise ValueError(f"{label}: expected an element object, got {type(el).__name__}")
        el = dict(el)
        notes: list[str] = []
        if "color_palette" in el:
            palette, pnotes = parse_palette(el["color_palette"])
            el["color_palette"] = palette
            notes += [f"{label}: color {n}" for n in pnotes]
        if isinstance(el.get("bbox"), tuple):
            el["bbox"] = list(el["bbox"])
        out = out + ElementList((el,), (label,), tuple(notes))
    return out


def build_caption(
    high_level_description: str = "",
    background: str = "",
    style: StyleBlock | None = None,
    elements: ElementList | None = None,
) -> tuple[dict, list[str]]:
    """Assemble a caption dict in official key order; returns it with the builders' notes.

    A blank high-level description is omitted (the report recommends one). Validation is the caller's job."""
    caption: dict = {}
    notes: list[str] = []
    hld = _prose(high_level_description)
    if hld:
        caption["high_level_description"] = hld
    if style is not None:
        caption["style_description"] = dict(style.style)
        notes += style.notes
    elements = elements or ElementList()
    notes += elements.notes
    caption["compositional_deconstruction"] = {
        "background": _prose(background),
        "elements": [dict(e) for e in elements.elements],
    }
    return caption, notes
