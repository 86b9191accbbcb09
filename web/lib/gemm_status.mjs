// Pure logic of the GEMM-path panel: summaries, formatting, warning rules, node badges.
// No DOM, no ComfyUI imports: tested with `node --test tests/js/` against the shared fixture.
// Input: the JSON of GET /ideogram4_int8/status (nodes/status.schema.json, schema_version 1).

export const SCHEMA_VERSION = 1;
export const EVENT = "ideogram4_int8.status";
export const ROUTE = "/ideogram4_int8/status";
export const TIMING_ROUTE = "/ideogram4_int8/timing";

// Fastest first, as in kernels/registry.py PATHS.
export const PATHS = ["triton-int8", "triton-fp8", "cublas-int8", "dequant-bf16", "bf16"];

export const PATH_INFO = {
  "triton-int8": {
    short: "fused INT8",
    label: "fused Triton INT8",
    help: "int8 x int8 on the INT8 tensor cores, dequant and bias fused in the epilogue",
  },
  "triton-fp8": {
    short: "fused FP8",
    label: "fused Triton FP8 (protected layers)",
    help: "a layer kept out of INT8, stored float8 e4m3: e4m3 x e4m3 on the FP8 tensor cores, scales fused in the epilogue",
  },
  "cublas-int8": {
    short: "cuBLAS INT8",
    label: "cuBLAS INT8 (not fused)",
    help: "real INT8 GEMM through torch._int_mm, epilogue as a second pass; slower than the fused kernel",
  },
  "dequant-bf16": {
    short: "dequant-bf16",
    label: "dequant → bf16 (phantom INT8)",
    help: "weights dequantized and multiplied in bf16: no INT8 tensor cores run",
  },
  bf16: {
    short: "bf16",
    label: "bf16 (protected)",
    help: "kept in bf16 on purpose (protected or unquantized layer)",
  },
};

export const SEVERITIES = ["ok", "idle", "notice", "warning", "error"];

// Badge colours on the LiteGraph canvas (text is white on all of them).
export const SEVERITY_COLORS = {
  ok: { bg: "#1d6b3a", fg: "#ffffff" },
  idle: { bg: "#4a4a4a", fg: "#ffffff" },
  notice: { bg: "#8a5a00", fg: "#ffffff" },
  warning: { bg: "#b3261e", fg: "#ffffff" },
  error: { bg: "#b3261e", fg: "#ffffff" },
};

const ROLE_ORDER = { conditional: 0, unconditional: 1, other: 2 };
const BADGE_MAX = 48; // keep badges short on the title bar

// On a CPU the words come from the report (`path_labels`: what each path id runs on the models' device); short
// forms here, for badges. `deviceLabels`: those of the report read last (every report-level function below reads
// it first); null: the CUDA words above.
const CPU_SHORT = { "triton-int8": "fused INT8", "triton-fp8": "fused FP8", "cublas-int8": "CPU INT8", "dequant-bf16": "CPU float", bf16: "float" };
let deviceLabels = null;

export function useLabels(report) {
  const pl = report?.path_labels;
  deviceLabels = pl && typeof pl === "object" && pl.labels && typeof pl.labels === "object" ? pl : null;
}

const SEPARATORS = /^[\s;:,]+|[\s;:,]+$/g;

/** `text` without the reason every layer and note on this device shares (`path_labels.device_reason`: off CUDA, "the
 * fused kernel needs a CUDA GPU"), which the banner gives once: per layer, per reason group and per note it repeated
 * the same sentence several times a model. What is left keeps its own words ("" when nothing is). */
export function withoutDeviceReason(text) {
  const shared = deviceLabels?.device_reason;
  if (typeof text !== "string" || typeof shared !== "string" || !shared || !text.includes(shared)) return text;
  return text
    .split(shared)
    .map((part) => part.replace(SEPARATORS, ""))
    .filter(Boolean)
    .join("; ");
}

function onCpu() {
  return deviceLabels?.device === "cpu";
}

export function pathLabel(path) {
  return (onCpu() ? deviceLabels.labels[path] : null) ?? PATH_INFO[path]?.label ?? String(path);
}

export function pathShort(path) {
  return (onCpu() ? CPU_SHORT[path] : null) ?? PATH_INFO[path]?.short ?? String(path);
}

export function worstSeverity(list) {
  let worst = null;
  for (const s of list) {
    if (s == null) continue;
    if (worst === null || SEVERITIES.indexOf(s) > SEVERITIES.indexOf(worst)) worst = s;
  }
  return worst ?? "idle";
}

/** null when `report` looks like our schema; otherwise a sentence saying what is wrong. */
export function checkReport(report) {
  if (report === null || typeof report !== "object" || Array.isArray(report)) {
    return "the server's answer is not a JSON object";
  }
  if (report.schema_version !== SCHEMA_VERSION) {
    return `the panel reads schema ${SCHEMA_VERSION} but the server sent ${JSON.stringify(report.schema_version)}; reload the page after updating the pack`;
  }
  for (const key of ["status", "environment", "models", "timing"]) {
    if (!(key in report)) return `the server's report has no "${key}"`;
  }
  if (!Array.isArray(report.models)) return `"models" is not a list`;
  return null;
}

function countsOf(model, which = "counts") {
  const src = model?.[which] ?? {};
  const out = {};
  for (const p of PATHS) out[p] = Number(src[p] ?? 0);
  return out;
}

function total(counts) {
  return PATHS.reduce((acc, p) => acc + counts[p], 0);
}

/** The warning rule. A forward that routed around the pack's op (`bypass`) or dequant-bf16 anywhere ->
 * "warning"; cuBLAS INT8 (real INT8, not fused) or a model with no quantized linear at all -> "notice";
 * all quantized linears on the fused kernel -> "ok"; nothing recorded -> "idle". */
export function modelSeverity(model) {
  const c = countsOf(model);
  if (model?.bypass) return "warning";
  if (total(c) === 0) return "idle";
  if (onCpu()) {
    // no fused kernel without a CUDA GPU: the CPU's measured choice is a notice, the slower matmul (forced) a warning
    return c["dequant-bf16"] > 0 && deviceLabels.preferred !== "dequant-bf16" ? "warning" : "notice";
  }
  if (c["dequant-bf16"] > 0) return "warning";
  if (c["cublas-int8"] > 0) return "notice";
  if (c["triton-int8"] === 0) return "notice";
  if (fp8FloatGroups(model).length) return "notice";
  return "ok";
}

// kernels/fp8_gemm.py FLOAT_REASON: a layer stored fp8 (protected_layers = fp8) that runs float on this device
const FP8_FLOAT = "fp8 weight dequantized: ";

function fp8FloatGroups(model) {
  return reasonGroups(model).filter((g) => g.path === "bf16" && g.reason.startsWith(FP8_FLOAT));
}

const PART_TEXT = {
  "triton-int8": (n) => `${n} on fused INT8`,
  "triton-fp8": (n) => `${n} on fused FP8`,
  "cublas-int8": (n) => `${n} on cuBLAS INT8 (not fused)`,
  "dequant-bf16": (n) => `${n} dequantized to bf16 (phantom INT8)`,
  bf16: (n) => `${n} bf16-protected`,
};

const FIRST_PART_TEXT = {
  "triton-int8": (n, t) => `${n}/${t} linears on fused INT8`,
  "triton-fp8": (n, t) => `${n}/${t} linears on fused FP8`,
  "cublas-int8": (n, t) => `${n}/${t} linears on cuBLAS INT8 (not fused)`,
  "dequant-bf16": (n, t) => `${n}/${t} linears dequantized to bf16 (phantom INT8)`,
  bf16: (n, t) => `${n}/${t} linears bf16 (no INT8 layer)`,
};

export function modelName(model) {
  return model?.label ? String(model.label) : "(unlabelled)";
}

/**
 * One model at a glance, e.g. "conditional: 204/221 linears on fused INT8 · 17 bf16-protected".
 * Returns {label, role, severity, headline, parts, counts, total, notRun, warning}.
 */
export function summarizeModel(model) {
  const counts = countsOf(model);
  const all = total(counts);
  const label = modelName(model);
  const parts = [];
  for (const p of PATHS) {
    if (counts[p] === 0) continue;
    if (onCpu()) parts.push(parts.length === 0 ? `${counts[p]}/${all} linears on ${pathLabel(p)}` : `${counts[p]} on ${pathLabel(p)}`);
    else parts.push(parts.length === 0 ? FIRST_PART_TEXT[p](counts[p], all) : PART_TEXT[p](counts[p]));
  }
  // before its first pass (a load push, a run still going) nothing has run: "not run yet", not a count of layers the
  // last pass missed; layers its passes never run (the image-only pass's text projection) are idle by design
  const idle = idleLayers(model);
  const ran = Number(model?.layers_run ?? all);
  const notRun = Math.max(0, Number(model?.layers_total ?? all) - ran - idle.length);
  if (all > 0 && ran === 0) parts.push("not run yet");
  else if (notRun > 0) parts.push(`${notRun} not run yet`);
  if (ran > 0 && idle.length) parts.push(`${idle.length} idle by design`);
  const severity = modelSeverity(model);
  const headline = all === 0 ? `${label}: no linears recorded` : `${label}: ${parts.join(" · ")}`;
  return {
    label,
    role: model?.role ?? "other",
    severity,
    headline,
    parts,
    counts,
    total: all,
    notRun,
    idle,
    warning: warningText(model),
  };
}

/** [{layer, why}] of the layers the model's passes never run (the report's `idle`), by layer name. */
export function idleLayers(model) {
  const idle = model?.idle && typeof model.idle === "object" && !Array.isArray(model.idle) ? model.idle : {};
  return Object.entries(idle)
    .filter(([, why]) => typeof why === "string")
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([layer, why]) => ({ layer, why }));
}

/** The sentence under a model's headline when it is not all fused; null when there is nothing to say.
 * A bypass comes first: then the table itself cannot be trusted for the layers it names. */
export function warningText(model) {
  if (model?.bypass) return `ComfyUI routed around the pack's INT8 op: ${model.bypass}.`;
  const c = countsOf(model);
  if (onCpu() && total(c) > 0) {
    const slow = c["dequant-bf16"] > 0 && deviceLabels.preferred !== "dequant-bf16" ? "dequant-bf16" : null;
    const reasons = reasonGroups(model).filter((g) => g.path !== "bf16" && g.reason && (!slow || g.path === slow));
    const why = reasons.length ? ` Why: ${reasons.slice(0, 3).map((g) => g.reason).join("; ")}.` : "";
    if (slow) {
      return `${c[slow]} linear${c[slow] === 1 ? "" : "s"} on the ${pathLabel(slow)}, slower here than the ${pathLabel(deviceLabels.preferred)}.${why}`;
    }
    // the banner says once why there is no fused kernel here; this says which CPU matmul runs and what it rests on
    return `On the CPU the quantized linears run the CPU matmul the pack measured faster.${why}`;
  }
  const n = c["dequant-bf16"];
  if (n > 0) {
    const reasons = reasonGroups(model).filter((g) => g.path === "dequant-bf16" && g.reason);
    const why = reasons.length ? ` Why: ${reasons.slice(0, 3).map((g) => g.reason).join("; ")}.` : "";
    return (
      `${n} linear${n === 1 ? "" : "s"} fell back to dequant-bf16: the weights are INT8 but the matmul runs ` +
      `in bf16, without INT8 tensor cores.${why}`
    );
  }
  if (c["cublas-int8"] > 0) {
    const reasons = reasonGroups(model).filter((g) => g.path === "cublas-int8" && g.reason);
    const why = reasons.length ? ` Why: ${reasons.slice(0, 3).map((g) => g.reason).join("; ")}.` : "";
    return `${c["cublas-int8"]} linear${c["cublas-int8"] === 1 ? "" : "s"} on cuBLAS INT8: real INT8, but not the fused kernel.${why}`;
  }
  const fp8 = fp8FloatGroups(model);
  if (fp8.length) {
    const k = fp8.reduce((a, g) => a + g.count, 0);
    const why = fp8.slice(0, 3).map((g) => g.reason.slice(FP8_FLOAT.length)).join("; ");
    return (
      `${k} layer${k === 1 ? "" : "s"} stored fp8 run${k === 1 ? "s" : ""} dequantized to bf16 here, not on the fused ` +
      `FP8 GEMM (the loader's protected_layers = bf16 runs them as fast, exactly as stored). Why: ${why}.`
    );
  }
  if (total(c) > 0 && c["triton-int8"] === 0) {
    return "No quantized linear in this model: it runs entirely in bf16.";
  }
  return null;
}

/** The model's other notes (low-VRAM streaming, its device) as [{kind, text}], streaming first. */
export function modelNotes(model) {
  const notes = model?.notes && typeof model.notes === "object" ? model.notes : {};
  const order = ["streaming", "device"];
  return Object.entries(notes)
    .filter(([, text]) => typeof text === "string" && text)
    .sort(([a], [b]) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99) || a.localeCompare(b))
    .map(([kind, text]) => ({ kind, text: withoutDeviceReason(text) }))
    .filter((n) => n.text);
}

/** Layers grouped by (path, reason), slowest path first, biggest group first (needs the layer table). */
export function reasonGroups(model) {
  const groups = new Map();
  const add = (path, raw, count) => {
    const reason = withoutDeviceReason(raw ?? "");
    const key = `${path}\u0000${reason}`;
    const g = groups.get(key) ?? { path, reason, count: 0 };
    g.count += count;
    groups.set(key, g);
  };
  const idle = model?.idle && typeof model.idle === "object" ? model.idle : {};
  // a layer idle by design has no why-not: its path did not run (the report's `reasons` leave it out too)
  if (Array.isArray(model?.layers)) {
    for (const l of model.layers) if (!(l.layer in idle)) add(l.path, l.reason, 1);
  } else if (Array.isArray(model?.reasons)) {
    // a websocket push has no layer table; its per-reason counts say the same (reports of older packs lack them)
    for (const r of model.reasons) add(r.path, r.reason, Number(r.layers) || 0);
  }
  return [...groups.values()].sort(
    (a, b) => PATHS.indexOf(b.path) - PATHS.indexOf(a.path) || b.count - a.count || a.reason.localeCompare(b.reason),
  );
}

export function sortModels(models) {
  return [...(models ?? [])].sort(
    (a, b) =>
      (ROLE_ORDER[a.role] ?? 2) - (ROLE_ORDER[b.role] ?? 2) ||
      modelName(a).localeCompare(modelName(b), undefined, { numeric: true }),
  );
}

/** Per-model summaries plus the overall severity. */
export function summarizeReport(report) {
  useLabels(report);
  const models = sortModels(report?.models).map(summarizeModel);
  return { models, severity: models.length ? worstSeverity(models.map((m) => m.severity)) : "idle" };
}

/** The banner over the model cards: {severity, text, notes}. */
export function statusBanner(report, error = null) {
  if (error) return { severity: "error", text: String(error), notes: [] };
  const problem = checkReport(report);
  if (problem) return { severity: "error", text: `Cannot show the GEMM status: ${problem}.`, notes: [] };
  useLabels(report);
  const st = report.status ?? {};
  const notes = Array.isArray(st.notes) ? st.notes.map(String) : [];
  if (st.code === "no_models_yet") return { severity: "idle", text: String(st.message), notes };
  const models = summarizeReport(report).severity;
  const text =
    models === "warning"
      ? "Some linears fall back to dequant-bf16 (phantom INT8): see the red model below."
      : models === "notice"
        ? "INT8 runs, but not all of it on the fused kernel."
        : models === "ok"
          ? "All quantized linears ran on the fused INT8 kernel."
          : "No linears recorded yet.";
  if (st.code === "no_cuda") {
    // no GPU is worth saying, but a dequant fallback is worse: the banner takes the worse of the two
    return { severity: worstSeverity(["notice", models]), text, notes: [String(st.message), ...notes] };
  }
  return { severity: models, text, notes };
}

export function describeEnvironment(env) {
  if (!env) return "";
  const parts = [];
  if (env.cuda_available && env.gpu) {
    parts.push(env.compute_capability ? `${env.gpu} (sm ${env.compute_capability})` : String(env.gpu));
  } else {
    parts.push("no CUDA GPU");
  }
  parts.push(`torch ${env.torch}`);
  parts.push(env.triton ? `triton ${env.triton}` : "no triton");
  if (env.triton_interpreter) parts.push("TRITON_INTERPRET=1");
  const forced = env.forced_path;
  if (forced?.value) {
    parts.push(forced.valid ? `forced: ${forced.value}` : `${forced.variable}=${forced.value} (ignored)`);
  }
  return parts.join(" · ");
}

/**
 * The path that most layers of `models` took, for a node badge: {path, count, total, severity, counts} or null.
 * Counts every linear of each model on its path, as the panel's headlines do (a layer that did not run in the last
 * pass, e.g. llm_cond_proj of the image-only unconditional pass, keeps its path; the headline says "N not run").
 * Ties go to the slower path, so a badge never flatters.
 */
export function dominantPath(models) {
  const list = (models ?? []).filter(Boolean);
  if (!list.length) return null;
  const sum = Object.fromEntries(PATHS.map((p) => [p, 0]));
  for (const m of list) {
    const c = countsOf(m);
    for (const p of PATHS) sum[p] += c[p];
  }
  const all = total(sum);
  if (all === 0) return null;
  let best = PATHS[0];
  for (const p of PATHS) if (sum[p] >= sum[best]) best = p;
  const severity = worstSeverity(list.map(modelSeverity));
  return { path: best, count: sum[best], total: all, severity, counts: sum };
}

/** "12/19" for one model; "12/19 in both models" / "12/19 in all 3 models" when they agree; else "12/19 + 10/19". */
export function perModelCounts(models, path) {
  const pairs = sortModels(models).map((m) => {
    const c = countsOf(m);
    return `${c[path]}/${total(c)}`;
  });
  if (pairs.length === 1) return pairs[0];
  if (pairs.every((x) => x === pairs[0])) {
    return `${pairs[0]} in ${pairs.length === 2 ? "both" : `all ${pairs.length}`} models`;
  }
  return pairs.join(" + ");
}

/**
 * Badge for one of our nodes: {text, severity, colors, tooltip} or null (nothing ran yet).
 * `labels`: the model labels this node published (null: every model).
 * The text tells the panel's story per model: the path and how many of each model's linears take it, e.g.
 * "cuBLAS INT8 12/19 in both models" next to headlines "conditional: 12/19 linears on cuBLAS INT8 ...". A model
 * with phantom-INT8 layers turns it into their count: "⚠ dequant-bf16 4/221 in both models".
 */
export function badgeFor(report, labels = null) {
  if (checkReport(report)) return null;
  useLabels(report);
  let models = report.models;
  if (Array.isArray(labels) && labels.length) {
    const wanted = new Set(labels.map(String));
    const picked = models.filter((m) => wanted.has(String(m.label)));
    if (picked.length) models = picked;
  }
  const dom = dominantPath(models);
  if (!dom) return null;
  const path = dom.severity === "warning" ? "dequant-bf16" : dom.path;
  let text = `${dom.severity === "warning" ? "⚠ " : ""}${pathShort(path)} ${perModelCounts(models, path)}`;
  if (text.length > BADGE_MAX) text = text.slice(0, BADGE_MAX - 1) + "…";
  const tooltip = sortModels(models).map((m) => summarizeModel(m).headline).join("\n") +
    `\n(badge: linears on ${pathLabel(path)} out of each model's linears)`;
  return { text, severity: dom.severity, colors: SEVERITY_COLORS[dom.severity], tooltip };
}

export function formatShape(n, k) {
  return `${n}×${k}`;
}

export function formatMs(ms) {
  if (ms == null || !Number.isFinite(Number(ms))) return "—";
  const v = Number(ms);
  if (v >= 10000) return `${(v / 1000).toFixed(1)} s`;
  if (v >= 100) return `${Math.round(v)} ms`;
  if (v >= 1) return `${v.toFixed(1)} ms`;
  return `${v.toFixed(2)} ms`;
}

export function formatShare(share) {
  if (share == null || !Number.isFinite(Number(share))) return "—";
  return `${(Number(share) * 100).toFixed(1)} %`;
}

/** Rows of the timing table, or {rows: [], message} when there is no timed run. */
export function timingRows(timing) {
  if (!timing) return { rows: [], message: "No timing information." };
  const last = timing.last_run;
  if (!last) {
    const message = timing.enabled
      ? (timing.note ?? "Timing is on; no timed run has finished yet.")
      : `GEMM timing is off. Switch it on in Settings (Ideogram 4 INT8) or start ComfyUI with ${timing.env_variable ?? "IDEOGRAM4_INT8_GEMM_TIMING"}=1.`;
    return { rows: [], message };
  }
  const rows = [];
  for (const p of PATHS) {
    const v = last.per_path?.[p];
    if (!v || !(Number(v.ms) > 0)) continue;
    rows.push({ path: p, label: pathLabel(p), ms: formatMs(v.ms), share: formatShare(v.share) });
  }
  rows.push({ path: null, label: "all GEMMs", ms: formatMs(last.gemm_ms), share: formatShare(last.gemm_share) });
  const message = timing.enabled ? null : "Timing is off now; these numbers are from the last timed run.";
  return { rows, message, wall: formatMs(last.wall_ms) };
}

const FUSED = new Set(["triton-int8", "triton-fp8"]); // the pack's fused kernels: no reason to give

export const LAYER_FILTERS = {
  all: () => true,
  "not-fused": (l) => !FUSED.has(l.path),
  "dequant-bf16": (l) => l.path === "dequant-bf16",
};

/** Rows of a model's per-layer table (null when the report was fetched without layers).
 * A row whose reason repeats the row above has `sameReasonAsAbove`, so a table of 221 rows that all
 * give one reason prints it once; the reason every layer of the device shares (banner) is left out. */
export function layerRows(model, filter = "all") {
  if (!Array.isArray(model?.layers)) return null;
  const keep = LAYER_FILTERS[filter];
  if (!keep) throw new Error(`unknown layer filter ${JSON.stringify(filter)}; use one of ${Object.keys(LAYER_FILTERS).join(", ")}`);
  let previous = null;
  return model.layers.filter(keep).map((l) => ({ ...l, reason: withoutDeviceReason(l.reason) })).map((l) => ({
    layer: String(l.layer),
    shape: formatShape(l.N, l.K),
    m: l.calls > 0 ? String(l.M_last) : "—",
    path: l.path,
    pathLabel: pathShort(l.path),
    calls: l.calls > 0 ? String(l.calls) : "not run",
    // "calls" adds up every run since load; the last run's own count is shown next to it, each labelled
    callsText: callsText(l.calls_last_run, l.calls),
    reason: l.reason ? String(l.reason) : FUSED.has(l.path) ? "" : "—",
    // true when the row above (after filtering) gives the same reason: the table prints a ditto mark
    sameReasonAsAbove: (() => {
      const same = previous !== null && !!l.reason && l.reason === previous;
      previous = l.reason || null;
      return same;
    })(),
    config: l.config ? `${l.config}${l.config_source ? ` (${l.config_source})` : ""}` : "",
    // a layer of a fused pair (the FFN's w1|w3): how the pair ran, or why it ran as two linears
    fusion: l.fusion ? String(l.fusion) : "",
    severity: l.path === "dequant-bf16" ? "warning" : l.path === "cublas-int8" ? "notice" : "ok",
  }));
}

/** "20 calls in the last run · 32 in all runs" (a report without per-run counts: "32 calls in all runs"). */
export function callsText(lastRun, all) {
  const total = Number(all ?? 0);
  if (!(total > 0)) return "not run";
  if (lastRun == null || !Number.isFinite(Number(lastRun))) return `${total} calls in all runs`;
  return `${Number(lastRun)} calls in the last run · ${total} in all runs`;
}

/** Autotune picks of a model, one row per (shape, M bucket); shapes the fused kernel never ran are left out. */
export function autotuneRows(model) {
  const rows = [];
  for (const s of model?.shapes ?? []) {
    for (const a of s.autotune ?? []) {
      rows.push({ shape: formatShape(s.N, s.K), mBucket: String(a.m_bucket), config: a.config, source: a.source });
    }
  }
  return rows;
}

/**
 * Fold a websocket event ({event, models, node_id, report}) into the panel state
 * {report, nodeModels: {nodeId: [labels]}, lastEvent}; returns a new state, never mutates.
 */
export function applyEvent(state, detail) {
  const prev = state ?? { report: null, nodeModels: {}, lastEvent: null, currentPrompt: null };
  if (!detail || typeof detail !== "object" || checkReport(detail.report)) return prev;
  const nodeModels = { ...prev.nodeModels };
  if (detail.node_id != null && Array.isArray(detail.models)) nodeModels[String(detail.node_id)] = [...detail.models];
  const currentPrompt = detail.prompt_id != null ? String(detail.prompt_id) : (prev.currentPrompt ?? null);
  return { report: detail.report, nodeModels, lastEvent: String(detail.event ?? ""), currentPrompt };
}

/**
 * The badge of one node on the canvas, tied to the run and the models it came from: {text, severity, colors,
 * tooltip, stale} or null. `node`: {id, type, widgets: {name: value}}; `currentPrompt`: the prompt the frontend saw
 * start last (null: the report's last_prompt_id, e.g. right after a page reload); `hiddenRuns`: runs (prompt ids)
 * from before the graph on the canvas was loaded — its nodes did not take part in them.
 *
 * No badge when the report has no event of this node id (a node id alone matches nodes of other workflows), when
 * that event came from a node of another type, when a loader's file widgets now name other files than it loaded,
 * when it came from a run before this graph was loaded (a freshly opened workflow showed the last run's badge), or
 * when none of its models is in the report any more. A badge from an earlier run (neither the node nor one of its
 * models ran in the current run) reads "earlier run · …" in the idle colours.
 */
export function nodeBadge(report, node, currentPrompt = null, hiddenRuns = null) {
  if (checkReport(report) || !node) return null;
  useLabels(report);
  const entry = report.nodes?.[String(node.id)];
  if (!entry) return null;
  if (hiddenRuns?.has(String(entry.prompt_id))) return null;
  if (entry.node_type && node.type && entry.node_type !== node.type) return null;
  for (const [name, value] of Object.entries(entry.source ?? {})) {
    const now = node.widgets?.[name];
    if (now !== undefined && String(now) !== String(value)) return null;
  }
  const wanted = new Set((entry.models ?? []).map(String));
  const models = report.models.filter((m) => wanted.has(String(m.label)));
  if (!models.length) return null;
  const badge = badgeFor({ ...report, models });
  if (!badge) return null;
  const current = currentPrompt ?? report.last_prompt_id ?? null;
  const fresh = current == null || entry.prompt_id === current || models.some((m) => m.last_run === current);
  if (fresh) return { ...badge, stale: false };
  return {
    text: `earlier run · ${badge.text}`.slice(0, BADGE_MAX + 14),
    severity: "idle",
    colors: SEVERITY_COLORS.idle,
    tooltip: `From an earlier run (prompt ${entry.prompt_id ?? "unknown"}), not the current one.\n${badge.tooltip}`,
    stale: true,
  };
}

/** The runs (prompt ids) a report and the frontend know of: when a graph is loaded, its nodes took part in none. */
export function knownRuns(report, currentPrompt = null) {
  const runs = new Set();
  for (const entry of Object.values(report?.nodes ?? {})) if (entry?.prompt_id != null) runs.add(String(entry.prompt_id));
  for (const m of report?.models ?? []) if (m?.last_run != null) runs.add(String(m.last_run));
  if (report?.last_prompt_id != null) runs.add(String(report.last_prompt_id));
  if (currentPrompt != null) runs.add(String(currentPrompt));
  return runs;
}

/** Our loader / sampler nodes get a badge: ids start with Ideogram4Int8 and name a loader or sampler. */
export function wantsBadge(nodeType) {
  return typeof nodeType === "string" && nodeType.startsWith("Ideogram4Int8") && /Loader|Sampler/.test(nodeType);
}
