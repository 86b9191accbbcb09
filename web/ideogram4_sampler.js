// Ideogram 4 Sampler: the custom-only widgets (steps, guidance, polish_*, mu, std) are hidden while a named preset,
// which ignores them, is chosen, and shown for "custom". Logic: ./lib/sampler_widgets.mjs (node tests).
import { app } from "../../scripts/app.js";
import { SAMPLER_TYPE, applyCustomOnly } from "./lib/sampler_widgets.mjs";

// resize: only when the user switches the preset (a loaded workflow keeps its saved size)
function sync(node, resize = true) {
  const preset = node.widgets?.find((w) => w.name === "preset");
  if (!preset) return;
  if (!applyCustomOnly(node.widgets, preset.value) || !resize) {
    app.graph?.setDirtyCanvas?.(true, true);
    return;
  }
  try {
    const min = node.computeSize?.();
    if (min) node.setSize([Math.max(node.size[0], min[0]), min[1]]);
  } catch {
    /* size is cosmetic */
  }
  app.graph?.setDirtyCanvas?.(true, true);
}

function watch(node) {
  if ((node?.comfyClass ?? node?.type) !== SAMPLER_TYPE || node.__ig4i8Preset) return;
  node.__ig4i8Preset = true;
  const preset = node.widgets?.find((w) => w.name === "preset");
  if (!preset) return;
  const callback = preset.callback;
  preset.callback = function (...args) {
    const r = callback?.apply(this, args);
    sync(node);
    return r;
  };
  sync(node, false);
}

app.registerExtension({
  name: "comfyui_ideogram4_int8.SamplerPresetWidgets",
  nodeCreated(node) {
    watch(node);
  },
  loadedGraphNode(node) {
    // the saved values are set by now: follow the saved preset
    watch(node);
    sync(node, false);
  },
});
