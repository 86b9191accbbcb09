// What the browser scripts here share: Debian's chromium through playwright-core, and a ComfyUI page opened and
// settled (the app up, the default workflow loaded, the welcome dialogs closed).
import { createRequire } from "node:module";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

// Headless chromium (CHROMIUM, else /usr/bin/chromium) on a new empty profile folder named <prefix>*: playwright
// wants the profile folder as an argument rather than --user-data-dir. Returns { browser, profile }.
export async function launchChromium(prefix) {
  const profile = mkdtempSync(join(tmpdir(), prefix));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    viewport: { width: 1500, height: 950 },
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync",
    ],
  });
  return { browser, profile };
}

// The page's console errors and uncaught exceptions, appended to `errors`.
export function collectErrors(page, errors) {
  page.on("console", (msg) => {
    if (msg.type() === "error") errors.push(msg.text());
  });
  page.on("pageerror", (err) => errors.push(String(err)));
}

// Open ComfyUI at `base` and wait until `ready()` holds in the page; then wait for the default workflow (so that
// clearing the graph afterwards is not undone by it loading late) and close whatever dialog a fresh profile opens
// (templates / welcome).
export async function openComfy(page, base, ready) {
  await page.goto(base, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(ready, null, { timeout: 120000 });
  await page.waitForFunction(() => window.comfyAPI.app.app.graph.nodes?.length > 0, null, { timeout: 60000 }).catch(() => {});
  await page.waitForTimeout(1500);
  for (let i = 0; i < 3 && (await page.locator('[data-testid="dialog-overlay"]').count()); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(500);
  }
}
