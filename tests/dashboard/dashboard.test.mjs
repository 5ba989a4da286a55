// The dashboard in a real browser: Playwright (playwright-core) driving Debian's chromium
// headless against the real `provisioner serve`, which this test starts on a free loopback
// port with a temporary data directory, a 300 ms start latency and one injected start failure
// (`--sim-start-failures 1` with `[retry] count = 0`: the first start ends in provisioning
// error).
//
// Log in (a wrong token first), add 5 machines through the page, watch them turn running
// without a reload (a marker set on `window` survives, and the page navigated once), retry
// the failed one, change the worker count, remove one and see it go; then restart the service
// while the page cannot reconnect, change the model behind its back, and see the page catch
// up once it reconnects. Every outcome is checked in the page and through the API. A
// screenshot is written to $DASHBOARD_SCREENSHOT. Run by .ci/dashboard:
//
//   PROVISIONER_BIN=target/debug/provisioner node --test tests/dashboard/dashboard.test.mjs
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { chromium } from 'playwright-core';

const bin = process.env.PROVISIONER_BIN;
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const screenshot = process.env.DASHBOARD_SCREENSHOT || 'dashboard.png';
// Every wait is bounded.
const WAIT = Number(process.env.DASHBOARD_WAIT_MS || 30_000);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const work = mkdtempSync(join(tmpdir(), 'provisioner-dashboard-'));
const data = join(work, 'data');
const log = join(work, 'serve.log');
let url = '';
let token = '';

async function freePort() {
  const s = createServer().listen(0, '127.0.0.1');
  await once(s, 'listening');
  const { port } = s.address();
  s.close();
  return port;
}

/** Starts `serve` on `port` and waits until /healthz answers 200. */
async function serve(port, extra) {
  writeFileSync(join(work, 'serve.toml'), '[retry]\ncount = 0\n');
  const child = spawn(bin, ['serve', '--config', join(work, 'serve.toml'), '--listen', `127.0.0.1:${port}`,
    '--data-dir', data, '--sim-start-latency', '300ms', ...extra], { stdio: ['ignore', 'ignore', openSync(log, 'a')] });
  const began = Date.now();
  for (;;) {
    assert.equal(child.exitCode, null, `serve exited:\n${readFileSync(log, 'utf8')}`);
    const ok = await fetch(`http://127.0.0.1:${port}/healthz`).then((r) => r.ok, () => false);
    if (ok) return child;
    assert.ok(Date.now() - began < WAIT, 'serve not ready');
    await sleep(50);
  }
}

/** SIGTERM, and its exit (bounded). */
async function stop(child) {
  if (child.exitCode !== null) return;
  const exited = once(child, 'exit');
  child.kill('SIGTERM');
  let timer;
  const late = new Promise((r) => { timer = setTimeout(() => r(['timeout']), WAIT); });
  const [code] = await Promise.race([exited, late]);
  clearTimeout(timer);
  assert.equal(code, 0, 'serve did not stop cleanly on SIGTERM');
}

async function api(method, path, body) {
  const res = await fetch(url + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(10_000),
  });
  const text = await res.text();
  assert.ok(res.ok, `${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/** Polls the API until `check` returns a truthy value (bounded). */
async function eventually(what, check) {
  const began = Date.now();
  let last;
  for (;;) {
    last = await check();
    if (last) return last;
    assert.ok(Date.now() - began < WAIT, `timed out waiting for ${what}`);
    await sleep(100);
  }
}

const text = (page, selector) => page.locator(selector).innerText();

let service = null;
let browser = null;
let port = 0;

before(async () => {
  assert.ok(bin, 'PROVISIONER_BIN must name the binary');
  port = await freePort();
  service = await serve(port, ['--sim-start-failures', '1']);
  url = `http://127.0.0.1:${port}`;
  token = readFileSync(join(data, 'token'), 'utf8').trim();
  browser = await chromium.launch({
    executablePath,
    headless: true,
    args: ['--disable-dev-shm-usage', '--disable-gpu', '--disable-quic', '--disable-background-networking',
      ...(process.getuid && process.getuid() === 0 ? ['--no-sandbox'] : [])],
  });
});

after(async () => {
  if (browser) await browser.close();
  if (service) await stop(service).catch(() => service.kill('SIGKILL'));
  rmSync(work, { recursive: true, force: true });
});

/** A new page in a context of its own (its own sessionStorage: no token yet). */
async function newPage() {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  page.setDefaultTimeout(WAIT);
  return page;
}

test('the dashboard drives the service live, without reloading', { timeout: 6 * WAIT }, async () => {
  try {
    const page = await newPage();
    const problems = [];
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    // Refused tokens (401) and the restart below (connections refused or aborted) are expected.
    page.on('console', (m) => {
      if (m.type() === 'error' && !/status of 401|net::ERR_/.test(m.text())) problems.push(`console: ${m.text()}`);
    });
    // Loopback only: any request elsewhere is a failure (and is not made).
    const outside = [];
    await page.route((u) => u.hostname !== new URL(url).hostname, (route) => {
      outside.push(route.request().url());
      return route.abort();
    });
    let navigations = 0;
    page.on('framenavigated', (frame) => {
      if (frame === page.mainFrame()) navigations += 1;
    });

    // The page is served without a token and asks for one; a wrong one is refused.
    const res = await page.goto(url + '/');
    assert.equal(res.status(), 200);
    assert.match(res.headers()['content-security-policy'], /default-src 'none'/);
    await page.locator('#login').waitFor({ state: 'visible' });
    await page.fill('#login-token', 'not-the-token');
    await page.click('#login-button');
    await page.waitForFunction(() => /refused the token/.test(document.getElementById('login-error').textContent));
    assert.ok(await page.locator('#login').isVisible(), 'a wrong token keeps the login open');
    await page.fill('#login-token', token);
    await page.click('#login-button');
    await page.locator('#login').waitFor({ state: 'hidden' });
    await page.locator('#conn.live').waitFor();
    await page.evaluate(() => { window.__dashboardMarker = 'still here'; });

    // Add 5 machines through the page.
    await page.fill('#add-count', '5');
    await page.fill('#add-constraints', 'cores=2');
    await page.click('#add-button');
    await page.waitForFunction(() => /^Added machines /.test(document.getElementById('feedback').textContent));
    const added = (await text(page, '#feedback')).replace(/^Added machines /, '').replace(/\.$/, '').split(', ');
    assert.equal(added.length, 5, `ids in the feedback: ${added}`);

    // They settle live: 4 running, and the first start refused (--sim-start-failures 1, no
    // retries) leaves one in error, listed with its message.
    await page.waitForFunction(() => document.getElementById('n-running').textContent === '4'
      && document.getElementById('n-error').textContent === '1');
    const failedRow = page.locator('#error-rows tr');
    assert.equal(await failedRow.count(), 1);
    const failed = await failedRow.getAttribute('data-machine');
    assert.ok(added.includes(failed), `${failed} is one of ${added}`);
    assert.match(await failedRow.innerText(), /simulated fault/);
    // The zone grid counts them: 4 running over the zones, 1 in error.
    assert.equal(await text(page, '#zone-grid tr.total td[data-phase="running"]'), '4');
    assert.equal(await text(page, '#zone-grid tr.total td[data-phase="error"]'), '1');
    // The API agrees.
    let machines = await api('GET', '/v1/machines');
    assert.equal(machines.length, 5);
    assert.deepEqual(machines.filter((m) => m.status === 'started').length, 4);
    const inError = machines.find((m) => m.id === failed);
    assert.equal(inError.instance_status, 'provisioning error', JSON.stringify(inError));
    assert.equal(inError.instance, null);

    // Retry it through the page: it is provisioned.
    await page.click(`#error-rows tr[data-machine="${failed}"] button[data-action="retry"]`);
    await page.waitForFunction(() => document.getElementById('n-running').textContent === '5'
      && document.getElementById('errors').hidden);
    await page.locator(`#machine-rows tr[data-machine="${failed}"][data-phase="running"]`).waitFor();
    machines = await eventually('5 machines started', async () => {
      const list = await api('GET', '/v1/machines');
      return list.filter((m) => m.status === 'started' && m.instance).length === 5 && list;
    });
    let instances = await api('GET', '/v1/instances');
    for (const m of machines) {
      assert.deepEqual(instances.filter((i) => i.machine === m.id).map((i) => i.id), [m.instance], `machine ${m.id}`);
    }
    assert.equal(await page.locator('#instance-rows tr[data-instance]').count(), 5);
    // Each machine's capacity: the default preference, on-demand (the simulated cloud runs what
    // is asked); none is in a spot hand-over.
    assert.ok((await page.locator('#machines thead th').allTextContents()).includes('capacity'));
    await page.waitForFunction((id) => document.querySelector(`#machine-rows tr[data-machine="${id}"] td.capacity`)
      ?.textContent === 'on-demand', failed);
    assert.equal(await page.locator('#machine-rows td.capacity').count(), 5);
    assert.equal(await page.locator('#machine-rows tr[data-handover]').count(), 0);

    // Issue 34: a machine whose constraints change to zones its instance is not in has drifted:
    // its health cell says so (and why, in its title); the others' are empty.
    assert.ok((await page.locator('#machines thead th').allTextContents()).includes('health'));
    assert.equal(await page.locator('#machine-rows td.health[data-drifted]').count(), 0);
    const moved = machines.find((m) => m.id !== failed);
    const elsewhere = (await api('GET', '/v1/status')).zones.find((z) => z !== moved.zone);
    await api('PUT', `/v1/machines/${moved.id}/constraints`, { constraints: `zones=${elsewhere}` });
    const cell = page.locator(`#machine-rows tr[data-machine="${moved.id}"] td.health[data-drifted]`);
    await cell.waitFor();
    assert.equal(await cell.innerText(), 'drifted: zone');
    assert.match(await cell.locator('.badge').getAttribute('title'), new RegExp(`zone ${moved.zone} is outside`));
    assert.equal(await page.locator('#machine-rows td.health[data-drifted]').count(), 1);
    assert.deepEqual((await api('GET', '/v1/drift')).map((d) => d.machine), [moved.id]);

    // The worker count, through the page.
    await page.fill('#workers-value', '8');
    await page.click('#workers-form button');
    await page.waitForFunction(() => document.getElementById('workers').textContent === '8');
    assert.deepEqual(await api('GET', '/v1/config/workers'), { key: 'workers', value: '8' });

    // Remove one (the button asks to be clicked again): it goes, and so does its instance.
    const gone = machines.find((m) => m.id !== failed);
    const remove = page.locator(`#machine-rows tr[data-machine="${gone.id}"] button[data-action="remove"]`);
    await remove.click();
    assert.equal(await remove.innerText(), 'Confirm');
    await remove.click();
    await page.locator(`#machine-rows tr[data-machine="${gone.id}"]`).waitFor({ state: 'detached' });
    await page.waitForFunction(() => document.getElementById('n-machines').textContent === '4');
    await eventually(`machine ${gone.id} removed and its instance stopped`, async () => {
      const [list, live] = await Promise.all([api('GET', '/v1/machines'), api('GET', '/v1/instances')]);
      return list.length === 4 && !list.some((m) => m.id === gone.id) && !live.some((i) => i.id === gone.instance);
    });
    await page.locator(`#instance-rows tr[data-instance="${gone.instance}"]`).waitFor({ state: 'detached' });
    instances = await api('GET', '/v1/instances');
    assert.equal(instances.length, 4);

    // The live parts: the events arrived on the stream, and the plot counted the starts.
    const log = await text(page, '#event-log');
    for (const name of ['machine-started', 'machine-failed', 'machine-removed', 'resized-worker-pool']) {
      assert.ok(log.includes(name), `${name} in the event log:\n${log}`);
    }
    assert.equal(await text(page, '#n-rate'), '5', 'five starts in the last minute');

    // A lost stream reconnects with backoff and refetches what it missed: the service restarts
    // (its streams end) while the page's reconnections are refused, a machine is added and
    // started through the API meanwhile, and once the page reconnects it shows it running
    // (The machine list is refused too, so that a refetch the page had scheduled before cannot
    // show it early.)
    await page.route('**/v1/events', (route) => route.abort());
    await page.route('**/v1/machines', (route) => route.abort());
    await stop(service);
    await page.locator('#conn.down').waitFor();
    service = await serve(port, []);
    const [late] = (await api('POST', '/v1/machines', { count: 1 })).ids;
    await eventually(`machine ${late} started`, async () =>
      (await api('GET', `/v1/machines/${late}`)).status === 'started');
    assert.equal(await page.locator(`#machine-rows tr[data-machine="${late}"]`).count(), 0, 'seen before reconnecting');
    await page.unroute('**/v1/machines');
    await page.unroute('**/v1/events');
    await page.locator('#conn.live').waitFor();
    await page.locator(`#machine-rows tr[data-machine="${late}"][data-phase="running"]`).waitFor();
    assert.equal(await text(page, '#n-machines'), '5');
    assert.match(await text(page, '#event-log'), /reconnected/);

    // All of it without a reload.
    assert.equal(await page.evaluate(() => window.__dashboardMarker), 'still here', 'the page was reloaded');
    assert.equal(navigations, 1, 'the page navigated more than once');
    assert.deepEqual(outside, [], 'requests outside the service');
    assert.deepEqual(problems, [], 'errors in the page');

    mkdirSync(dirname(screenshot), { recursive: true });
    await page.screenshot({ path: screenshot, fullPage: true });
  } catch (e) {
    console.error(`the service's log:\n${readFileSync(log, 'utf8').split('\n').slice(-40).join('\n')}`);
    throw e;
  }
});

// Replicas need PostgreSQL (feature `postgres`), which this run does not start: the status is
// the service's own, with the four fields a replica adds (names as in the CLI contract).
test('with replicas, the page shows the role, the leader and the epoch', { timeout: 2 * WAIT }, async () => {
  const page = await newPage();
  await page.route('**/v1/status', async (route) => {
    const res = await route.fetch();
    const status = { ...(await res.json()), role: 'follower', leader: 'db-1', epoch: 7, replica: 'db-2' };
    await route.fulfill({ response: res, json: status });
  });
  await page.goto(url + '/');
  await page.fill('#login-token', token);
  await page.click('#login-button');
  await page.locator('#replica').waitFor({ state: 'visible' });
  assert.equal(await text(page, '#role'), 'follower');
  assert.equal(await text(page, '#leader'), 'db-1');
  assert.equal(await text(page, '#epoch'), '7');
  assert.equal(await text(page, '#replica-id'), 'db-2');
  assert.match(await text(page, '#banner'), /follower.*db-1/);
  await page.close();
});

// Many models: the picker lists the models the token sees, and the page then shows and drives
// the model picked alone (its state, its actions, its event stream); the fragment keeps it.
test('a model picked in the header is the one shown and driven', { timeout: 4 * WAIT }, async () => {
  await api('POST', '/v1/models', { name: 'team-a' });
  await api('POST', '/v1/models/team-a/machines', { count: 2 });
  const before = (await api('GET', '/v1/machines')).length;
  const page = await newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  await page.goto(url + '/');
  await page.fill('#login-token', token);
  await page.click('#login-button');
  await page.locator('#conn.live').waitFor();
  await page.waitForFunction((n) => document.getElementById('n-machines').textContent === String(n), before);
  assert.deepEqual(await page.locator('#model-select option').allInnerTexts(), ['default', 'team-a']);
  assert.equal(await page.locator('#model-select').inputValue(), 'default');

  // team-a: its two machines, running, and nothing of default's.
  await page.selectOption('#model-select', 'team-a');
  await page.waitForFunction(() => document.getElementById('n-running').textContent === '2'
    && document.getElementById('n-machines').textContent === '2');
  assert.match(page.url(), /#model=team-a$/);
  const uuid = (await api('GET', '/v1/models/team-a')).uuid;
  assert.equal(await page.locator('#model-uuid').getAttribute('title'), uuid);
  // An add through the page goes to team-a, and its start reaches the page on team-a's stream.
  await page.fill('#add-count', '1');
  await page.fill('#add-constraints', '');
  await page.click('#add-button');
  await page.waitForFunction(() => document.getElementById('n-running').textContent === '3');
  assert.match(await text(page, '#event-log'), /machine-started/);
  assert.equal((await api('GET', '/v1/models/team-a/machines')).length, 3);
  assert.equal((await api('GET', '/v1/machines')).length, before, 'default unchanged');

  // A page opened on the fragment shows team-a at once.
  const again = await newPage();
  await again.goto(url + '/#model=team-a');
  await again.fill('#login-token', token);
  await again.click('#login-button');
  await again.waitForFunction(() => document.getElementById('n-machines').textContent === '3');
  assert.equal(await again.locator('#model-select').inputValue(), 'team-a');
  assert.deepEqual(problems, [], 'errors in the page');
  await again.close();
  await page.close();
});
