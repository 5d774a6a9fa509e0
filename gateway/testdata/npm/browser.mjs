// Opens the gateway's demo page in headless Chromium, chats over the websocket and
// opens a token's trace. Run by the Go test TestDemoPageInChromium, which passes
// TROUPE_BASE_URL, TROUPE_API_KEY, TROUPE_CHROMIUM and optionally TROUPE_SCREENSHOT.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

// within rejects when promise has not settled in ms, naming what it waited for,
// so a page that stops short fails the test with a reason instead of hanging it.
const within = (promise, ms, what) => Promise.race([promise, new Promise((_, reject) =>
  setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms).unref())]);

// step notes on stderr how far the script got; the Go test prints it when the
// script fails.
const started = Date.now();
const step = (what) => process.stderr.write(`${((Date.now() - started) / 1000).toFixed(1)}s ${what}\n`);

const profile = mkdtempSync(join(tmpdir(), "troupe-chromium-"));
step("launching Chromium");
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.TROUPE_CHROMIUM,
  headless: true,
  timeout: 60000,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run"],
});
const result = {};
try {
  const page = context.pages()[0] ?? (await context.newPage());
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  step("opening the page");
  await page.goto(process.env.TROUPE_BASE_URL + "/?api_key=" + encodeURIComponent(process.env.TROUPE_API_KEY));
  await page.waitForFunction(() => document.getElementById("status").textContent === "connected");
  await page.waitForFunction(() => document.querySelectorAll("#model option").length > 0);
  step("connected; sending a prompt");
  await page.fill("#prompt", "Hello from the browser");
  // Tokens arrive one by one: see a partial message first, then the whole of it.
  // The page counts them on the DOM change that reaches three (an observer set
  // up before sending), so a slow test process does not count tokens that
  // arrived after that.
  const partial = page.evaluate(() => new Promise((resolve) => {
    const count = () => document.querySelectorAll(".msg.assistant a.tok").length;
    if (count() >= 3) return resolve(count());
    const obs = new MutationObserver(() => {
      const n = count();
      if (n >= 3) {
        obs.disconnect();
        resolve(n);
      }
    });
    obs.observe(document.body, { childList: true, subtree: true });
  }));
  await page.click("#send");
  result.partialTokens = await within(partial, 30000, "three streamed tokens");
  step("tokens streaming; waiting for the end");
  await page.waitForFunction(() => !document.getElementById("send").disabled, null, { timeout: 30000 });
  result.tokens = await page.locator(".msg.assistant a.tok").count();
  result.text = await page.locator(".msg.assistant .body").innerText();
  result.ttft = await page.locator("#ttft").innerText();
  result.itl = await page.locator("#itl").innerText();
  result.tps = await page.locator("#tps").innerText();
  result.tokenTitle = await page.locator(".msg.assistant a.tok").nth(2).getAttribute("title");
  result.traceHref = await page.locator(".msg.assistant a.tok").first().getAttribute("href");
  step("opening a token's trace");
  await page.locator(".msg.assistant a.tok").first().click();
  await page.waitForSelector("#waterfall .row.span");
  result.spans = await page.locator("#waterfall .row.span").count();
  result.spanNames = await page.locator("#waterfall .row.span .name").allInnerTexts();
  if (process.env.TROUPE_SCREENSHOT) await page.screenshot({ path: process.env.TROUPE_SCREENSHOT, fullPage: true });
  result.errors = errors;
} finally {
  step("closing Chromium");
  // A browser slow to close does not hold the result back: the Go test kills
  // what the script leaves running.
  await within(context.close(), 20000, "Chromium to close").catch((e) => step(String(e)));
  rmSync(profile, { recursive: true, force: true });
}
process.stdout.write(JSON.stringify(result) + "\n", () => process.exit(0));
