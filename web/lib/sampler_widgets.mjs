// Which of the Ideogram 4 Sampler's widgets a preset uses (nodes/sampler_nodes.py): a named preset (Quality 48,
// Default 20, Turbo 12) fixes steps, guidance, polish steps, polish guidance, mu and std; only "custom" reads them.
export const SAMPLER_TYPE = "Ideogram4Int8Sampler";
export const CUSTOM_PRESET = "custom";
export const CUSTOM_ONLY = ["steps", "guidance", "polish_steps", "polish_guidance", "mu", "std"];

/** {name: hidden} for the custom-only widgets under `preset`: hidden unless the preset is "custom". */
export function customOnlyVisibility(preset) {
  const hide = preset !== CUSTOM_PRESET;
  return Object.fromEntries(CUSTOM_ONLY.map((name) => [name, hide]));
}

/**
 * Apply the visibility to a node's widgets in place (a widget is hidden, never removed, so `widgets_values` keeps
 * its order in saved workflows). Under "custom" the widgets are also shown without "show advanced" (they are
 * advanced inputs). Returns true when a widget changed.
 */
export function applyCustomOnly(widgets, preset) {
  const hidden = customOnlyVisibility(preset);
  let changed = false;
  for (const w of widgets ?? []) {
    if (!(w.name in hidden)) continue;
    const hide = hidden[w.name];
    if (w.__ig4i8Advanced === undefined) w.__ig4i8Advanced = !!w.advanced;
    const advanced = hide ? w.__ig4i8Advanced : false;
    if (!!w.hidden !== hide || !!w.advanced !== advanced || !!w.disabled !== hide) changed = true;
    w.hidden = hide;
    w.disabled = hide;
    w.advanced = advanced;
    w.options = { ...(w.options ?? {}), hidden: hide, advanced };
  }
  return changed;
}
