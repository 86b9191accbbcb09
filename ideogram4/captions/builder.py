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


def make_style(kind: str, aesthetics: str, lighting: str, medium: str, photo: str = "", art_style: str = "",
               color_palette: Any = "", source: str = "style") -> StyleBlock:
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
        notes.append(f"{source}: the {unused[0]} text is not used because the style kind is {kind!r} "
                     f"(a caption has exactly one of photo / art_style): {unused[1].strip()[:60]!r}")
    palette, pnotes = parse_palette(color_palette)
    notes += [f"{source}: color {n}" for n in pnotes]
    if palette:
        style["color_palette"] = palette
    return StyleBlock(style, tuple(notes), source)


def make_element(kind: str, desc: Any, text: Any = None, bbox: Any = None, color_palette: Any = "",
                 source: str = "element") -> ElementList:
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
        notes.append(f"{source}: type is 'obj', so its text {text.strip()[:40]!r} is not rendered (switch the box to "
                     "'text' to render it)")
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

    Negative sizes are flipped; values are clamped to the grid."""
    x, y, w, h = (box.get(k, 0) for k in ("x", "y", "width", "height"))
    if w < 0:
        x, w = x + w, -w
    if h < 0:
        y, h = y + h, -h
    return [_grid(y, height), _grid(x, width), _grid(y + h, height), _grid(x + w, width)]


def elements_from_boxes(boxes: Any, width: int, height: int, source: str = "boxes") -> ElementList:
    """Elements from the frontend's bounding-box widget value (``[{x, y, width, height, metadata: {type, text,
    desc, palette}}]`` in pixels of ``width`` x ``height``), in list order."""
    if width <= 0 or height <= 0:
        raise ValueError(f"{source}: width and height must be positive, got {width}x{height}")
    if not isinstance(boxes, list):
        raise ValueError(f"{source}: expected a list of boxes, got {type(boxes).__name__}")
    out = ElementList()
    for i, box in enumerate(boxes):
        label = f"{source} box {i + 1}"
        if not isinstance(box, dict) or not all(isinstance(box.get(k), (int, float)) for k in ("x", "y", "width",
                                                                                             "height")):
            raise ValueError(f"{label}: expected {{x, y, width, height, metadata}} with numbers, got {box!r:.80}")
        meta = box.get("metadata") if isinstance(box.get("metadata"), dict) else {}
        kind = meta.get("type", "obj")
        out = out + make_element(kind if kind in ELEMENT_TYPES else "obj", meta.get("desc", ""),
                                 meta.get("text", ""), pixel_box_to_bbox(box, width, height),
                                 meta.get("palette") or [], label)
        if kind not in ELEMENT_TYPES:
            out = ElementList(out.elements, out.sources, out.notes + (f"{label}: type {kind!r} read as 'obj'",))
    return out


def elements_from_native(value: Any, source: str = "native elements") -> ElementList:
    """Elements from ComfyUI's ``CreateBoundingBoxes`` ``elements`` output (a list of caption elements) or
    any list of caption-element dicts. Palettes are normalized (noted); everything else is kept as given."""
    if isinstance(value, ElementList):
        return value
    if not isinstance(value, list):
        raise ValueError(f"{source}: expected a list of elements (CreateBoundingBoxes 'elements' output), "
                         f"got {type(value).__name__}")
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


def build_caption(high_level_description: str = "", background: str = "", style: StyleBlock | None = None,
                  elements: ElementList | None = None) -> tuple[dict, list[str]]:
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
