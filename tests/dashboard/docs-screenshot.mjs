// Makes docs/dashboard.png: a service with machines in every state, as an operator sees it.
// Not a test (the test is dashboard.test.mjs); run by hand against a fresh service started as
//   provisioner serve --config retry0.toml --sim-start-latency 4s --sim-start-failures 2
// (retry0.toml: `[retry]` `count = 0`), then
//   DASHBOARD_URL=http://127.0.0.1:PORT PROVISIONER_TOKEN=... node docs-screenshot.mjs ../../docs/dashboard.png
import { chromium } from 'playwright-core';

const url = process.env.DASHBOARD_URL;
const token = process.env.PROVISIONER_TOKEN;
const out = process.argv[2] || 'dashboard.png';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const add = (count, constraints) => fetch(`${url}/v1/machines`, {
  method: 'POST',
  headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
  body: JSON.stringify(constraints ? { count, constraints } : { count }),
});

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--disable-dev-shm-usage', '--disable-gpu', '--disable-quic', '--disable-background-networking',
    ...(process.getuid() === 0 ? ['--no-sandbox'] : [])],
});
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  await page.goto(`${url}/`);
  await page.fill('#login-token', token);
  await page.click('#login-button');
  await page.locator('#conn.live').waitFor();
  await add(8);
  await sleep(11_000);
  await add(9, 'cores=2 mem=8G');
  await sleep(11_000);
  await add(10, 'zones=az1,az2');
  await sleep(1_500);
  await page.screenshot({ path: out });
} finally {
  await browser.close();
}
