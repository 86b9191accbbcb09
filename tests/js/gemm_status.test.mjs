// Pure logic of the GEMM-path panel (web/lib/gemm_status.mjs), run with `node --test tests/js/`.
// The fixture is the same sample report the Python schema test validates.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  PATHS,
  SEVERITY_COLORS,
  applyEvent,
  autotuneRows,
  badgeFor,
  callsText,
  nodeBadge,
  perModelCounts,
  checkReport,
  describeEnvironment,
  knownRuns,
  dominantPath,
  formatMs,
  formatShare,
  layerRows,
  modelNotes,
  modelSeverity,
  reasonGroups,
  sortModels,
  statusBanner,
  summarizeModel,
  summarizeReport,
  timingRows,
  useLabels,
  wantsBadge,
  warningText,
  withoutDeviceReason,
} from "../../web/lib/gemm_status.mjs";

const FIXTURE = new URL("../fixtures/gemm_status_sample.json", import.meta.url);
const sample = () => JSON.parse(readFileSync(FIXTURE, "utf8"));
const byLabel = (report, label) => report.models.find((m) => m.label === label);

// A model built from a list of [layer, path] pairs, with counts derived the way the server does.
function makeModel(label, entries, { notRun = 0 } = {}) {
  const layers = entries.map(([layer, path, reason = ""], i) => ({
    layer, path, reason, N: 64, K: 64, M_last: i < entries.length - notRun ? 8 : 0,
    calls: i < entries.length - notRun ? 1 : 0, dtype: "float32", config: null, config_source: null,
  }));
  const counts = Object.fromEntries(PATHS.map((p) => [p, layers.filter((l) => l.path === p).length]));
  const countsRun = Object.fromEntries(PATHS.map((p) => [p, layers.filter((l) => l.path === p && l.calls).length]));
  return {
    label, role: label.startsWith("unconditional") ? "unconditional" : label.startsWith("conditional") ? "conditional" : "other",
    layers_total: layers.length, layers_run: layers.filter((l) => l.calls).length, calls: layers.length - notRun,
    counts, counts_run: countsRun, shapes: [], layers,
  };
}

function repeat(n, path, prefix = "layers") {
  return Array.from({ length: n }, (_, i) => [`${prefix}.${i}.x`, path]);
}

test("the fixture is a report the panel accepts", () => {
  assert.equal(checkReport(sample()), null);
});

test("headline reads at a glance: 204/221 on fused INT8 and 17 bf16-protected", () => {
  const m = makeModel("conditional", [...repeat(204, "triton-int8"), ...repeat(17, "bf16", "protected")]);
  const s = summarizeModel(m);
  assert.equal(s.headline, "conditional: 204/221 linears on fused INT8 · 17 bf16-protected");
  assert.equal(s.severity, "ok");
  assert.equal(s.warning, null);
});

test("headline counts come from the report, not from a constant", () => {
  for (let i = 0; i < 20; i++) {
    const fused = 1 + Math.floor(Math.random() * 300);
    const prot = Math.floor(Math.random() * 30);
    const s = summarizeModel(makeModel("conditional", [...repeat(fused, "triton-int8"), ...repeat(prot, "bf16")]));
    const tail = prot ? ` · ${prot} bf16-protected` : "";
    assert.equal(s.headline, `conditional: ${fused}/${fused + prot} linears on fused INT8${tail}`);
  }
});

test("mixed paths are listed fastest first, with what has not run", () => {
  const m = makeModel(
    "conditional",
    [...repeat(3, "dequant-bf16"), ...repeat(5, "triton-int8"), ...repeat(2, "cublas-int8"), ...repeat(1, "bf16")],
    { notRun: 1 },
  );
  const s = summarizeModel(m);
  assert.equal(
    s.headline,
    "conditional: 5/11 linears on fused INT8 · 2 on cuBLAS INT8 (not fused) · 3 dequantized to bf16 (phantom INT8) · 1 bf16-protected · 1 not run yet",
  );
  assert.equal(s.notRun, 1);
});

test("before its first pass a model has not run yet: no count of layers a pass missed", () => {
  // the load push (and the panel during the first run) had every layer at 0 calls: "31 not run in the last pass"
  const loaded = makeModel("conditional", [...repeat(23, "triton-int8"), ...repeat(8, "bf16")], { notRun: 31 });
  const s = summarizeModel(loaded);
  assert.equal(s.headline, "conditional: 23/31 linears on fused INT8 · 8 bf16-protected · not run yet");
  assert.doesNotMatch(s.headline, /last pass|31 not run/);
});

test("the image-only pass's text projection is idle by design, with the server's why, not a layer to run", () => {
  const why = "not run by design: the unconditional pass is image-only (no text tokens to project)";
  const m = makeModel("unconditional", [...repeat(3, "cublas-int8"), ["llm_cond_proj", "cublas-int8", why]], {
    notRun: 1,
  });
  m.idle = { llm_cond_proj: why };
  const s = summarizeModel(m);
  assert.equal(s.notRun, 0);
  assert.equal(s.headline, "unconditional: 4/4 linears on cuBLAS INT8 (not fused) · 1 idle by design");
  assert.deepEqual(s.idle, [{ layer: "llm_cond_proj", why }]);
  assert.ok(reasonGroups(m).every((g) => g.reason !== why), "an idle layer has no why-not-faster");
  assert.equal(layerRows(m).find((r) => r.layer === "llm_cond_proj").reason, why);
  delete m.idle; // a layer the server does not call idle is still one to run
  assert.match(summarizeModel(m).headline, /1 not run yet$/);
});

test("on a CPU the shared 'needs a CUDA GPU' reason is said once (the banner), not per layer, group and note", () => {
  const shared = "CPU tensors: the fused Triton kernel needs a CUDA GPU (sm_80+)";
  const measured = "CPU: torch._int_mm took 0.37 ms against 1.13 ms for the dequantized float32 matmul at M=280 K=256 N=768 (measured on first use), so it runs";
  const report = sample();
  report.path_labels = {
    device: "cpu",
    preferred: "cublas-int8",
    device_reason: shared,
    labels: { "cublas-int8": "CPU INT8 matmul (torch._int_mm)", "dequant-bf16": "CPU dequantized float32 matmul", bf16: "float (protected)" },
  };
  report.status = { code: "no_cuda", message: "No CUDA GPU is visible to torch: ... The fused Triton INT8 kernel needs an NVIDIA GPU (sm_80 or newer).", notes: [] };
  const model = makeModel("conditional-demo", [
    ...repeat(3, "cublas-int8").map(([l, p]) => [l, p, `${shared}; ${measured}`]),
    ["final_layer.linear", "bf16", "unquantized top-level layer"],
  ]);
  model.notes = {
    rope: `q/k RMSNorm + RoPE: the pack's op (qk_norm_rope) as its pure-torch twin: ${shared}`,
    block_norms: `block RMSNorms with their modulation and residual: ComfyUI's ops (the twin): ${shared}`,
  };
  report.models = [model];
  try {
    const banner = statusBanner(report);
    const s = summarizeReport(report).models[0];
    const card = [
      s.headline,
      s.warning,
      ...modelNotes(model).map((n) => n.text),
      ...reasonGroups(model).map((g) => g.reason),
      ...layerRows(model).map((r) => r.reason),
    ].join("\n");
    assert.doesNotMatch(card, /needs a CUDA GPU/, card);
    assert.match(s.warning, /measured faster\. Why: CPU: torch\._int_mm took 0\.37 ms/);
    assert.deepEqual(modelNotes(model).map((n) => n.text), [
      "block RMSNorms with their modulation and residual: ComfyUI's ops (the twin)",
      "q/k RMSNorm + RoPE: the pack's op (qk_norm_rope) as its pure-torch twin",
    ]);
    assert.equal([banner.text, ...banner.notes].join(" ").match(/needs an NVIDIA GPU/g).length, 1);
    assert.equal(withoutDeviceReason(shared), "");
    assert.equal(withoutDeviceReason("forced by X"), "forced by X");
  } finally {
    useLabels(null);
  }
  assert.equal(withoutDeviceReason(`${shared}; x`), `${shared}; x`); // a GPU report names no shared reason
});

test("warning rule: any dequant-bf16 layer makes the model a warning", () => {
  const ok = makeModel("conditional", repeat(10, "triton-int8"));
  assert.equal(modelSeverity(ok), "ok");
  const one = makeModel("conditional", [...repeat(10, "triton-int8"), ["layers.9.y", "dequant-bf16", "forced by x"]]);
  assert.equal(modelSeverity(one), "warning");
  assert.match(warningText(one), /^1 linear fell back to dequant-bf16/);
  assert.match(warningText(one), /Why: forced by x\./);
});

test("a forward that routed around the pack's op is a warning, said before anything else", () => {
  const m = makeModel("conditional", repeat(10, "triton-int8"));
  m.bypass = "2 of 10 quantized linears did not run through the pack's op (layers.1.feed_forward.w1, layers.1.feed_forward.w3)";
  assert.equal(modelSeverity(m), "warning");
  assert.match(warningText(m), /^ComfyUI routed around the pack's INT8 op: 2 of 10 quantized linears/);
  assert.equal(summarizeModel(m).severity, "warning");
  assert.equal(modelSeverity({ ...m, bypass: null }), "ok");
});

test("layers of a fused pair say how the pair ran", () => {
  const m = makeModel("conditional", [["layers.0.feed_forward.w1", "triton-int8"], ["layers.0.attention.o", "triton-int8"]]);
  m.layers[0].fusion = "gate/up pair: one GEMM with the SwiGLU epilogue, w1 and w3 read in place";
  const rows = layerRows(m);
  assert.match(rows[0].fusion, /one GEMM/);
  assert.equal(rows[1].fusion, "");
});

test("cuBLAS INT8 is a notice (real INT8, not fused), never ok and never a warning", () => {
  const m = makeModel("conditional", [...repeat(4, "cublas-int8"), ...repeat(1, "bf16")]);
  assert.equal(modelSeverity(m), "notice");
  assert.equal(summarizeModel(m).headline, "conditional: 4/5 linears on cuBLAS INT8 (not fused) · 1 bf16-protected");
  assert.match(warningText(m), /4 linears on cuBLAS INT8/);
});

test("a model with no quantized linear is a notice; an empty one is idle", () => {
  assert.equal(modelSeverity(makeModel("other", repeat(3, "bf16"))), "notice");
  assert.match(warningText(makeModel("other", repeat(3, "bf16"))), /entirely in bf16/);
  const empty = makeModel("conditional", []);
  assert.equal(modelSeverity(empty), "idle");
  assert.equal(summarizeModel(empty).headline, "conditional: no linears recorded");
});

test("fixture: conditional is a notice (one cuBLAS layer), unconditional a warning", () => {
  const r = sample();
  const cond = summarizeModel(byLabel(r, "conditional"));
  const unc = summarizeModel(byLabel(r, "unconditional"));
  const c = byLabel(r, "conditional").counts;
  assert.equal(cond.total, c["triton-int8"] + c["triton-fp8"] + c["cublas-int8"] + c["dequant-bf16"] + c.bf16);
  assert.ok(c["triton-fp8"] > 0 && cond.headline.includes(`${c["triton-fp8"]} on fused FP8`), cond.headline);
  assert.equal(cond.severity, "notice");
  assert.equal(unc.severity, "warning");
  assert.match(unc.headline, /^unconditional: \d+\/\d+ linears dequantized to bf16 \(phantom INT8\)/);
  assert.match(unc.headline, /1 not run yet$/);
  assert.equal(summarizeReport(r).severity, "warning");
});

test("reason groups put the slowest path first and count layers", () => {
  const groups = reasonGroups(byLabel(sample(), "unconditional"));
  assert.equal(groups[0].path, "bf16");
  const dq = groups.find((g) => g.path === "dequant-bf16");
  assert.equal(dq.count, byLabel(sample(), "unconditional").counts["dequant-bf16"]);
  assert.equal(dq.reason, "forced by IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16");
});

test("models sort conditional, unconditional, then others; numbered labels in numeric order", () => {
  const ms = ["other", "unconditional#2", "conditional#10", "unconditional", "conditional#2", "conditional"].map((l) =>
    makeModel(l, repeat(1, "triton-int8")),
  );
  assert.deepEqual(sortModels(ms).map((m) => m.label), [
    "conditional", "conditional#2", "conditional#10", "unconditional", "unconditional#2", "other",
  ]);
});

test("status banner: no models yet, no CUDA, warning and bad answers", () => {
  const r = sample();
  assert.equal(statusBanner(r).severity, "warning");
  assert.match(statusBanner(r).text, /dequant-bf16/);

  const idle = { ...r, models: [], status: { code: "no_models_yet", message: "No Ideogram 4 INT8 model has run yet.", notes: ["n1"] } };
  assert.deepEqual(statusBanner(idle), { severity: "idle", text: "No Ideogram 4 INT8 model has run yet.", notes: ["n1"] });

  const cpu = { ...r, status: { code: "no_cuda", message: "No CUDA GPU is visible", notes: ["n2"] } };
  assert.equal(statusBanner(cpu).severity, "warning", "a dequant fallback outranks the missing GPU");
  assert.deepEqual(statusBanner(cpu).notes, ["No CUDA GPU is visible", "n2"]);
  const cpuCublas = { ...cpu, models: [makeModel("conditional", repeat(3, "cublas-int8"))] };
  assert.equal(statusBanner(cpuCublas).severity, "notice");
  assert.match(statusBanner(cpuCublas).text, /not all of it on the fused kernel/);

  assert.equal(statusBanner(null).severity, "error");
  assert.match(statusBanner({ ...r, schema_version: 2 }).text, /schema 1 but the server sent 2/);
  assert.deepEqual(statusBanner(r, "HTTP 500: boom"), { severity: "error", text: "HTTP 500: boom", notes: [] });

  const fused = { ...r, models: [makeModel("conditional", repeat(3, "triton-int8"))] };
  assert.equal(statusBanner(fused).severity, "ok");
});

test("checkReport names what is wrong", () => {
  assert.match(checkReport([]), /not a JSON object/);
  const r = sample();
  delete r.timing;
  assert.match(checkReport(r), /no "timing"/);
  assert.match(checkReport({ ...sample(), models: {} }), /"models" is not a list/);
});

test("environment line", () => {
  const env = sample().environment;
  assert.equal(describeEnvironment(env), "NVIDIA H100 80GB HBM3 (sm 9.0) · torch 2.11.0+cu130 · triton 3.6.0");
  const cpu = { ...env, cuda_available: false, gpu: null, compute_capability: null, triton: null,
    forced_path: { variable: "IDEOGRAM4_INT8_GEMM_PATH", value: "dequant-bf16", valid: true } };
  assert.equal(describeEnvironment(cpu), "no CUDA GPU · torch 2.11.0+cu130 · no triton · forced: dequant-bf16");
  cpu.forced_path = { variable: "IDEOGRAM4_INT8_GEMM_PATH", value: "fast", valid: false };
  assert.match(describeEnvironment(cpu), /IDEOGRAM4_INT8_GEMM_PATH=fast \(ignored\)$/);
});

test("dominant path counts every linear per path, as the headlines do; ties go to the slower path", () => {
  const m = makeModel("conditional", [...repeat(4, "triton-int8"), ...repeat(4, "dequant-bf16")]);
  const d = dominantPath([m]);
  assert.equal(d.path, "dequant-bf16");
  assert.equal(d.count, 4);
  assert.equal(d.total, 8);
  assert.equal(d.severity, "warning");
  // a layer that did not run keeps its path: the same numbers as the model's headline
  const m2 = makeModel("conditional", [...repeat(2, "triton-int8"), ...repeat(5, "cublas-int8")], { notRun: 5 });
  assert.equal(dominantPath([m2]).path, "cublas-int8");
  assert.equal(dominantPath([m2]).total, 7);
  assert.equal(dominantPath([]), null);
});

test("badge: the panel's per-model numbers, warning marker and colours", () => {
  const r = sample();
  const cond = badgeFor(r, ["conditional"]);
  const c = byLabel(r, "conditional").counts;
  const tot = PATHS.reduce((a, p) => a + c[p], 0);
  assert.equal(cond.text, `fused INT8 ${c["triton-int8"]}/${tot}`);
  assert.ok(summarizeModel(byLabel(r, "conditional")).headline.includes(`${c["triton-int8"]}/${tot} linears`));
  assert.equal(cond.severity, "notice");
  assert.deepEqual(cond.colors, SEVERITY_COLORS.notice);

  const unc = badgeFor(r, ["unconditional"]);
  assert.ok(unc.text.startsWith("⚠ dequant-bf16 "), unc.text);
  assert.equal(unc.severity, "warning");
  assert.notDeepEqual(unc.colors, SEVERITY_COLORS.ok);

  const both = badgeFor(r); // no labels: every model
  assert.equal(both.severity, "warning");
  assert.ok(both.text.length <= 48, both.text);
  assert.match(both.tooltip, /^conditional: .*\nunconditional: .*\n\(badge: linears on dequant/);

  // unknown labels fall back to every model rather than showing nothing
  assert.equal(badgeFor(r, ["nope"]).text, both.text);
  assert.equal(badgeFor({ ...r, models: [] }), null);
  assert.equal(badgeFor(null), null);
});

test("badge of a loader / sampler: the same story as the two model headlines", () => {
  // issue 22: "cuBLAS INT8 23/37" on the badges next to "12/19" per model could not be reconciled
  const layers = [...repeat(12, "cublas-int8"), ...repeat(7, "bf16")];
  const cond = makeModel("conditional", layers);
  const unc = makeModel("unconditional", layers, { notRun: 1 }); // llm_cond_proj: not in the image-only pass
  const r = { ...sample(), models: [unc, cond] };
  const badge = badgeFor(r, ["conditional", "unconditional"]);
  assert.equal(badge.text, "cuBLAS INT8 12/19 in both models");
  for (const m of [cond, unc]) {
    assert.ok(summarizeModel(m).headline.includes("12/19 linears on cuBLAS INT8"), summarizeModel(m).headline);
  }
  const other = makeModel("unconditional", [...repeat(10, "cublas-int8"), ...repeat(9, "bf16")]);
  assert.equal(badgeFor({ ...r, models: [cond, other] }).text, "cuBLAS INT8 12/19 + 10/19");
  assert.equal(perModelCounts([cond, cond, cond].map((m, i) => ({ ...m, label: `m${i}` })), "cublas-int8"),
    "12/19 in all 3 models");
});

test("badge counts the phantom-INT8 layers per model even when another path dominates", () => {
  const m = makeModel("conditional", [...repeat(200, "triton-int8"), ...repeat(4, "dequant-bf16"), ...repeat(17, "bf16")]);
  const r = { ...sample(), models: [m] };
  assert.equal(badgeFor(r).text, "⚠ dequant-bf16 4/221");
  const twin = { ...m, label: "unconditional", role: "unconditional" };
  assert.equal(badgeFor({ ...r, models: [m, twin] }).text, "⚠ dequant-bf16 4/221 in both models");
});

test("number formatting", () => {
  assert.equal(formatMs(0.4234), "0.42 ms");
  assert.equal(formatMs(12.345), "12.3 ms");
  assert.equal(formatMs(345.6), "346 ms");
  assert.equal(formatMs(12345), "12.3 s");
  assert.equal(formatMs(null), "—");
  assert.equal(formatShare(0.6625), "66.3 %");
  assert.equal(formatShare(null), "—");
});

test("timing rows: per path with share, plus the total; clear messages when absent", () => {
  const t = sample().timing;
  const { rows, message, wall } = timingRows(t);
  assert.equal(message, null);
  assert.equal(wall, formatMs(t.last_run.wall_ms));
  assert.deepEqual(rows.map((r) => r.path), [...PATHS.filter((p) => t.last_run.per_path[p].ms > 0), null]);
  const tri = rows.find((r) => r.path === "triton-int8");
  assert.equal(tri.share, formatShare(t.last_run.per_path["triton-int8"].share));
  assert.equal(rows.at(-1).ms, formatMs(t.last_run.gemm_ms));

  const off = timingRows({ ...t, enabled: false, last_run: null });
  assert.equal(off.rows.length, 0);
  assert.match(off.message, /timing is off.*IDEOGRAM4_INT8_GEMM_TIMING=1/);
  const waiting = timingRows({ ...t, last_run: null, note: "no timed run yet" });
  assert.equal(waiting.message, "no timed run yet");
  assert.match(timingRows({ ...t, enabled: false }).message, /last timed run/);
});

test("layer rows and filters", () => {
  const unc = byLabel(sample(), "unconditional");
  const all = layerRows(unc);
  assert.equal(all.length, unc.layers.length);
  const notRun = all.filter((r) => r.calls === "not run");
  assert.equal(notRun.length, unc.layers_total - unc.layers_run);
  assert.equal(notRun[0].m, "—");
  const dq = layerRows(unc, "dequant-bf16");
  assert.equal(dq.length, unc.counts["dequant-bf16"]);
  assert.ok(dq.every((r) => r.severity === "warning" && r.pathLabel === "dequant-bf16"));
  const cond = byLabel(sample(), "conditional");
  // the fused FP8 path (protected layers stored fp8) is fused too
  assert.equal(
    layerRows(cond, "not-fused").length,
    cond.layers_total - cond.counts["triton-int8"] - cond.counts["triton-fp8"],
  );
  const fp8Row = layerRows(cond).find((row) => row.path === "triton-fp8");
  assert.equal(fp8Row.pathLabel, "fused FP8");
  assert.equal(fp8Row.reason, "");
  const first = layerRows(cond)[0];
  assert.equal(first.shape, `${cond.layers[0].N}×${cond.layers[0].K}`);
  assert.match(first.config, /\(autotuned \(412 us\)\)$/);
  assert.equal(layerRows({ ...cond, layers: null }), null);
  assert.throws(() => layerRows(cond, "bogus"), /unknown layer filter "bogus"/);
});

test("a reason that repeats the row above is marked, so the table prints it once", () => {
  const m = makeModel("conditional", [
    ["a", "cublas-int8", "CPU tensors"], ["b", "cublas-int8", "CPU tensors"], ["c", "bf16", "protected"],
    ["d", "cublas-int8", "CPU tensors"], ["e", "triton-int8", ""], ["f", "cublas-int8", "CPU tensors"],
  ]);
  assert.deepEqual(layerRows(m).map((r) => r.sameReasonAsAbove), [false, true, false, false, false, false]);
  // after filtering, rows that become neighbours compare with each other
  assert.deepEqual(layerRows(m, "not-fused").map((r) => r.sameReasonAsAbove), [false, true, false, false, true]);
});

test("autotune rows list each pick by shape", () => {
  const rows = autotuneRows(byLabel(sample(), "conditional"));
  assert.ok(rows.length >= 1);
  assert.ok(rows.some((r) => r.shape === "4608×53248" && r.source === "autotuned (412 us)"));
  assert.deepEqual(autotuneRows(byLabel(sample(), "unconditional")), []);
});

test("websocket events update the state and remember which node published which models", () => {
  const r = sample();
  let s = applyEvent(null, { event: "load", models: ["conditional", "unconditional"], node_id: "4", report: r });
  assert.equal(s.report, r);
  assert.deepEqual(s.nodeModels, { 4: ["conditional", "unconditional"] });
  const s2 = applyEvent(s, { event: "run", models: null, node_id: "9", report: r });
  assert.equal(s2.lastEvent, "run");
  assert.deepEqual(s2.nodeModels, { 4: ["conditional", "unconditional"] });
  assert.equal(applyEvent(s2, { event: "run", report: { schema_version: 99 } }), s2, "a bad report is ignored");
  assert.equal(applyEvent(s2, null), s2);
});

test("only our loader and sampler nodes get a badge", () => {
  assert.ok(wantsBadge("Ideogram4Int8Loader"));
  assert.ok(wantsBadge("Ideogram4Int8Sampler"));
  assert.ok(!wantsBadge("Ideogram4Int8CaptionBuilder"));
  assert.ok(!wantsBadge("KSampler"));
  assert.ok(!wantsBadge(undefined));
});

// The sample's runs: loader 8 loaded both models in an earlier prompt (cached since); sampler 9 ran them in the
// report's last prompt (Default 20 after a Turbo 12 run: 'calls' adds both up, 32 per layer, 20 in the last run).
const LOADER = { id: 8, type: "Ideogram4Int8Loader",
                 widgets: { weights: "ideogram4-int8-w8a8.safetensors",
                            unconditional_weights: "(second branch of the weights file)" } };
const SAMPLER = { id: 9, type: "Ideogram4Int8Sampler", widgets: { preset: "Default 20" } };

test("node badges come from the node's own run, type and files, not from its id alone", () => {
  const r = sample();
  const both = badgeFor(r, ["conditional", "unconditional"]);
  // the loader was cached in the last run, but its models ran in it: current
  assert.deepEqual(nodeBadge(r, LOADER), { ...both, stale: false });
  assert.deepEqual(nodeBadge(r, SAMPLER), { ...both, stale: false });
  // after a reload, a loader whose widget names another (e.g. missing) file: no badge from the earlier run
  assert.equal(nodeBadge(r, { ...LOADER, widgets: { ...LOADER.widgets, weights: "missing.safetensors" } }), null);
  // a node id the server never heard of, or a node of another type under that id: no badge
  assert.equal(nodeBadge(r, { ...LOADER, id: 3 }), null);
  assert.equal(nodeBadge(r, { ...SAMPLER, type: "Ideogram4Int8Loader" }), null);
  assert.equal(nodeBadge(r, { ...LOADER, type: "Ideogram4Int8Patch" }), null);
  // its models are gone from the report (unloaded): no badge, never "every model" instead
  assert.equal(nodeBadge({ ...r, models: [] }, SAMPLER), null);
  r.nodes["9"].models = ["some other model"];
  assert.equal(nodeBadge(r, SAMPLER), null);
});

test("a badge from an earlier run is labelled so, in the idle colours", () => {
  const r = sample();
  // a new prompt started (or a later one ran without these models): both nodes are from an earlier run
  for (const node of [LOADER, SAMPLER]) {
    const b = nodeBadge(r, node, "a-new-prompt");
    assert.ok(b.stale && b.text.startsWith("earlier run · "), b.text);
    assert.equal(b.severity, "idle");
    assert.deepEqual(b.colors, SEVERITY_COLORS.idle);
    assert.match(b.tooltip, /From an earlier run \(prompt /);
  }
  // the loader ran in the current prompt itself (its models not yet): current
  assert.equal(nodeBadge(r, LOADER, r.nodes["8"].prompt_id).stale, false);
  // models that ran in an older prompt than the report's last one: the sampler of that older prompt is stale
  for (const m of r.models) m.last_run = "older";
  r.nodes["9"].prompt_id = "older";
  assert.equal(nodeBadge(r, SAMPLER).stale, true);
  assert.equal(nodeBadge(r, LOADER).stale, true);
});

test("a freshly loaded workflow shows no badge from the runs before it was loaded", () => {
  // Nodes 2.0 showed the last run's badge on a workflow just opened from the Templates browser: same node ids
  const r = sample();
  const before = knownRuns(r, "the-prompt-that-ran");
  assert.ok(before.has(String(r.nodes["8"].prompt_id)) && before.has(String(r.last_prompt_id)));
  assert.ok(before.has("the-prompt-that-ran") && r.models.every((m) => m.last_run == null || before.has(m.last_run)));
  for (const node of [LOADER, SAMPLER]) {
    assert.ok(nodeBadge(r, node), "shown while the graph that ran is on the canvas");
    assert.equal(nodeBadge(r, node, null, before), null);
  }
  // the loaded graph runs: its nodes' new events are not hidden
  const ran = structuredClone(r);
  for (const id of ["8", "9"]) ran.nodes[id].prompt_id = "a-new-prompt";
  for (const m of ran.models) m.last_run = "a-new-prompt";
  assert.equal(nodeBadge(ran, LOADER, "a-new-prompt", before).stale, false);
  assert.deepEqual([...knownRuns(null)], []);
});

test("per-layer and per-model calls show the last run and the total, each labelled", () => {
  assert.equal(callsText(20, 32), "20 calls in the last run · 32 in all runs");
  assert.equal(callsText(undefined, 32), "32 calls in all runs");
  assert.equal(callsText(0, 0), "not run");
  const cond = byLabel(sample(), "conditional");
  const rows = layerRows(cond);
  assert.ok(rows.every((row) => row.callsText === "20 calls in the last run · 32 in all runs"), rows[0].callsText);
  assert.equal(callsText(cond.calls_last_run, cond.calls), `${cond.calls_last_run} calls in the last run · ${cond.calls} in all runs`);
  assert.ok(cond.calls_last_run < cond.calls);
});

test("events carry the prompt they came from", () => {
  const r = sample();
  const s = applyEvent(null, { event: "run", models: ["conditional"], node_id: "9", prompt_id: "p7", report: r });
  assert.equal(s.currentPrompt, "p7");
  assert.equal(applyEvent(s, { event: "load", models: ["x"], node_id: "8", report: r }).currentPrompt, "p7");
});

test("a model's streaming and device notes, streaming first", async () => {
  const { modelNotes } = await import("../../web/lib/gemm_status.mjs");
  const notes = modelNotes({ notes: { device: "on cuda:1", streaming: "low-VRAM streaming: 2 GiB", zz: "", other: "x" } });
  assert.deepEqual(notes.map((n) => n.kind), ["streaming", "device", "other"]);
  assert.equal(notes[0].text, "low-VRAM streaming: 2 GiB");
  assert.deepEqual(modelNotes({}), []);
  assert.deepEqual(modelNotes(null), []);
});

test("on a CPU the panel names the CPU matmul that ran; only a forced slower one is a warning", async () => {
  const { useLabels } = await import("../../web/lib/gemm_status.mjs");
  const cpu = (preferred) => {
    const report = sample();
    report.path_labels = {
      device: "cpu",
      preferred,
      labels: {
        "triton-int8": "fused Triton INT8 (CUDA GPUs only)",
        "cublas-int8": "CPU INT8 matmul (torch._int_mm)",
        "dequant-bf16": "CPU dequantized float32 matmul",
        bf16: "float (protected)",
      },
    };
    for (const m of report.models) {
      for (const l of m.layers ?? []) if (l.path === "triton-int8" || l.path === "cublas-int8") l.path = "dequant-bf16";
      const c = m.counts;
      c["dequant-bf16"] += c["triton-int8"] + c["cublas-int8"];
      c["triton-int8"] = c["cublas-int8"] = 0;
    }
    return report;
  };
  try {
    const measured = summarizeReport(cpu("dequant-bf16")); // the CPU's own choice: a notice, CPU words
    const text = measured.models.map((m) => `${m.headline} ${m.warning}`).join("\n");
    assert.match(text, /CPU dequantized float32 matmul/);
    assert.doesNotMatch(text, /cuBLAS|phantom/);
    assert.ok(measured.models.every((m) => m.severity === "notice"), measured.models);
    assert.match(badgeFor(cpu("dequant-bf16")).text, /^CPU float /);
    const forced = summarizeReport(cpu("cublas-int8")); // slower than the CPU's choice: a warning
    assert.ok(forced.models.every((m) => m.severity === "warning"), forced.models);
    assert.match(forced.models[0].warning, /slower here than the CPU INT8 matmul/);
    assert.match(badgeFor(cpu("cublas-int8")).text, /^⚠ CPU float /);
  } finally {
    useLabels(null); // the CUDA words for the other tests
  }
});

test("protected layers stored fp8 that run float on this GPU are a notice that says why", () => {
  useLabels({}); // a GPU report: the CUDA words
  const why = "GPU is sm_86: the fused FP8 GEMM runs on sm_89 / sm_90 (Ada, Hopper) fp8 tensor cores";
  const layers = [
    { layer: "layers.0.attention.qkv", path: "triton-int8", reason: "" },
    { layer: "layers.1.feed_forward.w2", path: "bf16", reason: `fp8 weight dequantized: ${why}` },
    { layer: "layers.3.feed_forward.w2", path: "bf16", reason: `fp8 weight dequantized: ${why}` },
    { layer: "final_layer.linear", path: "bf16", reason: "unquantized top-level layer" },
  ];
  const counts = { "triton-int8": 1, "triton-fp8": 0, "cublas-int8": 0, "dequant-bf16": 0, bf16: 3 };
  const model = { label: "conditional", counts, counts_run: counts, layers };
  assert.equal(modelSeverity(model), "notice");
  assert.equal(
    warningText(model),
    `2 layers stored fp8 run dequantized to bf16 here, not on the fused FP8 GEMM (the loader's protected_layers = ` +
      `bf16 runs them as fast, exactly as stored). Why: ${why}.`,
  );
  const plain = { ...model, layers: layers.map((l) => (l.path === "bf16" ? { ...l, reason: "protected" } : l)) };
  assert.equal(modelSeverity(plain), "ok");
  assert.equal(warningText(plain), null);
  // a websocket push: no layer table, its per-reason counts instead; the badge says the same without a fetch
  const reasons = [
    { path: "bf16", reason: `fp8 weight dequantized: ${why}`, layers: 2 },
    { path: "triton-int8", reason: "", layers: 1 },
    { path: "bf16", reason: "unquantized top-level layer", layers: 1 },
  ];
  const pushed = { label: "conditional", counts, counts_run: counts, layers: null, reasons };
  assert.equal(modelSeverity(pushed), "notice");
  assert.equal(warningText(pushed), warningText(model));
  assert.equal(modelSeverity({ ...pushed, reasons: undefined }), "ok"); // an older pack's push: nothing to go on
});
