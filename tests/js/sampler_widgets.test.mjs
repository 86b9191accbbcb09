// The sampler's custom-only widgets (web/lib/sampler_widgets.mjs), run with `node --test tests/js/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { CUSTOM_ONLY, applyCustomOnly, customOnlyVisibility } from "../../web/lib/sampler_widgets.mjs";

// the sampler's widgets in schema order (nodes/sampler_nodes.py), custom-only ones advanced as the schema says
const widgets = () =>
  ["seed", "control_after_generate", "preset", "width", "height", "batch_size", ...CUSTOM_ONLY].map((name) => ({
    name,
    value: 1,
    advanced: name === "batch_size" || CUSTOM_ONLY.includes(name),
    options: {},
  }));

test("a named preset hides the widgets it ignores; custom shows them without 'show advanced'", () => {
  assert.deepEqual(CUSTOM_ONLY, ["steps", "guidance", "polish_steps", "polish_guidance", "mu", "std"]);
  for (const preset of ["Quality 48", "Default 20", "Turbo 12"]) {
    assert.ok(Object.values(customOnlyVisibility(preset)).every(Boolean), preset);
  }
  const ws = widgets();
  const names = ws.map((w) => w.name);
  assert.equal(applyCustomOnly(ws, "Default 20"), true);
  for (const w of ws) {
    const custom = CUSTOM_ONLY.includes(w.name);
    assert.equal(!!w.hidden, custom, w.name);
    assert.equal(!!w.disabled, custom, w.name);
    assert.equal(!!w.options.hidden, custom, w.name);
  }
  assert.equal(applyCustomOnly(ws, "Turbo 12"), false, "nothing changes between named presets");
  assert.equal(applyCustomOnly(ws, "custom"), true);
  for (const w of ws.filter((x) => CUSTOM_ONLY.includes(x.name))) {
    assert.ok(!w.hidden && !w.disabled && !w.advanced && !w.options.hidden, w.name);
  }
  assert.equal(ws.find((w) => w.name === "batch_size").advanced, true, "other advanced widgets stay advanced");
  applyCustomOnly(ws, "Quality 48");
  assert.ok(ws.filter((x) => CUSTOM_ONLY.includes(x.name)).every((w) => w.hidden && w.advanced), "advanced again");
  // hidden, never removed: widgets_values keeps its order and length
  assert.deepEqual(ws.map((w) => w.name), names);
});
