// The Layout Boxes editor in a real ComfyUI frontend (driven by tests/browser/test_layout_editor_browser.py).
//
//   node tests/browser/layout_editor_shots.mjs <base-url> <out-prefix> <workflow.json>
//
// Loads the workflow (the captions example), shows its Layout Boxes node at 100 % zoom and shoots it
// (<out>01-editor.png), clicks the first box (<out>02-after-click-text.png), then the second (<out>03-after-click-obj
// .png), measuring the editor, its canvas and its fields each time; then selects the node and opens the frontend's
// properties panel (<out>04-properties-panel.png) and reads what it lists. Prints one JSON line.
// Needs playwright-core importable (NODE_PATH) and Debian's chromium (CHROMIUM, default /usr/bin/chromium); it never
// downloads a browser.
import { createRequire } from "node:module";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const [base, out, workflowPath] = process.argv.slice(2);
if (!base || !out || !workflowPath) {
  console.error("usage: layout_editor_shots.mjs <base-url> <out-prefix> <workflow.json>");
  process.exit(2);
}
const LAYOUT = "Ideogram4Int8LayoutBoxes";

const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "ig4i8-editor-")), {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1500, height: 950 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const result = { consoleErrors: [], shots: [], states: {} };

// Where everything of the editor is on the screen, and what it shows.
function measureInPage(type) {
  const app = window.comfyAPI.app.app;
  const node = app.graph.nodes.find((n) => n.type === type);
  const root = document.querySelector('[data-testid="ideogram4-layout-editor"]');
  const rect = (e) => {
    const r = e.getBoundingClientRect();
    return [r.x, r.y, r.width, r.height].map((v) => Math.round(v * 10) / 10);
  };
  const canvas = root.querySelector("canvas");
  const [text, desc] = root.querySelectorAll("textarea");
  const scale = app.canvas.ds.scale;
  const box = app.canvas.canvas.getBoundingClientRect();
  return {
    nodeScreen: [box.left + (node.pos[0] + app.canvas.ds.offset[0]) * scale,
                 box.top + (node.pos[1] + app.canvas.ds.offset[1]) * scale, node.size[0] * scale,
                 node.size[1] * scale].map((v) => Math.round(v * 10) / 10),
    nodeSize: [...node.size],
    editor: rect(root),
    stage: rect(canvas.parentElement),
    canvas: rect(canvas),
    text: rect(text),
    desc: rect(desc),
    info: root.lastElementChild.textContent,
    textValue: text.value,
    descValue: desc.value,
    typeButton: root.querySelector("button").textContent,
    boxes: node.widgets.find((w) => w.name === "boxes").value,
    dims: [node.widgets.find((w) => w.name === "width").value, node.widgets.find((w) => w.name === "height").value],
  };
}

async function shoot(page, name, clip) {
  const path = `${out}${name}.png`;
  await page.screenshot(clip ? { path, clip } : { path });
  result.shots.push(path);
}

const around = (m) => ({ x: Math.max(0, m.nodeScreen[0] - 40), y: Math.max(0, m.nodeScreen[1] - 60),
                         width: Math.min(1500 - Math.max(0, m.nodeScreen[0] - 40), m.nodeScreen[2] + 80),
                         height: Math.min(950 - Math.max(0, m.nodeScreen[1] - 60), m.nodeScreen[3] + 100) });

// Click the middle of drawn box `i` (its place on the editor's canvas, from the widget value).
async function clickBox(page, m, i) {
  const b = m.boxes[i];
  const [W, H] = m.dims;
  const [cx, cy, cw, ch] = m.canvas;
  await page.mouse.click(cx + ((b.x + b.width / 2) / W) * cw, cy + ((b.y + b.height / 2) / H) * ch);
  await page.waitForTimeout(800);
}

try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  page.on("console", (msg) => {
    if (msg.type() === "error") result.consoleErrors.push(`${msg.text()} ${msg.location().url}`);
  });
  page.on("pageerror", (err) => result.consoleErrors.push(`pageerror: ${err}`));
  await page.goto(base, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.LiteGraph, null, { timeout: 120000 });
  await page.waitForTimeout(3000);
  for (let i = 0; i < 3 && (await page.locator("[role=dialog]").count()); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(500);
  }
  const workflow = JSON.parse(readFileSync(workflowPath, "utf8"));
  await page.evaluate(async (wf) => window.comfyAPI.app.app.loadGraphData(wf, true, true, null), workflow);
  await page.waitForTimeout(1500);
  await page.evaluate((type) => {
    const app = window.comfyAPI.app.app;
    const node = app.graph.nodes.find((n) => n.type === type);
    app.canvas.ds.scale = 1;
    app.canvas.ds.offset = [-node.pos[0] + 420, -node.pos[1] + 110];
    app.canvas.setDirty(true, true);
  }, LAYOUT);
  await page.waitForTimeout(1000);
  result.states.before = await page.evaluate(measureInPage, LAYOUT);
  await shoot(page, "01-editor", around(result.states.before));
  await clickBox(page, result.states.before, 0);
  result.states.afterText = await page.evaluate(measureInPage, LAYOUT);
  await shoot(page, "02-after-click-text", around(result.states.afterText));
  await clickBox(page, result.states.afterText, 1);
  result.states.afterObj = await page.evaluate(measureInPage, LAYOUT);
  await shoot(page, "03-after-click-obj", around(result.states.afterObj));

  // the frontend's properties panel for the selected node: what it lists
  await page.evaluate((type) => {
    const app = window.comfyAPI.app.app;
    app.canvas.selectNode(app.graph.nodes.find((n) => n.type === type));
  }, LAYOUT);
  const before = await page.evaluate(() => document.body.innerText);
  const toggle = page.getByRole("button", { name: "Toggle properties panel" });
  const opened = page.getByText("Parameters", { exact: true }).first();
  for (let attempt = 0; attempt < 3 && !(await opened.isVisible()); attempt++) {
    await toggle.click();
    await opened.waitFor({ state: "visible", timeout: 5000 }).catch(() => {});
  }
  await page.waitForTimeout(800);
  const after = await page.evaluate(() => document.body.innerText);
  result.panelOpened = after !== before;
  // the panel is the part of the page right of the canvas's middle that appeared with it
  result.panelText = await page.evaluate(() => {
    const leaves = [...document.querySelectorAll("body *")].filter((e) => e.children.length === 0 && e.offsetParent &&
      e.getBoundingClientRect().left > window.innerWidth * 0.6 && e.textContent.trim());
    return leaves.map((e) => e.textContent.trim());
  });
  result.domMentionsOurWidgets = await page.evaluate(() =>
    [...document.querySelectorAll("body *")].filter((e) => e.children.length === 0 &&
      /ideogram4_(layout|report)/.test(e.textContent)).map((e) => e.textContent.trim().slice(0, 80)));
  await shoot(page, "04-properties-panel");
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
