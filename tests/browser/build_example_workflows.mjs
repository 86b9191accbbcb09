// Builds the example workflows in a real ComfyUI frontend and writes them (developer tool, not a CI test).
//
//   node tests/browser/build_example_workflows.mjs <base-url> <out-dir> --nodes2 <newest-url> --meta <json> [<name> ...]
//
// <json>: {"pack": {"id": <registry id>, "version": <version>}, "titles": {<name>: <file title>}}, from
// tests/browser/regenerate_workflows.py (pyproject.toml's [project] name and version; tests/workflow_checks.py's
// TEMPLATES). <name> is a workflow's key (its API twin: api/<name>_api.json); its UI file is <title>.json, since the
// Templates dialog of ComfyUI 0.33's frontend (and of the newest) titles a custom node pack's card with the file name.
//
// <base-url>: a ComfyUI on the frontend it pins (1.49.6 for 0.33), where the files are built; <newest-url>: the same
// ComfyUI started with --front-end-root on the newest frontend, where each built file is loaded under Nodes 2.0
// (Vue nodes), which draws some nodes taller than their saved size: the layout is redone with room for those
// heights until every node fits (the saved sizes stay the classic ones), so it overlaps in neither frontend.
// tests/browser/regenerate_workflows.py starts both servers (with the model stand-ins) and runs this script.
//
// The UI files are not written by hand: every node is created by the frontend itself (LiteGraph.createNode,
// app.graph.add), connected with node.connect, its widgets set by name; then the frontend serializes the graph
// (app.graphToPrompt(): `workflow` = the UI file, `output` = the API-format twin, exactly what the frontend
// queues). Each file is then loaded back (app.loadGraphData) and exported again: the script fails unless that
// round trip gives the same graph. ComfyUI must list every file a workflow names (tests/workflow_models.py
// writes small stand-ins under the real names) and have this pack installed.
//
// It also writes <title>.jpg, the card picture the Templates dialog shows: a card drawn from the spec's `card` (what
// the workflow does, what it needs, in type large enough to read at the dialog's card size; a screenshot of the
// graph shrank to unreadable lines there).
//
// Every node gets the properties the frontend writes for nodes of registry packs (with ComfyUI-Manager installed):
// `cnr_id` and `ver`, this pack's for its nodes and "comfy-core" with the ComfyUI version for native ones, so that
// "Install Missing Custom Nodes" finds the pack from a shared workflow.
//
// Each workflow is laid out in columns (see WORKFLOWS) and refused when nodes or groups overlap or when its nodes
// span more than MAX_BOUNDS: the Templates browser opens a workflow fitted to the window, and a wider graph would open
// below the zoom at which LiteGraph draws node text.
//
// Needs playwright-core importable (NODE_PATH) and Debian's chromium (CHROMIUM, default /usr/bin/chromium); it never
// downloads a browser. Prints one JSON line: {name: {nodes, links}}.
import { createRequire } from "node:module";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const args = process.argv.slice(2);
const option = (flag) => {
  const at = args.indexOf(flag);
  return at >= 0 ? args.splice(at, 2)[1] : undefined;
};
const nodes2Base = option("--nodes2");
const meta = JSON.parse(option("--meta") ?? "null");
const [base, outDir, ...only] = args;
if (!base || !outDir || !nodes2Base || !meta?.pack?.id || !meta?.pack?.version || !meta?.titles) {
  console.error(
    "usage: build_example_workflows.mjs <base-url> <out-dir> --nodes2 <newest-frontend-url> --meta <json> [<name> ...]",
  );
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
// Widths come from the column a node stands in (see `columns` below); `size` only raises a height.
const CAPTION_NODES = [
  { key: "style", type: "Ideogram4Int8StyleDescription", widgets: {
    kind: "photo", aesthetics: "warm, inviting, editorial", lighting: "soft morning sun from the left",
    medium: "photograph", photo: "50mm lens, f/2.8, eye-level", art_style: "",
    color_palette: "#F4E9D8 #2F5D50 #C8883A #7A4B2A" } },
  { key: "object", type: "Ideogram4Int8ObjectElement", widgets: {
    desc: "A wicker basket full of golden baguettes and round country loaves on a wooden bench",
    placed: true, y_min: 560, x_min: 200, y_max: 920, x_max: 800, color_palette: "#C8883A #7A4B2A" } },
  { key: "text", type: "Ideogram4Int8TextElement", widgets: {
    text: "FRESH BREAD", desc: "Hand-painted cream serif letters on a dark green wooden sign board above the door",
    placed: true, y_min: 120, x_min: 250, y_max: 330, x_max: 750, color_palette: "#F4E9D8 #2F5D50" } },
  { key: "caption", type: "Ideogram4Int8CaptionBuilder", widgets: {
    high_level_description: "A small bakery front in the morning: a hand-painted sign reading 'FRESH BREAD' above " +
      "a basket of bread on a bench.",
    background: "A cream-colored bakery wall with a large shop window and a wooden door, cobblestone sidewalk.",
    on_invalid: "error" } },
  { key: "clip", type: "CLIPLoader", models: [MODELS.te],
    widgets: { clip_name: MODELS.te.name, type: "ideogram4", device: "default" } },
  { key: "encode", type: "CLIPTextEncode", widgets: {} },
];
const CAPTION_LINKS = [
  ["object", "elements", "text", "elements"],
  ["text", "elements", "caption", "elements"],
  ["style", "style", "caption", "style"],
  ["caption", "caption", "encode", "text"],
  ["clip", "CLIP", "encode", "clip"],
];
const DECODE_NODES = [
  { key: "vae", type: "VAELoader", models: [MODELS.vae], widgets: { vae_name: MODELS.vae.name } },
  { key: "decode", type: "VAEDecode", widgets: {} },
];
const save = (prefix) => ({ key: "save", type: "SaveImage", size: [0, 290], widgets: { filename_prefix: prefix } });

const GPU = "**GPU:** NVIDIA, compute capability 8.0+ (Ampere, Ada, Hopper) for the fused INT8 GEMM (Triton, " +
  "Linux). Both INT8 branches peaked at 19.9 GiB at 1024×1024 on an H100 (measured): a 24 GB card fits. Elsewhere " +
  "a labelled fallback runs (`cublas-int8` / `dequant-bf16`); the *GEMM paths* side panel shows every layer's path.";
const FILES_TAIL = "Put each file in its folder, then press R (or refresh the page) so the lists show it.";
const CAPTION_HELP = "**Caption:** the element nodes (boxes on the 0–1000 grid, left/top = 0) feed *Caption Builder*, " +
  "which checks the caption and passes it to *CLIP Text Encode*.";
const LOADER = "**What the loader does:** it reads both CFG branches of the W8A8 file, one tensor at a time, into two " +
  "native MODELs whose INT8 linears run the fused INT8 GEMM; its `summary` output lists each layer's path. Tensors " +
  "the file does not hold (norms, embeddings) come from its `base` inputs: if it stops and names missing tensors, " +
  `pick \`${MODELS.fp8.name}\` / \`${MODELS.fp8Uncond.name}\` (\`Comfy-Org/Ideogram-4\`) as \`base\` / ` +
  "`unconditional_base`.";

const NOTES = {
  // short: it stands under the models column, so the workflow opens at a zoom its text can be read at
  ideogram4_int8_text_to_image: [
    "## Ideogram 4 · W8A8 INT8 text → image",
    "**Files** (repo → folder; the frontend offers missing ones, then press R):",
    `- \`${MODELS.w8a8.name}\` (20.4 GB, gated): \`transformerlab/ideogram-4-int8-w8a8\` → ` +
      "`models/diffusion_models`",
    `- \`${MODELS.te.name}\`: \`Comfy-Org/Qwen3-VL\` → \`models/text_encoders\``,
    `- \`${MODELS.vae.name}\`: \`Comfy-Org/flux2-dev\` → \`models/vae\``,
    "",
    "**What the loader does:** two MODELs on the fused INT8 GEMM from the W8A8 file; if it names missing tensors, " +
      `set \`base\` / \`unconditional_base\` to \`${MODELS.fp8.name}\` / \`${MODELS.fp8Uncond.name}\`.`,
    "",
    "**GPU:** NVIDIA, compute capability 8.0+, 24 GB; elsewhere a labelled fallback (*GEMM paths* panel).",
  ],
  ideogram4_int8_two_gpus: [
    "## Ideogram 4 · W8A8 INT8 on two GPUs: one branch on each card",
    "",
    "**Needs two GPUs** (NVIDIA, compute capability 8.0+ / sm_80+). Each card holds one CFG branch: " +
      "*Ideogram 4 Branch Device* puts the unconditional MODEL on the second card, and *Ideogram 4 Sampler* runs " +
      "the unconditional pass there at the same time as the conditional pass on the first card (the latent and " +
      "the CFG combine stay on the first card).",
    "",
    "**With one GPU** the node does nothing and says so (on the node and in its `placement` output): both " +
      "branches stay on that card, as in the text → image example.",
    "",
    "**Model files:** as in the text → image example (Hugging Face repo → ComfyUI folder):",
    "",
    `- \`${MODELS.w8a8.name}\` (both CFG branches): \`transformerlab/ideogram-4-int8-w8a8\` (gated) → ` +
      "`models/diffusion_models`",
    `- \`${MODELS.te.name}\`: \`Comfy-Org/Qwen3-VL\` → \`models/text_encoders\``,
    `- \`${MODELS.vae.name}\`: \`Comfy-Org/flux2-dev\` → \`models/vae\``,
    "",
    "**Speed** (two H200s, each branch's pass replayed as a CUDA graph): a step takes 0.54× the one-card step at " +
      "1024² and 0.53× at 2048²; each card's peak is 11.3 GiB at 1024² (12.6 GiB at 2048²). The first two steps " +
      "are slower (an eager pass, then the capture). One 24 GB card fits both branches (see the text → image example).",
  ],
  ideogram4_int8_fp8_patch: [
    "## Ideogram 4 · INT8 from ComfyUI's fp8 files (no new download)",
    "",
    "**Model files** — those of ComfyUI's own Ideogram 4 template (Hugging Face repo → ComfyUI folder)",
    "",
    `- \`${MODELS.fp8.name}\` (conditional branch): \`Comfy-Org/Ideogram-4\` → \`models/diffusion_models\``,
    `- \`${MODELS.fp8Uncond.name}\`: \`Comfy-Org/Ideogram-4\` → \`models/diffusion_models\``,
    `- \`${MODELS.te.name}\` (text encoder): \`Comfy-Org/Qwen3-VL\` → \`models/text_encoders\``,
    `- \`${MODELS.vae.name}\`: \`Comfy-Org/flux2-dev\` → \`models/vae\``,
    "",
    FILES_TAIL,
    "",
    "*Load Diffusion Model* loads each branch as a native MODEL; *Ideogram 4 INT8 Patch* quantizes its fp8 linears " +
      "to W8A8 when it runs (per-output-channel int8; the small top-level linears stay float), so the sampler runs " +
      "the fused INT8 GEMM. LoRAs applied before the patch carry over.",
    "",
    CAPTION_HELP,
    "",
    GPU + " The patch step itself (fp8 in, int8 out) was not measured on a 24 GB card.",
  ],
  ideogram4_int8_native_guider: [
    "## Ideogram 4 · INT8 models in ComfyUI's native sampling nodes",
    "",
    "**Model files:** `" + MODELS.w8a8.name + "` (`transformerlab/ideogram-4-int8-w8a8`, gated) → " +
      "`models/diffusion_models`; `" + MODELS.te.name + "` (`Comfy-Org/Qwen3-VL`) → `models/text_encoders`; `" +
      MODELS.vae.name + "` (`Comfy-Org/flux2-dev`) → `models/vae`. The loader works as in the text → image example.",
    "",
    "**Why it is wired this way**",
    "- *DualModelGuider*: `negative` stays **unconnected**, which runs the unconditional model image-only, as the " +
      "official pipeline does (*ConditioningZeroOut* is not the same).",
    "- *CFG Override* (cfg 3, start 0.79): guidance 3 on the last 2 of 20 steps = the official Default 20 " +
      "schedule from 768×1344 to 1024×1024. Quality 48: steps 48, std 1.5, start 0.82. Turbo 12: steps 12, " +
      "mu 0.5, start 0.70.",
    "- *width* / *height* feed both the scheduler (its resolution shift) and the latent: change them there.",
    "",
    "**GPU:** NVIDIA, compute capability 8.0+, a 24 GB card fits (see the text → image example).",
  ],
  ideogram4_int8_demo: [
    "## Ideogram 4 · INT8 demo: no download, random weights",
    "",
    "**No model files.** *Ideogram 4 INT8 Demo Model* builds the pack's embedded demo model in memory: a 4-block " +
      "model pair shaped like Ideogram 4 (128 latent channels, both CFG branches) with seeded **random weights**, " +
      "stored W8A8 like the real checkpoint and run through the same INT8 layers as the real loader's MODELs.",
    "",
    "- *Ideogram 4 INT8 Demo Text* is **not a text encoder**: each word becomes a seeded random vector (no 8B " +
      "Qwen3-VL download); the same prompt gives the same conditioning.",
    "- *Ideogram 4 Sampler* (the same node as the real workflows) runs Turbo 12 at 256×256: under a minute on a CPU.",
    "- *Ideogram 4 INT8 Demo Decode* turns the latent into pixels without a VAE and stamps **RANDOM WEIGHTS** on " +
      "the image: random weights draw colour noise, not a picture.",
    "",
    "**What to look at:** the *GEMM paths* side panel lists `conditional-demo` / `unconditional-demo` and the path " +
      "each layer ran: `triton-int8` (the fused kernel) on an NVIDIA GPU with compute capability 8.0+; on a CPU " +
      "`cublas-int8` or `dequant-bf16`, whichever CPU matmul the pack measured faster there (the reason gives the " +
      "times). For real images, open the text → image example.",
  ],
  ideogram4_captions: [
    "## Ideogram 4 · structured captions",
    "",
    "No model needed: the caption nodes build and check Ideogram 4's JSON captions. Run the graph (the previews " +
      "show each caption and its report).",
    "",
    "- *Layout Boxes*: drag on its canvas to draw a box, drag a box to move it, its edges to resize; click a box to " +
      "set its type (obj / text), text, desc and colors. The first box is the furthest back. *Object Element* " +
      "adds an element typed in by widgets (bbox on the 0–1000 grid).",
    "- *Caption Builder* joins style, elements, a one-line summary and the background, and reports every problem " +
      "with the node and widget to fix.",
    "- *Caption Validate / Repair* checks a caption written by hand or by an LLM and repairs what is unambiguous " +
      "(here: code fences, a trailing comma, `aspect_ratio`, key case).",
    "",
    "Connect `caption` to *CLIP Text Encode* (CLIPLoader type `ideogram4`) to render it.",
  ],
};

// The notes are written with `code` for file, folder, repo and output names; the shipped note shows them in bold
// instead: Nodes 2.0 draws inline code dark blue on the note's brown (hard to read), the classic canvas light on dark.
const boldCode = (text) => text.replace(/`([^`\n]+)`/g, "**$1**");

// height "fill": down to the bottom of the lowest other node
const note = (name, height = "fill") => ({ key: "note", type: "MarkdownNote", size: [0, height], title: "Read me",
                                           widgets: { text: boldCode(NOTES[name].join("\n")) } });

// Layout: `columns` left to right, each [width, [keys top to bottom]]; "|" in a column starts a new group (room for
// its title). Every node takes its column's width. A workflow must open readable: the frontend fits a template's
// nodes into 75 % of the window, and LiteGraph stops drawing node text below about 60 % zoom, so the node bounds
// stay within MAX_BOUNDS (= 1600 x 965 px canvas at 60 %); the builder refuses a layout that does not, or that
// overlaps.
const MAX_BOUNDS = [2000, 1205];
const LOADER_WIDGETS = {
  weights: MODELS.w8a8.name, unconditional_weights: SAME_FILE, base: "none", unconditional_base: "none",
  hf_repo_id: "", hf_filename: MODELS.w8a8.name, compute_dtype: "auto", gemm_path: "auto" };
const SAMPLER_WIDGETS = { seed: SEED, control_after_generate: "randomize", preset: "Default 20", width: 1024,
                          height: 1024 };

const WORKFLOWS = {
  ideogram4_int8_text_to_image: {
    nodes: [
      note("ideogram4_int8_text_to_image", 270), ...CAPTION_NODES,
      { key: "loader", type: "Ideogram4Int8Loader", models: [MODELS.w8a8], widgets: LOADER_WIDGETS },
      { key: "sampler", type: "Ideogram4Int8Sampler", widgets: SAMPLER_WIDGETS },
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
    // four columns, the note under the models: a note column of its own (and the three element nodes in one
    // column, tall under Nodes 2.0) made this open at 61 % zoom, its note unreadable
    columns: [[380, ["style", "object"]], [390, ["text", "caption"]], [390, ["clip", "encode", "loader", "note"]],
              [300, ["sampler", "vae", "decode", "save"]]],
    groups: [["Caption", ["style", "object", "text", "caption"]],
             ["Text encoder + INT8 models", ["clip", "encode", "loader"]],
             ["Official sampler + decode", ["sampler", "vae", "decode", "save"]]],
    card: { title: "Text to image", badge: ["W8A8 file, 20.4 GB (gated)", "need"],
            lines: ["NVIDIA GPU sm_80+, a 24 GB card fits", "the fused INT8 GEMM, official sampler"],
            flow: ["Caption nodes", "INT8 Loader", "Ideogram 4 Sampler", "VAE Decode"] },
  },
  ideogram4_int8_two_gpus: {
    nodes: [
      note("ideogram4_int8_two_gpus"), ...CAPTION_NODES,
      { key: "loader", type: "Ideogram4Int8Loader", models: [MODELS.w8a8], widgets: LOADER_WIDGETS },
      { key: "branch", type: "Ideogram4Int8BranchDevice", widgets: { device: "second GPU" } },
      { key: "sampler", type: "Ideogram4Int8Sampler", widgets: SAMPLER_WIDGETS },
      ...DECODE_NODES, save("ideogram4_int8/two_gpus"),
    ],
    links: [
      ...CAPTION_LINKS,
      ["loader", "conditional", "sampler", "model"],
      ["loader", "unconditional", "branch", "model_negative"],
      ["branch", "model_negative", "sampler", "model_negative"],
      ["encode", "CONDITIONING", "sampler", "positive"],
      ["sampler", "LATENT", "decode", "samples"],
      ["vae", "VAE", "decode", "vae"],
      ["decode", "IMAGE", "save", "images"],
    ],
    columns: [[280, ["note"]], [420, ["style", "object", "text"]], [390, ["caption", "clip", "encode"]],
              [390, ["loader", "branch", "sampler"]], [320, ["vae", "decode", "save"]]],
    groups: [["Caption", ["style", "object", "text", "caption", "clip", "encode"]],
             ["Two GPUs: one branch on each", ["loader", "branch", "sampler"]],
             ["Decode", ["vae", "decode", "save"]]],
    card: { title: "Two GPUs", badge: ["two NVIDIA GPUs (sm_80+)", "need"],
            lines: ["one CFG branch on each card", "both passes at the same time"],
            flow: ["INT8 Loader", "Branch Device", "Ideogram 4 Sampler"] },
  },
  ideogram4_int8_fp8_patch: {
    nodes: [
      note("ideogram4_int8_fp8_patch"), ...CAPTION_NODES,
      { key: "unet", type: "UNETLoader", models: [MODELS.fp8],
        widgets: { unet_name: MODELS.fp8.name, weight_dtype: "default" } },
      { key: "unetUncond", type: "UNETLoader", models: [MODELS.fp8Uncond],
        widgets: { unet_name: MODELS.fp8Uncond.name, weight_dtype: "default" } },
      { key: "patch", type: "Ideogram4Int8Patch", widgets: { label: "conditional", gemm_path: "auto" } },
      { key: "patchUncond", type: "Ideogram4Int8Patch", widgets: { label: "unconditional", gemm_path: "auto" } },
      { key: "sampler", type: "Ideogram4Int8Sampler", widgets: SAMPLER_WIDGETS },
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
    columns: [[270, ["note"]], [420, ["style", "object", "text"]], [390, ["caption", "clip", "encode"]],
              [430, ["unet", "unetUncond", "patch", "patchUncond", "sampler"]], [320, ["vae", "decode", "save"]]],
    groups: [["Caption", ["style", "object", "text", "caption", "clip", "encode"]],
             ["Native fp8 models → INT8", ["unet", "unetUncond", "patch", "patchUncond", "sampler"]],
             ["Decode", ["vae", "decode", "save"]]],
    card: { title: "From ComfyUI's fp8 files", badge: ["ComfyUI's fp8 files", "need"],
            lines: ["quantized to W8A8 when it runs", "NVIDIA GPU sm_80+"],
            flow: ["Load Diffusion Model", "INT8 Patch", "Ideogram 4 Sampler"] },
  },
  ideogram4_int8_native_guider: {
    nodes: [
      note("ideogram4_int8_native_guider"), ...CAPTION_NODES,
      { key: "loader", type: "Ideogram4Int8Loader", models: [MODELS.w8a8], widgets: LOADER_WIDGETS },
      { key: "cfgOverride", type: "CFGOverride", widgets: { cfg: 3.0, start_percent: 0.79, end_percent: 1.0 } },
      { key: "guider", type: "DualModelGuider", widgets: { cfg: 7.0 } },
      { key: "width", type: "PrimitiveInt", title: "width", widgets: { value: 1024 } },
      { key: "height", type: "PrimitiveInt", title: "height", widgets: { value: 1024 } },
      { key: "scheduler", type: "Ideogram4Scheduler", widgets: { steps: 20, mu: 0.0, std: 1.75 } },
      { key: "latent", type: "EmptyFlux2LatentImage", widgets: { batch_size: 1 } },
      { key: "noise", type: "RandomNoise", widgets: { noise_seed: SEED, control_after_generate: "randomize" } },
      { key: "samplerSelect", type: "KSamplerSelect", widgets: { sampler_name: "euler" } },
      { key: "sample", type: "SamplerCustomAdvanced", widgets: {} },
      ...DECODE_NODES, save("ideogram4_int8/native_guider"),
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
    // the tall native-sampling column stays off the right edge, where the frontend's minimap sits
    columns: [[420, ["style", "object", "text"]], [390, ["caption", "clip", "encode"]],
              [390, ["loader", "cfgOverride", "guider", "note"]],
              [290, ["width", "height", "scheduler", "latent", "noise", "samplerSelect", "sample"]],
              [330, ["vae", "decode", "save"]]],
    groups: [["Caption", ["style", "object", "text", "caption", "clip", "encode"]],
             ["INT8 models → native guider", ["loader", "cfgOverride", "guider"]],
             ["Native sampling", ["width", "height", "scheduler", "latent", "noise", "samplerSelect", "sample"]],
             ["Decode", ["vae", "decode", "save"]]],
    card: { title: "Native sampling nodes", badge: ["W8A8 file, 20.4 GB (gated)", "need"],
            lines: ["DualModelGuider + CFG Override", "the same image as the sampler node"],
            flow: ["INT8 Loader", "DualModelGuider", "SamplerCustomAdvanced"] },
  },
  ideogram4_int8_demo: {
    nodes: [
      note("ideogram4_int8_demo"),
      { key: "loader", type: "Ideogram4Int8DemoLoader", widgets: { compute_dtype: "auto", gemm_path: "auto" } },
      { key: "text", type: "Ideogram4Int8DemoText", widgets: {
        text: "A small bakery front in the morning with a hand-painted sign reading FRESH BREAD" } },
      { key: "sampler", type: "Ideogram4Int8Sampler", widgets: {
        seed: SEED, control_after_generate: "fixed", preset: "Turbo 12", width: 256, height: 256 } },
      { key: "decode", type: "Ideogram4Int8DemoDecode", widgets: {} },
      save("ideogram4_int8/demo_random_weights"),
    ],
    links: [
      ["loader", "conditional", "sampler", "model"],
      ["loader", "unconditional", "sampler", "model_negative"],
      ["text", "CONDITIONING", "sampler", "positive"],
      ["sampler", "LATENT", "decode", "samples"],
      ["decode", "IMAGE", "save", "images"],
    ],
    columns: [[300, ["note"]], [390, ["loader", "text"]], [390, ["sampler"]], [320, ["decode", "save"]]],
    groups: [["Demo model (random weights) + official sampler", ["loader", "text", "sampler"]],
             ["Decode (no VAE)", ["decode", "save"]]],
    card: { title: "Demo", badge: ["No download", "ok"],
            lines: ["runs on a CPU, in under a minute", "random weights: colour noise, not a picture"],
            flow: ["Demo Model", "Ideogram 4 Sampler", "Demo Decode"] },
  },
  ideogram4_captions: {
    nodes: [
      note("ideogram4_captions", 330),
      { key: "style", type: "Ideogram4Int8StyleDescription", widgets: {
        kind: "photo", aesthetics: "moody, cinematic, urban night", lighting: "pink neon glow, wet reflections",
        medium: "photograph", photo: "35mm lens, f/2, eye-level", art_style: "",
        color_palette: "#2B1A1F #FF4FA3 #1C2A3A #F2E6D8" } },
      { key: "object", type: "Ideogram4Int8ObjectElement", widgets: {
        desc: "Black metal sign frame mounted on the brick wall above the door", placed: true, y_min: 60,
        x_min: 150, y_max: 560, x_max: 850, color_palette: "#111111" } },
      { key: "layout", type: "Ideogram4Int8LayoutBoxes", widgets: { width: 1024, height: 576, boxes: [
        { x: 256, y: 72, width: 512, height: 180, metadata: { type: "text", text: "CAFÉ\nOUVERT",
          desc: "Glowing pink neon script letters inside the sign frame", palette: ["#FF4FA3", "#FFFFFF"] } },
        { x: 600, y: 360, width: 300, height: 200, metadata: { type: "obj", text: "",
          desc: "A parked red city bicycle leaning against the wall", palette: ["#B3202A"] } },
      ] } },
      { key: "caption", type: "Ideogram4Int8CaptionBuilder", widgets: {
        high_level_description: "A neon café sign reading 'CAFÉ OUVERT' on a brick wall at night, with a red " +
          "bicycle parked below.",
        background: "A dark red brick wall with a wooden door, wet cobblestone pavement reflecting the neon light.",
        on_invalid: "error" } },
      { key: "preview", type: "PreviewAny", title: "caption + report", widgets: {} },
      { key: "validate", type: "Ideogram4Int8CaptionValidate", widgets: {
        caption: "LLM answer:\n```json\n{\"aspect_ratio\":\"16:9\",\"compositional_deconstruction\":{\"elements\":" +
          "[{\"type\":\"Text\",\"text\":\"SALE\",\"desc\":\"red letters\",\"bbox\":[100.0,100,300,900]}]," +
          "\"background\":\"white shop window\",}}\n```",
        mode: "repair", on_invalid: "error" } },
      { key: "previewRepaired", type: "PreviewAny", title: "repaired caption + report", widgets: {} },
    ],
    links: [
      ["object", "elements", "layout", "elements"],
      ["style", "style", "caption", "style"],
      ["layout", "elements", "caption", "elements"],
      ["caption", "caption", "preview", "source"],
      ["validate", "caption", "previewRepaired", "source"],
    ],
    columns: [[430, ["note", "style", "object"]], [490, ["layout"]], [420, ["caption", "validate"]],
              [260, ["preview", "previewRepaired"]]],
    groups: [],
    card: { title: "Structured captions", badge: ["No model needed", "ok"],
            lines: ["layout boxes, elements, style", "validate and repair a caption"],
            flow: ["Layout Boxes", "Caption Builder", "Validate / Repair"] },
  },
};

// -- runs inside the page -------------------------------------------------------------------------------------------
// Creates the spec's nodes (widgets set by name) and links on an empty graph; installed as window.__ig4i8Create.
function createInPage(spec) {
  const app = window.comfyAPI.app.app;
  const LG = window.LiteGraph;
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
    // what the frontend writes for a registry pack's node (ComfyUI-Manager's workflow metadata): the pack's registry
    // id and version, or comfy-core and the ComfyUI version; a frontend-only node (a note) has no python module
    const module = String(node.constructor?.nodeData?.python_module ?? "").split(".")[0];
    if (module === "custom_nodes") Object.assign(node.properties, { cnr_id: spec.pack.id, ver: spec.pack.version });
    else if (["nodes", "comfy_extras", "comfy_api_nodes"].includes(module)) {
      Object.assign(node.properties, { cnr_id: "comfy-core", ver: spec.comfyVersion });
    }
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
  return { byKey, problems };
}

// Nodes 2.0 (newest frontend, Vue nodes on): the workflow loaded as a user loads it, and the height of each node's
// element (title included), in canvas units. Nodes 2.0 draws a node as tall as its content when that is more than
// the saved size, so its nodes can be taller than the classic ones.
async function measureNodes2InPage([workflow, ids]) {
  const app = window.comfyAPI.app.app;
  await app.loadGraphData(structuredClone(workflow), true, true, null);
  await new Promise((r) => setTimeout(r, 2500));
  const heights = {};
  const problems = [];
  for (const [key, id] of Object.entries(ids)) {
    const r = document.querySelector(`[data-node-id="${id}"]`)?.getBoundingClientRect();
    if (!r?.height) problems.push(`Nodes 2.0 drew no element for ${key}`);
    else heights[key] = Math.ceil(r.height / app.canvas.ds.scale);
  }
  return { heights, problems };
}

// the classic layout (pinned frontend); `spec.nodes2` holds each node's Nodes 2.0 height (title included)
async function buildInPage(spec) {
  const app = window.comfyAPI.app.app;
  const LG = window.LiteGraph;
  const Group = LG.LGraphGroup ?? window.LGraphGroup;
  const { byKey, problems } = window.__ig4i8Create(spec);
  // layout: columns left to right, nodes stacked top to bottom; each node as wide as its column, as tall as it needs
  // (or its spec's height); "|" leaves room for the next group's title. A node takes the room of the taller of its
  // two drawings: the classic one (title + size) and the Nodes 2.0 one (spec.nodes2, measured in the newest frontend),
  // so the layout overlaps in neither; the saved size stays the classic one.
  const th = LG.NODE_TITLE_HEIGHT;
  const keyOf = new Map(Object.entries(byKey).map(([k, n]) => [n, k]));
  const tall = (node) => Math.max(node.size[1] + th, spec.nodes2[keyOf.get(node)] ?? 0);
  const COLUMN_GAP = 40;
  const NODE_GAP = 26;
  const GROUP_PAD = 14;
  const GROUP_TITLE = 40;
  const specOf = Object.fromEntries(spec.nodes.map((n) => [n.key, n]));
  const placed = new Set();
  let x = 0;
  for (const [width, keys] of spec.columns) {
    let y = th + GROUP_TITLE + GROUP_PAD;
    for (const key of keys) {
      if (key === "|") {
        y += GROUP_TITLE + 2 * GROUP_PAD;
        continue;
      }
      const node = byKey[key];
      if (!node) throw new Error(`layout names '${key}', which is not a node of this workflow`);
      const want = specOf[key].size?.[1];
      node.setSize([width, Math.max(node.computeSize()[1], typeof want === "number" ? want : 0)]);
      node.pos = [x, y];
      y += tall(node) + NODE_GAP;
      placed.add(key);
    }
    x += width + COLUMN_GAP;
  }
  const fill = spec.nodes.filter((n) => n.size?.[1] === "fill").map((n) => byKey[n.key]);
  const lowest = Math.max(...app.graph.nodes.filter((n) => !fill.includes(n)).map((n) => n.pos[1] - th + tall(n)));
  for (const node of fill) node.setSize([node.size[0], Math.max(node.computeSize()[1], lowest - node.pos[1])]);
  const unplaced = Object.keys(byKey).filter((k) => !placed.has(k));
  if (unplaced.length) problems.push(`not in the layout: ${unplaced.join(", ")}`);
  const rectOf = (node) => [node.pos[0], node.pos[1] - th, node.size[0], tall(node)];
  const overlap = (a, b) => a[0] < b[0] + b[2] && b[0] < a[0] + a[2] && a[1] < b[1] + b[3] && b[1] < a[1] + a[3];
  const groupRects = [];
  for (const [title, keys] of spec.groups ?? []) {
    const rects = keys.map((k) => rectOf(byKey[k]));
    const x0 = Math.min(...rects.map((r) => r[0])) - GROUP_PAD;
    const y0 = Math.min(...rects.map((r) => r[1])) - GROUP_PAD - GROUP_TITLE;
    const x1 = Math.max(...rects.map((r) => r[0] + r[2])) + GROUP_PAD;
    const y1 = Math.max(...rects.map((r) => r[1] + r[3])) + GROUP_PAD;
    const g = new Group(title);
    app.graph.add(g);
    g.pos = [x0, y0];
    g.size = [x1 - x0, y1 - y0];
    groupRects.push([title, [x0, y0, x1 - x0, y1 - y0], new Set(keys)]);
  }
  // nothing overlaps: no two nodes, no two groups, no node inside a group it is not part of
  const keys = Object.keys(byKey);
  for (const [i, a] of keys.entries()) {
    for (const b of keys.slice(i + 1)) {
      if (overlap(rectOf(byKey[a]), rectOf(byKey[b]))) problems.push(`nodes ${a} and ${b} overlap`);
    }
    for (const [title, rect, members] of groupRects) {
      if (!members.has(a) && overlap(rectOf(byKey[a]), rect)) problems.push(`node ${a} overlaps group ${title}`);
    }
  }
  for (const [i, [ta, ra]] of groupRects.entries()) {
    for (const [tb, rb] of groupRects.slice(i + 1)) if (overlap(ra, rb)) problems.push(`groups ${ta} and ${tb} overlap`);
  }
  // what the Templates browser shows first: the frontend fits the nodes' bounds into 75 % of the window
  const all = app.graph.nodes;
  const bx0 = Math.min(...all.map((n) => n.pos[0]));
  const by0 = Math.min(...all.map((n) => n.pos[1] - th));
  const bounds = [Math.max(...all.map((n) => n.pos[0] + n.size[0])) - bx0,
                  Math.max(...all.map((n) => n.pos[1] + n.size[1])) - by0];
  if (bounds[0] > spec.maxBounds[0] || bounds[1] > spec.maxBounds[1]) {
    problems.push(`the nodes span ${bounds.map(Math.round).join(" x ")}, more than ${spec.maxBounds.join(" x ")}: ` +
                  "the workflow would open below a readable zoom");
  }
  // the view saved in the file (used when it is opened as a file rather than as a template): the same fit
  const fit = Math.min((0.75 * 1600) / bounds[0], (0.75 * 965) / bounds[1], 1);
  app.canvas.ds.scale = fit;
  app.canvas.ds.offset = [Math.round(800 / fit - bx0 - bounds[0] / 2), Math.round(482 / fit - by0 - bounds[1] / 2)];
  app.graph.setDirtyCanvas(true, true);
  const ids = Object.fromEntries(Object.entries(byKey).map(([k, n]) => [k, n.id]));
  const room = Object.fromEntries(Object.entries(byKey).map(([k, n]) => [k, Math.floor(tall(n))]));
  return { problems, ids, room, bounds: bounds.map(Math.round), fit: Math.round(fit * 1000) / 1000 };
}

async function exportInPage() {
  const app = window.comfyAPI.app.app;
  const { workflow, output } = await app.graphToPrompt();
  return { workflow: JSON.parse(JSON.stringify(workflow)), output: JSON.parse(JSON.stringify(output)) };
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

// the path of the first value that differs between two JSON values ("nodes.3.size.0: 420 -> 440")
function firstDifference(a, b, path = "") {
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) {
    return a === b ? null : `${path || "(root)"}: ${JSON.stringify(a)} -> ${JSON.stringify(b)}`;
  }
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    const d = firstDifference(a[k], b[k], path ? `${path}.${k}` : k);
    if (d) return d;
  }
  return null;
}

const DIALOGS = '[data-testid="dialog-overlay"], [role=dialog]';

// close open dialogs (the first-load Templates browser) with Escape only; the number still open
async function closeDialogs(page) {
  for (let i = 0; i < 3 && (await page.locator(DIALOGS).count()); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(500);
  }
  return page.locator(DIALOGS).count();
}

// a frontend loaded, its first-load dialogs (1.58's Templates browser) closed, the node-building helper installed
async function openFrontend(page, url) {
  await page.goto(url, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.LiteGraph, null, { timeout: 120000 });
  await page.waitForFunction(() => window.comfyAPI.app.app.graph.nodes?.length >= 0, null, { timeout: 60000 });
  await page.waitForTimeout(3000);
  await closeDialogs(page);
  await page.evaluate(`window.__ig4i8Create = ${createInPage.toString()}`);
  return page;
}

// -- the card picture -----------------------------------------------------------------------------------------------
// The Templates dialog shows it square, about 220 px wide, under its own "Node graph" tag at the top left (the top
// 64 px stay empty for it) and above the card's title (the file name, which names the pack): the type here is large
// enough to read there (the title at 46 px of 512 reads as 20 px). Drawn by chromium from the spec's `card`: a title,
// a badge (what the workflow needs: "ok" green for nothing to download, "need" amber for a download or a GPU), two
// lines, the graph's main nodes in order.
const esc = (text) => String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

function cardHtml(card) {
  const badge = card.badge[1] === "ok" ? ["#1d6b3a", "#e8fff0"] : ["#8a5a00", "#fff4e0"];
  const flow = card.flow.map((n) => `<span class="node">${esc(n)}</span>`).join('<span class="arrow">→</span>');
  return `<!doctype html><html><head><meta charset="utf-8"><style>
  html,body{margin:0;width:512px;height:512px;overflow:hidden}
  body{font-family:"DejaVu Sans",Arial,sans-serif;color:#f2f4f8;background:linear-gradient(160deg,#243247,#111722 70%);
       box-sizing:border-box;padding:72px 34px 30px;display:flex;flex-direction:column}
  h1{font-size:46px;line-height:1.08;margin:0 0 20px;font-weight:700}
  .badge{align-self:flex-start;font-size:26px;font-weight:700;padding:8px 18px;border-radius:10px;
         background:${badge[0]};color:${badge[1]}}
  ul{margin:22px 0 0;padding:0;list-style:none;font-size:25px;line-height:1.35;color:#d5dceb}
  li::before{content:"· ";color:#9fb4d4}
  .flow{margin-top:auto;display:flex;flex-wrap:wrap;align-items:center;gap:8px 6px;font-size:19px}
  .node{background:#35465f;border:1px solid #5c7396;border-radius:7px;padding:5px 10px;white-space:nowrap}
  .arrow{color:#9fb4d4;font-size:22px}
  </style></head><body><h1>${esc(card.title)}</h1>
  <div class="badge">${esc(card.badge[0])}</div><ul>${card.lines.map((l) => `<li>${esc(l)}</li>`).join("")}</ul>
  <div class="flow">${flow}</div></body></html>`;
}

async function cardPicture(context, title, card) {
  const page = await context.newPage();
  try {
    await page.setViewportSize({ width: 512, height: 512 });
    await page.setContent(cardHtml(card));
    const overflow = await page.evaluate(() => document.body.scrollHeight > 512 || document.body.scrollWidth > 512);
    if (overflow) throw new Error(`${title}: the card's text does not fit 512 x 512; shorten it`);
    await page.screenshot({ path: join(outDir, `${title}.jpg`), type: "jpeg", quality: 85 });
  } finally {
    await page.close();
  }
}

const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "ig4i8-wf-")), {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1800, height: 1100 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const summary = {};
try {
  const page = await openFrontend(browser.pages()[0] ?? (await browser.newPage()), base);
  const nodes2Page = await openFrontend(await browser.newPage(), nodes2Base);
  await nodes2Page.evaluate(async () => {
    await window.comfyAPI.app.app.extensionManager.setting.set("Comfy.VueNodes.Enabled", true);
  });
  await nodes2Page.waitForTimeout(1000);
  mkdirSync(join(outDir, "api"), { recursive: true });
  const comfyVersion = await page.evaluate(async () => (await (await fetch("/api/system_stats")).json()).system.comfyui_version);
  const unknown = [...only, ...Object.keys(meta.titles)].filter((name) => !(name in WORKFLOWS));
  if (unknown.length) throw new Error(`no workflow named ${unknown.join(", ")} (have ${Object.keys(WORKFLOWS).join(", ")})`);
  for (const [name, workflowSpec] of Object.entries(WORKFLOWS)) {
    if (only.length && !only.includes(name)) continue;
    const title = meta.titles[name];
    if (!title) throw new Error(`${name}: no title in --meta`);
    const spec = { ...workflowSpec, pack: meta.pack, comfyVersion };
    // classic layout, then Nodes 2.0 heights of that file; again with room for them until every node fits its room
    let heights = {};
    let built;
    let first;
    for (let pass = 1; ; pass++) {
      built = await page.evaluate(buildInPage, { ...spec, maxBounds: MAX_BOUNDS, nodes2: heights });
      if (built.problems.length) throw new Error(`${name}: ${built.problems.join("; ")}`);
      first = await page.evaluate(exportInPage);
      const nodes2 = await nodes2Page.evaluate(measureNodes2InPage, [first.workflow, built.ids]);
      if (nodes2.problems.length) throw new Error(`${name} (Nodes 2.0): ${nodes2.problems.join("; ")}`);
      const tooTall = Object.keys(built.room).filter((k) => nodes2.heights[k] > built.room[k]);
      if (!tooTall.length) break;
      if (pass === 4) throw new Error(`${name}: under Nodes 2.0 still taller than their room: ${tooTall.join(", ")}`);
      for (const k of tooTall) heights[k] = Math.max(heights[k] ?? 0, nodes2.heights[k]);
    }
    const again = await page.evaluate(reloadInPage, first.workflow);
    if (stable(first.workflow) !== stable(again.workflow)) {
      const diff = firstDifference(JSON.parse(stable(first.workflow)), JSON.parse(stable(again.workflow)));
      throw new Error(`${name}: UI file changes on reload, first at ${diff}`);
    }
    if (JSON.stringify(first.output) !== JSON.stringify(again.output)) {
      throw new Error(`${name}: API export changes on reload`);
    }
    const workflow = first.workflow;
    workflow.id = "00000000-0000-0000-0000-000000000000"; // no random id in a shipped file
    writeFileSync(join(outDir, `${title}.json`), JSON.stringify(workflow, null, 1) + "\n");
    writeFileSync(join(outDir, "api", `${name}_api.json`), JSON.stringify(first.output, null, 1) + "\n");
    await cardPicture(browser, title, spec.card);
    summary[name] = { nodes: workflow.nodes.length, links: workflow.links.length, ids: built.ids,
                      bounds: built.bounds, fit: built.fit, nodes2: heights };
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(summary));
