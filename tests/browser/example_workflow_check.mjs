// Opens each example workflow the way a user does — Templates dialog, the pack's category, the workflow's card —
// in a real ComfyUI frontend, and reports what the frontend made of it; takes a screenshot of each.
//
//   node tests/browser/example_workflow_check.mjs <base-url> <shots-dir> <pack-folder-name> <category> <title> ...
//
// <category>: the label the dialog's sidebar shows for the pack's folder (its locale names it); <title>: a template's
// file name, which the dialog shows as the card's title.
// Reported per workflow (one JSON line on stdout, for tests/comfyui/test_example_workflows_comfyui.py to check):
//   listed          the card was in the pack's template category, with its title on one line (not cut)
//   nodes           node count after loading; missingTypes: node types the frontend does not know
//   widgetProblems  widgets whose value differs from the file's (by name), or a combo value the combo does not
//                   offer, or a number outside the widget's min/max
//   errorNodes      nodes the frontend flagged (has_errors)
//   overlays        text of dialogs / error overlays / toasts that appeared after loading
//   view            the view it opened with: {scale, lowQuality (LiteGraph draws no node text), hidden: nodes whose
//                   title bar is off the canvas or under the frontend's own panels (sidebar, minimap, run bar),
//                   overlaps: pairs of nodes, or a node and a group it is not in, that overlap}
//   consoleProblems console errors and warnings logged while loading (request failures for optional files such as
//                   user.css are not counted)
// Needs playwright-core importable (NODE_PATH) and Debian's chromium (CHROMIUM, default /usr/bin/chromium); it never
// downloads a browser.
import { createRequire } from "node:module";
import { mkdirSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const [base, shots, packName, category, ...names] = process.argv.slice(2);
if (!base || !shots || !packName || !category || !names.length) {
  console.error("usage: example_workflow_check.mjs <base-url> <shots-dir> <pack-folder-name> <category> <title> ...");
  process.exit(2);
}
mkdirSync(shots, { recursive: true });

// request failures for files ComfyUI treats as optional (a user stylesheet, the user's settings/workflow index)
// and for the internet (no network here) are not problems of a workflow, nor are the frontend's own start-up notices
// (same on an empty graph); and the frontend's own bounding-box widget warns when it is created (ComfyUI's
// CreateBoundingBoxes does too)
const IGNORED = [/user\.css/, /\/api\/userdata/, /api\.comfy\.org/, /ERR_NAME_NOT_RESOLVED/, /ERR_INTERNET_DISCONNECTED/,
                 /legacy queue\/history menu/, /open_maskeditor is deprecated/, /graph accessed before initialization/,
                 /addWidget\(\.\.\.\) without a callback or property assigned/];

async function inspect([name, fileJson]) {
  const app = window.comfyAPI.app.app;
  const LG = window.LiteGraph;
  const nodes = app.graph.nodes;
  const missingTypes = nodes.filter((n) => !(n.type in LG.registered_node_types)).map((n) => n.type);
  const widgetProblems = [];
  const fileNodes = Object.fromEntries(fileJson.nodes.map((n) => [String(n.id), n]));
  for (const node of nodes) {
    const saved = fileNodes[String(node.id)];
    if (!saved) {
      widgetProblems.push(`node ${node.id} (${node.type}) is not in the file`);
      continue;
    }
    const named = saved.widgets_values_named ?? {};
    for (const w of node.widgets ?? []) {
      if (w.serialize === false) continue;
      const where = `${node.type} #${node.id} '${w.name}'`;
      if (!(w.name in named)) {
        widgetProblems.push(`${where}: not in the file`);
        continue;
      }
      if (JSON.stringify(w.value) !== JSON.stringify(named[w.name])) {
        widgetProblems.push(`${where}: ${JSON.stringify(w.value)} loaded, ${JSON.stringify(named[w.name])} in file`);
      }
      const values = w.options?.values;
      if (w.type === "combo" && Array.isArray(values) && !values.includes(w.value)) {
        widgetProblems.push(`${where}: ${JSON.stringify(w.value)} is not one of the combo's values`);
      }
      if (typeof w.value === "number") {
        const { min, max } = w.options ?? {};
        if ((min !== undefined && w.value < min) || (max !== undefined && w.value > max)) {
          widgetProblems.push(`${where}: ${w.value} outside [${min}, ${max}]`);
        }
      }
    }
  }
  const errorNodes = nodes.filter((n) => n.has_errors).map((n) => `${n.type} #${n.id}`);
  // the view as opened: readable, every node's title bar on the canvas and not under a panel of the frontend
  const ds = app.canvas.ds;
  const el = app.canvas.canvas;
  const box = el.getBoundingClientRect();
  const th = LG.NODE_TITLE_HEIGHT;
  const toScreen = (x, y) => [box.left + (x + ds.offset[0]) * ds.scale, box.top + (y + ds.offset[1]) * ds.scale];
  const hidden = [];
  for (const n of nodes) {
    const [x0, y0] = toScreen(n.pos[0], n.pos[1] - th);
    const [x1, y1] = toScreen(n.pos[0] + n.size[0], n.pos[1]);
    const ym = (y0 + y1) / 2;
    const probes = [x0 + 4, (x0 + x1) / 2, x1 - 4].map((px) => [px, ym]);
    const blocked = probes.filter(([px, py]) => {
      if (px < 0 || py < 0 || px >= window.innerWidth || py >= window.innerHeight) return true;
      const top = document.elementFromPoint(px, py);
      return top !== el;
    });
    if (blocked.length) hidden.push(`${n.type} #${n.id}`);
  }
  const rectOf = (n) => [n.pos[0], n.pos[1] - th, n.size[0], n.size[1] + th];
  const hit = (a, b) => a[0] < b[0] + b[2] && b[0] < a[0] + a[2] && a[1] < b[1] + b[3] && b[1] < a[1] + a[3];
  const overlaps = [];
  for (const [i, a] of nodes.entries()) {
    for (const b of nodes.slice(i + 1)) if (hit(rectOf(a), rectOf(b))) overlaps.push(`${a.type} #${a.id} / ${b.type} #${b.id}`);
    for (const g of app.graph.groups) {
      const inside = g.pos[0] <= a.pos[0] && g.pos[1] <= a.pos[1] - th && a.pos[0] + a.size[0] <= g.pos[0] + g.size[0] &&
        a.pos[1] + a.size[1] <= g.pos[1] + g.size[1];
      if (!inside && hit(rectOf(a), [g.pos[0], g.pos[1], g.size[0], g.size[1]])) overlaps.push(`${a.type} #${a.id} / group ${g.title}`);
    }
  }
  const view = { scale: Math.round(ds.scale * 1000) / 1000, lowQuality: Boolean(app.canvas.low_quality), hidden,
                 overlaps };
  const overlays = [...document.querySelectorAll('[role=dialog], [role=alertdialog], [role=alert], .p-toast-message')]
    .filter((e) => e.offsetParent !== null)
    .map((e) => e.innerText.slice(0, 300));
  // the frontend's error overlay ("N errors found", e.g. missing models) is a plain element
  const leaves = [...document.querySelectorAll("body *")].filter((e) => e.children.length === 0 && e.offsetParent);
  for (const e of leaves) {
    if (/\berrors? found\b/i.test(e.textContent)) overlays.push(e.textContent.trim());
  }
  return { name, nodes: nodes.length, links: app.graph.links?.size ?? Object.keys(app.graph.links ?? {}).length,
           missingTypes, widgetProblems, errorNodes, overlays, view, title: document.title };
}

const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "ig4i8-wfcheck-")), {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1600, height: 1000 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const results = [];
try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  let console_ = [];
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") console_.push(`${m.type()}: ${m.text()} ${m.location().url}`);
  });
  page.on("pageerror", (err) => console_.push(`pageerror: ${err}`));
  await page.goto(base, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.LiteGraph, null, { timeout: 120000 });
  await page.waitForTimeout(3000);
  for (const name of names) {
    // the Templates dialog, as from the sidebar's Templates button
    if (!(await page.locator("[role=dialog]").count())) {
      await page.evaluate(() => window.comfyAPI.app.app.extensionManager.command.execute("Comfy.BrowseTemplates"));
    }
    await page.getByText(category, { exact: true }).first().click({ timeout: 30000 });
    const card = page.locator(`[data-testid="template-workflow-${name}"]`);
    const listed = (await card.count()) > 0;
    if (listed) await page.screenshot({ path: join(shots, `templates-${packName}.png`) });
    // the card's title and the category's label, each on its line: cut (an ellipsis) where wider than their box
    const cut = listed
      ? await page.evaluate(([title, label]) => {
          const fits = (el) => el && el.scrollWidth <= el.clientWidth + 1;
          const h3 = [...document.querySelectorAll("h3")].find((h) => h.textContent.trim() === title);
          const nav = [...document.querySelectorAll("span, div")].find((e) => e.children.length === 0 && e.textContent.trim() === label);
          return [...(fits(h3) ? [] : [`title ${title}`]), ...(fits(nav) ? [] : [`category ${label}`])];
        }, [name, category])
      : [];
    if (!listed) {
      results.push({ name, listed });
      await page.keyboard.press("Escape");
      continue;
    }
    console_ = [];
    await card.first().click();
    await page.waitForFunction(() => !document.querySelector("[role=dialog]"), null, { timeout: 30000 });
    await page.waitForFunction(() => window.comfyAPI.app.app.graph.nodes.length > 0, null, { timeout: 30000 });
    await page.waitForTimeout(2500);
    const fileJson = await page.evaluate(async ([pack, n]) =>
      (await fetch(`/api/workflow_templates/${pack}/${encodeURIComponent(n)}.json`)).json(), [packName, name]);
    const r = await page.evaluate(inspect, [name, fileJson]);
    await page.screenshot({ path: join(shots, `${name}.png`) });
    // what the frontend says about errors, when it says anything (e.g. model files not installed)
    const details = page.getByRole("button", { name: "View details" });
    if (await details.count()) {
      await details.first().click();
      await page.waitForTimeout(1500);
      await page.screenshot({ path: join(shots, `${name}-errors.png`) });
      r.errorDetails = (await page.evaluate(() => document.body.innerText)).slice(0, 4000);
      await page.keyboard.press("Escape");
      await page.waitForTimeout(500);
    }
    // then each group at 100 % zoom, readable
    const groups = await page.evaluate(() => window.comfyAPI.app.app.graph.groups.map((g) => g.title));
    for (const [i, title] of groups.entries()) {
      await page.evaluate((t) => {
        const app = window.comfyAPI.app.app;
        const g = app.graph.groups.find((x) => x.title === t);
        app.canvas.ds.scale = 1;
        app.canvas.ds.offset = [-g.pos[0] + 100, -g.pos[1] + 90];
        app.canvas.setDirty(true, true);
      }, title);
      await page.waitForTimeout(400);
      await page.screenshot({ path: join(shots, `${name}-group${i + 1}.png`) });
    }
    await page.evaluate(() => {
      const app = window.comfyAPI.app.app;
      const note = app.graph.nodes.find((n) => n.type === "MarkdownNote" || n.type === "Note");
      if (!note) return;
      app.canvas.ds.scale = 1;
      app.canvas.ds.offset = [-note.pos[0] + 100, -note.pos[1] + 110];
      app.canvas.setDirty(true, true);
    });
    await page.waitForTimeout(400);
    await page.screenshot({ path: join(shots, `${name}-note.png`) });
    r.listed = listed;
    r.cut = cut;
    r.consoleProblems = console_.filter((line) => !IGNORED.some((re) => re.test(line)));
    results.push(r);
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(results));
