// The fleet's page: nodes, the devices of every node from DeviceStatus, and desired values set
// through the Device spec, on cloudcore's Kubernetes API. Each kind is listed once and then
// watched (the API's watch, as kubectl and kube-rs follow it), so an idle page costs nothing and
// a change costs the object that changed. No build step, no dependencies.
"use strict";

const DEV = "/apis/devices.kubeedge.io/v1beta1";
const F = {
  nodes: new Map(),     // name -> Node
  devices: new Map(),   // "ns/name" -> Device
  statuses: new Map(),  // "ns/name" -> DeviceStatus
  models: new Map(),    // "ns/name" -> DeviceModel
  pods: new Map(),      // "ns/name" -> Pod
  prepulls: new Map(),  // "default/name" -> ImagePrePullJob
  upgrades: new Map(),  // "default/name" -> NodeUpgradeJob
  configs: new Map(),   // "default/name" -> ConfigUpdateJob
  shown: null,          // the device whose page is open
  pod: null,            // the pod whose page is open
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
  const nodes = [...F.nodes.values()].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
  setRows($("node-rows"), nodes.map((n) => {
    const r = ready(n);
    const lost = lostAt();
    const st = lost ? "unknown" : r.status === "True" ? "Ready" : "NotReady";
    const beat = r.lastHeartbeatTime ? `${age(now - Date.parse(r.lastHeartbeatTime))} ago` : "never";
    const info = (n.status || {}).nodeInfo || {};
    // With cloudcore replicas: the one holding the node's session (its Lease identity).
    const replica = st === "Ready" ? ((n.metadata.annotations || {})["cloudcore.kubeedge.io/session"] || "") : "";
    const name = n.metadata.name;
    return {
      key: name,
      attrs: `data-node="${esc(name)}"`,
      cells: [
        esc(name),
        lost ? stateCell(...knownState("", "", lost, "the API"))
          : `<span class="${st === "Ready" ? "state-online" : "state-offline"}">${st}</span>${r.reason && st !== "Ready" ? ` <span class="muted">${esc(r.reason)}</span>` : ""}`,
        esc(beat),
        `<a href="#/devices?node=${encodeURIComponent(name)}">${count.get(name) || 0}</a>`,
        esc(info.kubeletVersion || ""),
        esc(replica),
      ],
    };
  }), emptyText("nodes", "no node has joined"), 6);
}

// A device's state as DeviceStatus has it.
function reportedState(id) {
  const s = F.statuses.get(id);
  return (s && s.status && s.status.state) || "unknown";
}

// When the page lost the API (the first of its watches that failed for another reason than a
// refusal, and is still down), 0 while it has it.
function lostAt() {
  const down = watches.filter((w) => !w.live && !w.forbidden && w.downSince);
  return down.length ? Math.min(...down.map((w) => w.downSince)) : 0;
}

// A device's state as shown, and why: what DeviceStatus says, or unknown while the page cannot
// follow the API (the gateway's page takes the same rule for edgecore).
function shownOf(id) {
  return knownState(reportedState(id), reasonOf(id), lostAt(), "the API");
}
const stateOf = (id) => shownOf(id)[0];

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

// The first values a device reported (its spec's order, with the model's units), each marked
// stale or failed as DeviceStatus says.
function valuesOf(id, d) {
  const twins = new Map(((((F.statuses.get(id) || {}).status) || {}).twins || []).map((t) => [t.propertyName, t]));
  const model = F.models.get(`${d.metadata.namespace || "default"}/${((d.spec || {}).deviceModelRef || {}).name}`);
  const units = new Map((((model || {}).spec || {}).properties || []).map((p) => [p.name, p.unit || ""]));
  return valuesCell((d.spec.properties || []).map((p) => p.name)
    .filter((n) => twins.has(n) && (twins.get(n).reported || {}).value !== undefined)
    .map((n) => {
      const r = twins.get(n).reported;
      const m = r.metadata || {};
      return { name: n, value: r.value, unit: units.get(n), stale: m.stale || !!lostAt(), error: m.error };
    }));
}

const PAGE = 50;
const SORT = { key: "id", dir: 1 };
let page = 0;

function renderDevices() {
  const q = $("search").value.trim().toLowerCase();
  const want = $("state-filter").value;
  const node = new URLSearchParams(location.hash.split("?")[1] || "").get("node");
  const inScope = [...F.devices.entries()].filter(([, d]) => !node || (d.spec || {}).nodeName === node);
  const counts = new Map();
  for (const [id] of inScope) counts.set(stateOf(id), (counts.get(stateOf(id)) || 0) + 1);
  $("state-counts").textContent = [...counts].sort((a, b) => b[1] - a[1]).map(([st, n]) => `${n} ${st}`).join(" · ");
  const val = ([id, d]) => ({ id, node: (d.spec || {}).nodeName || "", state: stateKey(stateOf(id)), model: ((d.spec || {}).deviceModelRef || {}).name || "" })[SORT.key];
  const rows = inScope
    .filter(([id]) => !want || stateOf(id) === want)
    .filter(([id, d]) => !q || `${id} ${(d.spec || {}).nodeName} ${((d.spec || {}).deviceModelRef || {}).name}`.toLowerCase().includes(q))
    .sort((a, b) => SORT.dir * (val(a).localeCompare(val(b)) || a[0].localeCompare(b[0])));
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  page = Math.min(page, pages - 1);
  const shown = rows.slice(page * PAGE, (page + 1) * PAGE);
  setRows($("device-rows"), shown.map(([id, d]) => ({
    key: id,
    attrs: `data-device="${esc(id)}"`,
    cells: [
      `<a href="#/device/${esc(id)}">${esc(id)}</a>`,
      esc((d.spec || {}).nodeName || ""),
      stateCell(...shownOf(id)),
      valuesOf(id, d),
      esc(((d.spec || {}).deviceModelRef || {}).name || ""),
    ],
  })), F.devices.size ? "no device matches" : emptyText("devices", "no device yet"), 5);
  const where = node ? ` on ${node}` : "";
  $("device-count").textContent = rows.length > PAGE
    ? `${page * PAGE + 1} to ${page * PAGE + shown.length} of ${rows.length} devices${where} (${F.devices.size} in all)`
    : `${rows.length} of ${F.devices.size} devices${where}`;
  $("pager").hidden = pages < 2;
  $("page-of").textContent = `page ${page + 1} of ${pages}`;
  $("page-prev").disabled = page === 0;
  $("page-next").disabled = page >= pages - 1;
  for (const th of document.querySelectorAll("#devices th[aria-sort]")) {
    const k = th.querySelector("button").dataset.sort;
    th.setAttribute("aria-sort", k === SORT.key ? (SORT.dir > 0 ? "ascending" : "descending") : "none");
  }
}

document.querySelector("#devices thead").addEventListener("click", (e) => {
  const b = e.target.closest("button[data-sort]");
  if (!b) return;
  SORT.dir = SORT.key === b.dataset.sort ? -SORT.dir : 1;
  SORT.key = b.dataset.sort;
  renderDevices();
});
$("page-prev").addEventListener("click", () => { page = Math.max(0, page - 1); renderDevices(); });
$("page-next").addEventListener("click", () => { page += 1; renderDevices(); });

// Property `name` of device `id`'s model ({} when either is not known).
function mpOf(id, name) {
  const d = F.devices.get(id);
  if (!d) return {};
  const model = F.models.get(`${d.metadata.namespace || "default"}/${(d.spec.deviceModelRef || {}).name}`);
  return (((model || {}).spec || {}).properties || []).find((p) => p.name === name) || {};
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
  const lost = lostAt();
  $("device-state").innerHTML = `${stateCell(...knownState(st.state, reasonOf(id), lost, "the API"))} · node ${esc(d.spec.nodeName || "")} · model ${esc((d.spec.deviceModelRef || {}).name || "")}${st.lastOnlineTime ? ` · last online ${esc(st.lastOnlineTime)}` : ""}`;
  const mp = (name) => mpOf(id, name);
  const props = (d.spec.properties || []).map((p) => p.name);
  const writable = (name) => mp(name).accessMode !== "ReadOnly";
  const may = mayPatch(d.metadata.namespace || "default");
  const shape = `${id}|${may}|${props.map((n) => `${n}:${writable(n)}:${mp(n).type}:${mp(n).minimum}:${mp(n).maximum}`).join(",")}`;
  if (shape !== renderedShape) {
    renderedShape = shape;
    $("property-rows").innerHTML = props.map((name) => {
      const m = mp(name);
      const form = !writable(name) ? `<span class="muted">read-only</span>`
        : may === false ? `<span class="muted" data-not-allowed>you may not set it (no patch on devices in ${esc(d.metadata.namespace || "default")})</span>`
        : may ? desiredForm(name, m) : `<span class="muted">checking whether you may set it…</span>`;
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
    const live = !lost && st.state === "online" && !meta.stale && !meta.error;
    let rep = r ? `<span data-value>${esc(r.value)}</span>${unit}${ts ? ` <span class="muted">changed ${age(now - ts)} ago${live ? " · current" : ""}</span>` : ""}` : `<span class="muted">none yet</span>`;
    if (meta.stale) rep += ` <span class="stale" title="not read since ${esc(meta.stale)}">stale</span>`;
    else if (r && lost) rep += ` <span class="stale" title="the API unreachable since ${esc(clock(lost))}">stale</span>`;
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
    if (refused) des += `<p class="error" id="desired-${esc(p.name)}-refused" role="alert">refused: ${esc(refused)}</p>`;
    const set = (sel, html) => { const el = tr.querySelector(sel); if (el && el.innerHTML !== html) el.innerHTML = html; };
    set(".rep", rep);
    set(".des", des);
    syncForm(tr.querySelector("form.desired"), { desired: want === undefined ? "" : String(want), reported: r ? String(r.value) : "", version: d.metadata.resourceVersion });
    const said = tr.querySelector(".desired p.error");
    if (said) said.textContent = F.errors.get(p.name) || "";
  }
  chartChoices([...props].sort(), (n) => mp(n).type);
}

// The history chart (chart.js), read through the cloud from the device's gateway (the API's
// devices/history): a gateway that is away or silent is said in the chart's place.
Chart.source = (prop, query) => {
  const [ns, name] = F.shown.split("/");
  return api(`${DEV}/namespaces/${encodeURIComponent(ns)}/devices/${encodeURIComponent(name)}/history?property=${encodeURIComponent(prop)}&${query}`);
};
Chart.property = (name) => (F.shown ? mpOf(F.shown, name) : null);

$("property-rows").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = e.target;
  const name = form.dataset.prop;
  const id = F.shown;
  const d = F.devices.get(id);
  const value = ask(e, form, `${name} of ${id}`, mpOf(id, name) || {}, F.errors);
  if (value === null) return;
  const i = (d.spec.properties || []).findIndex((p) => p.name === name);
  const [ns, dn] = id.split("/");
  F.errors.delete(name);
  // A desired value is the Device spec's, as kubectl patch sets it; written only if the Device
  // is still the one the question was asked about (its resourceVersion: a 409 otherwise).
  const asked = form.asked || {};
  const patch = [
    ...(asked.version ? [{ op: "replace", path: "/metadata/resourceVersion", value: asked.version }] : []),
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
    if (r.status === 409) {
      const now = (((F.devices.get(id) || d).spec.properties || []).find((p) => p.name === name) || {}).desired;
      const v = now && now.value !== undefined && now.value !== "" ? now.value : "none";
      F.errors.set(name, `not written: ${id} changed while the question was open (${name} desired is now ${v}); look again and set it anew`);
    } else if (!r.ok) F.errors.set(name, body.message || `${r.status} ${r.statusText}`);
    else {
      F.devices.set(id, body);
      settle(form);
    }
  } catch (err) {
    F.errors.set(name, String(err.message || err));
  }
  renderDevice();
});

// One kind kept in `store`: listed, then watched from the list's resourceVersion; a watch that
// ends (the API's timeout) is resumed where it was, one the API no longer can resume (410 Gone)
// lists again, and an error is said in the health line and tried again after 1, 2, 4 ... 30 s.
function follow(what, path, query, store, onChange) {
  const ctl = new AbortController();
  const w = { what, live: false, error: "", forbidden: false, downSince: 0, stop: () => ctl.abort() };
  const url = (extra) => `${path}?${[query, extra].filter(Boolean).join("&")}`;
  (async () => {
    let wait = 1000;
    while (!ctl.signal.aborted) {
      try {
        const r = await api(url(""), { signal: ctl.signal });
        if (!r.ok) {
          const err = new Error(`${r.status} ${(await r.json().catch(() => ({}))).message || r.statusText}`);
          err.status = r.status;
          throw err;
        }
        const body = await r.json();
        store.clear();
        for (const o of body.items || []) store.set(key(o), o);
        let rv = (body.metadata || {}).resourceVersion || "";
        Object.assign(w, { live: true, error: "", forbidden: false, downSince: 0 });
        onChange(null);
        wait = 1000;
        for (;;) {
          const s = await api(url(`watch=1&allowWatchBookmarks=true&resourceVersion=${encodeURIComponent(rv)}`), { signal: ctl.signal });
          if (!s.ok) throw new Error(`${s.status} ${s.statusText}`);
          const reader = s.body.pipeThrough(new TextDecoderStream()).getReader();
          let buf = "", gone = false;
          while (!gone) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += value;
            let nl;
            while ((nl = buf.indexOf("\n")) >= 0) {
              const line = buf.slice(0, nl).trim();
              buf = buf.slice(nl + 1);
              if (!line) continue;
              const ev = JSON.parse(line);
              const o = ev.object || {};
              if (ev.type === "ERROR") { gone = true; break; }
              rv = (o.metadata || {}).resourceVersion || rv;
              if (ev.type === "BOOKMARK") continue;
              if (ev.type === "DELETED") store.delete(key(o));
              else store.set(key(o), o);
              onChange(o);
            }
          }
          if (gone) break;
        }
      } catch (err) {
        if (ctl.signal.aborted || String(err.message) === "unauthorized") return;
        // A refusal (403) is not a lost API: the page says what it may not see instead.
        const forbidden = err.status === 403;
        Object.assign(w, { live: false, error: String(err.message || err), forbidden, downSince: forbidden ? 0 : w.downSince || Date.now() });
        onChange(null);
        await new Promise((r) => setTimeout(r, wait));
        wait = Math.min(wait * 2, 30000);
      }
    }
  })();
  return w;
}

let watches = [];
let changes = null;   // the shown Device's audit Events, watched while its page is open
const audit = new Map();

// The text of an empty table of `what`: `none` when the page follows it, else why it cannot know.
function emptyText(what, none) {
  const w = watches.find((x) => x.what === what) || (what === "pods" ? podWatch : null);
  if (w && w.forbidden) return `you may not list ${what}: the API refused (403), so whether there are any is not known here`;
  if (w && !w.live) return `${what} not known: ${w.error || "connecting to the API"}`;
  return none;
}

// Whether the user may `verb` devices (or their `sub`resource) in namespace `ns` (a
// SelfSubjectAccessReview, asked once per namespace and verb): true, false, or undefined while
// the answer is awaited.
const may = new Map();
function mayDo(ns, verb, sub) {
  const k = `${ns}|${verb}|${sub || ""}`;
  if (!may.has(k)) {
    may.set(k, undefined);
    (async () => {
      try {
        const attrs = { namespace: ns, verb, group: "devices.kubeedge.io", resource: "devices" };
        if (sub) attrs.subresource = sub;
        const r = await api("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ apiVersion: "authorization.k8s.io/v1", kind: "SelfSubjectAccessReview", spec: { resourceAttributes: attrs } }),
        });
        const body = await r.json().catch(() => ({}));
        // Asked and not answered: the form is offered, and the API still decides.
        may.set(k, r.ok ? !!(body.status || {}).allowed : true);
      } catch (_) {
        may.set(k, true);
      }
      changed();
    })();
  }
  return may.get(k);
}
// Setting desired values: patch on devices.
const mayPatch = (ns) => mayDo(ns, "patch");
// Acknowledging an alarm: update on devices/alarms (cloudcore's subresource).
const mayAck = (ns) => mayDo(ns, "update", "alarms");

// Every alarm of every device, from each DeviceStatus's status.extensions.alarms (the
// gateway's own evaluation, as it last reported it).
function alarmList() {
  const out = [];
  for (const [id, st] of F.statuses) {
    const alarms = (((st.status || {}).extensions || {}).alarms) || {};
    for (const [rule, a] of Object.entries(alarms)) {
      if (a && typeof a === "object") out.push(Object.assign({}, a, { rule, device: id }));
    }
  }
  return out;
}

// The header's count (every view) and the alarm table.
function renderAlarms() {
  const list = alarmList();
  const count = alarmCount(list);
  if ($("alarm-count").textContent !== count) $("alarm-count").textContent = count;
  if ($("alarms").hidden) return;
  const nss = new Set(list.map((a) => a.device.split("/")[0]));
  const canAck = [...nss].every((ns) => mayAck(ns) !== false);
  setRows($("alarm-rows"), alarmRows(list, canAck, lostAt()), emptyText("device states", "no alarm: every rule holds nothing"), 6);
}

$("alarm-rows").addEventListener("click", async (e) => {
  const a = await acknowledgeClicked(e, (ns, name, rule) => `${DEV}/namespaces/${ns}/devices/${name}/alarms?rule=${rule}`);
  // The gateway took it; its report of it comes back through DeviceStatus (shown at once).
  const st = a && F.statuses.get(a.device);
  const alarms = st && st.status && st.status.extensions && st.status.extensions.alarms;
  if (alarms && alarms[a.rule]) {
    if (a.ended) delete alarms[a.rule];
    else Object.assign(alarms[a.rule], { ackedBy: a.ackedBy, ackedAt: a.ackedAt });
  }
  changed();
});

function showHealth() {
  const all = watches.concat(podWatch ? [podWatch] : [], jobWatch || [], changes ? [changes] : []);
  const down = all.filter((w) => !w.live && !w.forbidden);
  const refused = all.filter((w) => w.forbidden).map((w) => w.what);
  const lost = lostAt();
  const text = [
    lost ? `the API does not answer since ${clock(lost)}: states unknown, values stale (${down.map((w) => `${w.what}: ${w.error || "connecting"}`).join("; ")}); trying again`
      : down.length ? `connecting to the API (${down.map((w) => w.what).join(", ")})`
      : `${F.nodes.size} nodes · ${F.devices.size} devices · live, following ${all.length} watches`,
    refused.length ? `not allowed to see: ${refused.join(", ")}` : "",
  ].filter(Boolean).join(" · ");
  if ($("health").textContent !== text) $("health").textContent = text;
  F.ok = !down.length;
}

// Changes are drawn at once, then at most every 300 ms however fast they come.
let drawing = 0, drawn = 0;
function changed() {
  if (drawing) return;
  drawing = setTimeout(() => { drawing = 0; drawn = Date.now(); showHealth(); show(); }, Math.max(0, drawn + 300 - Date.now()));
}

// The Device's audit: each desired value set through the API, by whom and when (its Events,
// reason DesiredValueSet, newest first), watched while the device's page is open.
function followChanges() {
  if (changes) changes.stop();
  changes = null;
  audit.clear();
  renderChanges();
  const id = F.shown;
  if (!id) return;
  const [ns, name] = id.split("/");
  const sel = `fieldSelector=${encodeURIComponent(`involvedObject.kind=Device,involvedObject.name=${name},reason=DesiredValueSet`)}`;
  changes = follow("changes", `/api/v1/namespaces/${encodeURIComponent(ns)}/events`, sel, audit, renderChanges);
}

function renderChanges() {
  const items = [...audit.values()].sort((a, b) => String(b.lastTimestamp || "").localeCompare(String(a.lastTimestamp || "")) || b.metadata.name.localeCompare(a.metadata.name));
  const html = changes && changes.error && !changes.live
    ? `<tr><td colspan="2" class="error">${esc(changes.error)}</td></tr>`
    : items.slice(0, 50).map((e) => `<tr><td>${esc(e.lastTimestamp ? new Date(e.lastTimestamp).toLocaleString() : "")}</td><td>${esc(e.message)}</td></tr>`).join("")
      || `<tr><td colspan="2" class="muted">no value set through the API yet</td></tr>`;
  if ($("change-rows").innerHTML !== html) $("change-rows").innerHTML = html;
}

// Pods, as the nodes report them; each one's log is read through its node's tunnel.
function podRestarts(p) {
  return ((p.status || {}).containerStatuses || []).reduce((n, c) => n + (c.restartCount || 0), 0);
}

function renderPods() {
  const pods = [...F.pods.entries()].sort((a, b) => a[0].localeCompare(b[0]));
  setRows($("pod-rows"), pods.map(([id, p]) => {
    const cs = (p.status || {}).containerStatuses || [];
    return {
      key: id,
      attrs: `data-pod="${esc(id)}"`,
      cells: [
        `<a href="#/pod/${esc(id)}">${esc(id)}</a>`,
        esc((p.spec || {}).nodeName || ""),
        esc((p.status || {}).phase || "Pending"),
        `${cs.filter((c) => c.ready).length}/${((p.spec || {}).containers || []).length}`,
        String(podRestarts(p)),
      ],
    };
  }), emptyText("pods", "no pod yet"), 5);
}

function renderPod() {
  const p = F.pods.get(F.pod);
  $("pod-title").textContent = F.pod;
  if (!p) {
    $("pod-state").textContent = "not found";
    return;
  }
  const text = `${(p.status || {}).phase || "Pending"} · node ${(p.spec || {}).nodeName || "none yet"} · ${podRestarts(p)} restarts`;
  if ($("pod-state").textContent !== text) $("pod-state").textContent = text;
  const names = ((p.spec || {}).containers || []).map((c) => c.name);
  const sel = $("pod-container");
  if ([...sel.options].map((o) => o.value).join() !== names.join()) {
    sel.innerHTML = names.map((n) => `<option>${esc(n)}</option>`).join("");
    followLog();
  }
}

// Jobs over the fleet: a row per job (its kind, phase, how many of its nodes are done), then a
// row per node (its phase, what it did, its reason), as the controller writes its status.
const OPS = "/apis/operations.kubeedge.io/v1alpha2";
const JOB_KINDS = [
  { kind: "imageprepulljob", label: "image pre-pull", path: `${OPS}/imageprepulljobs`, store: "prepulls" },
  { kind: "nodeupgradejob", label: "upgrade", path: `${OPS}/nodeupgradejobs`, store: "upgrades" },
  { kind: "configupdatejob", label: "config update", path: `${OPS}/configupdatejobs`, store: "configs" },
];
function jobProgress(kind, x) {
  if (kind === "imageprepulljob") {
    const images = x.imageStatus || [];
    const pulled = images.filter((i) => i.status === "True").length;
    return images.length ? `${pulled} of ${images.length} images pulled` : "";
  }
  const steps = (x.actionFlow || []).map((a) => `${a.action}${a.status === "True" ? "" : " ✗"}`).join(" → ");
  const version = x.currentVersion ? `runs ${x.currentVersion}` : "";
  return [version, steps].filter(Boolean).join(" · ");
}
function renderJobs() {
  const rows = [];
  for (const k of JOB_KINDS) {
    const jobs = [...F[k.store].values()].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
    for (const j of jobs) {
      const st = j.status || {};
      const nodes = st.nodeStatus || [];
      const n = (p) => nodes.filter((x) => x.phase === p).length;
      const id = `${k.kind}/${j.metadata.name}`;
      const spec = j.spec || {};
      const what = k.kind === "nodeupgradejob" ? `${k.label} to ${spec.version || "?"}`
        : k.kind === "configupdatejob" ? `${k.label}: ${Object.keys(spec.updateFields || {}).join(", ")}`
        : k.label;
      rows.push({
        key: id,
        attrs: `data-job="${esc(id)}"`,
        cells: [
          `<strong>${esc(j.metadata.name)}</strong> <span class="muted">${esc(what)}</span>`,
          esc(st.phase || "Init"),
          esc(`${n("Successful")} succeeded, ${n("Failure")} failed, ${n("InProgress")} in progress, ${n("Pending")} pending`),
          esc(st.reason || ""),
        ],
      });
      for (const x of nodes) {
        rows.push({
          key: `${id}/${x.nodeName}`,
          attrs: `data-job-node="${esc(id)}/${esc(x.nodeName)}"`,
          cells: [
            `<span class="sub">${esc(x.nodeName)}</span>`,
            esc(x.phase || "Pending"),
            esc(jobProgress(k.kind, x)),
            esc(x.reason || ""),
          ],
        });
      }
    }
  }
  const refused = (jobWatch || []).filter((w) => w.forbidden).map((w) => w.what);
  const none = refused.length
    ? `you may not list ${refused.join(", ")}: the API refused (403), so whether there are any is not known here`
    : "no job yet (kubectl apply an ImagePrePullJob, a NodeUpgradeJob or a ConfigUpdateJob)";
  setRows($("job-rows"), rows, none, 4);
}

// The open pod's log: its last 500 lines, then followed as the node writes it (the API's
// pods/log through the node's tunnel); the newest 2,000 lines are kept. Leaving the page stops it.
let logRead = null;
let podWatch = null;
let jobWatch = null;
async function followLog() {
  if (logRead) logRead.abort();
  logRead = null;
  const pre = $("pod-log");
  pre.textContent = "";
  const p = F.pods.get(F.pod || "");
  const container = $("pod-container").value;
  if (!p || !container) return;
  const ctl = new AbortController();
  logRead = ctl;
  const [ns, name] = F.pod.split("/");
  const status = (t) => { if (logRead === ctl) $("pod-log-status").textContent = t; };
  status("reading the log through the node…");
  try {
    const r = await api(`/api/v1/namespaces/${encodeURIComponent(ns)}/pods/${encodeURIComponent(name)}/log?container=${encodeURIComponent(container)}&follow=true&tailLines=500`, { signal: ctl.signal });
    if (!r.ok) {
      status((await r.json().catch(() => ({}))).message || `${r.status} ${r.statusText}`);
      return;
    }
    status("following");
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += value;
      const lines = text.split("\n");
      if (lines.length > 2001) text = lines.slice(-2001).join("\n");
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = text;
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }
    status("the log ended: the container stopped");
  } catch (err) {
    if (ctl.signal.aborted) return;
    status(`the log stopped: ${err.message || err} (the link to the node, or the node itself)`);
  }
}
$("pod-container").addEventListener("change", followLog);

function show() {
  renderAlarms();
  if (!$("nodes").hidden) renderNodes();
  if (!$("devices").hidden) renderDevices();
  if (!$("device").hidden) renderDevice();
  if (!$("pods").hidden) renderPods();
  if (!$("pod").hidden) renderPod();
  if (!$("jobs").hidden) renderJobs();
}

function route() {
  const h = location.hash.replace(/^#\/?/, "");
  for (const s of ["nodes", "devices", "device", "pods", "pod", "jobs", "alarms"]) $(s).hidden = true;
  const was = F.shown;
  const wasPod = F.pod;
  F.shown = null;
  F.pod = null;
  if (h.startsWith("pod/")) {
    F.pod = decodeURIComponent(h.slice(4));
    $("pod").hidden = false;
  } else if (h.startsWith("pods")) {
    $("pods").hidden = false;
  } else if (h.startsWith("jobs")) {
    $("jobs").hidden = false;
  } else if (h.startsWith("alarms")) {
    $("alarms").hidden = false;
  } else if (h.startsWith("device/")) {
    F.shown = decodeURIComponent(h.slice(7));
    if (F.shown !== was) {
      F.errors.clear();
      Chart.prop = "";
    }
    renderedShape = "";
    $("device").hidden = false;
  } else if (h.startsWith("devices")) {
    $("devices").hidden = false;
  } else {
    $("nodes").hidden = false;
  }
  if (F.shown !== was || !changes) followChanges();
  // Pods are watched only while their pages are open: a browser holds at most six
  // connections to the API, and each watch keeps one.
  const podsShown = !$("pods").hidden || !$("pod").hidden;
  if (podsShown && !podWatch) podWatch = follow("pods", "/api/v1/pods", "", F.pods, changed);
  if (!podsShown && podWatch) {
    podWatch.stop();
    podWatch = null;
    F.pods.clear();
  }
  // Jobs too, only while their page is open.
  if (!$("jobs").hidden && !jobWatch) {
    jobWatch = JOB_KINDS.map((k) => follow(`${k.label} jobs`, k.path, "", F[k.store], changed));
  }
  if ($("jobs").hidden && jobWatch) {
    for (const w of jobWatch) w.stop();
    jobWatch = null;
    for (const k of JOB_KINDS) F[k.store].clear();
  }
  if (F.pod !== wasPod) {
    $("pod-container").innerHTML = "";
    if (logRead) logRead.abort();
    logRead = null;
    $("pod-log").textContent = "";
    $("pod-log-status").textContent = "";
  }
  show();
  if (F.pod) return "pod";
  if (h.startsWith("pods")) return "pods";
  if (h.startsWith("jobs")) return "jobs";
  if (h.startsWith("alarms")) return "alarms";
  return F.shown ? "device" : h.startsWith("devices") ? "devices" : "nodes";
}

$("search").addEventListener("input", renderDevices);
$("state-filter").addEventListener("change", renderDevices);
// The new view's heading takes the focus (a screen reader says where the user is).
window.addEventListener("hashchange", () => {
  const view = route();
  requestAnimationFrame(() => $(`${view}-title`).focus());
});

function start() {
  for (const w of watches) w.stop();
  if (changes) changes.stop();
  changes = null;
  watches = [
    follow("nodes", "/api/v1/nodes", "", F.nodes, changed),
    follow("devices", `${DEV}/devices`, "", F.devices, changed),
    follow("device states", `${DEV}/devicestatuses`, "", F.statuses, changed),
    follow("models", `${DEV}/devicemodels`, "", F.models, changed),
  ];
  if (podWatch) podWatch.stop();
  podWatch = null;
  if (jobWatch) for (const w of jobWatch) w.stop();
  jobWatch = null;
  route();
}
// Ages (last heartbeat, changed ... ago) move on without anything from the API; the chart is
// read again every 10 s while a device's page is open.
setInterval(() => {
  show();
  if (F.shown && !$("device").hidden && Date.now() - Chart.loadedAt > 10000) loadHistory();
}, 5000);
UI.onLogin = start;
start();
