// Screenshots of the GEMM-path panel in a real ComfyUI frontend (driven by tests/browser/test_panel_browser.py).
//
//   node tests/browser/gemm_panel_shots.mjs <base-url> <out-prefix> <idle|runs|fixture> [options-json]
//
// Needs playwright-core importable (e.g. NODE_PATH=/some/dir/node_modules) and Debian's chromium
// at /usr/bin/chromium (override with CHROMIUM); it never downloads a browser.
// "idle": the panel before anything ran.
// "runs": builds the pack's real graph in the page — Ideogram 4 INT8 Loader -> Ideogram 4 Sampler -> SaveLatent,
//   positive from the test-only Ideogram4TestConditioning node (text features from a file: no 8B text encoder on
//   test machines) — queues it with the loader's gemm_path on "auto", shoots <out>-auto.png (graph with the node
//   badges, panel with both models) and <out>-auto-table.png (per-layer table open), then sets gemm_path to
//   "dequant-bf16", queues again and shoots <out>-forced.png / <out>-forced-table.png.
//   options-json: {"weights": "<file in models/diffusion_models>", "cond": "<text-features file>", "steps": 2,
//   "size": 256}.
// "fixture": answers the status route with tests/fixtures/gemm_status_sample.json (an H100 report with fused,
//   cuBLAS, dequant and timing rows) to look at states a CPU machine cannot produce; those screenshots show
//   rendering only, not a path that ran.
// Prints a JSON line with what the page showed, for the calling test to check.
import { readFileSync } from "node:fs";
import { collectErrors, launchChromium, openComfy } from "./comfy_page.mjs";

const [base, out, phase, optionsJson] = process.argv.slice(2);
if (!base || !out || !["idle", "runs", "fixture"].includes(phase)) {
  console.error("usage: gemm_panel_shots.mjs <base-url> <out-prefix> <idle|runs|fixture> [options-json]");
  process.exit(2);
}
const options = { steps: 2, size: 256, ...(optionsJson ? JSON.parse(optionsJson) : {}) };
if (phase === "runs" && (!options.weights || !options.cond)) {
  console.error('"runs" needs options {"weights": ..., "cond": ...}');
  process.exit(2);
}

const { browser } = await launchChromium("ig4i8-chr-");
const result = { phase, consoleErrors: [], shots: [] };

// What the panel and the badges show right now.
async function observe(page) {
  return page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    const b = document.querySelector('[data-testid="ig4i8-banner"]');
    const badges = {};
    for (const node of app.graph.nodes) {
      const list = (node.badges ?? []).map((x) => (typeof x === "function" ? x() : x)).filter((x) => x?.text);
      badges[node.comfyClass ?? node.type] = list.map((x) => ({ text: x.text, bg: x.bgColor }));
    }
    return {
      banner: { severity: b?.dataset.severity, text: b?.textContent },
      models: [...document.querySelectorAll("section.ig4i8-model[data-model]")].map((s) => ({
        label: s.dataset.model,
        severity: s.dataset.severity,
        headline: s.querySelector(".ig4i8-headline")?.textContent,
        warning: s.querySelector(".ig4i8-warning")?.textContent ?? null,
        rows: s.querySelectorAll("tbody tr").length,
        paths: [...s.querySelectorAll("tbody td.ig4i8-path")].map((td) => td.textContent),
      })),
      env: document.querySelector(".ig4i8-env")?.textContent ?? null,
      badgeNote: document.querySelector('[data-testid="ig4i8-badge-note"]')?.textContent ?? null,
      foot: document.querySelector(".ig4i8-foot")?.textContent ?? null,
      events: (window.__ig4i8Events ?? []).map((e) => [e.event, e.node_id, e.models]),
      badges,
    };
  });
}

async function shoot(page, name, anchor = ".ig4i8-head") {
  // the sidebar scrolls in a container of the frontend, not in our element: scroll by element
  await page.evaluate((sel) => document.querySelector(sel).scrollIntoView({ block: "start" }), anchor);
  await page.waitForTimeout(300);
  const path = `${out}${name}.png`;
  await page.screenshot({ path });
  result.shots.push(path);
}

const tableOf = (label) => `section.ig4i8-model[data-model="${label}"] details[data-key="${label}/layers"]`;

async function toggleTable(page, label) {
  await page.locator(`${tableOf(label)} > summary`).click();
  await page.waitForTimeout(300);
}

// Queue the graph; wait for the sampler's "run" push number `runs` and for the panel's fetch after it.
async function queueAndWait(page, runs) {
  await page.evaluate(() => window.comfyAPI.app.app.queuePrompt(0, 1));
  await page.waitForFunction((n) => window.__ig4i8Events.filter((e) => e.event === "run").length >= n, runs, {
    timeout: 240000,
  });
  await page.waitForFunction(() => {
    const btn = document.querySelector(".ig4i8-head .ig4i8-btn");
    return btn && btn.textContent === "Refresh" && document.querySelectorAll("section.ig4i8-model[data-model]").length > 0;
  }, null, { timeout: 60000 });
  await page.waitForTimeout(1500); // the canvas redraws the badges on its next frame
}

try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  collectErrors(page, result.consoleErrors);
  if (phase === "fixture") {
    const fixture = readFileSync(new URL("../fixtures/gemm_status_sample.json", import.meta.url), "utf8");
    await page.route("**/ideogram4_int8/status**", (route) =>
      route.fulfill({ status: 200, contentType: "application/json", body: fixture }),
    );
  }
  await openComfy(page, base, () => window.comfyAPI?.app?.app?.graph && window.LGraphBadge);
  // start from an empty graph: the default workflow needs checkpoints this test machine lacks
  await page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    app.graph.clear();
    app.graph.setDirtyCanvas(true, true);
    window.__ig4i8Events = [];
    window.comfyAPI.api.api.addEventListener("ideogram4_int8.status", (e) => window.__ig4i8Events.push(e.detail));
  });
  const tabButton = page.locator('button[aria-label*="GEMM path"]').first();
  await tabButton.click();
  await page.waitForSelector('[data-testid="ig4i8-banner"]', { timeout: 30000 });
  await page.waitForTimeout(500);

  if (phase === "idle" || phase === "fixture") {
    if (phase === "fixture") {
      await page.waitForSelector("section.ig4i8-model[data-model]", { timeout: 30000 });
      const tables = page.locator("section.ig4i8-model[data-model] details summary");
      for (const text of ["Per-layer table", "Autotune picks"]) {
        await tables.filter({ hasText: text }).first().click();
      }
      await page.locator("section.ig4i8-model[data-model] select").first().selectOption("not-fused");
      await page.waitForTimeout(300);
    }
    Object.assign(result, await observe(page));
    await shoot(page, "");
  }

  if (phase === "runs") {
    // the pack's graph, laid out to the right of the open sidebar
    const missing = await page.evaluate((opt) => {
      const app = window.comfyAPI.app.app;
      const L = window.LiteGraph;
      const made = {};
      const add = (type, pos) => {
        const node = L.createNode(type);
        if (!node) return null;
        node.pos = pos;
        app.graph.add(node);
        made[type] = node;
        return node;
      };
      const set = (node, name, value) => {
        const w = node.widgets.find((x) => x.name === name);
        if (!w) throw new Error(`${node.type} has no widget ${name}`);
        w.value = value;
        w.callback?.(value);
      };
      const loader = add("Ideogram4Int8Loader", [400, 150]);
      const cond = add("Ideogram4TestConditioning", [400, 520]);
      const sampler = add("Ideogram4Int8Sampler", [770, 150]);
      const save = add("SaveLatent", [1120, 150]);
      const absent = ["Ideogram4Int8Loader", "Ideogram4TestConditioning", "Ideogram4Int8Sampler", "SaveLatent"].filter(
        (t) => !made[t],
      );
      if (absent.length) return absent;
      set(loader, "weights", opt.weights);
      set(loader, "gemm_path", "auto");
      set(cond, "path", opt.cond);
      set(sampler, "preset", "custom");
      set(sampler, "steps", opt.steps);
      set(sampler, "polish_steps", 1);
      set(sampler, "width", opt.size);
      set(sampler, "height", opt.size);
      set(sampler, "seed", 7);
      set(sampler, "control_after_generate", "fixed");
      set(save, "filename_prefix", "panel");
      const slot = (node, name) => node.inputs.findIndex((i) => i.name === name);
      loader.connect(0, sampler, slot(sampler, "model"));
      loader.connect(1, sampler, slot(sampler, "model_negative"));
      cond.connect(0, sampler, slot(sampler, "positive"));
      sampler.connect(0, save, slot(save, "samples"));
      app.canvas.ds.offset = [0, 0];
      app.canvas.ds.scale = 1;
      app.graph.setDirtyCanvas(true, true);
      return [];
    }, options);
    if (missing.length) throw new Error(`node types not registered in this ComfyUI: ${missing.join(", ")}`);

    await queueAndWait(page, 1);
    result.auto = await observe(page);
    await shoot(page, "-auto");
    await toggleTable(page, "conditional");
    result.auto.tableRows = (await observe(page)).models.map((m) => m.rows);
    await shoot(page, "-auto-table", tableOf("conditional"));
    await toggleTable(page, "conditional"); // closed again: the forced shot starts like the automatic one

    // the fallback, forced on the loader: the loader and the sampler run again
    await page.evaluate(() => {
      const app = window.comfyAPI.app.app;
      const loader = app.graph.nodes.find((n) => (n.comfyClass ?? n.type) === "Ideogram4Int8Loader");
      const w = loader.widgets.find((x) => x.name === "gemm_path");
      w.value = "dequant-bf16";
      w.callback?.(w.value);
      app.graph.setDirtyCanvas(true, true);
    });
    await queueAndWait(page, 2);
    result.forced = await observe(page);
    await shoot(page, "-forced");
    await toggleTable(page, "unconditional");
    result.forced.tableRows = (await observe(page)).models.map((m) => m.rows);
    await shoot(page, "-forced-table", tableOf("unconditional"));
  }
} catch (err) {
  const page = browser.pages()[0];
  if (page) await page.screenshot({ path: `${out}-FAILED.png` }).catch(() => {});
  throw err;
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
