// Small DOM helpers shared by the caption nodes' widgets (web/ideogram4_captions.js, web/lib/layout_editor.mjs).

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  const { style, ...rest } = props;
  Object.assign(node, rest);
  if (style) Object.assign(node.style, style);
  for (const c of children) node.append(c);
  return node;
}

export const FIELD_STYLE = {
  width: "100%", boxSizing: "border-box", background: "var(--comfy-input-bg, #222)",
  color: "var(--input-text, #ddd)", border: "1px solid var(--border-color, #444)", borderRadius: "4px",
  font: "12px monospace", padding: "3px 5px",
};
export const BUTTON_STYLE = {
  background: "var(--comfy-input-bg, #222)", color: "var(--input-text, #ddd)",
  border: "1px solid var(--border-color, #444)", borderRadius: "4px", font: "12px sans-serif",
  padding: "2px 7px", cursor: "pointer",
};

// A textarea with its input's name painted at its top (a CSS background, so it survives the frontend re-mounting
// the element and scrolls away with the text) and room for it above the text.
const LABEL_COLOR = "#8d939c";

function labelSvg(label) {
  const esc = label.replace(/&/g, "&amp;").replace(/</g, "&lt;");
  return `<svg xmlns="http://www.w3.org/2000/svg" width="600" height="14"><text x="0" y="10" ` +
    `font-family="sans-serif" font-size="10.5" fill="${LABEL_COLOR}">${esc}</text></svg>`;
}

export function labelField(area, label) {
  area.dataset.ig4i8Label = label;
  Object.assign(area.style, {
    paddingTop: "15px",
    backgroundImage: `url("data:image/svg+xml,${encodeURIComponent(labelSvg(label))}")`,
    backgroundRepeat: "no-repeat",
    backgroundPosition: "5px 2px",
    backgroundAttachment: "local",
  });
}
