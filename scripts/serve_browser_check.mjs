// Opens a running `sluice serve`'s dashboard in headless Chromium (Debian's `chromium`, driven
// by Playwright's `playwright-core`; both installed by scripts/fetch_serve_deps.sh, no browser
// download), sends one chat message, waits for the answer to stream in and for the per-token
// bars and the heatmap to be drawn, saves a screenshot and prints what it saw as one JSON
// object; the Rust test crates/cli/tests/serve.rs judges it.
//
//   node serve_browser_check.mjs BASE_URL PROMPT SCREENSHOT.png [CHROMIUM]
import { chromium } from "playwright-core";

const [base, prompt, shot, exe] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: exe || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"],
});
const out = { console_errors: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
  page.on("pageerror", (e) => out.console_errors.push(String(e)));
  // Only the server itself may be reached: a CDN would break offline use.
  const foreign = [];
  page.on("request", (r) => { if (!r.url().startsWith(base)) foreign.push(r.url()); });
  await page.goto(base + "/", { waitUntil: "load" });
  await page.waitForFunction(() => document.getElementById("state").textContent === "ready",
                             null, { timeout: 60000 });
  out.model = await page.textContent("#model");
  await page.fill("#maxtok", "24");
  await page.fill("#prompt", prompt);
  // Watch the answer grow while it streams: several distinct lengths mean it arrived in pieces.
  await page.evaluate(() => {
    window.answerLengths = [];
    new MutationObserver(() => {
      const a = document.getElementById("answer");
      if (a) window.answerLengths.push(a.textContent.length);
    }).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
  });
  await page.click("#send");
  await page.waitForFunction(() => {
    const a = document.getElementById("answer");
    return a && a.textContent.length > 0 && !document.getElementById("send").disabled;
  }, null, { timeout: 120000 });
  await page.waitForFunction(() => window.sluiceStats.bars > 0 && window.sluiceStats.heatCells > 0,
                             null, { timeout: 30000 });
  out.answer = await page.textContent("#answer");
  out.answer_lengths = [...new Set(await page.evaluate(() => window.answerLengths))].length;
  out.stats = await page.evaluate(() => ({ ...window.sluiceStats }));
  out.toks = await page.textContent("#toks");
  out.hit = await page.textContent("#hit");
  out.mib = await page.textContent("#mib");
  out.config_rows = await page.evaluate(() => document.querySelectorAll("#config tr").length);
  // The canvases hold drawn pixels (not blank).
  out.painted = await page.evaluate(() => ["bars", "heat"].map((id) => {
    const c = document.getElementById(id);
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
    return n;
  }));
  out.foreign_requests = foreign;
  await page.screenshot({ path: shot, fullPage: true });
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
