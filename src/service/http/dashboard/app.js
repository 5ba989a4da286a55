// The provisioner's dashboard: plain JavaScript, no dependency, no build step.
//
// State comes from the API (`/v1/status`, `/v1/machines`, `/v1/instances`) with the token the
// page asks for once (kept in sessionStorage; a 401 asks again). It stays live through the
// event stream (`/v1/events`), read with fetch() because EventSource cannot send the
// Authorization header: each event is logged, counted for the rate plot, and schedules one
// refetch of the state (coalesced). The stream reconnects with backoff, and refetches the
// state on every (re)connection, so a `stream-dropped` event or a lost connection loses
// nothing. The page never reloads itself.
//
// The model shown is picked in the header (the models the token may see, `/v1/models`) and
// kept in the address's fragment (`#model=NAME`); every per-model call goes to
// `/v1/models/NAME/...` (`default`'s to the plain `/v1/...`), and a change of model closes the
// stream and reads the new model's state afresh.
//
// Spot hand-overs (issue 33): a machine is marked "replacing" from its `machine-interrupted`
// event until its `machine-replaced` (or `machine-failed`, `machine-removed`), and whenever its
// message says it is replacing an instance (after a reload, or a hand-over that began while
// the stream was down). Its capacity column shows its preference and what its instance runs on.
'use strict';

(() => {
  const TOKEN_KEY = 'provisioner-token';
  const PHASES = ['pending', 'running', 'error', 'stopped', 'dying', 'dead'];
  const MAX_ROWS = 1000;
  const MAX_EVENTS = 200;
  const BIN_MS = 10_000;
  const WINDOW_MS = 10 * 60_000;
  const REFRESH_DELAY_MS = 250;

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    status: null,
    machines: [],
    instances: [],
    instancesError: '',
    starts: [], // {t, ok}: machine-started and machine-failed events, for the plot
    replacing: new Map(), // machine id → interrupted instance, from machine-interrupted to machine-replaced
    drift: new Map(), // machine id → its drift reasons (`/v1/drift`, issue 34)
    stream: null, // the AbortController of the open event stream
    model: new URLSearchParams(location.hash.slice(1)).get('model') || '',
    generation: 0, // grows at each change of model: answers for an earlier one are dropped
  };

  /** A per-model route (`/v1/...`) for the model shown. */
  function at(path) {
    if (!state.model || state.model === 'default') return path;
    return `/v1/models/${encodeURIComponent(state.model)}${path.slice(3)}`;
  }

  const $ = (id) => document.getElementById(id);

  /** An element with attributes and children (text children are text nodes: no HTML). */
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  class Unauthorized extends Error {}

  /** One API call with the token; JSON in and out; a refusal throws its `error` sentence. */
  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${state.token}` };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    if (res.status === 401) {
      signOut('The service refused the token: give it again.');
      throw new Unauthorized('unauthorized');
    }
    const text = await res.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!res.ok) throw new Error((data && data.error) || `${method} ${path}: HTTP ${res.status}`);
    return data;
  }

  /** What the grid and the badges call a machine's state. */
  function phase(m) {
    if (m.life === 'dying' || m.life === 'dead') return m.life;
    if (m.status === 'error' || m.instance_status === 'provisioning error') return 'error';
    if (m.status === 'started' && m.instance) return 'running';
    if (m.status === 'stopped') return 'stopped';
    return 'pending';
  }

  /** Whether a machine is in a spot hand-over: its interruption seen on the stream and its
   * replacement not yet, or its message saying so ("replacing instance ID: ..."). */
  function replacing(m) {
    return state.replacing.has(m.id) || /^replacing instance /.test(m.message || '');
  }

  /** A machine's health (issue 34): unhealthy (its instance stopped or impaired past
   * repair-after, and what its repair does) and drifted (why), as badges; none when healthy. */
  function health(m) {
    const out = [];
    if (m.health) {
      const mins = Math.round(m.health.unhealthy_for_s / 60);
      out.push(el('span', {
        class: 'badge unhealthy',
        title: `instance ${m.health.reason} for ${mins} min; repair: ${m.health.repair}`,
        text: `unhealthy (${m.health.repair})`,
      }));
    }
    const drifted = state.drift.get(m.id);
    if (drifted) {
      out.push(el('span', {
        class: 'badge drifted',
        title: drifted.map((r) => r.message).join('; '),
        text: `drifted: ${drifted.map((r) => r.kind).join(', ')}`,
      }));
    }
    return out;
  }

  /** A machine's capacity: its preference, and what its instance runs on when that differs. */
  function capacity(m) {
    const wanted = m.capacity || 'on-demand';
    if (!m.capacity_type || m.capacity_type === wanted) return wanted;
    return `${wanted} → ${m.capacity_type}`;
  }

  // ---- the token ------------------------------------------------------------------------

  function askToken(message) {
    const dialog = $('login');
    $('login-error').textContent = message || '';
    $('login-token').value = '';
    if (!dialog.open) dialog.showModal();
    $('login-token').focus();
  }

  function signOut(message) {
    state.token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    if (state.stream) state.stream.abort();
    state.stream = null;
    setConnection('down', 'signed out');
    askToken(message);
  }

  async function signIn(event) {
    event.preventDefault();
    const token = $('login-token').value.trim();
    if (!token) return;
    state.token = token;
    $('login-button').disabled = true;
    try {
      await api('GET', '/v1/models');
      sessionStorage.setItem(TOKEN_KEY, token);
      $('login').close();
      start();
    } catch (e) {
      if (!(e instanceof Unauthorized)) $('login-error').textContent = `Cannot reach the service: ${e.message}`;
    } finally {
      $('login-button').disabled = false;
    }
  }

  // ---- state ----------------------------------------------------------------------------

  let refreshing = false;
  let refreshAgain = false;
  let refreshTimer = null;
  let lastRefreshMs = 0;

  /** One refetch soon, however many events ask for it meanwhile; with a large model (a slow
   * refetch) the page waits twice as long as the last one took, so that it never spends more
   * than about a third of its time refetching. */
  function scheduleRefresh() {
    if (refreshTimer === null) {
      refreshTimer = setTimeout(() => {
        refreshTimer = null;
        refresh();
      }, Math.max(REFRESH_DELAY_MS, 2 * lastRefreshMs));
    }
  }

  async function refresh() {
    if (!state.token) return;
    if (refreshing) {
      refreshAgain = true;
      return;
    }
    refreshing = true;
    const began = performance.now();
    const generation = state.generation;
    try {
      const [status, machines] = await Promise.all([api('GET', at('/v1/status')), api('GET', at('/v1/machines'))]);
      let instances = [];
      let instancesError = '';
      let drift = new Map();
      try {
        instances = await api('GET', at('/v1/instances'));
        // Drifted machines (issue 34), judged on the same listings: machine id → reasons.
        drift = new Map((await api('GET', at('/v1/drift'))).map((d) => [d.machine, d.reasons]));
      } catch (e) {
        if (e instanceof Unauthorized) throw e;
        instancesError = e.message;
      }
      if (generation !== state.generation) return; // another model was picked meanwhile
      Object.assign(state, { status, machines, instances, instancesError, drift });
      render();
      banner('');
    } catch (e) {
      if (!(e instanceof Unauthorized)) banner(`Cannot read the service's state: ${e.message}`, true);
    } finally {
      refreshing = false;
      lastRefreshMs = performance.now() - began;
      if (refreshAgain) {
        refreshAgain = false;
        scheduleRefresh();
      }
    }
  }

  function banner(text, bad) {
    const b = $('banner');
    if (!text && b.dataset.kind === 'replica') return;
    b.textContent = text;
    b.hidden = !text;
    b.className = bad ? 'banner bad' : 'banner';
    b.dataset.kind = bad ? 'error' : '';
  }

  // ---- rendering ------------------------------------------------------------------------

  function render() {
    renderHeader();
    renderSummary();
    renderZones();
    renderErrors();
    renderMachines();
    renderInstances();
    drawRate();
  }

  function renderHeader() {
    const s = state.status;
    $('model-uuid').textContent = s.model_uuid.slice(0, 8);
    $('model-uuid').title = s.model_uuid;
    $('broker').textContent = s.broker + (s.model_life === 'alive' ? '' : ` (model ${s.model_life})`);
    $('harvest-mode').textContent = s.harvest_mode;
    $('workers').textContent = String(s.workers);
    $('jobs').textContent = `${s.jobs_in_flight} running, ${s.jobs_queued} queued`;
    if (document.activeElement !== $('harvest-value')) $('harvest-value').value = s.harvest_mode;
    if (document.activeElement !== $('workers-value')) $('workers-value').value = String(s.workers);
    const replicated = typeof s.role === 'string';
    $('replica').hidden = !replicated;
    if (replicated) {
      $('replica-id').textContent = s.replica || '?';
      $('role').textContent = s.role;
      $('role').className = `badge ${s.role}`;
      $('leader').textContent = s.leader || 'none';
      $('epoch').textContent = s.epoch === null || s.epoch === undefined ? '–' : String(s.epoch);
      const b = $('banner');
      if (s.role !== 'leader') {
        b.textContent = `This replica is a follower: changes are refused here; open the leader's (${s.leader || 'none yet'}) dashboard.`;
        b.hidden = false;
        b.className = 'banner';
        b.dataset.kind = 'replica';
      } else if (b.dataset.kind === 'replica') {
        b.hidden = true;
        b.dataset.kind = '';
      }
    }
  }

  function counts() {
    const c = Object.fromEntries(PHASES.map((p) => [p, 0]));
    for (const m of state.machines) c[phase(m)] += 1;
    return c;
  }

  function renderSummary() {
    const c = counts();
    $('n-machines').textContent = String(state.machines.length);
    $('n-running').textContent = String(c.running);
    $('n-pending').textContent = String(c.pending);
    $('n-error').textContent = String(c.error);
    $('n-error').classList.toggle('nonzero', c.error > 0);
    $('n-dying').textContent = String(c.dying + c.dead);
    $('n-instances').textContent = state.instancesError ? '?' : String(state.instances.length);
  }

  function renderZones() {
    const zones = [...(state.status.zones || [])];
    const grid = new Map();
    for (const m of state.machines) {
      const zone = m.zone || '';
      if (!zones.includes(zone)) zones.push(zone);
      const row = grid.get(zone) || Object.fromEntries(PHASES.map((p) => [p, 0]));
      row[phase(m)] += 1;
      grid.set(zone, row);
    }
    const head = el('tr', {}, el('th', { text: 'zone' }), ...PHASES.map((p) => el('th', { class: 'num', text: p })),
      el('th', { class: 'num', text: 'total' }));
    const cell = (n, p) => el('td', { class: n ? 'num' : 'num zero', 'data-phase': p, text: n ? String(n) : '·' });
    const rows = zones.map((zone) => {
      const row = grid.get(zone) || {};
      const total = PHASES.reduce((a, p) => a + (row[p] || 0), 0);
      return el('tr', { 'data-zone': zone || '(none)' }, el('td', { text: zone || '(no zone yet)' }),
        ...PHASES.map((p) => cell(row[p] || 0, p)), el('td', { class: 'num', text: String(total) }));
    });
    const c = counts();
    rows.push(el('tr', { class: 'total' }, el('td', { text: 'all zones' }), ...PHASES.map((p) => cell(c[p], p)),
      el('td', { class: 'num', text: String(state.machines.length) })));
    $('zone-grid').tHead.replaceChildren(head);
    $('zone-grid').tBodies[0].replaceChildren(...rows);
  }

  function renderErrors() {
    const failed = state.machines.filter((m) => phase(m) === 'error');
    $('errors').hidden = failed.length === 0;
    $('errors-count').textContent = String(failed.length);
    $('retry-all').disabled = !failed.some((m) => !m.container_type);
    $('error-rows').replaceChildren(...failed.slice(0, MAX_ROWS).map((m) => el('tr', { 'data-machine': m.id },
      el('td', { class: 'id', text: m.id }),
      el('td', { class: 'msg', text: m.message || '(no message)' }),
      el('td', { class: 'actions' }, m.container_type ? null
        : el('button', { class: 'small', type: 'button', 'data-action': 'retry', onclick: () => retry([m.id]) }, 'Retry')))));
  }

  function renderMachines() {
    const filter = $('machine-filter').value.trim().toLowerCase();
    const shown = state.machines.filter((m) => !filter || [m.id, phase(m), m.zone, m.instance, m.message, m.status,
      capacity(m), replacing(m) ? 'replacing' : '', m.health ? 'unhealthy' : '', state.drift.has(m.id) ? 'drifted' : '']
      .some((v) => v && String(v).toLowerCase().includes(filter)));
    $('machines-count').textContent = String(state.machines.length);
    $('machines-note').textContent = shown.length > MAX_ROWS ? `Showing the first ${MAX_ROWS} of ${shown.length}: filter to narrow.` : '';
    const rows = shown.slice(0, MAX_ROWS).map((m) => {
      const p = phase(m);
      const actions = el('td', { class: 'actions' });
      if (p === 'error' && !m.container_type) {
        actions.append(el('button', { class: 'small', type: 'button', 'data-action': 'retry', onclick: () => retry([m.id]) }, 'Retry'), ' ');
      }
      if (m.life === 'alive') actions.append(removeButton(m.id));
      const kind = m.container_type ? ` (${m.container_type} on ${m.host})` : m.manual ? ' (manual)' : '';
      const handover = replacing(m);
      const interrupted = state.replacing.get(m.id);
      return el('tr', { 'data-machine': m.id, 'data-phase': p, 'data-handover': handover },
        el('td', { class: 'id', text: m.id + kind }),
        el('td', {}, el('span', { class: `badge ${p}`, text: p }), handover ? el('span', {
          class: 'badge replacing',
          title: `the cloud warned it takes ${interrupted ? `instance ${interrupted}` : 'its instance'} away: a replacement is starting`,
          text: 'replacing',
        }) : null),
        el('td', { text: m.zone || '' }),
        el('td', { class: 'capacity', 'data-capacity': m.capacity || 'on-demand', 'data-capacity-type': m.capacity_type || undefined,
          text: capacity(m) }),
        el('td', { class: 'health', 'data-unhealthy': m.health ? m.health.repair : undefined,
          'data-drifted': state.drift.has(m.id) ? 'true' : undefined }, ...health(m)),
        el('td', { class: 'instance', text: m.instance || '' }),
        el('td', { class: 'msg', title: m.message || undefined, text: m.message || '' }),
        actions);
    });
    $('machine-rows').replaceChildren(...(rows.length ? rows
      : [el('tr', {}, el('td', { colspan: 8, class: 'empty', text: filter ? 'No machine matches.' : 'No machines yet: add some above.' }))]));
  }

  // The machine whose Remove was clicked once, waiting for its confirmation (kept across the
  // re-renders that live updates make, so that the second click confirms).
  const armed = { id: null, timer: null };

  /** A remove button that asks to be clicked again (no modal: nothing blocks the page). */
  function removeButton(id) {
    const confirming = armed.id === id;
    const b = el('button', { class: confirming ? 'small danger confirm' : 'small danger', type: 'button', 'data-action': 'remove' },
      confirming ? 'Confirm' : 'Remove');
    b.addEventListener('click', () => {
      clearTimeout(armed.timer);
      if (armed.id === id) {
        armed.id = null;
        b.disabled = true;
        remove([id]);
        return;
      }
      armed.id = id;
      armed.timer = setTimeout(() => {
        armed.id = null;
        renderMachines();
      }, 4000);
      renderMachines();
    });
    return b;
  }

  function renderInstances() {
    $('instances-count').textContent = state.instancesError ? '' : String(state.instances.length);
    $('instances-note').textContent = state.instancesError ? `Listing the cloud failed: ${state.instancesError}` : '';
    const rows = state.instances.slice(0, MAX_ROWS).map((i) => el('tr', { 'data-instance': i.id },
      el('td', { class: 'instance', text: i.id }),
      el('td', {}, el('span', { class: `badge ${i.state === 'running' ? 'running' : i.state === 'pending' ? 'pending' : ''}`, text: i.state })),
      el('td', { text: i.zone || '' }),
      el('td', { class: 'id', text: i.machine || '(none)' })));
    $('instance-rows').replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: 4, class: 'empty', text: 'No instances.' }))]));
  }

  // ---- the rate plot --------------------------------------------------------------------

  function drawRate() {
    const canvas = $('rate-plot');
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    if (!w || !h) return;
    if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(h * ratio)) {
      canvas.width = Math.round(w * ratio);
      canvas.height = Math.round(h * ratio);
    }
    const g = canvas.getContext('2d');
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, w, h);
    const now = Date.now();
    const bins = WINDOW_MS / BIN_MS;
    const end = Math.ceil(now / BIN_MS) * BIN_MS;
    const ok = new Array(bins).fill(0);
    const bad = new Array(bins).fill(0);
    state.starts = state.starts.filter((s) => s.t > end - WINDOW_MS);
    for (const s of state.starts) {
      const i = bins - 1 - Math.floor((end - 1 - s.t) / BIN_MS);
      if (i >= 0 && i < bins) (s.ok ? ok : bad)[i] += 1;
    }
    $('n-rate').textContent = String(state.starts.filter((s) => s.ok && s.t > now - 60_000).length);
    const top = Math.max(4, ...ok.map((n, i) => n + bad[i]));
    const scale = niceCeil(top);
    const left = 36;
    const bottom = 20;
    const plotW = w - left - 6;
    const plotH = h - bottom - 8;
    const css = getComputedStyle(document.documentElement);
    g.font = '11px system-ui, sans-serif';
    g.fillStyle = '#667085';
    g.strokeStyle = '#e2e5ea';
    g.lineWidth = 1;
    g.textAlign = 'right';
    g.textBaseline = 'middle';
    for (let k = 0; k <= 4; k += 1) {
      const v = (scale * k) / 4;
      const y = 8 + plotH - (plotH * k) / 4;
      g.beginPath();
      g.moveTo(left, Math.round(y) + 0.5);
      g.lineTo(left + plotW, Math.round(y) + 0.5);
      g.stroke();
      g.fillText(Number.isInteger(v) ? String(v) : v.toFixed(1), left - 6, y);
    }
    g.textAlign = 'center';
    g.textBaseline = 'top';
    for (let m = 10; m >= 0; m -= 2) {
      const x = left + plotW - (plotW * m * 60_000) / WINDOW_MS;
      g.fillText(m === 0 ? 'now' : `-${m} min`, Math.min(Math.max(x, left + 14), left + plotW - 12), 8 + plotH + 5);
    }
    const bw = plotW / bins;
    for (let i = 0; i < bins; i += 1) {
      const x = left + i * bw + 1;
      const hOk = (plotH * ok[i]) / scale;
      const hBad = (plotH * bad[i]) / scale;
      g.fillStyle = css.getPropertyValue('--running').trim() || '#1f8a4c';
      g.fillRect(x, 8 + plotH - hOk, Math.max(bw - 2, 1), hOk);
      g.fillStyle = css.getPropertyValue('--error').trim() || '#c2352b';
      g.fillRect(x, 8 + plotH - hOk - hBad, Math.max(bw - 2, 1), hBad);
    }
  }

  function niceCeil(n) {
    for (const step of [4, 8, 12, 20, 40, 80, 100, 200, 400, 800, 1000, 2000, 4000, 8000]) if (n <= step) return step;
    return Math.ceil(n / 4000) * 4000;
  }

  // ---- events ---------------------------------------------------------------------------

  function setConnection(kind, text) {
    $('conn').className = `conn ${kind}`;
    $('conn').textContent = text;
  }

  function describe(ev) {
    const parts = [];
    if (ev.machine) parts.push(`machine ${ev.machine}`);
    if (ev.instance) parts.push(`instance ${ev.instance}`);
    if (ev.zone) parts.push(`in ${ev.zone}`);
    if (ev.instances && ev.instances.length) parts.push(ev.instances.join(', '));
    if (ev.size !== undefined) parts.push(`${ev.size} workers`);
    if (ev.mode) parts.push(`mode ${ev.mode}`);
    if (ev.role) parts.push(`${ev.replica || ''} is ${ev.role}, epoch ${ev.epoch ?? '–'}`);
    if (ev.message) parts.push(ev.message);
    return parts.join(' · ');
  }

  /** HH:MM:SS, local time. */
  function clock(t) {
    return [t.getHours(), t.getMinutes(), t.getSeconds()].map((n) => String(n).padStart(2, '0')).join(':');
  }

  /** A line of the event log (the latest first, at most MAX_EVENTS). */
  function logLine(t, name, detail, kind) {
    $('event-log').prepend(el('li', {},
      el('span', { class: 't', text: clock(t) }),
      el('span', { class: `e ${kind}`, text: name }),
      el('span', { class: 'd', text: detail })));
    while ($('event-log').children.length > MAX_EVENTS) $('event-log').lastElementChild.remove();
  }

  function onEvent(ev) {
    const t = new Date();
    if (ev.event === 'machine-started') state.starts.push({ t: t.getTime(), ok: true });
    if (ev.event === 'machine-failed') state.starts.push({ t: t.getTime(), ok: false });
    if (ev.event === 'machine-interrupted' && ev.machine) state.replacing.set(ev.machine, ev.instance || '');
    if (['machine-replaced', 'machine-failed', 'machine-removed'].includes(ev.event)) state.replacing.delete(ev.machine);
    logLine(t, ev.event, describe(ev), ev.event);
    drawRate();
    scheduleRefresh();
  }

  /** Parses one server-sent event frame (`event:` and `data:` lines; `:` lines are comments). */
  function parseFrame(frame) {
    const data = [];
    for (const line of frame.split('\n')) {
      if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (!data.length) return null;
    try {
      return JSON.parse(data.join('\n'));
    } catch (_) {
      return null;
    }
  }

  /** Reads the event stream until signed out, reconnecting with backoff. */
  async function stream() {
    let backoff = 500;
    let connectedBefore = false;
    const generation = state.generation; // this model's stream: a change of model ends it
    while (state.token && generation === state.generation) {
      const controller = new AbortController();
      state.stream = controller;
      try {
        const res = await fetch(at('/v1/events'), {
          headers: { Authorization: `Bearer ${state.token}`, Accept: 'text/event-stream' },
          cache: 'no-store',
          signal: controller.signal,
        });
        if (res.status === 401) {
          signOut('The service refused the token: give it again.');
          return;
        }
        if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
        setConnection('live', 'live');
        if (connectedBefore) logLine(new Date(), 'reconnected', 'the state was read again (events in between are not replayed)', 'local');
        connectedBefore = true;
        backoff = 500;
        // Whatever happened while not connected: read it all again.
        refresh();
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n?/g, '\n');
          let cut;
          while ((cut = buffer.indexOf('\n\n')) >= 0) {
            const ev = parseFrame(buffer.slice(0, cut));
            buffer = buffer.slice(cut + 2);
            if (ev) onEvent(ev);
          }
        }
      } catch (e) {
        if (controller.signal.aborted) return;
      }
      if (state.stream !== controller || !state.token) return;
      setConnection('down', 'reconnecting');
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 15_000);
    }
  }

  // ---- actions --------------------------------------------------------------------------

  function feedback(text, ok) {
    $('feedback').textContent = text;
    $('feedback').className = ok ? 'ok' : 'bad';
  }

  async function act(what, call) {
    try {
      const out = await call();
      feedback(what(out), true);
      refresh();
    } catch (e) {
      if (!(e instanceof Unauthorized)) feedback(e.message, false);
    }
  }

  function addMachines(event) {
    event.preventDefault();
    const count = Number($('add-count').value);
    const constraints = $('add-constraints').value.trim();
    const body = { count };
    if (constraints) body.constraints = constraints;
    const button = $('add-button');
    button.disabled = true;
    act((out) => `Added ${out.ids.length === 1 ? 'machine' : 'machines'} ${out.ids.join(', ')}.`,
      () => api('POST', at('/v1/machines'), body)).finally(() => { button.disabled = false; });
  }

  function retry(ids) {
    act(() => `Retrying ${ids.join(', ')}.`, () => api('POST', at('/v1/machines/retry'), { ids }));
  }

  function remove(ids) {
    act(() => `Removing ${ids.join(', ')}.`, () => api('POST', at('/v1/machines/remove'), { ids }));
  }

  function setConfig(key, value) {
    act((out) => `${out.key} is now ${out.value}.`, () => api('PUT', at(`/v1/config/${key}`), { value }));
  }

  // ---- start ----------------------------------------------------------------------------

  function start() {
    setConnection('down', 'connecting');
    loadModels().then(() => {
      refresh();
      if (!state.stream) stream();
    });
  }

  /** Fills the model picker with the models the token may see; keeps the model asked for
   * (the fragment's) if it is one of them, else `default`, else the first. */
  async function loadModels() {
    let names = [];
    try {
      names = (await api('GET', '/v1/models')).map((m) => m.name);
    } catch (e) {
      if (e instanceof Unauthorized) return;
      banner(`Cannot list the models: ${e.message}`, true);
    }
    if (!names.includes(state.model)) state.model = names.includes('default') ? 'default' : (names[0] || '');
    const select = $('model-select');
    select.replaceChildren(...names.map((n) => el('option', { value: n, text: n, selected: n === state.model })));
    select.hidden = names.length < 2;
  }

  /** Shows another model: its state read afresh, its own event stream. */
  function pickModel(name) {
    if (name === state.model) return;
    state.model = name;
    state.generation += 1;
    history.replaceState(null, '', `#model=${encodeURIComponent(name)}`);
    if (state.stream) state.stream.abort();
    state.stream = null;
    Object.assign(state, {
      status: null, machines: [], instances: [], instancesError: '', starts: [], replacing: new Map(), drift: new Map(),
    });
    $('event-log').replaceChildren();
    feedback('', true);
    setConnection('down', 'connecting');
    refresh();
    stream();
  }

  function init() {
    $('login-form').addEventListener('submit', signIn);
    $('login').addEventListener('cancel', (e) => e.preventDefault());
    $('sign-out').addEventListener('click', () => signOut(''));
    $('model-select').addEventListener('change', (e) => pickModel(e.target.value));
    $('add-form').addEventListener('submit', addMachines);
    $('harvest-form').addEventListener('submit', (e) => {
      e.preventDefault();
      setConfig('harvest-mode', $('harvest-value').value);
    });
    $('workers-form').addEventListener('submit', (e) => {
      e.preventDefault();
      setConfig('workers', String($('workers-value').value).trim());
    });
    $('retry-all').addEventListener('click', () => {
      const ids = state.machines.filter((m) => phase(m) === 'error' && !m.container_type).map((m) => m.id);
      if (ids.length) retry(ids);
    });
    $('machine-filter').addEventListener('input', () => state.status && renderMachines());
    window.addEventListener('resize', drawRate);
    setInterval(drawRate, 5000);
    drawRate();
    if (state.token) start();
    else askToken('');
  }

  init();
})();
