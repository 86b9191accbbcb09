// The Layout Boxes editor for the classic canvas (attached by web/ideogram4_captions.js): the frontend's own
// bounding-box widget is "Node 2.0 only", so this editor reads and writes the very same widget value (pixel boxes
// with type/text/desc/palette metadata): draw, move, resize, label, reorder, delete. The canvas has the target
// aspect ratio (the node's width/height widgets) and shows the 0..1000 bbox the Python side will emit (bbox.mjs
// mirrors it; tests/js checks the mirror). Needs a browser DOM; imports nothing from ComfyUI.
import {
  applyDrag, boxFromRegion, boxGeometry, boxProblems, elementFromBox, hitTest, normalizeColor, parsePaletteText,
  regionFromBox,
} from "./bbox.mjs";
import { MAX_ELEMENT_COLORS } from "./caption_limits.mjs";
import { BUTTON_STYLE, FIELD_STYLE, el, labelField } from "./dom.mjs";

const STAGE_HEIGHT = 300;
// Everything under the stage has a fixed height, so selecting a box (which fills the fields in) never moves or
// resizes anything: toolbar 24 + stage + text 46 + desc 46 + colors 24 + swatches 10 + info 42, gaps 4 px each.
const FIELD_HEIGHT = 46;
const EDITOR_HEIGHT = 24 + STAGE_HEIGHT + 2 * FIELD_HEIGHT + 24 + 10 + 42 + 6 * 4;
const HANDLE_PX = 7;
const MIN_BOX = 0.01; // a box smaller than 1% of the canvas on either axis is a click, not a box

class LayoutEditor {
  constructor(node, boxesWidget, onChange) {
    this.node = node;
    this.widget = boxesWidget;
    this.onChange = onChange; // tells the app the graph changed (a workflow save asks)
    this.regions = [];
    this.upstream = []; // elements connected to the 'elements' input, from the last run (read-only)
    this.selected = -1;
    this.drag = null;
    this.lastValue = undefined;
    this.lastDims = "";
    this.build();
    this.reload();
  }

  dims() {
    const get = (name) => {
      const v = this.node.widgets?.find((w) => w.name === name)?.value;
      return typeof v === "number" && v > 0 ? v : 1024;
    };
    return { W: get("width"), H: get("height") };
  }

  // ---- model <-> widget value --------------------------------------------------------------------------------
  reload() {
    const { W, H } = this.dims();
    const value = Array.isArray(this.widget.value) ? this.widget.value : [];
    this.regions = value.filter((b) => b && typeof b === "object").map((b) => regionFromBox(b, W, H));
    this.lastValue = this.widget.value;
    this.lastDims = `${W}x${H}`;
    if (this.selected >= this.regions.length) this.selected = this.regions.length - 1;
    this.refresh();
  }

  commit() {
    const { W, H } = this.dims();
    const value = this.regions.map((r) => boxFromRegion(r, W, H));
    this.widget.value = value;
    this.lastValue = value;
    this.lastDims = `${W}x${H}`;
    this.widget.callback?.(value);
    this.node.setDirtyCanvas?.(true, true);
    this.onChange?.();
    this.refresh();
  }

  /** Pick up outside changes: a loaded workflow, undo, or new width/height (boxes keep their place). */
  poll() {
    const { W, H } = this.dims();
    if (this.widget.value !== this.lastValue) this.reload();
    else if (`${W}x${H}` !== this.lastDims) this.commit();
    else this.draw();
  }

  // ---- DOM -----------------------------------------------------------------------------------------------------
  build() {
    const btn = (label, title, onclick) => el("button", { textContent: label, title, onclick, style: BUTTON_STYLE });
    this.typeBtn = btn("type", "Element type of the selected box (click to switch obj / text)", () => {
      const r = this.regions[this.selected];
      if (!r) return;
      r.type = r.type === "text" ? "obj" : "text";
      this.commit();
    });
    this.typeBtn.style.minWidth = "76px"; // "type: text" and "type: obj" take the same room: the row never reflows
    const fixed = (height) => ({ height: `${height}px`, minHeight: `${height}px`, flex: "0 0 auto" });
    const toolbar = el("div", { style: { display: "flex", gap: "4px", alignItems: "center", overflow: "hidden",
      ...fixed(24) } },
      this.typeBtn,
      btn("back", "Move the selected box one step back (earlier in the list)", () => this.reorder(-1)),
      btn("front", "Move the selected box one step to the front (later in the list)", () => this.reorder(1)),
      btn("delete", "Delete the selected box (or press Delete on the canvas)", () => this.remove()),
      btn("clear", "Remove all boxes", () => {
        if (this.regions.length && confirm("Remove all boxes?")) {
          this.regions = [];
          this.selected = -1;
          this.commit();
        }
      }));
    this.canvas = el("canvas", { tabIndex: 0, style: { display: "block", outline: "none", cursor: "crosshair" } });
    this.stage = el("div", { style: {
      ...fixed(STAGE_HEIGHT), width: "100%", display: "flex", alignItems: "center", justifyContent: "center",
      background: "#0d0d0d", borderRadius: "4px", overflow: "hidden",
    } }, this.canvas);
    const area = (label, placeholder, title) => {
      const field = el("textarea", { rows: 2, placeholder, title,
        style: { ...FIELD_STYLE, resize: "none", ...fixed(FIELD_HEIGHT) } });
      labelField(field, label);
      return field;
    };
    this.text = area("text", "the exact characters to render (Enter = line break; text boxes only)",
      "Verbatim text of a text element");
    this.desc = area("desc", "what it is and looks like", "Description of the element");
    this.colors = el("input", { placeholder: `colors: up to ${MAX_ELEMENT_COLORS} #RRGGBB, e.g. #D4AF37 #1A1A1A`,
      title: "Element colors, separated by spaces or commas", style: { ...FIELD_STYLE, ...fixed(24) } });
    this.swatches = el("div", { style: { display: "flex", gap: "2px", ...fixed(10) } });
    this.info = el("div", { style: { font: "11px monospace", whiteSpace: "pre-wrap", overflow: "hidden",
      ...fixed(42) } });
    this.fields = el("div", { style: { display: "flex", flexDirection: "column", gap: "4px", flex: "0 0 auto" } },
      this.text, this.desc, this.colors, this.swatches);
    this.root = el("div", { style: {
      display: "flex", flexDirection: "column", gap: "4px", width: "100%", height: "100%", boxSizing: "border-box",
      color: "var(--input-text, #ddd)", overflow: "hidden",
    } }, toolbar, this.stage, this.fields, this.info);
    this.root.dataset.testid = "ideogram4-layout-editor";

    const edit = (field, key, transform = (v) => v) => field.addEventListener("input", () => {
      const r = this.regions[this.selected];
      if (!r) return;
      r[key] = transform(field.value);
      this.commit();
    });
    edit(this.text, "text");
    edit(this.desc, "desc");
    edit(this.colors, "palette", (v) => parsePaletteText(v).map((c) => normalizeColor(c)[0]));
    this.colors.addEventListener("change", () => this.refresh(true));
    for (const f of [this.text, this.desc, this.colors]) {
      f.addEventListener("keydown", (e) => e.stopPropagation()); // typing must not trigger graph shortcuts
    }
    this.root.addEventListener("pointerdown", (e) => e.stopPropagation());
    this.canvas.addEventListener("pointerdown", (e) => this.onDown(e));
    this.canvas.addEventListener("pointermove", (e) => this.onMove(e));
    this.canvas.addEventListener("pointerup", (e) => this.onUp(e));
    this.canvas.addEventListener("pointercancel", (e) => this.onUp(e));
    this.canvas.addEventListener("dblclick", () => this.desc.focus());
    this.canvas.addEventListener("keydown", (e) => {
      if ((e.key === "Delete" || e.key === "Backspace") && this.selected >= 0) {
        e.preventDefault();
        e.stopPropagation();
        this.remove();
      }
    });
  }

  preferredHeight() {
    return EDITOR_HEIGHT;
  }

  // ---- editing -------------------------------------------------------------------------------------------------
  reorder(step) {
    const i = this.selected;
    const j = i + step;
    if (i < 0 || j < 0 || j >= this.regions.length) return;
    [this.regions[i], this.regions[j]] = [this.regions[j], this.regions[i]];
    this.selected = j;
    this.commit();
  }

  remove() {
    if (this.selected < 0) return;
    this.regions.splice(this.selected, 1);
    this.selected = Math.min(this.selected, this.regions.length - 1);
    this.commit();
  }

  pointer(e) {
    const rect = this.canvas.getBoundingClientRect();
    return {
      x: Math.max(0, Math.min(1, (e.clientX - rect.left) / rect.width)),
      y: Math.max(0, Math.min(1, (e.clientY - rect.top) / rect.height)),
      tolX: HANDLE_PX / rect.width,
      tolY: HANDLE_PX / rect.height,
    };
  }

  onDown(e) {
    if (e.button !== 0) return;
    e.stopPropagation();
    this.canvas.focus();
    const p = this.pointer(e);
    // Shift or Ctrl draws a new box even over existing ones (e.g. lettering inside a sign).
    const hit = e.shiftKey || e.ctrlKey ? null : hitTest(this.regions, p.x, p.y, p.tolX, p.tolY, this.selected);
    if (hit) {
      this.selected = hit.index;
      this.drag = { mode: hit.mode, start: { ...this.regions[hit.index] }, x: p.x, y: p.y };
    } else {
      const r = { x: p.x, y: p.y, w: 0, h: 0, type: "obj", text: "", desc: "", palette: [] };
      this.regions.push(r);
      this.selected = this.regions.length - 1;
      this.drag = { mode: "draw", start: { ...r }, x: p.x, y: p.y };
    }
    this.canvas.setPointerCapture(e.pointerId);
    this.refresh(true);
  }

  onMove(e) {
    const p = this.pointer(e);
    if (!this.drag) {
      const hit = hitTest(this.regions, p.x, p.y, p.tolX, p.tolY, this.selected);
      const cursors = { move: "move", "resize-t": "ns-resize", "resize-b": "ns-resize", "resize-l": "ew-resize",
        "resize-r": "ew-resize", "resize-tl": "nwse-resize", "resize-br": "nwse-resize", "resize-tr": "nesw-resize",
        "resize-bl": "nesw-resize" };
      this.canvas.style.cursor = hit ? cursors[hit.mode] : "crosshair";
      return;
    }
    e.stopPropagation();
    this.regions[this.selected] = applyDrag(this.drag.mode, this.drag.start, p.x - this.drag.x, p.y - this.drag.y);
    this.draw();
    this.showInfo();
  }

  onUp(e) {
    if (!this.drag) return;
    this.canvas.releasePointerCapture?.(e.pointerId);
    const r = this.regions[this.selected];
    const drew = this.drag.mode === "draw";
    if (drew && r && (r.w < MIN_BOX || r.h < MIN_BOX)) {
      this.regions.splice(this.selected, 1);
      this.selected = this.regions.length ? Math.min(this.selected, this.regions.length - 1) : -1;
    }
    this.drag = null;
    this.commit();
    if (drew && this.regions[this.selected]) this.desc.focus(); // a new box: describe it next
  }

  // ---- view ----------------------------------------------------------------------------------------------------
  refresh(fieldsToo = true) {
    const r = this.regions[this.selected];
    if (fieldsToo) {
      const active = document.activeElement;
      this.fields.style.opacity = r ? "1" : "0.45";
      for (const f of [this.desc, this.colors]) f.disabled = !r;
      this.text.disabled = !r || r.type !== "text"; // always there (the layout never jumps), used by text boxes
      if (active !== this.text) this.text.value = r && r.type === "text" ? r.text : "";
      if (active !== this.desc) this.desc.value = r ? r.desc : "";
      if (active !== this.colors) this.colors.value = r ? r.palette.join(" ") : "";
      this.typeBtn.textContent = r ? `type: ${r.type}` : "type";
      this.swatches.replaceChildren(...(r ? r.palette : []).map((c) => el("span", { title: c, style: {
        width: "16px", height: "10px", background: c, border: "1px solid #555" } })));
    }
    this.draw();
    this.showInfo();
  }

  showInfo() {
    const { W, H } = this.dims();
    const r = this.regions[this.selected];
    if (!r) {
      this.info.textContent = `${this.regions.length} box(es) on ${W}x${H}; the first is furthest back. Drag on the ` +
        "canvas to draw (Shift: over a box), drag a box to move it, its edges to resize; click a box to edit it.";
      this.info.style.color = "";
      return;
    }
    const box = boxFromRegion(r, W, H);
    const element = elementFromBox(box, W, H);
    const geometry = boxGeometry(box, W, H);
    const problems = [...(geometry.problem ? [geometry.problem] : []), ...boxProblems(box)];
    this.info.textContent = `box ${this.selected + 1}/${this.regions.length} · ${element.type} · bbox ` +
      `[${element.bbox.join(", ")}] (ymin, xmin, ymax, xmax on 0..1000)` +
      (problems.length ? `\n⚠ ${problems.join("; ")}` : "");
    this.info.style.color = problems.length ? "#f0a040" : "";
  }

  draw() {
    const { W, H } = this.dims();
    const sw = Math.max(50, this.stage.clientWidth - 8);
    const sh = Math.max(50, Math.min(STAGE_HEIGHT, this.stage.clientHeight || STAGE_HEIGHT) - 8);
    const scale = Math.min(sw / W, sh / H);
    const cw = Math.max(10, Math.round(W * scale));
    const ch = Math.max(10, Math.round(H * scale));
    const dpr = window.devicePixelRatio || 1;
    if (this.canvas.width !== Math.round(cw * dpr) || this.canvas.height !== Math.round(ch * dpr)) {
      this.canvas.width = Math.round(cw * dpr);
      this.canvas.height = Math.round(ch * dpr);
      this.canvas.style.width = `${cw}px`;
      this.canvas.style.height = `${ch}px`;
    }
    const g = this.canvas.getContext("2d");
    if (!g) return;
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.fillStyle = "#2a2a2a";
    g.fillRect(0, 0, cw, ch);
    g.strokeStyle = "rgba(255,255,255,0.07)";
    g.lineWidth = 1;
    for (let k = 1; k < 3; k++) { // rule-of-thirds guides
      g.beginPath();
      g.moveTo(Math.round((cw * k) / 3) + 0.5, 0);
      g.lineTo(Math.round((cw * k) / 3) + 0.5, ch);
      g.moveTo(0, Math.round((ch * k) / 3) + 0.5);
      g.lineTo(cw, Math.round((ch * k) / 3) + 0.5);
      g.stroke();
    }
    g.fillStyle = "rgba(255,255,255,0.35)";
    g.font = "10px monospace";
    g.fillText(`${W}×${H}`, 4, ch - 4);
    this.upstream.forEach((e, i) => this.drawUpstream(g, e, i, cw, ch));
    const order = this.regions.map((_, i) => i).filter((i) => i !== this.selected);
    if (this.selected >= 0) order.push(this.selected);
    for (const i of order) this.drawRegion(g, this.regions[i], i, cw, ch, i === this.selected);
  }

  drawUpstream(g, element, i, cw, ch) {
    const b = Array.isArray(element?.bbox) && element.bbox.length === 4 ? element.bbox : null;
    if (!b) return; // unplaced elements have nothing to draw
    const [y0, x0, y1, x1] = b.map((v) => v / 1000);
    const x = x0 * cw;
    const y = y0 * ch;
    const w = (x1 - x0) * cw;
    const h = (y1 - y0) * ch;
    g.save();
    g.strokeStyle = "rgba(200,200,200,0.45)";
    g.setLineDash([2, 3]);
    g.strokeRect(x + 0.5, y + 0.5, Math.max(0, w - 1), Math.max(0, h - 1));
    g.setLineDash([]);
    g.beginPath();
    g.rect(x, y, w, h);
    g.clip();
    g.font = "10px monospace";
    g.fillStyle = "rgba(220,220,220,0.6)";
    const what = element.type === "text" ? `“${element.text}”` : element.desc;
    g.fillText(`in ${i + 1} ${element.type}: ${String(what ?? "").split("\n")[0]}`, x + 3, y + h - 4);
    g.restore();
  }

  drawRegion(g, r, i, cw, ch, active) {
    const color = r.palette.find((c) => /^#[0-9A-Fa-f]{6}$/.test(c)) || (r.type === "text" ? "#46b4e6" : "#9a9a9a");
    const x = r.x * cw;
    const y = r.y * ch;
    const w = r.w * cw;
    const h = r.h * ch;
    g.fillStyle = color + (active ? "40" : "22");
    g.fillRect(x, y, w, h);
    g.strokeStyle = color;
    g.lineWidth = active ? 2 : 1;
    g.setLineDash(r.type === "text" ? [] : [5, 3]);
    g.strokeRect(x + 0.5, y + 0.5, Math.max(0, w - 1), Math.max(0, h - 1));
    g.setLineDash([]);
    g.save();
    g.beginPath();
    g.rect(x, y, w, h);
    g.clip();
    const tag = `${String(i + 1).padStart(2, "0")} ${r.type}`;
    g.font = "bold 11px monospace";
    const tw = g.measureText(tag).width + 8;
    g.fillStyle = color;
    g.fillRect(x, y, tw, 15);
    g.fillStyle = luminance(color) > 140 ? "#000" : "#fff";
    g.fillText(tag, x + 4, y + 11);
    let label = r.desc || "";
    if (r.type === "text") label = `“${r.text}”${label ? " — " + label : ""}`;
    g.font = "11px sans-serif";
    g.fillStyle = "#eee";
    let ty = y + 28;
    for (const line of wrap(g, label, w - 8)) {
      if (ty > y + h - 2) break;
      g.fillText(line, x + 4, ty);
      ty += 13;
    }
    g.restore();
    if (active) {
      g.fillStyle = "#fff";
      for (const [hx, hy] of [[0, 0], [0.5, 0], [1, 0], [0, 0.5], [1, 0.5], [0, 1], [0.5, 1], [1, 1]]) {
        g.fillRect(x + hx * w - 3, y + hy * h - 3, 6, 6);
      }
    }
  }
}

function luminance(hex) {
  const n = parseInt(hex.slice(1, 7), 16);
  return 0.299 * ((n >> 16) & 255) + 0.587 * ((n >> 8) & 255) + 0.114 * (n & 255);
}

function wrap(g, text, maxWidth) {
  const lines = [];
  for (const para of String(text).split("\n")) {
    let line = "";
    for (const word of para.split(/\s+/)) {
      if (!word) continue;
      const next = line ? `${line} ${word}` : word;
      if (line && g.measureText(next).width > maxWidth) {
        lines.push(line);
        line = word;
      } else line = next;
    }
    lines.push(line);
  }
  return lines;
}

export function attachLayoutEditor(node, { onChange } = {}) {
  const boxes = node.widgets?.find((w) => w.name === "boxes");
  if (!boxes || node.__ideogram4Layout) return;
  boxes.hidden = true; // the classic canvas only draws "Node 2.0 only" for the frontend's own widget
  const editor = new LayoutEditor(node, boxes, onChange);
  node.__ideogram4Layout = editor;
  // canvasOnly: the editor is drawn on the node, not listed (as an empty row) in the properties panel
  const widget = node.addDOMWidget("ideogram4_layout", "ideogram4_layout", editor.root, {
    serialize: false, hideOnZoom: false, canvasOnly: true, getValue: () => undefined, setValue: () => {},
  });
  widget.serialize = false; // keeps widgets_values [width, height, boxes] in both frontend modes
  // the frontend gives the element the widget's height less its margin above and below
  const height = () => editor.preferredHeight() + 2 * (widget.margin ?? 10);
  widget.computeLayoutSize = () => ({ minHeight: height(), maxHeight: height(), minWidth: 380 });
  const timer = setInterval(() => editor.poll(), 250);
  const onRemoved = node.onRemoved;
  node.onRemoved = function () {
    clearInterval(timer);
    return onRemoved?.apply(this, arguments);
  };
  const onExecuted = node.onExecuted;
  node.onExecuted = function (message) {
    onExecuted?.apply(this, arguments);
    if (Array.isArray(message?.ideogram4_upstream)) {
      editor.upstream = message.ideogram4_upstream;
      editor.draw();
    }
  };
  node.setSize([Math.max(node.size[0], 460), Math.max(node.size[1], node.computeSize()[1])]);
  requestAnimationFrame(() => editor.refresh());
}
