// Pure logic of the layout editor: pixel boxes <-> 0..1000 grid, drag math, hit testing, colors, and a mirror of
// the Python serializer. No DOM here, so Node's test runner can check it against the shared fixtures.
// Python (ideogram4/captions) is authoritative; every function here mirrors one there and is tested for parity.
import {
  BBOX_MAX, BBOX_MIN, CD_KEYS, ELEMENT_TYPES, HEX_COLOR_PATTERN, MAX_ELEMENT_COLORS, OBJ_KEYS, ROOT_KEYS,
  STYLE_KEYS_ART, STYLE_KEYS_PHOTO, TEXT_KEYS,
} from "./caption_limits.mjs";

const HEX = new RegExp(HEX_COLOR_PATTERN);

// Python's str.strip() whitespace set (differs from String.prototype.trim on \x1c-\x1f, \x85 and \ufeff).
const PY_SPACE = "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007" +
  "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000";

export function pyStrip(s) {
  let a = 0;
  let b = s.length;
  while (a < b && PY_SPACE.includes(s[a])) a++;
  while (b > a && PY_SPACE.includes(s[b - 1])) b--;
  return s.slice(a, b);
}

/** Pixel coordinate -> 0..1000 grid, rounded half up, clamped (mirror of builder._grid). */
export function toGrid(value, size) {
  let g;
  if (Number.isInteger(value) && Number.isInteger(size)) {
    g = Math.floor((2 * value * BBOX_MAX + size) / (2 * size)); // exact half-up, like Python's integer path
  } else {
    g = Math.floor((value * BBOX_MAX) / size + 0.5);
  }
  return Math.max(BBOX_MIN, Math.min(BBOX_MAX, g));
}

/** {x, y, width, height} in pixels of a width x height image -> [ymin, xmin, ymax, xmax] (pixel_box_to_bbox). */
export function pixelBoxToBbox(box, width, height) {
  let { x = 0, y = 0, width: w = 0, height: h = 0 } = box;
  if (w < 0) { x += w; w = -w; }
  if (h < 0) { y += h; h = -h; }
  return [toGrid(y, height), toGrid(x, width), toGrid(y + h, height), toGrid(x + w, width)];
}

/** Mirror of colors.normalize_color: [color, changed]. */
export function normalizeColor(value) {
  if (typeof value !== "string") return [value, false];
  const s = pyStrip(value);
  let m = /^#?([0-9A-Fa-f]{6})$/.exec(s);
  let digits = null;
  if (m) digits = m[1];
  else if ((m = /^#?([0-9A-Fa-f]{3})$/.exec(s))) digits = [...m[1]].map((c) => c + c).join("");
  else if ((m = /^#?([0-9A-Fa-f]{6})[Ff]{2}$/.exec(s))) digits = m[1];
  if (digits === null) return [value, false];
  const fixed = "#" + digits.toUpperCase();
  return [fixed, fixed !== value];
}

export function isValidColor(value) {
  return typeof value === "string" && HEX.test(value);
}

/** A palette typed as text ("#2B1D14, #c8a27a #FFF") -> entries (mirror of colors.parse_palette's split). */
export function parsePaletteText(text) {
  return String(text).split(/[\s,;]+/).filter(Boolean);
}

/** Frontend bounding-box value item -> caption element, in official key order (builder.elements_from_boxes). */
export function elementFromBox(box, width, height) {
  const meta = box && typeof box.metadata === "object" && box.metadata ? box.metadata : {};
  const type = ELEMENT_TYPES.includes(meta.type) ? meta.type : "obj";
  const el = { type, bbox: pixelBoxToBbox(box, width, height) };
  if (type === "text") el.text = meta.text ?? "";
  const desc = meta.desc ?? "";
  el.desc = typeof desc === "string" ? pyStrip(desc) : desc;
  const palette = (Array.isArray(meta.palette) ? meta.palette : []).map((c) => normalizeColor(c)[0]);
  if (palette.length) el.color_palette = palette;
  return el;
}

const finite = (v) => typeof v === "number" && Number.isFinite(v);
const fmt = (v) => String(Math.round(v * 1e6) / 1e6);

/**
 * Mirror of builder.box_problem: {problem, note} for one box on a width x height canvas. problem: the node refuses
 * the box (not numbers, no area, off the canvas, thinner than one grid step); note: it is clamped to the canvas.
 */
export function boxGeometry(box, width, height) {
  if (!box || typeof box !== "object" || !["x", "y", "width", "height"].every((k) => finite(box[k]))) {
    return { problem: "expected {x, y, width, height, metadata} with finite numbers (pixels)", note: null };
  }
  for (const key of ["width", "height"]) {
    const v = box[key];
    if (v === 0) return { problem: `its ${key} is 0 px: the box has no area — drag it larger or delete it`, note: null };
    if (v < 0) {
      return { problem: `its ${key} is ${fmt(v)} px: a box is its top-left corner (x, y) and a positive width and ` +
        "height — draw it again", note: null };
    }
  }
  const { x, y, width: w, height: h } = box;
  const x0 = Math.max(x, 0), y0 = Math.max(y, 0), x1 = Math.min(x + w, width), y1 = Math.min(y + h, height);
  if (x1 <= x0 || y1 <= y0) {
    return { problem: `it lies outside the ${width}x${height} canvas (x ${fmt(x)}..${fmt(x + w)}, y ${fmt(y)}..` +
      `${fmt(y + h)} px) — move it onto the canvas or delete it`, note: null };
  }
  const edges = [["top", y < 0], ["left", x < 0], ["bottom", y + h > height], ["right", x + w > width]]
    .filter(([, past]) => past).map(([name]) => name);
  const bbox = pixelBoxToBbox({ x: x0, y: y0, width: x1 - x0, height: y1 - y0 }, width, height);
  if (bbox[0] === bbox[2] || bbox[1] === bbox[3]) {
    return { problem: `it is ${fmt(x1 - x0)}x${fmt(y1 - y0)} px on the ${width}x${height} canvas, less than one ` +
      "step of the 0..1000 grid on one side — make it larger or delete it", note: null };
  }
  const note = edges.length
    ? `reached past the ${edges.join(" and ")} edge${edges.length > 1 ? "s" : ""} of the ${width}x${height} canvas; ` +
      `clamped to the canvas (bbox [${bbox.join(", ")}])`
    : null;
  return { problem: null, note, bbox };
}

/** Problems the editor can show live for one box (the Python report stays authoritative). */
export function boxProblems(box) {
  const el = elementFromBox(box, 1000, 1000);
  const out = [];
  if (el.type === "text" && (typeof el.text !== "string" || pyStrip(el.text) === "")) out.push("text is empty");
  if (typeof el.desc !== "string" || el.desc === "") out.push("desc is empty");
  const palette = el.color_palette || [];
  if (palette.length > MAX_ELEMENT_COLORS) {
    out.push(`${palette.length} colors; at most ${MAX_ELEMENT_COLORS} per element`);
  }
  palette.forEach((c, i) => {
    if (!isValidColor(c)) out.push(`color ${i + 1} ${JSON.stringify(c)} is not #RRGGBB`);
  });
  return out;
}

// ---- regions: the editor's working form, fractions of the canvas --------------------------------------------

const clamp01 = (v) => Math.max(0, Math.min(1, v));

export function regionFromBox(box, width, height) {
  let { x = 0, y = 0, width: w = 0, height: h = 0 } = box;
  if (w < 0) { x += w; w = -w; }
  if (h < 0) { y += h; h = -h; }
  const meta = box.metadata || {};
  return {
    x: x / width, y: y / height, w: w / width, h: h / height,
    type: meta.type === "text" ? "text" : "obj",
    text: typeof meta.text === "string" ? meta.text : "",
    desc: typeof meta.desc === "string" ? meta.desc : "",
    palette: Array.isArray(meta.palette) ? meta.palette.slice() : [],
  };
}

/** Region -> the frontend widget's value format (pixels, Math.round as the frontend does). */
export function boxFromRegion(r, width, height) {
  return {
    x: Math.round(r.x * width), y: Math.round(r.y * height),
    width: Math.round(r.w * width), height: Math.round(r.h * height),
    metadata: { type: r.type, text: r.text, desc: r.desc, palette: r.palette.slice() },
  };
}

export function normalizeRegion(r) {
  let { x, y, w, h } = r;
  if (w < 0) { x += w; w = -w; }
  if (h < 0) { y += h; h = -h; }
  x = clamp01(x); y = clamp01(y);
  w = Math.max(0, Math.min(w, 1 - x)); h = Math.max(0, Math.min(h, 1 - y));
  return { ...r, x, y, w, h };
}

/** Move or resize ``start`` by (dx, dy) canvas fractions; mode: move, draw, or resize-<t|b|l|r|tl|tr|bl|br>. */
export function applyDrag(mode, start, dx, dy) {
  let { x, y, w, h } = start;
  if (mode === "move") {
    return { ...start, x: clamp01(Math.min(x + dx, 1 - w)), y: clamp01(Math.min(y + dy, 1 - h)) };
  }
  const edges = mode === "draw" ? "br" : mode.replace("resize-", "");
  if (edges.includes("l")) { x += dx; w -= dx; }
  if (edges.includes("r")) { w += dx; }
  if (edges.includes("t")) { y += dy; h -= dy; }
  if (edges.includes("b")) { h += dy; }
  return normalizeRegion({ ...start, x, y, w, h });
}

/** What a pointer at (px, py) (fractions) grabs: {index, mode} or null. tolX/tolY: handle size in fractions. */
export function hitTest(regions, px, py, tolX, tolY, selected = -1) {
  const order = regions.map((_, i) => i).reverse(); // the last box is drawn on top
  if (selected >= 0 && selected < regions.length) order.unshift(selected);
  for (const i of order) {
    const r = regions[i];
    const tx = Math.min(tolX, r.w / 3);
    const ty = Math.min(tolY, r.h / 3);
    const inX = px >= r.x - tx && px <= r.x + r.w + tx;
    const inY = py >= r.y - ty && py <= r.y + r.h + ty;
    if (!inX || !inY) continue;
    const l = Math.abs(px - r.x) <= tx;
    const rr = Math.abs(px - (r.x + r.w)) <= tx;
    const t = Math.abs(py - r.y) <= ty;
    const b = Math.abs(py - (r.y + r.h)) <= ty;
    const edge = (t ? "t" : b ? "b" : "") + (l ? "l" : rr ? "r" : "");
    if (edge) return { index: i, mode: `resize-${edge}` };
    if (px >= r.x && px <= r.x + r.w && py >= r.y && py <= r.y + r.h) return { index: i, mode: "move" };
  }
  return null;
}

// ---- serializer mirror ---------------------------------------------------------------------------------------

function ordered(obj, keys) {
  const out = {};
  for (const k of keys) if (Object.prototype.hasOwnProperty.call(obj, k)) out[k] = obj[k];
  for (const k of Object.keys(obj)) if (!(k in out)) out[k] = obj[k];
  return out;
}

const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

/** Mirror of serialize.canonical_order (no validation). */
export function canonicalOrder(caption) {
  if (!isObj(caption)) return caption;
  const cap = ordered(caption, ROOT_KEYS);
  const style = cap.style_description;
  if (isObj(style)) {
    const photo = "photo" in style && !("art_style" in style);
    cap.style_description = ordered(style, photo ? STYLE_KEYS_PHOTO : STYLE_KEYS_ART);
  }
  if (isObj(cap.compositional_deconstruction)) {
    const cd = ordered(cap.compositional_deconstruction, CD_KEYS);
    if (Array.isArray(cd.elements)) {
      cd.elements = cd.elements.map((el) => (isObj(el) ? ordered(el, el.type === "text" ? TEXT_KEYS : OBJ_KEYS) : el));
    }
    cap.compositional_deconstruction = cd;
  }
  return cap;
}

/** Mirror of serialize.dumps_compact(canonical_order(caption)): the same bytes as Python for a valid caption. */
export function serializeCaption(caption) {
  return JSON.stringify(canonicalOrder(caption));
}

/** The elements the Python node will emit for these boxes, for display. */
export function elementsFromBoxes(boxes, width, height) {
  return (Array.isArray(boxes) ? boxes : []).map((b) => elementFromBox(b, width, height));
}
