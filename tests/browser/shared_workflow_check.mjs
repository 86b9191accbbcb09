// A shared workflow opened in a ComfyUI without this pack: which pack the frontend says its missing nodes come from.
//
//   node tests/browser/shared_workflow_check.mjs <base-url> <shots-dir> <workflow.json> [<workflow.json> ...]
//
// Loads each file as a user opens a shared workflow, opens the frontend's error panel ("Missing Node Packs", where it
// groups the missing nodes by their cnr_id property and offers the pack for install through ComfyUI-Manager) and
// prints one JSON line: [{file, panel}] with the panel's text. Needs playwright-core (NODE_PATH) and Debian's
// chromium (CHROMIUM); it never downloads a browser.
import { readFileSync } from "node:fs";
import { basename, join } from "node:path";
import { launchChromium, openComfy } from "./comfy_page.mjs";

const [base, shots, ...files] = process.argv.slice(2);
if (!base || !shots || !files.length) {
  console.error("usage: shared_workflow_check.mjs <base-url> <shots-dir> <workflow.json> [<workflow.json> ...]");
  process.exit(2);
}
const { browser } = await launchChromium("ig4i8-shared-");
const results = [];
try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  await openComfy(page, base, () => window.comfyAPI?.app?.app?.graph && window.LiteGraph);
  for (const file of files) {
    const workflow = JSON.parse(readFileSync(file, "utf8"));
    await page.evaluate(async (wf) => window.comfyAPI.app.app.loadGraphData(wf, true, true, "shared"), workflow);
    await page.waitForTimeout(3000);
    const details = page.getByRole("button", { name: "View details" });
    if (await details.count()) {
      await details.first().click();
      await page.waitForTimeout(1500);
    }
    const panel = await page.evaluate(() => {
      const text = document.body.innerText;
      const at = text.indexOf("Missing Node Packs");
      return at < 0 ? "" : text.slice(at, at + 800);
    });
    await page.screenshot({ path: join(shots, `shared-${basename(file, ".json")}.png`) });
    results.push({ file: basename(file), panel });
    await page.keyboard.press("Escape");
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(results));
