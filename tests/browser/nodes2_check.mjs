// The pack's nodes on one frontend build, classic canvas or Nodes 2.0 (Vue nodes), in headless Chromium.
//
//   node tests/browser/nodes2_check.mjs <base-url> <out-prefix> <vue: 0|1> <workflow.json> ...
//
// 0. the first-load dialogs (1.58's Templates browser opens a few seconds after the app) closed; the pack's
//    "GEMM paths" sidebar tab opened: its banner's and the panel's screen rectangles;
// 1. an Ideogram 4 Sampler: which custom-only widgets show under "Default 20" and under "custom";
// 2. each workflow loaded as a file: the screen rectangles of its nodes (Vue: the node elements; classic: the
//    canvas' own node bounds, title included), and every pair that overlaps; a screenshot of each. On a Layout
//    Boxes node, the box editor: the frontend's own bounding-box widget under Nodes 2.0, the pack's editor on the
//    classic canvas; its rectangle, the node's, and how many of the pack's editors the page holds.
// Every screenshot records how many dialogs were open when it was taken. Prints one JSON line.
import { createRequire } from "node:module";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");
const [base, out, vueArg, ...workflows] = process.argv.slice(2);
const vue = vueArg === "1";
const profile = mkdtempSync(join(tmpdir(), "ig4i8-n2-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", headless: true, viewport: { width: 1800, height: 1100 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
});
const result = { vue, shots: [], dialogsAtShots: [], consoleErrors: [], workflows: {}, editors: {} };
const DIALOGS = '[data-testid="dialog-overlay"], [role=dialog], [data-reka-dialog-content]';
const CUSTOM_ONLY = ["steps", "guidance", "polish_steps", "polish_guidance", "mu", "std"];

async function dismiss(page) {
  // Escape closes them in 1.49 and 1.58 (a click on their close button can wait out an animation)
  for (let i = 0; i < 8 && (await page.locator(DIALOGS).count()); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(400);
  }
}

async function shoot(page, path) {
  await dismiss(page);
  result.dialogsAtShots.push(await page.locator(DIALOGS).count());
  await page.screenshot({ path });
  result.shots.push(path);
}

const rectOf = (el) => {
  const r = el?.getBoundingClientRect();
  return r ? [r.x, r.y, r.width, r.height] : null;
};

async function shown(page, id) {
  return await page.evaluate(([id, names, vue]) => {
    const app = window.comfyAPI.app.app;
    const node = app.graph.getNodeById(id);
    if (!vue) return names.filter((n) => node.isWidgetVisible(node.widgets.find((w) => w.name === n)));
    const el = document.querySelector(`[data-node-id="${id}"]`);
    const text = el?.innerText ?? "";
    return names.filter((n) => new RegExp(`(^|\\n)\\s*${n}\\s*(\\n|$)`).test(text));
  }, [id, CUSTOM_ONLY, vue]);
}

try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  page.on("pageerror", (err) => result.consoleErrors.push(String(err)));
  await page.goto(base, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.LiteGraph, null, { timeout: 120000 });
  // the frontend's startup workflow has loaded (else it may replace the graph built below)
  await page.waitForFunction(() => window.comfyAPI.app.app.graph.nodes?.length > 0, null, { timeout: 60000 }).catch(() => {});
  const tutorialDone = await page.evaluate(() => window.comfyAPI.app.app.extensionManager.setting.get("Comfy.TutorialCompleted"));
  // 1.58 opens the Templates browser on a first load (tutorial not done) a few seconds after the app is up
  if (!tutorialDone) await page.waitForSelector(DIALOGS, { timeout: 10000 }).catch(() => {});
  // and a dialog may open late: dismissed until none is left 1.5 s after the last one
  for (let i = 0; i < 4; i++) {
    await page.waitForTimeout(1500);
    if (!(await page.locator(DIALOGS).count())) break;
    await dismiss(page);
  }
  result.frontendVersion = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ ?? null);
  await page.evaluate(async (on) => {
    await window.comfyAPI.app.app.extensionManager.setting.set("Comfy.VueNodes.Enabled", on);
  }, vue);
  await page.waitForTimeout(1000);
  result.vueSetting = await page.evaluate(() => window.comfyAPI.app.app.extensionManager.setting.get("Comfy.VueNodes.Enabled"));

  // 0. the GEMM-path panel's tab
  const tab = page.locator('button[aria-label*="GEMM path"]').first();
  if (await tab.count()) {
    await dismiss(page);
    await tab.click();
    await page.waitForSelector('[data-testid="ig4i8-banner"]', { timeout: 30000 });
    await page.waitForTimeout(500);
    result.panel = await page.evaluate((rectOfSrc) => {
      const rectOf = eval(rectOfSrc);
      const banner = document.querySelector('[data-testid="ig4i8-banner"]');
      return { banner: rectOf(banner), text: banner?.textContent ?? null, viewport: [innerWidth, innerHeight] };
    }, rectOf.toString());
    await shoot(page, `${out}-panel.png`);
    await tab.click();
    await page.waitForTimeout(500);
  }

  // 1. the sampler's custom-only widgets
  const id = await page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    app.graph.clear();
    const node = window.LiteGraph.createNode("Ideogram4Int8Sampler");
    node.pos = [200, 150];
    app.graph.add(node);
    app.canvas.ds.offset = [0, 0];
    app.canvas.ds.scale = 1;
    app.graph.setDirtyCanvas(true, true);
    return node.id;
  });
  await page.waitForTimeout(1200);
  result.samplerNamed = await shown(page, id);
  await shoot(page, `${out}-sampler-named.png`);
  await page.evaluate((id) => {
    const node = window.comfyAPI.app.app.graph.getNodeById(id);
    const w = node.widgets.find((x) => x.name === "preset");
    w.value = "custom";
    w.callback?.("custom");
    window.comfyAPI.app.app.graph.setDirtyCanvas(true, true);
  }, id);
  await page.waitForTimeout(1200);
  result.samplerCustom = await shown(page, id);
  await shoot(page, `${out}-sampler-custom.png`);

  // 2. the workflows
  for (const file of workflows) {
    const name = basename(file, ".json");
    const wf = JSON.parse(readFileSync(file, "utf8"));
    await page.evaluate(async (wf) => {
      await window.comfyAPI.app.app.loadGraphData(wf, true, true, null);
    }, wf);
    await page.waitForTimeout(2500);
    await dismiss(page);
    const rects = await page.evaluate((vue) => {
      const app = window.comfyAPI.app.app;
      const out = {};
      for (const node of app.graph.nodes) {
        if (vue) {
          const r = document.querySelector(`[data-node-id="${node.id}"]`)?.getBoundingClientRect();
          if (r) out[`${node.id} ${node.type}`] = [r.x, r.y, r.width, r.height];
        } else {
          const b = new Float32Array(4);
          node.getBounding(b);
          const [x, y] = app.canvas.ds.convertOffsetToCanvas([b[0], b[1]]);
          const s = app.canvas.ds.scale;
          out[`${node.id} ${node.type}`] = [x, y, b[2] * s, b[3] * s];
        }
      }
      return out;
    }, vue);
    const keys = Object.keys(rects);
    const overlaps = [];
    for (const [i, a] of keys.entries()) {
      for (const b of keys.slice(i + 1)) {
        const [ra, rb] = [rects[a], rects[b]];
        const dx = Math.min(ra[0] + ra[2], rb[0] + rb[2]) - Math.max(ra[0], rb[0]);
        const dy = Math.min(ra[1] + ra[3], rb[1] + rb[3]) - Math.max(ra[1], rb[1]);
        if (dx > 1 && dy > 1) overlaps.push(`${a} / ${b}: ${Math.round(dx)}x${Math.round(dy)} px`);
      }
    }
    const editor = await page.evaluate(([vue, rectOfSrc]) => {
      const rectOf = eval(rectOfSrc);
      const app = window.comfyAPI.app.app;
      const node = app.graph.nodes.find((n) => (n.comfyClass ?? n.type) === "Ideogram4Int8LayoutBoxes");
      if (!node) return null;
      const packEditors = document.querySelectorAll('[data-testid="ideogram4-layout-editor"]');
      if (vue) {
        const el = document.querySelector(`[data-node-id="${node.id}"]`);
        const widget = [...(el?.querySelectorAll('[data-testid="node-widget"]') ?? [])]
          .find((w) => /Clear all/.test(w.innerText));
        return { node: rectOf(el), editor: rectOf(widget), text: widget?.innerText ?? "", packEditors: packEditors.length };
      }
      const b = new Float32Array(4);
      node.getBounding(b);
      const [x, y] = app.canvas.ds.convertOffsetToCanvas([b[0], b[1]]);
      const s = app.canvas.ds.scale;
      const canvasBox = app.canvas.canvas.getBoundingClientRect();
      const editor = packEditors[0];
      return { node: [x + canvasBox.x, y + canvasBox.y, b[2] * s, b[3] * s], editor: rectOf(editor),
               text: editor?.innerText ?? "", packEditors: packEditors.length };
    }, [vue, rectOf.toString()]);
    if (editor) result.editors[name] = editor;
    await shoot(page, `${out}-${name}.png`);
    result.workflows[name] = { nodes: keys.length, overlaps };
  }
} catch (err) {
  result.error = String(err?.stack ?? err);
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(result));
