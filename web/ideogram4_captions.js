// Ideogram 4 caption nodes in the ComfyUI frontend.
//
// * Layout Boxes: in Nodes 2.0 (Vue) mode the frontend's own bounding-box widget edits the `boxes` input. The
//   classic canvas cannot show that widget ("Node 2.0 only"), so there this file attaches the editor of
//   web/lib/layout_editor.mjs, which reads and writes the very same widget value.
// * Caption Builder / Validate: show the validation report on the node after a run.
import { api } from "../../scripts/api.js";
import { app } from "../../scripts/app.js";
import { FIELD_STYLE, el, labelField } from "./lib/dom.mjs";
import { attachLayoutEditor } from "./lib/layout_editor.mjs";

const LAYOUT_NODE = "Ideogram4Int8LayoutBoxes";
const REPORT_NODES = new Set(["Ideogram4Int8CaptionBuilder", "Ideogram4Int8CaptionValidate"]);

function vueNodesEnabled() {
  try {
    return Boolean(app.extensionManager?.setting?.get("Comfy.VueNodes.Enabled"));
  } catch {
    return false;
  }
}

function attachReport(node) {
  if (node.__ideogram4Report) return;
  const status = el("div", { textContent: "report: run the graph to validate",
    style: { font: "bold 12px sans-serif", opacity: "0.7" } });
  const area = el("textarea", { readOnly: true, rows: 6, style: { ...FIELD_STYLE, flex: "1", resize: "none" } });
  area.addEventListener("keydown", (e) => e.stopPropagation());
  const root = el("div", { style: { display: "flex", flexDirection: "column", gap: "3px", width: "100%",
    height: "100%", boxSizing: "border-box" } }, status, area);
  root.dataset.testid = "ideogram4-report";
  const widget = node.addDOMWidget("ideogram4_report", "ideogram4_report", root, {
    serialize: false, hideOnZoom: false, canvasOnly: true, getValue: () => undefined, setValue: () => {},
  });
  widget.serialize = false;
  widget.computeLayoutSize = () => ({ minHeight: 120, maxHeight: 1e6, minWidth: 280 });
  node.__ideogram4Report = { status, area };
  const onExecuted = node.onExecuted;
  node.onExecuted = function (message) {
    onExecuted?.apply(this, arguments);
    const text = Array.isArray(message?.text) ? message.text.join("\n") : "";
    if (!text) return;
    const valid = text.startsWith("VALID");
    status.textContent = valid ? "✓ valid Ideogram 4 caption" : "✗ invalid caption (see the report)";
    status.style.color = valid ? "#5c5" : "#e66";
    status.style.opacity = "1";
    area.value = text;
  };
  node.setSize([Math.max(node.size[0], 420), Math.max(node.size[1], node.computeSize()[1])]);
}

// The classic canvas draws no label for a multiline text widget (only a placeholder while it is empty), so a node
// with two of them (Caption Builder: high_level_description, background) shows two anonymous boxes. Each of our
// textareas gets its input's name painted at its top (a CSS background, so it survives the frontend re-mounting the
// element and scrolls away with the text) and room for it above the text.
function labelTextareas(node) {
  for (const w of node.widgets ?? []) {
    const area = w.element;
    if (!(area instanceof HTMLTextAreaElement) || area.dataset.ig4i8Label) continue;
    labelField(area, String(w.label ?? w.name).replace(/_/g, " "));
  }
}

// A failed run never reaches onExecuted: show the error (every problem with its JSON path) in the report too.
api.addEventListener("execution_error", (event) => {
  const detail = event.detail || {};
  const node = app.graph?.getNodeById?.(Number(detail.node_id)) ?? app.graph?.getNodeById?.(detail.node_id);
  const report = node?.__ideogram4Report;
  if (!report) return;
  report.status.textContent = "✗ run stopped: invalid caption (see below)";
  report.status.style.color = "#e66";
  report.status.style.opacity = "1";
  report.area.value = String(detail.exception_message || "").trim();
});

// Wide enough that the one-line text widgets show their label next to a typical value (LiteGraph cuts the label
// first when the two do not fit).
const MIN_WIDTH = { Ideogram4Int8StyleDescription: 440 };

app.registerExtension({
  name: "comfyui_ideogram4_int8.captions",
  async nodeCreated(node) {
    const cls = node.comfyClass || node.type;
    if (typeof cls !== "string" || !cls.startsWith("Ideogram4Int8")) return;
    if (cls === LAYOUT_NODE && !vueNodesEnabled()) attachLayoutEditor(node, { onChange: () => app.graph?.change?.() });
    if (REPORT_NODES.has(cls)) attachReport(node);
    if (MIN_WIDTH[cls] && node.size[0] < MIN_WIDTH[cls]) node.setSize([MIN_WIDTH[cls], node.size[1]]);
    labelTextareas(node);
  },
});
