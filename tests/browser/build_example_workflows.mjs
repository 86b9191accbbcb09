// Builds the example workflows in a real ComfyUI frontend and writes them (developer tool, not a CI test).
//
//   node tests/browser/build_example_workflows.mjs <base-url> <out-dir> [<name> ...]
//
// The UI files are not written by hand: every node is created by the frontend itself (LiteGraph.createNode,
// app.graph.add), connected with node.connect, its widgets set by name; then the frontend serializes the graph
// (app.graphToPrompt(): `workflow` = the UI file, `output` = the API-format twin, exactly what the frontend
// queues). Each file is then loaded back (app.loadGraphData) and exported again: the script fails unless that
// round trip gives the same graph. ComfyUI must list every file a workflow names (tests/workflow_models.py
// writes small stand-ins under the real names) and have this pack installed.
//
// It also writes <name>.jpg, the card picture the Templates dialog shows: the frontend's own rendering of the
// workflow's main group.
//
// Needs playwright-core importable (NODE_PATH) and Debian's chromium (CHROMIUM, default /usr/bin/chromium); it never
// downloads a browser. Prints one JSON line: {name: {nodes, links}}.
import { createRequire } from "node:module";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const [base, outDir, ...only] = process.argv.slice(2);
if (!base || !outDir) {
  console.error("usage: build_example_workflows.mjs <base-url> <out-dir> [<name> ...]");
  process.exit(2);
}

// -- what users download (facts: Comfy-Org's Ideogram 4 blueprint in ComfyUI 0.33 names the native files and URLs;
// the W8A8 file is transformerlab's gated repo) --------------------------------------------------------------------
const HF = "https://huggingface.co";
const MODELS = {
  w8a8: { name: "ideogram4-int8-w8a8.safetensors", directory: "diffusion_models",
          url: `${HF}/transformerlab/ideogram-4-int8-w8a8/resolve/main/ideogram4-int8-w8a8.safetensors` },
  fp8: { name: "ideogram4_fp8_scaled.safetensors", directory: "diffusion_models",
         url: `${HF}/Comfy-Org/Ideogram-4/resolve/main/diffusion_models/ideogram4_fp8_scaled.safetensors` },
  fp8Uncond: { name: "ideogram4_unconditional_fp8_scaled.safetensors", directory: "diffusion_models",
               url: `${HF}/Comfy-Org/Ideogram-4/resolve/main/diffusion_models/ideogram4_unconditional_fp8_scaled.safetensors` },
  te: { name: "qwen3vl_8b_fp8_scaled.safetensors", directory: "text_encoders",
        url: `${HF}/Comfy-Org/Qwen3-VL/resolve/main/text_encoders/qwen3vl_8b_fp8_scaled.safetensors` },
  vae: { name: "flux2-vae.safetensors", directory: "vae",
         url: `${HF}/Comfy-Org/flux2-dev/resolve/main/split_files/vae/flux2-vae.safetensors` },
};

const SEED = 20260401;
const SAME_FILE = "(second branch of the weights file)";

// -- the caption every workflow shares ------------------------------------------------------------------------------
const CAPTION_NODES = [
  { key: "style", type: "Ideogram4Int8StyleDescription", col: 1, size: [400, 0], widgets: {
    kind: "photo", aesthetics: "warm, inviting, editorial, uncluttered",
    lighting: "soft early-morning sunlight from the left, gentle shadows", medium: "photograph",
    photo: "50mm lens, f/2.8, eye-level", art_style: "", color_palette: "#F4E9D8 #2F5D50 #C8883A #7A4B2A" } },
  { key: "object", type: "Ideogram4Int8ObjectElement", col: 1, widgets: {
    desc: "A wicker basket full of golden baguettes and round country loaves on a wooden bench",
    placed: true, y_min: 560, x_min: 200, y_max: 920, x_max: 800, color_palette: "#C8883A #7A4B2A" } },
  { key: "text", type: "Ideogram4Int8TextElement", col: 1, widgets: {
    text: "FRESH BREAD", desc: "Hand-painted cream serif letters on a dark green wooden sign board above the door",
    placed: true, y_min: 120, x_min: 250, y_max: 330, x_max: 750, color_palette: "#F4E9D8 #2F5D50" } },
  { key: "caption", type: "Ideogram4Int8CaptionBuilder", col: 2, widgets: {
    high_level_description: "A small bakery front in the morning: a hand-painted sign reading 'FRESH BREAD' above " +
      "a basket of bread on a bench.",
    background: "A cream-colored bakery wall with a large shop window and a wooden door, cobblestone sidewalk.",
    on_invalid: "error" } },
  { key: "clip", type: "CLIPLoader", col: 2, models: [MODELS.te],
    widgets: { clip_name: MODELS.te.name, type: "ideogram4", device: "default" } },
  { key: "encode", type: "CLIPTextEncode", col: 2, widgets: {} },
];
const CAPTION_LINKS = [
  ["object", "elements", "text", "elements"],
  ["text", "elements", "caption", "elements"],
  ["style", "style", "caption", "style"],
  ["caption", "caption", "encode", "text"],
  ["clip", "CLIP", "encode", "clip"],
];
const DECODE_NODES = [
  { key: "vae", type: "VAELoader", col: 4, size: [320, 0], models: [MODELS.vae], widgets: { vae_name: MODELS.vae.name } },
  { key: "decode", type: "VAEDecode", col: 4, widgets: {} },
];
const save = (prefix) => ({ key: "save", type: "SaveImage", col: 5, size: [420, 460],
                            widgets: { filename_prefix: prefix } });

const GPU = "**GPU:** NVIDIA with compute capability 8.0 or newer (Ampere, Ada, Hopper) for the fused INT8 GEMM " +
  "(Triton, Linux). Both INT8 branches together peaked at 19.9 GiB at 1024×1024 on an H100 (measured), so a 24 GB " +
  "card fits. Elsewhere the pack runs a labelled fallback (`cublas-int8` / `dequant-bf16`): the *GEMM paths* side " +
  "panel shows which path every layer ran.";
const FILES_TAIL = "Put each file in the folder named, then refresh the page (or press R) so the lists pick it up.";
const CAPTION_HELP = "The caption is built from the element nodes on the left (boxes on the 0–1000 grid, " +
  "[y_min, x_min, y_max, x_max]); *Caption Builder* checks it and feeds *CLIP Text Encode*.";

const NOTES = {
  ideogram4_int8_text_to_image: [
    "## Ideogram 4 · W8A8 INT8 text → image (1024×1024)",
    "",
    "**Model files** (Hugging Face repo → ComfyUI folder)",
    "",
    `- \`${MODELS.w8a8.name}\` (~20.4 GB, both CFG branches): \`transformerlab/ideogram-4-int8-w8a8\` ` +
      "(gated: accept its terms and log in) → `models/diffusion_models`",
    `- \`${MODELS.te.name}\` (text encoder): \`Comfy-Org/Qwen3-VL\` → \`models/text_encoders\``,
    `- \`${MODELS.vae.name}\`: \`Comfy-Org/flux2-dev\` → \`models/vae\``,
    "",
    FILES_TAIL,
    "",
    "Whether the W8A8 file holds the norms and embeddings is not known. If the loader reports missing tensors, " +
      `download \`${MODELS.fp8.name}\` and \`${MODELS.fp8Uncond.name}\` (\`Comfy-Org/Ideogram-4\`, ` +
      "`models/diffusion_models`) and pick them as the loader's `base` and `unconditional_base`.",
    "",
    GPU,
    "",
    CAPTION_HELP + " *Ideogram 4 Sampler* runs the official Default 20 preset (guidance 7, last 2 steps 3) " +
      "with the image-only unconditional branch.",
  ],
  ideogram4_int8_fp8_patch: [
    "## Ideogram 4 · INT8 from ComfyUI's fp8 files (no new download)",
    "",
    "**Model files** — the ones ComfyUI's own Ideogram 4 template uses (Hugging Face repo → ComfyUI folder)",
    "",
    `- \`${MODELS.fp8.name}\` (conditional branch): \`Comfy-Org/Ideogram-4\` → \`models/diffusion_models\``,
    `- \`${MODELS.fp8Uncond.name}\`: \`Comfy-Org/Ideogram-4\` → \`models/diffusion_models\``,
    `- \`${MODELS.te.name}\` (text encoder): \`Comfy-Org/Qwen3-VL\` → \`models/text_encoders\``,
    `- \`${MODELS.vae.name}\`: \`Comfy-Org/flux2-dev\` → \`models/vae\``,
    "",
    FILES_TAIL,
    "",
    "*Load Diffusion Model* loads each branch as a native MODEL; *Ideogram 4 INT8 Patch* quantizes its fp8 " +
      "linears to W8A8 when it runs (per-output-channel int8; the small top-level linears stay float), so the " +
      "sampler runs the fused INT8 GEMM. LoRAs applied before the patch carry over.",
    "",
    GPU + " The patch step itself (fp8 in, int8 out) was not measured on a 24 GB card.",
    "",
    CAPTION_HELP,
  ],
  ideogram4_int8_native_guider: [
    "## Ideogram 4 · INT8 models in ComfyUI's native sampling nodes",
    "",
    "**Model files** — the same as the W8A8 text → image example (Hugging Face repo → ComfyUI folder)",
    "",
    `- \`${MODELS.w8a8.name}\` (~20.4 GB): \`transformerlab/ideogram-4-int8-w8a8\` (gated) → ` +
      "`models/diffusion_models`",
    `- \`${MODELS.te.name}\` (text encoder): \`Comfy-Org/Qwen3-VL\` → \`models/text_encoders\``,
    `- \`${MODELS.vae.name}\`: \`Comfy-Org/flux2-dev\` → \`models/vae\``,
    "",
    FILES_TAIL + " If the loader reports missing tensors, pick the Comfy-Org fp8 files as `base` / " +
      "`unconditional_base` (see the other example).",
    "",
    "**Why it is wired this way**",
    "- *DualModelGuider*: `negative` stays **unconnected** — that runs the unconditional model image-only, " +
      "as the official pipeline does (*ConditioningZeroOut* is not the same).",
    "- *CFG Override* (cfg 3, start 0.79): guidance 3 on the last 2 of 20 steps = the official Default 20 " +
      "schedule from 768×1344 to 1024×1024. Quality 48: steps 48, std 1.5, start 0.82. Turbo 12: steps 12, " +
      "mu 0.5, start 0.70.",
    "- *width* / *height* feed both the scheduler (its resolution shift) and the latent: change them there.",
    "",
    GPU,
  ],
};

const note = (name) => ({ key: "note", type: "MarkdownNote", col: 0, size: [520, 600], title: "Read me",
                          widgets: { text: NOTES[name].join("\n") } });

const WORKFLOWS = {
  ideogram4_int8_text_to_image: {
    nodes: [
      note("ideogram4_int8_text_to_image"), ...CAPTION_NODES,
      { key: "loader", type: "Ideogram4Int8Loader", col: 3, size: [420, 0], models: [MODELS.w8a8], widgets: {
        weights: MODELS.w8a8.name, unconditional_weights: SAME_FILE, base: "none", unconditional_base: "none",
        hf_repo_id: "", hf_filename: MODELS.w8a8.name, compute_dtype: "auto", gemm_path: "auto" } },
      { key: "sampler", type: "Ideogram4Int8Sampler", col: 3, size: [340, 0], widgets: {
        seed: SEED, control_after_generate: "randomize", preset: "Default 20", width: 1024, height: 1024 } },
      ...DECODE_NODES, save("ideogram4_int8/w8a8"),
    ],
    links: [
      ...CAPTION_LINKS,
      ["loader", "conditional", "sampler", "model"],
      ["loader", "unconditional", "sampler", "model_negative"],
      ["encode", "CONDITIONING", "sampler", "positive"],
      ["sampler", "LATENT", "decode", "samples"],
      ["vae", "VAE", "decode", "vae"],
      ["decode", "IMAGE", "save", "images"],
    ],
    groups: [["Caption", ["style", "object", "text", "caption", "clip", "encode"]],
             ["INT8 models + official sampler", ["loader", "sampler"]], ["Decode", ["vae", "decode", "save"]]],
    thumbnail: "INT8 models + official sampler",
  },
  ideogram4_int8_fp8_patch: {
    nodes: [
      note("ideogram4_int8_fp8_patch"), ...CAPTION_NODES,
      { key: "unet", type: "UNETLoader", col: 3, size: [470, 0], models: [MODELS.fp8],
        widgets: { unet_name: MODELS.fp8.name, weight_dtype: "default" } },
      { key: "unetUncond", type: "UNETLoader", col: 3, size: [470, 0], models: [MODELS.fp8Uncond],
        widgets: { unet_name: MODELS.fp8Uncond.name, weight_dtype: "default" } },
      { key: "patch", type: "Ideogram4Int8Patch", col: 3, widgets: { label: "conditional", gemm_path: "auto" } },
      { key: "patchUncond", type: "Ideogram4Int8Patch", col: 3,
        widgets: { label: "unconditional", gemm_path: "auto" } },
      { key: "sampler", type: "Ideogram4Int8Sampler", col: 3, size: [340, 0], widgets: {
        seed: SEED, control_after_generate: "randomize", preset: "Default 20", width: 1024, height: 1024 } },
      ...DECODE_NODES, save("ideogram4_int8/fp8_patch"),
    ],
    links: [
      ...CAPTION_LINKS,
      ["unet", "MODEL", "patch", "model"],
      ["unetUncond", "MODEL", "patchUncond", "model"],
      ["patch", "model", "sampler", "model"],
      ["patchUncond", "model", "sampler", "model_negative"],
      ["encode", "CONDITIONING", "sampler", "positive"],
      ["sampler", "LATENT", "decode", "samples"],
      ["vae", "VAE", "decode", "vae"],
      ["decode", "IMAGE", "save", "images"],
    ],
    groups: [["Caption", ["style", "object", "text", "caption", "clip", "encode"]],
             ["Native fp8 models → INT8", ["unet", "unetUncond", "patch", "patchUncond", "sampler"]],
             ["Decode", ["vae", "decode", "save"]]],
    thumbnail: "Native fp8 models → INT8",
  },
  ideogram4_int8_native_guider: {
    nodes: [
      note("ideogram4_int8_native_guider"), ...CAPTION_NODES,
      { key: "loader", type: "Ideogram4Int8Loader", col: 3, size: [420, 0], models: [MODELS.w8a8], widgets: {
        weights: MODELS.w8a8.name, unconditional_weights: SAME_FILE, base: "none", unconditional_base: "none",
        hf_repo_id: "", hf_filename: MODELS.w8a8.name, compute_dtype: "auto", gemm_path: "auto" } },
      { key: "cfgOverride", type: "CFGOverride", col: 3,
        widgets: { cfg: 3.0, start_percent: 0.79, end_percent: 1.0 } },
      { key: "guider", type: "DualModelGuider", col: 3, widgets: { cfg: 7.0 } },
      { key: "width", type: "PrimitiveInt", col: 4, title: "width",
        widgets: { value: 1024 } },
      { key: "height", type: "PrimitiveInt", col: 4, title: "height",
        widgets: { value: 1024 } },
      { key: "scheduler", type: "Ideogram4Scheduler", col: 4, widgets: { steps: 20, mu: 0.0, std: 1.75 } },
      { key: "latent", type: "EmptyFlux2LatentImage", col: 4, widgets: { batch_size: 1 } },
      { key: "noise", type: "RandomNoise", col: 5,
        widgets: { noise_seed: SEED, control_after_generate: "randomize" } },
      { key: "samplerSelect", type: "KSamplerSelect", col: 5, widgets: { sampler_name: "euler" } },
      { key: "sample", type: "SamplerCustomAdvanced", col: 5, widgets: {} },
      { key: "vae", type: "VAELoader", col: 6, size: [320, 0], models: [MODELS.vae],
        widgets: { vae_name: MODELS.vae.name } },
      { key: "decode", type: "VAEDecode", col: 6, widgets: {} },
      { ...save("ideogram4_int8/native_guider"), col: 7 },
    ],
    links: [
      ...CAPTION_LINKS,
      ["loader", "conditional", "cfgOverride", "model"],
      ["cfgOverride", "MODEL", "guider", "model"],
      ["loader", "unconditional", "guider", "model_negative"],
      ["encode", "CONDITIONING", "guider", "positive"],
      ["width", "INT", "scheduler", "width"],
      ["height", "INT", "scheduler", "height"],
      ["width", "INT", "latent", "width"],
      ["height", "INT", "latent", "height"],
      ["noise", "NOISE", "sample", "noise"],
      ["guider", "GUIDER", "sample", "guider"],
      ["samplerSelect", "SAMPLER", "sample", "sampler"],
      ["scheduler", "SIGMAS", "sample", "sigmas"],
      ["latent", "LATENT", "sample", "latent_image"],
      ["sample", "output", "decode", "samples"],
      ["vae", "VAE", "decode", "vae"],
      ["decode", "IMAGE", "save", "images"],
    ],
    groups: [["Caption", ["style", "object", "text", "caption", "clip", "encode"]],
             ["INT8 models → native guider", ["loader", "cfgOverride", "guider"]],
             ["Native sampling", ["width", "height", "scheduler", "latent", "noise", "samplerSelect", "sample"]],
             ["Decode", ["vae", "decode", "save"]]],
    thumbnail: "INT8 models → native guider",
  },
};

// -- runs inside the page -------------------------------------------------------------------------------------------
async function buildInPage(spec) {
  const app = window.comfyAPI.app.app;
  const LG = window.LiteGraph;
  const Group = LG.LGraphGroup ?? window.LGraphGroup;
  app.graph.clear();
  const byKey = {};
  const problems = [];
  for (const n of spec.nodes) {
    const node = LG.createNode(n.type);
    if (!node) throw new Error(`the frontend does not know node type ${n.type}`);
    if (n.title) node.title = n.title;
    app.graph.add(node);
    for (const [name, value] of Object.entries(n.widgets)) {
      const w = node.widgets?.find((x) => x.name === name);
      if (!w) {
        problems.push(`${n.key} (${n.type}) has no widget '${name}'`);
        continue;
      }
      const values = w.options?.values;
      if (Array.isArray(values) && !values.includes(value)) problems.push(`${n.key}.${name}: ${value} not offered`);
      w.value = value;
      w.callback?.(value);
    }
    if (n.models) node.properties.models = n.models;
    if (n.size) node.setSize([Math.max(node.size[0], n.size[0]), Math.max(node.size[1], n.size[1])]);
    byKey[n.key] = node;
  }
  const slotIndex = (slots, name, where) => {
    const i = slots.findIndex((s) => s.name === name);
    if (i < 0) throw new Error(`${where}: no slot '${name}' (have ${slots.map((s) => s.name).join(", ")})`);
    return i;
  };
  for (const [src, out, dst, inp] of spec.links) {
    const a = byKey[src];
    const b = byKey[dst];
    const link = a.connect(slotIndex(a.outputs, out, src), b, slotIndex(b.inputs, inp, dst));
    if (!link) problems.push(`could not connect ${src}.${out} -> ${dst}.${inp}`);
  }
  // layout: columns left to right, nodes stacked top to bottom in spec order
  const cols = {};
  for (const n of spec.nodes) (cols[n.col] ??= []).push(byKey[n.key]);
  let x = 0;
  for (const col of Object.keys(cols).map(Number).sort((p, q) => p - q)) {
    let y = 60;
    let width = 0;
    for (const node of cols[col]) {
      node.pos = [x, y];
      y += node.size[1] + LG.NODE_TITLE_HEIGHT + 50;
      width = Math.max(width, node.size[0]);
    }
    x += width + 70;
  }
  const th = LG.NODE_TITLE_HEIGHT;
  for (const [title, keys] of spec.groups ?? []) {
    const nodes = keys.map((k) => byKey[k]);
    const x0 = Math.min(...nodes.map((n) => n.pos[0])) - 20;
    const y0 = Math.min(...nodes.map((n) => n.pos[1])) - th - 20 - 40;
    const x1 = Math.max(...nodes.map((n) => n.pos[0] + n.size[0])) + 20;
    const y1 = Math.max(...nodes.map((n) => n.pos[1] + n.size[1])) + 20;
    const g = new Group(title);
    app.graph.add(g);
    g.pos = [x0, y0];
    g.size = [x1 - x0, y1 - y0];
  }
  // the view a template opens with: readable (LiteGraph drops text below ~60 % zoom), from the note on the left
  const all = app.graph.nodes;
  const gx0 = Math.min(...all.map((n) => n.pos[0])) - 30;
  const gy0 = Math.min(...all.map((n) => n.pos[1])) - th - 70;
  app.canvas.ds.scale = 0.75;
  app.canvas.ds.offset = [Math.round(-gx0), Math.round(-gy0)];
  app.graph.setDirtyCanvas(true, true);
  const ids = Object.fromEntries(Object.entries(byKey).map(([k, n]) => [k, n.id]));
  return { problems, ids };
}

async function exportInPage() {
  const app = window.comfyAPI.app.app;
  const { workflow, output } = await app.graphToPrompt();
  return { workflow: JSON.parse(JSON.stringify(workflow)), output: JSON.parse(JSON.stringify(output)) };
}

function focusInPage([title, scale, x, y]) {
  const app = window.comfyAPI.app.app;
  const g = app.graph.groups.find((grp) => grp.title === title) ?? app.graph.nodes.find((n) => n.type === title);
  if (!g) throw new Error(`no group or node '${title}'`);
  app.canvas.ds.scale = scale;
  app.canvas.ds.offset = [x / scale - g.pos[0], y / scale - g.pos[1]];
  app.canvas.setDirty(true, true);
}

async function reloadInPage(workflow) {
  const app = window.comfyAPI.app.app;
  await app.loadGraphData(structuredClone(workflow), true, true, null);
  const { workflow: again, output } = await app.graphToPrompt();
  return { workflow: JSON.parse(JSON.stringify(again)), output: JSON.parse(JSON.stringify(output)) };
}

// -- driver ---------------------------------------------------------------------------------------------------------
const stable = (wf) => {
  const copy = structuredClone(wf);
  delete copy.id; // a new workflow id on every load
  if (copy.extra) delete copy.extra.ds;
  return JSON.stringify(copy);
};

// card picture: 900 x 900 px of the canvas (clear of the sidebar, the run button and the minimap)
async function thumbnail(page, name, focus) {
  await page.evaluate(focusInPage, [focus, 0.9, 330, 140]);
  await page.waitForTimeout(500);
  await page.screenshot({ path: join(outDir, `${name}.jpg`), type: "jpeg", quality: 70,
                          clip: { x: 300, y: 110, width: 900, height: 900 } });
}

// card pictures for example workflows made elsewhere (loaded from <out-dir>, not rebuilt)
const EXISTING = { ideogram4_captions: "Ideogram4Int8LayoutBoxes" };

const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "ig4i8-wf-")), {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1800, height: 1100 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const summary = {};
try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  await page.goto(base, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.LiteGraph, null, { timeout: 120000 });
  await page.waitForFunction(() => window.comfyAPI.app.app.graph.nodes?.length >= 0, null, { timeout: 60000 });
  await page.waitForTimeout(3000);
  for (let i = 0; i < 3 && (await page.locator('[data-testid="dialog-overlay"], [role=dialog]').count()); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(500);
  }
  mkdirSync(join(outDir, "api"), { recursive: true });
  for (const [name, spec] of Object.entries(WORKFLOWS)) {
    if (only.length && !only.includes(name)) continue;
    const built = await page.evaluate(buildInPage, spec);
    if (built.problems.length) throw new Error(`${name}: ${built.problems.join("; ")}`);
    const first = await page.evaluate(exportInPage);
    const again = await page.evaluate(reloadInPage, first.workflow);
    if (stable(first.workflow) !== stable(again.workflow)) throw new Error(`${name}: UI file changes on reload`);
    if (JSON.stringify(first.output) !== JSON.stringify(again.output)) {
      throw new Error(`${name}: API export changes on reload`);
    }
    const workflow = first.workflow;
    workflow.id = "00000000-0000-0000-0000-000000000000"; // no random id in a shipped file
    writeFileSync(join(outDir, `${name}.json`), JSON.stringify(workflow, null, 1) + "\n");
    writeFileSync(join(outDir, "api", `${name}_api.json`), JSON.stringify(first.output, null, 1) + "\n");
    await thumbnail(page, name, spec.thumbnail);
    summary[name] = { nodes: workflow.nodes.length, links: workflow.links.length, ids: built.ids };
  }
  for (const [name, focus] of Object.entries(EXISTING)) {
    if (only.length && !only.includes(name)) continue;
    const file = join(outDir, `${name}.json`);
    if (!existsSync(file)) continue;
    await page.evaluate(async (wf) => window.comfyAPI.app.app.loadGraphData(wf, true, true, null),
                        JSON.parse(readFileSync(file, "utf8")));
    await thumbnail(page, name, focus);
    summary[name] = { thumbnail: true };
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(summary));
