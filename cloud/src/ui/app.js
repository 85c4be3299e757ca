// The fleet's page: nodes, the devices of every node from DeviceStatus, and desired values set
// through the Device spec, on cloudcore's Kubernetes API. No build step, no dependencies.
"use strict";

const DEV = "/apis/devices.kubeedge.io/v1beta1";
const F = {
  nodes: [],
  devices: new Map(),   // "ns/name" -> Device
  statuses: new Map(),  // "ns/name" -> DeviceStatus
  models: new Map(),    // "ns/name" -> DeviceModel
  shown: null,          // the device whose page is open
  errors: new Map(),    // property -> the API's answer to the last desired value set here
  ok: false,
};
const key = (o) => `${o.metadata.namespace || "default"}/${o.metadata.name}`;

function ready(n) {
  const c = ((n.status || {}).conditions || []).find((x) => x.type === "Ready");
  return c || {};
}

function renderNodes() {
  const now = Date.now();
  const count = new Map();
  for (const d of F.devices.values()) {
    const node = (d.spec || {}).nodeName || "";
    count.set(node, (count.get(node) || 0) + 1);
  }
  $("node-rows").innerHTML = F.nodes.map((n) => {
    const r = ready(n);
    const st = r.status === "True" ? "Ready" : "NotReady";
    const beat = r.lastHeartbeatTime ? `${age(now - Date.parse(r.lastHeartbeatTime))} ago` : "never";
    const info = (n.status || {}).nodeInfo || {};
    // With cloudcore replicas: the one holding the node's session (its Lease identity).
    const replica = st === "Ready" ? ((n.metadata.annotations || {})["cloudcore.kubeedge.io/session"] || "") : "";
    return `<tr data-node="${esc(n.metadata.name)}"><td>${esc(n.metadata.name)}</td><td><span class="${st === "Ready" ? "state-online" : "state-offline"}">${st}</span>${r.reason && st !== "Ready" ? ` <span class="muted">${esc(r.reason)}</span>` : ""}</td><td>${esc(beat)}</td><td><a href="#/devices?node=${encodeURIComponent(n.metadata.name)}">${count.get(n.metadata.name) || 0}</a></td><td>${esc(info.kubeletVersion || "")}</td><td>${esc(replica)}</td></tr>`;
  }).join("") || `<tr><td colspan="6" class="muted">no node has joined</td></tr>`;
}

function stateOf(id) {
  const s = F.statuses.get(id);
  return (s && s.status && s.status.state) || "unknown";
}

// Why the cloud set a device's state (its node went away), and since when.
function reasonOf(id) {
  const x = (((F.statuses.get(id) || {}).status || {}).extensions) || {};
  if (!x.stateReason) return "";
  return `${x.stateReason}${x.stateSince ? ` ${age(Date.now() - Date.parse(x.stateSince))} ago` : ""}`;
}

// Two values the same: as numbers when both are ("90" and "90.0"), else as text.
function same(a, b) {
  const x = Number(a), y = Number(b);
  return a === b || (a !== "" && b !== "" && !Number.isNaN(x) && !Number.isNaN(y) && x === y);
}

function renderDevices() {
  const q = $("search").value.trim().toLowerCase();
  const want = $("state-filter").value;
  const node = new URLSearchParams(location.hash.split("?")[1] || "").get("node");
  const rows = [...F.devices.entries()]
    .filter(([, d]) => !node || (d.spec || {}).nodeName === node)
    .filter(([id]) => !want || stateOf(id) === want)
    .filter(([id, d]) => !q || `${id} ${(d.spec || {}).nodeName} ${((d.spec || {}).deviceModelRef || {}).name}`.toLowerCase().includes(q))
    .sort(([a], [b]) => a.localeCompare(b));
  $("device-rows").innerHTML = rows.map(([id, d]) => `<tr data-device="${esc(id)}"><td><a href="#/device/${esc(id)}">${esc(id)}</a></td><td>${esc((d.spec || {}).nodeName || "")}</td><td>${stateCell(stateOf(id), reasonOf(id))}</td><td>${esc(((d.spec || {}).deviceModelRef || {}).name || "")}</td></tr>`).join("");
  $("device-count").textContent = `${rows.length} of ${F.devices.size} devices${node ? ` on ${node}` : ""}`;
}

let renderedShape = "";
function renderDevice() {
  const id = F.shown;
  const d = F.devices.get(id);
  if (!d) {
    $("device-title").textContent = id;
    $("device-state").textContent = "not found";
    $("property-rows").innerHTML = "";
    renderedShape = "";
    return;
  }
  const s = F.statuses.get(id) || {};
  const st = s.status || {};
  $("device-title").textContent = id;
  $("device-state").innerHTML = `${stateCell(st.state || "unknown", reasonOf(id))} · node ${esc(d.spec.nodeName || "")} · model ${esc((d.spec.deviceModelRef || {}).name || "")}${st.lastOnlineTime ? ` · last online ${esc(st.lastOnlineTime)}` : ""}`;
  const ns = d.metadata.namespace || "default";
  const model = F.models.get(`${ns}/${(d.spec.deviceModelRef || {}).name}`);
  const mp = (name) => (((model || {}).spec || {}).properties || []).find((p) => p.name === name) || {};
  const props = (d.spec.properties || []).map((p) => p.name);
  const writable = (name) => mp(name).accessMode !== "ReadOnly";
  const shape = `${id}|${props.map((n) => `${n}:${writable(n)}`).join(",")}`;
  if (shape !== renderedShape) {
    renderedShape = shape;
    $("property-rows").innerHTML = props.map((name) => {
      const fid = `desired-${name}`;
      const m = mp(name);
      const form = writable(name)
        ? `<form class="desired" data-prop="${esc(name)}"><label for="${esc(fid)}">Set ${esc(name)}</label><input id="${esc(fid)}" name="value" autocomplete="off" aria-describedby="${esc(fid)}-error"><button type="submit">Set</button><p class="error" id="${esc(fid)}-error" role="alert"></p></form>`
        : `<span class="muted">read-only</span>`;
      return `<tr data-prop="${esc(name)}"><th scope="row">${esc(name)} <span class="muted">${esc(m.type || "")}</span></th><td class="rep"></td><td><div class="des"></div>${form}</td></tr>`;
    }).join("");
  }
  const now = Date.now();
  const twins = new Map((st.twins || []).map((t) => [t.propertyName, t]));
  for (const p of d.spec.properties || []) {
    const tr = $("property-rows").querySelector(`tr[data-prop="${CSS.escape(p.name)}"]`);
    if (!tr) continue;
    const t = twins.get(p.name) || {};
    const r = t.reported;
    const ts = r && r.metadata && Number(r.metadata.timestamp);
    const unit = mp(p.name).unit ? ` ${esc(mp(p.name).unit)}` : "";
    const meta = (r && r.metadata) || {};
    // The edge reports a value when it changes; while the device is online and the value not
    // marked stale, the one shown is the one read now (the gateway's page has each read).
    const live = st.state === "online" && !meta.stale && !meta.error;
    let rep = r ? `<span data-value>${esc(r.value)}</span>${unit}${ts ? ` <span class="muted">changed ${age(now - ts)} ago${live ? " · current" : ""}</span>` : ""}` : `<span class="muted">none yet</span>`;
    if (meta.stale) rep += ` <span class="stale" title="not read since ${esc(meta.stale)}">stale</span>`;
    if (meta.error) rep += `<div class="error">read failed: ${esc(meta.error)}</div>`;
    const refused = meta.writeError;
    const want = p.desired && p.desired.value;
    let des = want !== undefined && want !== "" ? `<span data-desired>${esc(want)}</span>${unit}` : (writable(p.name) ? `<span class="muted">none</span>` : "");
    const o = t.observedDesired || {};
    const om = o.metadata || {};
    // A value set at the edge over the spec's: it stands until the spec changes.
    const override = om.source === "edge" && o.value !== undefined && want && !same(o.value, want);
    if (want) des += (r && same(r.value, want)) ? ` <span class="landed">landed</span>` : (refused || override ? "" : ` <span class="muted">pending</span>`);
    if (override) {
      const at = Number(om.timestamp) ? ` ${age(now - Number(om.timestamp))} ago` : "";
      des += `<p class="muted" data-override>set at the edge to ${esc(o.value)}${unit}${at}; the Device spec asks ${esc(want)}${unit} (the edge's value stands until the spec changes)</p>`;
    }
    if (refused) des += `<p class="error" role="alert">refused: ${esc(refused)}</p>`;
    const set = (sel, html) => { const el = tr.querySelector(sel); if (el && el.innerHTML !== html) el.innerHTML = html; };
    set(".rep", rep);
    set(".des", des);
    const said = tr.querySelector(".desired p.error");
    if (said) said.textContent = F.errors.get(p.name) || "";
  }
}

$("property-rows").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = e.target;
  const name = form.dataset.prop;
  const value = form.elements.value.value;
  const id = F.shown;
  const d = F.devices.get(id);
  const i = (d.spec.properties || []).findIndex((p) => p.name === name);
  const [ns, dn] = id.split("/");
  F.errors.delete(name);
  // A desired value is the Device spec's, as kubectl patch sets it.
  const patch = [
    { op: "test", path: `/spec/properties/${i}/name`, value: name },
    { op: "add", path: `/spec/properties/${i}/desired`, value: { value } },
  ];
  try {
    const r = await api(`${DEV}/namespaces/${encodeURIComponent(ns)}/devices/${encodeURIComponent(dn)}`, {
      method: "PATCH",
      headers: { "content-type": "application/json-patch+json" },
      body: JSON.stringify(patch),
    });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) F.errors.set(name, body.message || `${r.status} ${r.statusText}`);
    else { F.devices.set(id, body); form.elements.value.value = ""; }
  } catch (err) {
    F.errors.set(name, String(err.message || err));
  }
  renderDevice();
});

async function list(path) {
  const r = await api(path);
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return (await r.json()).items || [];
}

async function refresh() {
  try {
    const [nodes, devices, statuses, models] = await Promise.all([
      list("/api/v1/nodes"),
      list(`${DEV}/devices`),
      list(`${DEV}/devicestatuses`),
      list(`${DEV}/devicemodels`),
    ]);
    F.models = new Map(models.map((m) => [key(m), m]));
    F.nodes = nodes.sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
    F.devices = new Map(devices.map((d) => [key(d), d]));
    F.statuses = new Map(statuses.map((s) => [key(s), s]));
    F.ok = true;
    $("health").textContent = `${F.nodes.length} nodes · ${F.devices.size} devices · updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    if (String(err.message) === "unauthorized") return;
    F.ok = false;
    $("health").textContent = `cannot read the API: ${err.message}`;
  }
  show();
}

function show() {
  if (!$("nodes").hidden) renderNodes();
  if (!$("devices").hidden) renderDevices();
  if (!$("device").hidden) renderDevice();
}

function route() {
  const h = location.hash.replace(/^#\/?/, "");
  for (const s of ["nodes", "devices", "device"]) $(s).hidden = true;
  if (h.startsWith("device/")) {
    F.shown = decodeURIComponent(h.slice(7));
    F.errors.clear();
    renderedShape = "";
    $("device").hidden = false;
  } else if (h.startsWith("devices")) {
    $("devices").hidden = false;
  } else {
    $("nodes").hidden = false;
  }
  show();
}

$("search").addEventListener("input", renderDevices);
$("state-filter").addEventListener("change", renderDevices);
window.addEventListener("hashchange", route);

let timer = 0;
function start() {
  route();
  refresh();
  if (!timer) timer = setInterval(refresh, 2000);
}
UI.onLogin = start;
start();
