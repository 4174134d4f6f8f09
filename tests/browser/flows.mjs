// The console's and GraphiQL's flows in Debian's headless Chromium, driven by playwright-core.
// Started by tests/it/console.rs inside a network namespace that has only loopback: this script
// first proves that nothing else is reachable, then listens on 127.0.0.1:LEDGER_PORT and pipes
// each connection to LEDGER_SOCKET (a unix socket the test bridges to the real `ledger serve`),
// so the browser reaches the ledger at its own origin and nothing else at all.
// Every flow saves a screenshot in OUT_DIR. Any failure exits non-zero with the reason.
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const env = (name) => {
  const v = process.env[name];
  if (!v) { throw new Error(`${name} is not set`); }
  return v;
};
const SOCKET = env("LEDGER_SOCKET");
const PORT = Number(env("LEDGER_PORT"));
const ADMIN = env("ADMIN_TOKEN");
const USER = env("USER_TOKEN");
const OUT = env("OUT_DIR");
const PROFILE = env("PROFILE_DIR");
const STUCK = env("STUCK_REQ_ID");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const BASE = `http://127.0.0.1:${PORT}`;
const ORIGIN = new URL(BASE).origin;

function log(...args) { console.log("[browser]", ...args); }

/** Only loopback, and an outside address refuses at once: the browser has no route out. */
async function proveIsolation() {
  const names = Object.keys(os.networkInterfaces());
  if (names.some((n) => n !== "lo")) {
    throw new Error(`the namespace has interfaces other than lo: ${names.join(", ")}`);
  }
  for (const host of ["1.1.1.1", "8.8.8.8", "2606:4700:4700::1111"]) {
    const outcome = await new Promise((resolve) => {
      const s = net.connect({ host, port: 443, timeout: 3000 });
      s.on("connect", () => { s.destroy(); resolve("connected"); });
      s.on("timeout", () => { s.destroy(); resolve("timeout"); });
      s.on("error", (e) => resolve(e.code));
    });
    if (outcome === "connected") { throw new Error(`${host}:443 is reachable from the browser's namespace`); }
    log(`no route to ${host}: ${outcome}`);
  }
  return names;
}

function bridge() {
  const server = net.createServer((client) => {
    const upstream = net.connect(SOCKET);
    client.pipe(upstream).pipe(client);
    const close = () => { client.destroy(); upstream.destroy(); };
    client.on("error", close);
    upstream.on("error", close);
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(PORT, "127.0.0.1", () => resolve(server));
  });
}

async function apiTransfer(amount) {
  const res = await fetch(`${BASE}/api/v1/internal_transfer`, {
    method: "POST",
    headers: { Authorization: `Bearer ${USER}`, "Content-Type": "application/json" },
    body: JSON.stringify({ from: "FUNDING", to: "SPOT", asset: "USDT", amount }),
  });
  const body = await res.json();
  if (res.status !== 200 || body.state !== "COMMITTED") {
    throw new Error(`transfer through the API: ${res.status} ${JSON.stringify(body)}`);
  }
  return body.req_id;
}

async function shot(page, name) {
  const file = path.join(OUT, name);
  // A full-page capture of a scrolled page draws the sticky header over the middle.
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: file, fullPage: true });
  log(`screenshot ${file}`);
}

/** A marker set in the page: still there later means the page was never reloaded. */
async function mark(page) { await page.evaluate(() => { window.__noReload = true; }); }
async function assertNotReloaded(page) {
  if (!(await page.evaluate(() => window.__noReload === true))) { throw new Error("the page was reloaded"); }
}

async function userTokenRefused(page) {
  await page.goto(`${BASE}/console`);
  await page.fill("#token", USER);
  await page.click("#signin-button");
  const error = page.locator("#signin-error");
  await error.waitFor({ state: "visible" });
  const text = await error.innerText();
  if (!text.includes("FORBIDDEN") || !text.includes("403")) { throw new Error(`refusal shown: ${text}`); }
  if (await page.locator("#nav").isVisible()) { throw new Error("the console opened for a user token"); }
  const kept = await page.evaluate(() => sessionStorage.getItem("ledger.console.token"));
  if (kept !== null) { throw new Error("a refused token was kept"); }
  await shot(page, "01-user-token-refused.png");
}

async function signIn(page) {
  await page.fill("#token", ADMIN);
  await page.click("#signin-button");
  await page.locator("#nav").waitFor({ state: "visible" });
  await page.locator("h1", { hasText: "Overview" }).waitFor();
  const stored = await page.evaluate(() => ({ token: sessionStorage.getItem("ledger.console.token"),
    local: localStorage.length, cookie: document.cookie }));
  if (stored.token !== ADMIN) { throw new Error("the token is not in sessionStorage"); }
  if (stored.local !== 0 || stored.cookie !== "") { throw new Error(`token leaked to storage: ${JSON.stringify(stored)}`); }
  await page.locator("#app table").first().waitFor();
  await shot(page, "02-signed-in-overview.png");
}

async function liveTransfer(page) {
  await page.goto(`${BASE}/console#/overview`);
  await page.locator("h1", { hasText: "Overview" }).waitFor();
  await mark(page);
  const first = await apiTransfer("1.25");
  await page.locator(`#app tr[data-req-id="${first}"]`).first().waitFor({ timeout: 15000 });
  await assertNotReloaded(page);
  await shot(page, "03-overview-shows-new-transfer.png");
  await page.click('#nav a[data-page="feed"]');
  await page.locator(".live", { hasText: "streaming" }).waitFor({ timeout: 15000 });
  const second = await apiTransfer("2.5");
  await page.locator(`#feed-rows tr[data-req-id="${second}"]`).first().waitFor({ timeout: 15000 });
  await assertNotReloaded(page);
  await shot(page, "04-feed-shows-new-transfer.png");
}

async function stuckResolved(page) {
  await page.goto(`${BASE}/console#/overview?stuck_ms=5000`);
  await mark(page);
  const row = page.locator(`#stuck-table tr[data-req-id="${STUCK}"]`);
  await row.waitFor({ timeout: 30000 });
  // The ledger runs with MON-004 at 2 requests a minute: user 7's three transfers raised it.
  await page.locator("#alerts-table tr", { hasText: "MON-004" }).first().waitFor({ timeout: 15000 });
  await shot(page, "05-stuck-list-and-mon-004.png");
  await row.locator("a.id").click();
  await page.locator("#resolve-form").waitFor();
  await assertNotReloaded(page);
  const reason = "spot-core was down for maintenance; its journal has no deposit for this req_id";
  await page.check("#resolve-not-applied");
  await page.fill("#resolve-reason", reason);
  await shot(page, "06-resolve-form.png");
  await page.click("#resolve-submit");
  const box = page.locator("#resolution");
  await box.waitFor({ timeout: 20000 });
  const text = await box.innerText();
  if (!text.includes("admin:1") || !text.includes(reason) || !text.includes("NOT_APPLIED")) {
    throw new Error(`the timeline's resolution reads: ${text}`);
  }
  await page.locator("#timeline li", { hasText: "TransferManuallyResolved" }).waitFor();
  await shot(page, "07-timeline-resolved.png");
}

async function graphiql(page) {
  await page.goto(`${BASE}/graphql`);
  await page.locator(".graphiql-container").waitFor({ timeout: 20000 });
  await page.locator(".graphiql-execute-button").click();
  const result = page.locator(".result-window");
  await result.filter({ hasText: "stateCounts" }).waitFor({ timeout: 20000 });
  const text = await result.innerText();
  if (!text.includes("COMMITTED") || text.includes("\"errors\"")) { throw new Error(`GraphiQL's result: ${text.slice(0, 500)}`); }
  await shot(page, "08-graphiql-query.png");
  // The documentation explorer reads the schema by GraphiQL's own introspection query.
  await page.getByRole("button", { name: "Show Documentation Explorer" }).click();
  const docs = page.locator(".graphiql-doc-explorer");
  await docs.filter({ hasText: "QueryRoot" }).waitFor({ timeout: 20000 });
  await docs.getByText("QueryRoot").first().click();
  await docs.filter({ hasText: "stateCounts" }).waitFor({ timeout: 20000 });
  await shot(page, "08b-graphiql-docs.png");
}

/** The other pages an operator uses: transfers with a filter, a user, the full check and its stored report, assets. */
async function operatorPages(page) {
  await page.goto(`${BASE}/console#/transfers?user_id=7`);
  await page.locator("table.transfers").waitFor();
  await shot(page, "09-transfers-filtered.png");
  await page.goto(`${BASE}/console#/user/7`);
  await page.locator("h2", { hasText: "Balances" }).waitFor();
  await page.locator("table").first().waitFor();
  await shot(page, "10-user.png");
  await page.goto(`${BASE}/console#/invariant`);
  await page.click("#run-full");
  await page.locator("#invariant-assets").waitFor({ timeout: 30000 });
  const verdict = await page.locator(".pill", { hasText: "money is conserved" }).count();
  if (verdict !== 1) { throw new Error("the full check did not report conservation"); }
  await page.locator("#invariant-history").waitFor({ timeout: 10000 });
  await shot(page, "11-conservation-full-check.png");
  // The history links each check to its full report, stored when it ran.
  await page.locator("#invariant-history a.report-link").first().click();
  await page.locator("#check-report #invariant-assets td", { hasText: "USDT" }).waitFor({ timeout: 10000 });
  const stored = await page.locator("#check-report .pill", { hasText: "money is conserved" }).count();
  if (stored !== 1) { throw new Error("the stored full report does not show conservation"); }
  await page.goto(`${BASE}/console#/assets`);
  const btc = page.locator('#assets-table tr[data-asset="BTC"]');
  await btc.waitFor();
  await btc.locator('select[name="status"]').selectOption("SUSPENDED");
  await btc.locator("button", { hasText: "Save" }).click();
  await btc.locator(".pill", { hasText: "SUSPENDED" }).waitFor({ timeout: 10000 });
  await shot(page, "12-assets-btc-suspended.png");
}

async function main() {
  fs.mkdirSync(OUT, { recursive: true });
  const interfaces = await proveIsolation();
  const server = await bridge();
  log(`bridge on ${BASE} -> ${SOCKET}; interfaces: ${interfaces.join(", ")}`);
  const browser = await chromium.launchPersistentContext(PROFILE, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1440, height: 900 },
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--no-first-run", "--disable-default-apps", "--disable-extensions"],
  });
  const requests = [];
  const problems = [];
  browser.on("request", (r) => requests.push(r.url()));
  const page = browser.pages()[0] || await browser.newPage();
  page.on("websocket", (ws) => requests.push(ws.url()));
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && !/status of 40[134]/.test(m.text())) { problems.push(`console error: ${m.text()}`); }
  });
  const flows = [["user token refused", userTokenRefused], ["sign in", signIn], ["live transfer", liveTransfer],
    ["stuck transfer resolved", stuckResolved], ["operator pages", operatorPages], ["graphiql query", graphiql]];
  const failed = [];
  for (const [name, flow] of flows) {
    try {
      await flow(page);
      log(`PASS ${name}`);
    } catch (e) {
      failed.push(name);
      log(`FAIL ${name}: ${e.stack || e}`);
      await shot(page, `failed-${name.replace(/ /g, "-")}.png`).catch(() => {});
    }
  }
  await browser.close();
  server.close();
  const elsewhere = requests.filter((u) => !u.startsWith("data:") && new URL(u.replace(/^ws/, "http")).origin !== ORIGIN);
  log(`${requests.length} requests, all to ${ORIGIN}: ${elsewhere.length === 0}`);
  if (elsewhere.length) { failed.push("requests to another origin"); log("elsewhere:", elsewhere.join("\n")); }
  if (problems.length) { failed.push("page errors"); log("problems:\n" + problems.join("\n")); }
  fs.writeFileSync(path.join(OUT, "requests.txt"), requests.join("\n") + "\n");
  if (failed.length) { log(`FAILED: ${failed.join(", ")}`); process.exit(1); }
  log(`all ${flows.length} flows passed`);
}

main().catch((e) => { console.error("[browser] cannot run:", e.stack || e); process.exit(2); });
