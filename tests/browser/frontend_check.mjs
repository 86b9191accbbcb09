// The pack's frontend pieces in one ComfyUI frontend build (driven by tests/browser/test_frontend_browser.py, which runs it
// against the frontend ComfyUI 0.33 pins and against the newest comfyui-frontend-package).
//
//   node tests/browser/frontend_check.mjs <base-url> <out-prefix>
//
// Needs playwright-core importable (NODE_PATH) and Debian's chromium (/usr/bin/chromium, or CHROMIUM); it never
// downloads a browser. On the classic canvas (the frontend's default) it
//   1. reads the frontend's version and opens the pack's "GEMM paths" sidebar tab (the idle banner);
//   2. adds an "Ideogram 4 Layout Boxes" node: the pack's box editor must appear on it;
//   3. draws a box with the mouse, switches it to a text element, types its text and description, and reads the
//      node's `boxes` widget value back (what the Python side receives);
//   4. shoots <out-prefix>-editor.png and <out-prefix>-panel.png.
// Prints one JSON line with what it saw, for the calling test to check.
import { rmSync } from "node:fs";
import { collectErrors, launchChromium, openComfy } from "./comfy_page.mjs";

const [base, out] = process.argv.slice(2);
if (!base || !out) {
  console.error("usage: frontend_check.mjs <base-url> <out-prefix>");
  process.exit(2);
}

const { browser, profile } = await launchChromium("ig4i8-fe-");
const result = { consoleErrors: [], shots: [] };

async function shot(page, name) {
  const path = `${out}-${name}.png`;
  await page.screenshot({ path });
  result.shots.push(path);
}

try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  collectErrors(page, result.consoleErrors);
  await openComfy(page, base, () => window.comfyAPI?.app?.app?.graph && window.LiteGraph);
  result.frontendVersion = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ ?? null);
  result.vueNodes = await page.evaluate(() => {
    try {
      return Boolean(window.comfyAPI.app.app.extensionManager?.setting?.get("Comfy.VueNodes.Enabled"));
    } catch {
      return null;
    }
  });

  // 1. the GEMM-path panel
  const tab = page.locator('button[aria-label*="GEMM path"]').first();
  result.panelTab = (await tab.count()) > 0;
  if (result.panelTab) {
    await tab.click();
    await page.waitForSelector('[data-testid="ig4i8-banner"]', { timeout: 30000 });
    await page.waitForTimeout(500);
    result.banner = await page.evaluate(() => {
      const b = document.querySelector('[data-testid="ig4i8-banner"]');
      return { severity: b?.dataset.severity ?? null, text: b?.textContent ?? null };
    });
    await shot(page, "panel");
    await tab.click(); // closed again: the editor gets the room
    await page.waitForTimeout(500);
  }

  // 2. the box editor on a new Layout Boxes node
  await page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    app.graph.clear();
    const node = window.LiteGraph.createNode("Ideogram4Int8LayoutBoxes");
    if (!node) throw new Error("Ideogram4Int8LayoutBoxes is not registered in this frontend");
    node.pos = [120, 120];
    app.graph.add(node);
    app.canvas.ds.offset = [0, 0];
    app.canvas.ds.scale = 1;
    app.graph.setDirtyCanvas(true, true);
  });
  const editor = page.locator('[data-testid="ideogram4-layout-editor"]');
  await editor.waitFor({ state: "visible", timeout: 30000 });
  await page.waitForTimeout(800);
  const canvas = editor.locator("canvas");
  const box = await canvas.boundingBox();
  result.editorCanvas = box && { width: Math.round(box.width), height: Math.round(box.height) };

  // 3. draw a box from 20% / 25% to 70% / 75% of the canvas, make it a text element, describe it
  const at = (fx, fy) => [box.x + fx * box.width, box.y + fy * box.height];
  await page.mouse.move(...at(0.2, 0.25));
  await page.mouse.down();
  for (const f of [0.3, 0.45, 0.6, 0.7]) await page.mouse.move(...at(f, 0.25 + f * 0.7), { steps: 2 });
  await page.mouse.move(...at(0.7, 0.75));
  await page.mouse.up();
  await page.waitForTimeout(300);
  await editor.locator("button", { hasText: "type" }).first().click();
  await editor.locator("textarea").nth(0).fill("OPEN");
  await editor.locator("textarea").nth(1).fill("gold serif letters on a dark sign");
  await page.waitForTimeout(600);
  result.boxes = await page.evaluate(() => {
    const node = window.comfyAPI.app.app.graph.nodes.find((n) => (n.comfyClass ?? n.type) === "Ideogram4Int8LayoutBoxes");
    return node.widgets.find((w) => w.name === "boxes")?.value ?? null;
  });
  result.info = await editor.locator("div").last().textContent();
  await shot(page, "editor");
} catch (err) {
  result.error = String(err?.stack ?? err);
  const page = browser.pages()[0];
  if (page) await page.screenshot({ path: `${out}-FAILED.png` }).catch(() => {});
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(result));
