// Screenshots of the GEMM-path panel in a real ComfyUI frontend (developer tool, not a CI test).
//
//   node tests/browser/gemm_panel_shots.mjs <base-url> <out-prefix> <idle|run|fixture>
//
// Needs playwright-core importable (e.g. NODE_PATH=/some/dir/node_modules) and Debian's chromium
// at /usr/bin/chromium (override with CHROMIUM); it never downloads a browser. "run" queues the
// test-only probe node (tests/comfyui_nodes/ig4i8_panel_probe), waits for the pack's websocket
// event, and shoots the panel with the first model's per-layer table open, plus the node badge.
// "fixture" answers the status route with tests/fixtures/gemm_status_sample.json (an H100 report
// with fused, cuBLAS, dequant and timing rows) to look at states a CPU machine cannot produce;
// those screenshots show rendering only, not a path that ran.
// Prints a JSON line with what the page showed, for the calling test to check.
import { createRequire } from "node:module";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const [base, out, phase] = process.argv.slice(2);
if (!base || !out || !["idle", "run", "fixture"].includes(phase)) {
  console.error("usage: gemm_panel_shots.mjs <base-url> <out-prefix> <idle|run|fixture>");
  process.exit(2);
}

// playwright wants the profile folder as an argument rather than --user-data-dir: a new empty one
const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "ig4i8-chr-")), {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1500, height: 950 },
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
  ],
});
const result = { phase, consoleErrors: [] };
try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  page.on("console", (msg) => {
    if (msg.type() === "error") result.consoleErrors.push(msg.text());
  });
  page.on("pageerror", (err) => result.consoleErrors.push(String(err)));
  if (phase === "fixture") {
    const fixture = readFileSync(new URL("../fixtures/gemm_status_sample.json", import.meta.url), "utf8");
    await page.route("**/ideogram4_int8/status**", (route) =>
      route.fulfill({ status: 200, contentType: "application/json", body: fixture }),
    );
  }
  await page.goto(base, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.LGraphBadge, null, { timeout: 120000 });
  // wait for the default workflow, so clearing the graph below is not undone by it loading late
  await page.waitForFunction(() => window.comfyAPI.app.app.graph.nodes?.length > 0, null, { timeout: 60000 }).catch(() => {});
  await page.waitForTimeout(1500);
  // a fresh profile opens the templates / welcome dialog: close whatever is open
  for (let i = 0; i < 3 && (await page.locator('[data-testid="dialog-overlay"]').count()); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(500);
  }
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

  if (phase === "fixture") {
    await page.waitForSelector("section.ig4i8-model[data-model]", { timeout: 30000 });
    const tables = page.locator("section.ig4i8-model[data-model] details summary");
    for (const text of ["Per-layer table", "Autotune picks"]) {
      await tables.filter({ hasText: text }).first().click();
    }
    await page.locator("section.ig4i8-model[data-model] select").first().selectOption("not-fused");
    await page.waitForTimeout(300);
  }
  if (phase === "run") {
    await page.evaluate(() => {
      const app = window.comfyAPI.app.app;
      const node = window.LiteGraph.createNode("Ideogram4Int8PanelProbeSampler");
      node.pos = [420, 180];
      app.graph.add(node);
      app.canvas.ds.offset = [0, 0];
      app.canvas.ds.scale = 1.2;
      app.graph.setDirtyCanvas(true, true);
    });
    await page.evaluate(() => window.comfyAPI.app.app.queuePrompt(0, 1));
    await page.waitForFunction(() => window.__ig4i8Events.some((e) => e.event === "run"), null, { timeout: 120000 });
    await page.waitForSelector("section.ig4i8-model[data-model]", { timeout: 30000 });
    await page.waitForTimeout(1000);
    const firstTable = page.locator("section.ig4i8-model[data-model] details summary", { hasText: "Per-layer table" });
    await firstTable.first().click();
    await page.waitForTimeout(300);
    result.events = await page.evaluate(() => window.__ig4i8Events.map((e) => [e.event, e.node_id, e.models]));
    result.badges = await page.evaluate(() => {
      const node = window.comfyAPI.app.app.graph.nodes[0];
      // ours is the last one pushed (the frontend adds its own node-source badge first)
      return node.badges.map((x) => (typeof x === "function" ? x() : x)).filter((x) => x?.text).map((x) => ({ text: x.text, bg: x.bgColor }));
    });
  }
  result.banner = await page.evaluate(() => {
    const b = document.querySelector('[data-testid="ig4i8-banner"]');
    return { severity: b?.dataset.severity, text: b?.textContent };
  });
  result.models = await page.evaluate(() =>
    [...document.querySelectorAll("section.ig4i8-model[data-model]")].map((s) => ({
      label: s.dataset.model,
      severity: s.dataset.severity,
      headline: s.querySelector(".ig4i8-headline")?.textContent,
      rows: s.querySelectorAll("tbody tr").length,
    })),
  );
  result.env = await page.evaluate(() => document.querySelector(".ig4i8-env")?.textContent ?? null);
  // the sidebar scrolls in a container of the frontend, not in our element: scroll by element
  await page.evaluate(() => document.querySelector(".ig4i8-head").scrollIntoView({ block: "start" }));
  await page.waitForTimeout(200);
  await page.screenshot({ path: `${out}.png` });
  // then the bottom of the panel (second model, timing)
  await page.evaluate(() => document.querySelector('[data-testid="ig4i8-gemm-panel"]').lastElementChild.scrollIntoView({ block: "end" }));
  await page.waitForTimeout(300);
  await page.screenshot({ path: `${out}-bottom.png` });
  result.shots = [`${out}.png`, `${out}-bottom.png`];
} catch (err) {
  const page = browser.pages()[0];
  if (page) await page.screenshot({ path: `${out}-FAILED.png` }).catch(() => {});
  throw err;
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
