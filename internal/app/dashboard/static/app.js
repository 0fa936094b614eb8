// The PLEG dashboard: everything comes from the daemon that serves this
// page, through relative URLs (so it also works behind a path prefix):
//   readyz, healthz        the health banner
//   api/v1/relists         the relist chart, the time since the last relist
//   api/v1/pods            the pods table and the slow pods
//   api/v1/events (SSE)    the event feed (the lifecycle stream, docs/stream.md)
//   metrics                node name, running containers, timeout counter
// Text from the runtime (pod names, errors) only ever goes into textContent.
'use strict';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
const FEED_MAX = 200;

const state = {
  threshold: 180, // seconds; replaced by api/v1/relists
  pods: [],
  filter: '',
  events: 0,
  reachable: null,
};

// ---- small helpers -------------------------------------------------------

function el(tag, opts = {}, ...children) {
  const e = document.createElement(tag);
  if (opts.cls) e.className = opts.cls;
  if (opts.text !== undefined) e.textContent = opts.text;
  if (opts.title) e.title = opts.title;
  if (opts.data) for (const [k, v] of Object.entries(opts.data)) e.dataset[k] = v;
  for (const c of children) if (c) e.append(c);
  return e;
}

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// fmtDur formats seconds the way Go prints durations, rounded for people.
function fmtDur(sec) {
  if (sec === null || sec === undefined || Number.isNaN(sec)) return '–';
  if (sec < 0) sec = 0;
  if (sec === 0) return '0s';
  if (sec < 1e-3) return `${Math.round(sec * 1e6)}µs`;
  if (sec < 1) return `${+(sec * 1e3).toFixed(sec < 0.01 ? 1 : 0)}ms`;
  if (sec < 60) return `${+sec.toFixed(sec < 10 ? 2 : 1)}s`;
  const h = Math.floor(sec / 3600);
  const m = Math.floor((sec % 3600) / 60);
  const s = Math.round(sec % 60);
  return (h ? `${h}h` : '') + `${m}m${s}s`;
}

// goDuration parses a Go duration string ("2.5s", "3m0.1s", "300ms") into
// seconds, or NaN.
function goDuration(s) {
  const units = { h: 3600, m: 60, s: 1, ms: 1e-3, us: 1e-6, 'µs': 1e-6, ns: 1e-9 };
  const re = /([0-9.]+)(h|ms|m|s|us|µs|ns)/g;
  let total = 0;
  let seen = '';
  for (const m of s.matchAll(re)) {
    total += parseFloat(m[1]) * units[m[2]];
    seen += m[0];
  }
  return seen === s && s !== '' ? total : NaN;
}

function ago(iso) {
  if (!iso) return '–';
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return '–';
  return `${fmtDur(Math.max(0, (Date.now() - t) / 1000))} ago`;
}

function clock(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  const p = (n, w = 2) => String(n).padStart(w, '0');
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

function shortID(id) {
  return id ? id.slice(0, 13) : '';
}

async function fetchJSON(path) {
  const r = await fetch(path, { cache: 'no-store', headers: { Accept: 'application/json' } });
  let body = null;
  try { body = await r.json(); } catch (_) { /* not JSON */ }
  return { status: r.status, body };
}

async function fetchText(path) {
  const r = await fetch(path, { cache: 'no-store' });
  return { status: r.status, text: await r.text() };
}

function setConn(ok, text) {
  const c = $('conn');
  c.className = 'conn ' + (ok === null ? 'conn-wait' : ok ? 'conn-ok' : 'conn-bad');
  c.textContent = text;
}

// ---- health banner and relists --------------------------------------------

async function pollHealth() {
  try {
    const [ready, healthz, relists] = await Promise.all([
      fetchJSON('readyz'), fetchText('healthz'), fetchJSON('api/v1/relists'),
    ]);
    state.reachable = true;
    setConn(true, 'live');
    renderBanner(ready, healthz);
    if (relists.status === 200 && relists.body) renderRelists(relists.body);
  } catch (err) {
    state.reachable = false;
    setConn(false, 'daemon unreachable');
    const b = $('health');
    b.className = 'banner banner-unknown';
    $('health-state').textContent = 'Unknown';
    $('health-reason').textContent = '';
    $('health-message').textContent = `cannot reach the pleg daemon: ${err.message || err}`;
    $('health-healthz').textContent = '';
  }
}

function renderBanner(ready, healthz) {
  const b = $('health');
  const c = ready.body || {};
  let cls = 'banner-unknown';
  let word = 'Unknown';
  if (c.status === 'True') { cls = 'banner-ok'; word = 'Healthy'; }
  else if (c.status === 'False') { cls = 'banner-bad'; word = 'Not healthy'; }
  b.className = 'banner ' + cls;
  b.dataset.status = c.status || '';
  $('health-state').textContent = word;
  $('health-reason').textContent = c.reason || '';
  $('health-message').textContent = c.message || `readyz answered HTTP ${ready.status}`;
  $('health-healthz').textContent = `healthz: ${healthz.text.trim()}`;
}

function renderRelists(r) {
  if (r.thresholdSeconds > 0) state.threshold = r.thresholdSeconds;
  const rel = r.relists || [];
  const th = state.threshold;

  // Time since the last successful relist started: what Healthy() checks.
  const since = r.lastRelist ? r.secondsSinceLastRelist || 0 : null;
  const fill = $('since-fill');
  if (since === null) {
    $('since-text').textContent = `no successful relist yet (threshold ${fmtDur(th)})`;
    fill.style.width = '0%';
  } else {
    const frac = since / th;
    $('since-text').textContent = `${fmtDur(since)} of ${fmtDur(th)}`;
    fill.style.width = `${Math.min(100, Math.max(0.5, frac * 100)).toFixed(1)}%`;
    fill.className = 'meter-fill' + (frac >= 1 ? ' bad' : frac >= 0.5 ? ' warn' : '');
  }

  const ok = rel.filter((x) => !x.error);
  const last = rel.length ? rel[rel.length - 1] : null;
  setTile('stat-last', last ? fmtDur(last.durationSeconds) : '–',
    last && last.durationSeconds >= th ? 'bad' : last && last.durationSeconds >= 10 ? 'warn' : '');
  if (ok.length) {
    const sorted = ok.map((x) => x.durationSeconds).sort((a, b) => a - b);
    const p99 = sorted[Math.max(0, Math.ceil(0.99 * sorted.length) - 1)];
    setTile('stat-p99', fmtDur(p99), p99 >= th ? 'bad' : p99 >= 10 ? 'warn' : '');
    $('stat-p99-label').textContent = `relist p99 (last ${sorted.length})`;
  }
  renderChart(rel, th, r.relistRunningSeconds || 0);

  const notes = [];
  if (rel.length) notes.push(`${rel.length} most recent relists, since ${clock(rel[0].start)}`);
  const failed = rel.filter((x) => x.error);
  if (failed.length) notes.push(`${failed.length} failed (last: ${failed[failed.length - 1].error})`);
  if ((r.relistRunningSeconds || 0) >= 1) notes.push(`a relist has been running for ${fmtDur(r.relistRunningSeconds)}`);
  $('chart-note').textContent = notes.join(' · ');
}

function renderChart(rel, th, running) {
  const chart = $('chart');
  const W = 1000, H = 240, L = 64, R = 12, T = 12, B = 24;
  const pw = W - L - R, ph = H - T - B;
  const vals = rel.map((x) => x.durationSeconds).filter((v) => v > 0);
  const lo = Math.min(1e-3, ...vals);
  const yMin = Math.max(1e-6, 10 ** Math.floor(Math.log10(lo)));
  const yMax = Math.max(th * 1.5, ...vals.map((v) => v * 1.3), running * 1.3);
  const span = Math.log10(yMax) - Math.log10(yMin);
  const y = (v) => T + ph - ((Math.log10(Math.max(v, yMin)) - Math.log10(yMin)) / span) * ph;

  const parts = [];
  for (let e = Math.ceil(Math.log10(yMin)); 10 ** e <= yMax; e++) {
    const yy = y(10 ** e);
    parts.push(svg('line', { class: 'grid-line', x1: L, x2: W - R, y1: yy, y2: yy }));
    parts.push(svg('text', { class: 'axis-label', x: L - 6, y: yy + 4, 'text-anchor': 'end' }, fmtDur(10 ** e)));
  }

  const items = rel.map((x) => ({ v: x.durationSeconds, x }));
  if (running > 0) items.push({ v: running, running: true });
  const slots = Math.max(items.length, 60);
  const bw = pw / slots;
  const x0 = L + pw - items.length * bw;
  items.forEach((it, i) => {
    const top = Math.min(y(it.v), T + ph - 2);
    let cls = 'bar';
    let title;
    if (it.running) {
      cls += ' running';
      title = `relist running for ${fmtDur(it.v)}`;
    } else {
      const x = it.x;
      if (x.error) cls += ' failed';
      else if (it.v >= th) cls += ' bad';
      else if (it.v >= 10) cls += ' warn';
      title = `${clock(x.start)}: ${fmtDur(it.v)}` + (x.error ? ` — failed: ${x.error}`
        : ` — ${x.pods} pods, ${x.inspected} inspected, ${x.failed} failed (${x.timedOut} timed out), ${x.events} events`);
    }
    const rect = svg('rect', { class: cls, x: x0 + i * bw + bw * 0.1, y: top, width: Math.max(1, bw * 0.8), height: T + ph - top });
    rect.append(svg('title', {}, title));
    parts.push(rect);
  });

  const ty = y(th);
  parts.push(svg('line', { class: 'threshold', x1: L, x2: W - R, y1: ty, y2: ty }));
  parts.push(svg('text', { class: 'threshold-label', x: W - R - 4, y: ty - 5, 'text-anchor': 'end' },
    `threshold ${fmtDur(th)}`));
  if (rel.length) {
    parts.push(svg('text', { class: 'axis-label', x: x0, y: H - 6 }, clock(rel[0].start)));
  }
  parts.push(svg('text', { class: 'axis-label', x: W - R, y: H - 6, 'text-anchor': 'end' }, 'now'));
  chart.replaceChildren(...parts);
  chart.dataset.bars = String(items.length);
}

function setTile(id, text, cls) {
  const t = $(id);
  t.textContent = text;
  t.className = 'tile-value' + (cls ? ' ' + cls : '');
}

// ---- pods ------------------------------------------------------------------

const timeoutRE = /^inspection of pod "([^"]*)" (?:exceeded the pod inspection timeout of (\S+) \((.*) outstanding\)|still outstanding after (\S+) \((.*)\))$/;

// slowInfo tells whether a cached error is an inspection timeout, and what
// the inspection is stuck in.
function slowInfo(err, slow) {
  if (slow) {
    const call = slow.id ? `${slow.call} "${slow.id}"` : slow.call;
    const ms = Math.round(slow.waitedSeconds * 1000);
    return { call: call, waited: slow.waitedSeconds, waitedText: ms >= 1000 ? `${(ms / 1000).toFixed(1)}s` : `${ms}ms` };
  }
  const m = timeoutRE.exec(err || '');
  if (!m) return null;
  const waited = m[2] !== undefined ? m[2] : m[4];
  return { call: m[3] !== undefined ? m[3] : m[5], waited: goDuration(waited), waitedText: waited };
}

// shortCall cuts the ID in 'ContainerStatus "<64 hex>"' to crictl's 13
// characters.
function shortCall(call) {
  return call.replace(/"([0-9a-f]{13})[0-9a-f]+"/g, '"$1…"');
}

let podsTimer = null;
function pollPodsSoon() {
  if (podsTimer) return;
  podsTimer = setTimeout(() => { podsTimer = null; pollPods(); }, 250);
}

async function pollPods() {
  try {
    const r = await fetchJSON('api/v1/pods');
    if (r.status !== 200 || !r.body) return;
    state.pods = r.body.pods || [];
    renderPods();
    renderSlow();
    setTile('stat-pods', String(state.pods.length));
    if (state.runningFromMetrics === undefined) {
      let n = 0;
      for (const p of state.pods) for (const c of p.containers || []) if (c.state === 'running') n++;
      setTile('stat-containers', String(n));
    }
  } catch (_) { /* the health poll reports reachability */ }
}

function containerChip(c) {
  let text = `${c.name} ${c.state}`;
  let cls = `chip st-${c.state}`;
  if (c.state === 'exited' && c.exitCode !== undefined) {
    text += ` (${c.exitCode})`;
    if (c.exitCode !== 0) cls += ' failed';
  }
  return el('span', { cls, text, title: `${c.id}\n${c.image || ''}${c.reason ? '\n' + c.reason : ''}`, data: { state: c.state } });
}

function renderPods() {
  const tbody = $('pods');
  const f = state.filter.toLowerCase();
  const rows = [];
  const pods = [...state.pods].sort((a, b) => (!!b.error - !!a.error) ||
    `${a.podNamespace}/${a.podName}`.localeCompare(`${b.podNamespace}/${b.podName}`));
  for (const p of pods) {
    const containers = p.containers || [];
    const sandboxes = p.sandboxes || [];
    const newest = sandboxes.length ? sandboxes[sandboxes.length - 1] : null;
    const hay = [p.podNamespace, p.podName, p.podUID, p.error || '',
      ...containers.map((c) => `${c.name} ${c.state}`), newest ? newest.state : ''].join(' ').toLowerCase();
    if (f && !hay.includes(f)) continue;
    const sb = newest
      ? el('span', { cls: `chip st-${newest.state}`, text: `${newest.state === 'running' ? 'Ready' : newest.state === 'exited' ? 'NotReady' : newest.state}${newest.attempt ? ' #' + newest.attempt : ''}`, title: newest.id })
      : el('span', { cls: 'muted', text: '–' });
    const tr = el('tr', { cls: p.error ? 'problem' : '', data: { uid: p.podUID, pod: `${p.podNamespace}/${p.podName}` } },
      el('td', {}, el('div', { text: `${p.podNamespace}/${p.podName}` }), el('div', { cls: 'mono muted', text: p.podUID })),
      el('td', {}, sb),
      el('td', {}, ...(containers.length ? containers.map(containerChip) : [el('span', { cls: 'muted', text: '–' })])),
      el('td', { cls: 'mono', text: (p.ips || []).join(', ') }),
      el('td', { cls: 'muted', text: ago(p.observedAt) }),
      el('td', { cls: 'err', text: p.error || '' }));
    rows.push(tr);
  }
  tbody.replaceChildren(...rows);
  $('pods-empty').classList.toggle('hidden', state.pods.length > 0);
}

function renderSlow() {
  const rows = [];
  for (const p of state.pods) {
    const s = slowInfo(p.error, p.slowInspection);
    if (!s) continue;
    rows.push(el('tr', { cls: 'problem', data: { pod: `${p.podNamespace}/${p.podName}` } },
      el('td', {}, el('div', { text: `${p.podNamespace}/${p.podName}` }), el('div', { cls: 'mono muted', text: p.podUID })),
      el('td', { cls: 'mono', text: shortCall(s.call), title: s.call }),
      el('td', { text: Number.isNaN(s.waited) ? s.waitedText : fmtDur(s.waited) }),
      el('td', { cls: 'muted', text: ago(p.observedAt) })));
  }
  $('slow').replaceChildren(...rows);
  $('slow-empty').classList.toggle('hidden', rows.length > 0);
  setTile('stat-slow', String(rows.length), rows.length ? 'bad' : '');
}

// ---- metrics ---------------------------------------------------------------

function parseMetrics(text) {
  const out = [];
  const lineRE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/;
  const labelRE = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = lineRE.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const l of m[3].matchAll(labelRE)) labels[l[1]] = l[2].replace(/\\(.)/g, '$1');
    out.push({ name: m[1], labels, value: parseFloat(m[4]) });
  }
  return out;
}

async function pollMetrics() {
  try {
    const r = await fetchText('metrics');
    if (r.status !== 200) return;
    let timeouts = 0;
    let sawTimeouts = false;
    for (const s of parseMetrics(r.text)) {
      switch (s.name) {
        case 'kubelet_node_name':
          if (s.labels.node) $('node').textContent = `on ${s.labels.node}`;
          break;
        case 'kubelet_running_containers':
          if (s.labels.container_state === 'running') {
            state.runningFromMetrics = s.value;
            setTile('stat-containers', String(s.value));
          }
          break;
        case 'pleg_pod_inspection_timeouts_total':
          timeouts += s.value;
          sawTimeouts = true;
          break;
      }
    }
    setTile('stat-timeouts', String(timeouts), timeouts > 0 ? 'warn' : '');
    if (!sawTimeouts) setTile('stat-timeouts', '0');
  } catch (_) { /* optional */ }
}

// ---- events ----------------------------------------------------------------

function addFeed(item) {
  const list = $('events');
  list.prepend(item);
  while (list.children.length > FEED_MAX) list.lastElementChild.remove();
  $('events-empty').classList.toggle('hidden', list.children.length > 0);
}

// The lifecycle stream's event types (lifecyclev1.EventType) by the
// kubelet's names, which the feed shows.
const TRANSITIONS = {
  CONTAINER_STARTED: 'ContainerStarted',
  CONTAINER_DIED: 'ContainerDied',
  CONTAINER_REMOVED: 'ContainerRemoved',
  POD_SYNC: 'PodSync',
  POD_UPDATED: 'PodUpdated',
};

// onEvent shows each transition of a pod event (data: the protojson of a
// WatchResponse whose event is set).
function onEvent(msg) {
  const ev = msg.event || {};
  const p = ev.pod || {};
  const pod = `${p.namespace}/${p.name}`;
  for (const t of ev.transitions || []) {
    const type = TRANSITIONS[t.type] || t.type;
    state.events++;
    $('stat-events').textContent = String(state.events);
    const what = [];
    if (t.sandbox) what.push('(sandbox)');
    else if (t.containerName) what.push(t.containerName);
    if (t.containerId) what.push(shortID(t.containerId));
    if (t.exitCode !== undefined && t.exitCode !== null) what.push(`exit code ${t.exitCode}`);
    const li = el('li', { cls: 'fresh', data: { type, pod } },
      el('span', { cls: 'mono muted', text: clock(msg.time) }),
      el('span', { cls: `badge ev-${type}`, text: type }),
      el('span', {}, el('span', { text: pod }), el('span', { cls: 'mono muted', text: what.length ? '  ' + what.join(' · ') : '' })));
    li.title = t.containerId || '';
    addFeed(li);
  }
  pollPodsSoon();
}

// note adds a feed line that is not a pod's event.
function note(type, label, text, time) {
  addFeed(el('li', { cls: 'fresh', data: { type } },
    el('span', { cls: 'mono muted', text: clock(time || new Date().toISOString()) }),
    el('span', { cls: 'badge ev-resync', text: label }),
    el('span', { cls: 'muted', text })));
}

function connectEvents() {
  // EventSource resumes by itself from the last message's id (its
  // cursor); after resync-required (empty id) it reconnects afresh.
  const es = new EventSource('api/v1/events');
  let snapshot = 0;
  const on = (type, f) => es.addEventListener(type, (m) => { try { f(JSON.parse(m.data)); } catch (e) { console.warn(e); } });
  es.addEventListener('open', () => { $('feed-state').textContent = 'live'; });
  es.addEventListener('error', () => { $('feed-state').textContent = 'reconnecting…'; });
  on('snapshot', () => { snapshot++; });
  on('snapshot-end', (msg) => {
    note('resync', 'snapshot', `state of ${snapshot} pods; events follow`, msg.time);
    snapshot = 0;
    pollPodsSoon();
  });
  on('event', onEvent);
  on('runtime-status', (msg) => {
    const rs = msg.runtimeStatus || {};
    note('runtime', 'runtime', `${(rs.state || '').replace('RUNTIME_', '').toLowerCase().replaceAll('_', ' ')}${rs.message ? ': ' + rs.message : ''}`, msg.time);
  });
  on('resync-required', (msg) => {
    note('resync', 'resync', `${(msg.resyncRequired || {}).reason || 'resync required'}; reconnecting`, msg.time);
  });
}

// ---- start -----------------------------------------------------------------

// every runs f now and then ms after each run ends, so a slow daemon never
// piles requests up.
function every(ms, f) {
  const run = async () => {
    try { await f(); } finally { setTimeout(run, ms); }
  };
  run();
}

$('filter').addEventListener('input', (e) => { state.filter = e.target.value; renderPods(); });
every(1000, pollHealth);
every(2000, pollPods);
every(5000, pollMetrics);
connectEvents();
