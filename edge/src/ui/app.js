// The gateway's page: devices, their twins live (server-sent events), desired values, mappers,
// pods and health, from edgecore's HTTP API. No build step, no dependencies.
"use strict";

const S = {
  devices: new Map(),   // "ns/name" -> device row, with `values` (the list's short reported values)
  twin: null,           // the twin shown, with its id
  history: new Map(),   // "ns/name/property" -> [[ms, number], ...] (recent numeric values)
  live: false,
  lostAt: 0,            // when the page lost edgecore (0: it has it, or never had it)
  status: null,
  dirtyList: true,
  dirtyDevice: false,
  errors: new Map(),    // property -> the API's answer to the last desired value set here
  alarms: new Map(),    // "ns/name/rule" -> alarm (the API's view, with device and status)
};
const HISTORY = 1800;      // a spark's points at most (an hour of a 2 s cycle)
const HOUR = 3600e3;

// A device's state as shown: what edgecore says, or unknown while the page cannot reach
// edgecore (what it showed last is no longer known to hold).
function shownState(r) {
  return knownState(r.state, r.stateReason, S.lostAt, "edgecore");
}
const idOf = (r) => `${r.namespace}/${r.name}`;

// A reported value as a spark draws it: a number, a switch as 1 or 0 (NaN for text).
const sparkValue = (v) => (v === "true" ? 1 : v === "false" ? 0 : v === "" ? Number.NaN : Number(v));

// The values of the last hour kept for a spark: older ones go, but the last one before the hour
// stays (the value holding at its start); at most HISTORY points, thinned oldest first.
function keepHour(h) {
  const from = Date.now() - HOUR;
  let cut = 0;
  while (cut + 1 < h.length && h[cut + 1][0] <= from) cut++;
  const kept = h.slice(cut);
  while (kept.length > HISTORY) kept.splice(1, 1);
  return kept;
}

function remember(id, name, p) {
  const r = p && p.reported;
  if (!r) return;
  const n = sparkValue(r.value);
  if (!Number.isFinite(n)) return;
  const key = `${id}/${name}`;
  const h = S.history.get(key) || [];
  // Answers and events may cross: only a newer value than the last one kept is added.
  if (h.length && h[h.length - 1][0] >= r.timestamp) return;
  h.push([r.timestamp, n]);
  S.history.set(key, keepHour(h));
}

function spark(id, name) {
  const h = keepHour(S.history.get(`${id}/${name}`) || []);
  if (h.length < 2) return "";
  // The last hour (what its column says), or less when the page knows less: spaced by time (the
  // last value held until now), each value drawn as a step.
  const now = Date.now(), t0 = Math.max(h[0][0], now - HOUR), span = Math.max(1, now - t0);
  const vs = h.map((x) => x[1]);
  const lo = Math.min(...vs), hi = Math.max(...vs), range = hi - lo || 1;
  const X = (t) => (1 + ((Math.max(t, t0) - t0) * 118) / span).toFixed(1);
  const Y = (v) => (26 - ((v - lo) * 24) / range).toFixed(1);
  let d = `M${X(h[0][0])} ${Y(h[0][1])}`;
  for (let i = 1; i < h.length; i++) d += ` H${X(h[i][0])} V${Y(h[i][1])}`;
  d += ` H${X(now)}`;
  return `<svg class="spark" viewBox="0 0 120 28" role="img" aria-label="${esc(name)}: ${h.length} values over ${age(span)}, ${lo} to ${hi}"><path d="${d}"/></svg>`;
}

const PAGE = 50;
S.sort = { key: "id", dir: 1 };
S.page = 0;

function renderList() {
  S.dirtyList = false;
  const q = $("search").value.trim().toLowerCase();
  const want = $("state-filter").value;
  const all = [...S.devices.values()];
  // Counts per state, of every device (the filters do not change them).
  const counts = new Map();
  for (const r of all) counts.set(shownState(r)[0] || "unknown", (counts.get(shownState(r)[0] || "unknown") || 0) + 1);
  $("state-counts").textContent = [...counts].sort((a, b) => b[1] - a[1]).map(([st, n]) => `${n} ${st}`).join(" · ");
  const key = S.sort.key;
  const val = (r) => (key === "id" ? idOf(r) : key === "state" ? stateKey(shownState(r)[0]) : r[key] || "");
  const rows = all
    .filter((r) => !want || (shownState(r)[0] || "unknown") === want)
    .filter((r) => !q || `${idOf(r)} ${r.model} ${r.protocol}`.toLowerCase().includes(q))
    .sort((a, b) => S.sort.dir * (val(a).localeCompare(val(b)) || idOf(a).localeCompare(idOf(b))));
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  S.page = Math.min(S.page, pages - 1);
  const shown = rows.slice(S.page * PAGE, (S.page + 1) * PAGE);
  S.listed = new Set(shown.map(idOf));
  refollow();
  setRows($("device-rows"), shown.map((r) => ({
    key: idOf(r),
    attrs: `data-device="${esc(idOf(r))}"`,
    cells: [
      `<a href="#/device/${esc(idOf(r))}">${esc(idOf(r))}</a>`,
      stateCell(...shownState(r)),
      valuesCell(Object.entries(r.values || {}).map(([name, v]) => Object.assign({ name }, v, { stale: v.stale || !!S.lostAt }))),
      esc(r.model),
      esc(r.protocol),
    ],
  })), S.devices.size ? "no device matches" : "no device on this gateway", 5);
  $("device-count").textContent = rows.length > PAGE
    ? `${S.page * PAGE + 1} to ${S.page * PAGE + shown.length} of ${rows.length} devices (${S.devices.size} in all)`
    : `${rows.length} of ${S.devices.size} devices`;
  $("pager").hidden = pages < 2;
  $("page-of").textContent = `page ${S.page + 1} of ${pages}`;
  $("page-prev").disabled = S.page === 0;
  $("page-next").disabled = S.page >= pages - 1;
  for (const th of document.querySelectorAll("#devices th[aria-sort]")) {
    const k = th.querySelector("button").dataset.sort;
    th.setAttribute("aria-sort", k === key ? (S.sort.dir > 0 ? "ascending" : "descending") : "none");
  }
}

document.querySelector("#devices thead").addEventListener("click", (e) => {
  const b = e.target.closest("button[data-sort]");
  if (!b) return;
  S.sort = { key: b.dataset.sort, dir: S.sort.key === b.dataset.sort ? -S.sort.dir : 1 };
  renderList();
});
$("page-prev").addEventListener("click", () => { S.page = Math.max(0, S.page - 1); renderList(); });
$("page-next").addEventListener("click", () => { S.page += 1; renderList(); });

let renderedProps = "";
function renderDevice() {
  S.dirtyDevice = false;
  const t = S.twin;
  if (!t) return;
  const row = S.devices.get(t.id) || t;
  $("device-title").textContent = t.id;
  $("device-state").innerHTML = `${stateCell(...shownState(row))} · model ${esc(t.model)} · protocol ${esc(t.protocol)}`;
  const now = Date.now();
  const names = Object.keys(t.properties || {}).sort();
  // The rows (and their forms) are made again only when the properties change, so that a
  // field being typed in or a button being pressed stays where it is while values move.
  const shape = `${t.id}|` + names.map((n) => `${n}:${t.properties[n].writable}`).join(",");
  if (shape !== renderedProps) {
    renderedProps = shape;
    $("property-rows").innerHTML = names.map((name) => {
      const p = t.properties[name];
      const form = p.writable
        ? desiredForm(name, p)
        : `<span class="muted">read-only</span>`;
      return `<tr data-prop="${esc(name)}"><th scope="row">${esc(name)} <span class="muted">${esc(p.type)}</span></th><td class="rep"></td><td class="spark"></td><td><div class="des"></div>${form}</td></tr>`;
    }).join("");
  }
  for (const name of names) {
    const p = t.properties[name];
    const tr = $("property-rows").querySelector(`tr[data-prop="${CSS.escape(name)}"]`);
    if (!tr) continue;
    const r = p.reported;
    const unit = p.unit ? ` ${esc(p.unit)}` : "";
    // When it last changed, and when it was last read (a steady value is read, not stale).
    const read = r && r.lastRead ? ` · read ${age(now - r.lastRead)} ago` : "";
    let reported = r ? `<span data-value>${esc(r.value)}</span>${unit} <span class="muted">changed ${age(now - r.timestamp)} ago${read}</span>` : `<span class="muted">none yet</span>`;
    if (r && (r.stale || S.lostAt)) reported += ` <span class="stale">stale</span>`;
    if (p.error && p.error.kind !== "write") reported += `<div class="error">read failed: ${esc(p.error.message)}</div>`;
    const d = p.desired ? p.desired.value : "";
    let desired = d !== "" ? `<span data-desired>${esc(d)}</span>${unit}` : (p.writable ? `<span class="muted">none</span>` : "");
    const landed = d !== "" && ((p.observedDesired && p.observedDesired.value === d) || (r && r.value === d));
    if (d !== "") desired += landed ? ` <span class="landed">landed</span>` : (p.writeError ? "" : ` <span class="muted">pending</span>`);
    // A value set at the edge (here, kectl, MQTT) over the Device spec's: it stands until the
    // spec changes (KubeEdge's rule), and the page says so.
    if (d !== "" && p.specDesired !== undefined && p.specDesired !== null && p.specDesired !== d)
      desired += `<p class="muted" data-override>set at the edge; the Device spec asks ${esc(p.specDesired)}${unit} (the edge's value stands until the spec changes)</p>`;
    if (p.writeError) {
      // The refusal names the value it refused: it may not be the desired one shown.
      const what = p.writeError.desired && p.writeError.desired !== d ? ` ${esc(p.writeError.desired)}` : "";
      desired += `<p class="error" id="desired-${esc(name)}-refused" role="alert">refused${what}: ${esc(p.writeError.message)}</p>`;
    }
    const set = (sel, html) => { const el = tr.querySelector(sel); if (el && el.innerHTML !== html) el.innerHTML = html; };
    set(".rep", reported);
    set(".spark", spark(t.id, name));
    set(".des", desired);
    syncForm(tr.querySelector("form.desired"), { desired: d, reported: r ? r.value : "", version: t.desiredVersion });
    const said = tr.querySelector(".desired p.error");
    if (said) said.textContent = S.errors.get(name) || "";
  }
  chartChoices(Object.keys(t.properties || {}).sort(), (n) => t.properties[n].type);
}

// The history chart (chart.js) reads this gateway's own history API.
const enc = encodeURIComponent;
function historyBase(id) {
  const [ns, name] = id.split("/");
  return `/api/v1/devices/${enc(ns)}/${enc(name)}/properties/`;
}
Chart.source = (prop, query) => api(`${historyBase(S.twin.id)}${enc(prop)}/history?${query}`);
Chart.property = (name) => S.twin && S.twin.properties && S.twin.properties[name];

// The spark of each numeric property starts from the last hour of history, not from the page's
// own memory (empty after a reload, and for a value that has not changed since).
async function seedSparks(id) {
  const t = S.twin;
  if (!t) return;
  const base = historyBase(id);
  await Promise.all(Object.entries(t.properties || {}).filter(([, p]) => NUMERIC.has(p.type)).map(async ([name]) => {
    try {
      const r = await api(`${base}${enc(name)}/history?from=-1h&step=1m`);
      if (!r.ok) return;
      const d = await r.json();
      const key = `${id}/${name}`;
      const seen = S.history.get(key) || [];
      const old = (d.buckets || []).map((b) => [b.t, numberOf(b.last)]).filter(([, v]) => Number.isFinite(v));
      const first = seen.length ? seen[0][0] : Infinity;
      S.history.set(key, keepHour(old.filter(([tt]) => tt < first).concat(seen)));
    } catch (_) { /* the live values only */ }
  }));
  S.dirtyDevice = true;
  schedule();
}


let frame = 0;
function schedule() {
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    if (S.dirtyList && !$("devices").hidden) renderList();
    if (S.dirtyDevice && !$("device").hidden) renderDevice();
    if (S.dirtyAlarms) renderAlarms();
  });
}

// The alarm table and the header's count (shown on every view).
function renderAlarms() {
  S.dirtyAlarms = false;
  const list = [...S.alarms.values()];
  const count = alarmCount(list);
  if ($("alarm-count").textContent !== count) $("alarm-count").textContent = count;
  if (!$("alarms").hidden) setRows($("alarm-rows"), alarmRows(list, true, S.lostAt), "no alarm: every rule holds nothing", 6);
}

// An alarm told by the event stream: kept, or forgotten once it ended.
function onAlarm(a) {
  const key = `${a.device}/${a.rule}`;
  if (a.ended) S.alarms.delete(key); else S.alarms.set(key, a);
  S.dirtyAlarms = true;
}

async function loadAlarms() {
  const r = await api("/api/v1/alarms");
  if (!r.ok) return;
  const body = await r.json();
  S.alarms = new Map((body.items || []).map((a) => [`${a.device}/${a.rule}`, a]));
  S.dirtyAlarms = true;
  schedule();
}

$("alarm-rows").addEventListener("click", async (e) => {
  if (!e.target.closest("button[data-ack]")) return;
  const a = await acknowledgeClicked(e, (ns, name, rule) => `/api/v1/devices/${ns}/${name}/alarms/${rule}/acknowledge`);
  if (a) onAlarm(a); else await loadAlarms();
  schedule();
});

$("property-rows").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = e.target;
  const name = form.dataset.prop;
  const [ns, dn] = S.twin.id.split("/");
  const p = S.twin.properties[name] || {};
  const value = ask(e, form, `${name} of ${S.twin.id}`, p, S.errors);
  if (value === null) return;
  // Written only if no desired value changed since the question was asked.
  const asked = form.asked || {};
  const cond = Number.isInteger(asked.version) ? `?ifVersion=${asked.version}` : "";
  S.errors.delete(name);
  try {
    const r = await api(`/api/v1/devices/${encodeURIComponent(ns)}/${encodeURIComponent(dn)}/desired${cond}`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ [name]: value }),
    });
    if (r.status === 409) {
      const now = ((S.twin.properties[name] || {}).desired || {}).value;
      S.errors.set(name, `not written: a desired value of ${S.twin.id} changed while the question was open (${name} is now ${now === undefined || now === "" ? "none" : now}); look again and set it anew`);
    } else if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      S.errors.set(name, body.error || `${r.status} ${r.statusText}`);
    } else {
      settle(form);
    }
  } catch (err) {
    S.errors.set(name, String(err.message || err));
  }
  await openDevice(S.twin.id);
  S.dirtyDevice = true;
  schedule();
});

// Whether twin version vector `a` ({cloud, edge}, KubeEdge's) is at least `b` in both counts.
function atLeast(a, b) {
  if (!b) return true;
  if (!a) return false;
  return a.cloud >= b.cloud && a.edge >= b.edge;
}

async function openDevice(id) {
  const [ns, name] = id.split("/");
  const r = await api(`/api/v1/devices/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`);
  if (!r.ok) {
    $("device-title").textContent = id;
    const body = await r.json().catch(() => ({}));
    $("device-state").textContent = r.status === 404 ? `no device ${id} on this gateway` : `cannot be read: ${body.error || r.status}`;
    $("property-table").hidden = true;
    $("history-panel").hidden = true;
    $("property-rows").innerHTML = "";
    S.twin = null;
    return;
  }
  $("property-table").hidden = false;
  $("history-panel").hidden = false;
  const t = await r.json();
  t.id = id;
  // Events that arrived while this answer was on its way may be newer than it: a property the
  // page already has at newer versions than the answer's is kept (at the same versions, the
  // answer's view wins: it says whether the values are stale now).
  if (S.twin && S.twin.id === id) {
    for (const [k, p] of Object.entries(t.properties || {})) {
      const cur = S.twin.properties && S.twin.properties[k];
      const newer = cur && atLeast(cur.reportedVersion, p.reportedVersion) && atLeast(cur.desiredVersion, p.desiredVersion)
        && !(atLeast(p.reportedVersion, cur.reportedVersion) && atLeast(p.desiredVersion, cur.desiredVersion));
      if (newer) t.properties[k] = cur;
    }
  }
  for (const [k, p] of Object.entries(t.properties || {})) remember(id, k, p);
  const opened = !S.twin || S.twin.id !== id;
  S.twin = t;
  if (opened) refollow();
  if (opened) {
    Chart.prop = "";
    seedSparks(id);
  }
  renderDevice();
}

function onDeviceEvent(ev) {
  const id = ev.id;
  const old = S.devices.get(id);
  // The list shows states: a new value alone does not make it again.
  const moved = !old || !ev.row || old.state !== ev.row.state || old.stateReason !== ev.row.stateReason;
  if (ev.removed) {
    S.devices.delete(id);
    S.dirtyList = true;
  } else if (ev.row || old) {
    const values = Object.assign({}, (old && old.values) || {});
    for (const [k, p] of Object.entries(ev.properties || {})) {
      const r = p && p.reported;
      if (!r) delete values[k];
      else values[k] = { value: r.value, unit: p.unit, stale: r.stale, error: p.error && p.error.kind === "read" ? p.error.message : "" };
    }
    S.devices.set(id, Object.assign({}, ev.row || old, { values }));
    // A new value makes the list again only when the device is on the page shown.
    if (moved || (S.listed && S.listed.has(id) && Object.keys(ev.properties || {}).length)) S.dirtyList = true;
  }
  for (const [k, p] of Object.entries(ev.properties || {})) {
    if (p) remember(id, k, p);
  }
  for (const a of ev.alarms || []) onAlarm(a);
  if (S.twin && S.twin.id === id) {
    for (const [k, p] of Object.entries(ev.properties || {})) {
      if (p) S.twin.properties[k] = p; else delete S.twin.properties[k];
    }
    // The version a write is conditional on moves with every desired value set.
    if (ev.row && Number.isInteger(ev.row.desiredVersion) && ev.row.desiredVersion > (S.twin.desiredVersion || 0))
      S.twin.desiredVersion = ev.row.desiredVersion;
    // A device's state changes the staleness of all its values: read it whole again.
    if (ev.row && moved) openDevice(id); else S.dirtyDevice = true;
  }
  schedule();
}

async function loadDevices() {
  const r = await api("/api/v1/devices?values=true");
  const rows = await r.json();
  S.devices = new Map(rows.map((x) => [idOf(x), x]));
  S.dirtyList = true;
  schedule();
}

// The devices whose values the page shows (the list's page, the open device): the event stream
// carries theirs, and of the others only their states, so that a page costs what it shows.
function followed() {
  const ids = new Set(S.listed || []);
  if (S.twin) ids.add(S.twin.id);
  return [...ids].sort().join(",");
}

// When what is on screen changes, the stream is opened again for it (a moment later, so that
// paging or typing in the search opens it once).
let following = { key: null, ctl: null, timer: 0 };
function refollow() {
  if (following.timer) return;
  following.timer = setTimeout(() => {
    following.timer = 0;
    if (following.ctl && following.key !== followed()) following.ctl.abort();
  }, 300);
}

// Server-sent events over fetch (EventSource cannot send the token).
async function listen() {
  for (;;) {
    const ctl = new AbortController();
    following.ctl = ctl;
    following.key = followed();
    try {
      const r = await api(`/api/v1/events?devices=${encodeURIComponent(following.key)}`, { headers: { accept: "text/event-stream" }, signal: ctl.signal });
      S.live = true;
      S.lostAt = 0;
      showHealth();
      await loadDevices();
      await loadAlarms();
      if (S.twin) await openDevice(S.twin.id);
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let event = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (event === "device") onDeviceEvent(JSON.parse(data));
          else if (event === "resync") { await loadDevices(); await loadAlarms(); if (S.twin) await openDevice(S.twin.id); }
        }
      }
    } catch (err) {
      if (String(err.message) === "unauthorized") return;
      // Opened again for what is on screen now: not a lost edgecore.
      if (ctl.signal.aborted) continue;
    }
    S.live = false;
    if (!S.lostAt && S.devices.size) S.lostAt = Date.now();
    S.dirtyList = true;
    S.dirtyDevice = true;
    S.dirtyAlarms = true;
    schedule();
    showHealth();
    await new Promise((ok) => setTimeout(ok, 2000));
  }
}

// What is down, where the user cannot miss it: edgecore itself, a mapper, the cloud link.
function showBanner() {
  const said = [];
  if (S.lostAt) said.push(`edgecore does not answer since ${clock(S.lostAt)}: the values shown may be old`);
  for (const m of S.mappers || []) {
    if (m.state && m.state !== "alive") said.push(`mapper ${m.name} (${m.protocol}) is ${m.state}${m.error ? `: ${m.error}` : ""}; its devices are not read`);
  }
  const s = S.status;
  if (!S.lostAt && s && s.cloud === "cut") said.push("the cloud link is cut: this gateway works offline, changes wait for the cloud");
  const text = said.join(" · ");
  const b = $("banner");
  if (b.textContent !== text) b.textContent = text;
  b.hidden = !text;
}

// A request refused for want of the token shows the login form (common.js); the refusal is not
// an error to report again.
window.addEventListener("unhandledrejection", (e) => {
  if (String(e.reason && e.reason.message) === "unauthorized") e.preventDefault();
});

function showHealth() {
  const s = S.status;
  const parts = [S.live ? "live" : "reconnecting…"];
  if (s) {
    parts.push(s.store === "ok" ? "twin store ok" : `twin store ${s.store}`);
    if (s.cloud === "connected") parts.push(s.cloudServer ? `cloud connected (${s.cloudServer})` : "cloud connected");
    else if (s.cloud === "cut") parts.push("cloud link cut (working offline)");
    if (s.cloud !== "none" && s.outbox !== null && s.outbox !== undefined) parts.push(`${s.outbox} waiting for the cloud`);
  }
  $("health").textContent = parts.join(" · ");
  showBanner();
}

async function poll() {
  if (S.twin && !$("device").hidden && Date.now() - Chart.loadedAt > 10000) {
    loadHistory();
  }
  try {
    const r = await api("/api/v1/status");
    S.status = await r.json();
    $("node").textContent = `${S.status.node} · edgecore ${S.status.version}`;
    document.title = `${S.status.node} · edgecore`;
  } catch (_) { /* shown as not live */ }
  showHealth();
  // A steady value sends no event: when its properties were last read comes from the twin.
  if (S.twin && !$("device").hidden) {
    try {
      const [ns, name] = S.twin.id.split("/");
      const t = await (await api(`/api/v1/devices/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`)).json();
      for (const [k, p] of Object.entries(t.properties || {})) {
        const cur = S.twin && S.twin.properties && S.twin.properties[k];
        if (cur && cur.reported && p.reported && p.reported.lastRead) cur.reported.lastRead = p.reported.lastRead;
      }
      S.dirtyDevice = true;
      schedule();
    } catch (_) { /* next time */ }
  }
  try {
    const ms = await (await api("/api/v1/mappers")).json();
    S.mappers = ms;
    if (!$("mappers").hidden) {
      $("mapper-rows").innerHTML = ms.map((m) => `<tr><td>${esc(m.name)}</td><td>${esc(m.protocol)}</td><td>${stateCell(m.state, m.error ? `${m.since || ""} ${m.error}` : "")}</td><td>${(m.devices || []).length ? `<ul class="plain">${m.devices.map((d) => `<li><a href="#/device/${esc(d)}">${esc(d)}</a></li>`).join("")}</ul>` : `<span class="muted">none</span>`}</td></tr>`).join("") || `<tr><td colspan="4" class="muted">no mapper registered</td></tr>`;
    }
  } catch (_) { /* next time */ }
  showBanner();
  if (!$("pods").hidden) {
    try {
      const r = await api("/api/v1/pods");
      const list = r.ok ? await r.json() : { pods: [], runtimeError: (await r.json()).error };
      $("pod-rows").innerHTML = (list.pods || []).map((p) => {
        const cs = (p.containers || []).map((c) => `${esc(c.name)}: ${esc(c.state)}${c.reason ? ` (${esc(c.reason)})` : ""}, ${c.restartCount || 0} restarts`).join("<br>");
        const logs = (p.containers || []).map((c) => `<button type="button" data-log="${esc(p.namespace)}/${esc(p.name)}/${esc(c.name)}">log of ${esc(c.name)}</button>`).join(" ");
        return `<tr><td>${esc(p.namespace)}/${esc(p.name)}</td><td>${stateCell(p.phase, p.reason || p.message)}</td><td>${cs}</td><td>${logs}</td></tr>`;
      }).join("") || `<tr><td colspan="4" class="muted">${esc(list.runtimeError || "no pods")}</td></tr>`;
    } catch (_) { /* next time */ }
  }
}

$("pod-rows").addEventListener("click", async (e) => {
  const b = e.target.closest("button[data-log]");
  if (!b) return;
  const [ns, pod, c] = b.dataset.log.split("/");
  const r = await api(`/api/v1/pods/${encodeURIComponent(ns)}/${encodeURIComponent(pod)}/log?container=${encodeURIComponent(c)}&tailLines=200`);
  const pre = $("pod-log");
  pre.hidden = false;
  pre.textContent = await r.text();
  pre.focus();
});

function route() {
  const h = location.hash.replace(/^#\/?/, "");
  for (const s of ["devices", "device", "alarms", "mappers", "pods"]) $(s).hidden = true;
  // The new view's heading takes the focus (a screen reader says where the user is), but not
  // at the first load.
  const shown = h.startsWith("device/") ? "device" : ["alarms", "mappers", "pods"].includes(h) ? h : "devices";
  if (S.routed) requestAnimationFrame(() => $(`${shown}-title`).focus());
  S.routed = true;
  if (h.startsWith("device/")) {
    $("device").hidden = false;
    S.errors.clear();
    openDevice(decodeURIComponent(h.slice(7)));
  } else if (h === "alarms") {
    $(h).hidden = false;
    S.dirtyAlarms = true;
    schedule();
  } else if (h === "mappers" || h === "pods") {
    $(h).hidden = false;
    poll();
  } else {
    $("devices").hidden = false;
    S.twin = null;
    refollow();
    S.dirtyList = true;
    schedule();
  }
}

$("search").addEventListener("input", () => { S.dirtyList = true; schedule(); });
$("state-filter").addEventListener("change", () => { S.dirtyList = true; schedule(); });
window.addEventListener("hashchange", route);

UI.onLogin = () => start();
let started = false;
function start() {
  route();
  listen();
  poll();
  if (started) return;
  started = true;
  setInterval(poll, 5000);
  // Ages move on.
  setInterval(() => { if (S.twin) { S.dirtyDevice = true; schedule(); } }, 1000);
}

start();
