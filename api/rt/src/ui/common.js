// What the gateway's and the fleet's pages share: escaping, the API call with the token the page
// asks for (kept for the browser tab), states and ages. Loaded before each page's own script.
"use strict";

const UI = {
  token: sessionStorage.getItem("ui-token") || "",
  onLogin: null,
};
const $ = (id) => document.getElementById(id);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

async function api(path, opts = {}) {
  const headers = Object.assign({}, opts.headers || {});
  if (UI.token) headers.Authorization = `Bearer ${UI.token}`;
  const r = await fetch(path, Object.assign({}, opts, { headers }));
  if (r.status === 401) {
    showLogin(UI.token ? "that token was not accepted" : "");
    throw new Error("unauthorized");
  }
  return r;
}

function showLogin(message) {
  $("login").hidden = false;
  $("app").hidden = true;
  $("login-error").textContent = message;
  $("token").focus();
}

// A clock time as both pages say it: local time, with the date when it is not today.
function clock(ms) {
  const d = new Date(ms);
  return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}

// What a page may say of a state it had from `source` (edgecore, the API): since it lost that
// source at `lostAt`, unknown, and why (what it showed last is no longer known to hold); else
// the state and its reason. Both pages take every device state through this one rule.
function knownState(state, reason, lostAt, source) {
  if (lostAt) return ["unknown", `${source} unreachable since ${clock(lostAt)}`];
  return [state || "unknown", reason || ""];
}

function age(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

// A table body made from rows `{key, attrs, cells: [html, ...]}`: when the keys are those shown,
// only the cells that changed are replaced, so a link or button in the table keeps the keyboard
// focus while values move; `empty` (text) when there is no row.
function setRows(tbody, rows, empty, cols) {
  const keys = rows.map((r) => r.key).join("\n");
  if (rows.length && tbody.dataset.keys === keys) {
    rows.forEach((r, i) => r.cells.forEach((html, j) => {
      const td = tbody.rows[i] && tbody.rows[i].cells[j];
      if (td && td.shown !== html) { td.innerHTML = html; td.shown = html; }
    }));
    return;
  }
  tbody.dataset.keys = keys;
  tbody.innerHTML = rows.map((r) => `<tr ${r.attrs || ""}>${r.cells.map((c) => `<td>${c}</td>`).join("")}</tr>`).join("")
    || `<tr><td colspan="${cols}" class="muted">${esc(empty)}</td></tr>`;
  rows.forEach((r, i) => r.cells.forEach((html, j) => { tbody.rows[i].cells[j].shown = html; }));
}

// The form setting property `name`'s desired value, `p` its model's {type, minimum, maximum,
// unit}: a switch for a BOOLEAN, a number field (a number keyboard on phones) with the model's
// range and unit for a number, text otherwise. Its errors go in `#desired-NAME-error`, a refusal
// the page shows in `#desired-NAME-refused`.
function desiredForm(name, p) {
  const fid = `desired-${name}`;
  const described = `aria-describedby="${esc(fid)}-hint ${esc(fid)}-error ${esc(fid)}-refused"`;
  const numeric = ["INT", "FLOAT", "DOUBLE"].includes(p.type);
  const limits = [p.minimum, p.maximum].map((v) => (v === undefined || v === null || v === "" ? null : v));
  const hint = [
    limits[0] !== null && limits[1] !== null ? `${limits[0]} to ${limits[1]}` : limits[0] !== null ? `at least ${limits[0]}` : limits[1] !== null ? `at most ${limits[1]}` : "",
    p.unit || "",
  ].filter(Boolean).join(" ");
  const field = p.type === "BOOLEAN"
    ? `<input id="${esc(fid)}" name="value" type="checkbox" role="switch" data-prop="${esc(name)}" ${described}>`
    : numeric
      ? `<input id="${esc(fid)}" name="value" type="number" inputmode="decimal" step="${p.type === "INT" ? "1" : "any"}"${limits[0] !== null ? ` min="${esc(limits[0])}"` : ""}${limits[1] !== null ? ` max="${esc(limits[1])}"` : ""} data-prop="${esc(name)}" autocomplete="off" ${described}>`
      : `<input id="${esc(fid)}" name="value" data-prop="${esc(name)}" autocomplete="off" ${described}>`;
  return `<form class="desired" data-prop="${esc(name)}" novalidate><label for="${esc(fid)}">Set ${esc(name)}</label>${field}<span class="muted" id="${esc(fid)}-hint">${esc(hint)}</span><button type="submit">Set</button><p class="confirm" hidden></p><p class="error" id="${esc(fid)}-error" role="alert"></p></form>`;
}

// What a desired-value form's field holds that cannot be written to property `p` ({type,
// minimum, maximum, unit}), said before anything is asked: "" when it may be written.
function invalid(form, p) {
  const input = form.elements.value;
  if (input.type !== "number") return "";
  if (input.validity.badInput) return "not a number: type digits (a point for decimals)";
  if (input.value.trim() === "") return "type a number first (this field takes digits, a sign and a point only)";
  const n = Number(input.value);
  const unit = p.unit ? ` ${p.unit}` : "";
  if (p.type === "INT" && !Number.isInteger(n)) return `${input.value} is not a whole number (${p.type})`;
  const limit = (v) => (v === undefined || v === null || v === "" ? null : Number(v));
  const lo = limit(p.minimum), hi = limit(p.maximum);
  if (lo !== null && n < lo) return `${input.value} is below the minimum, ${p.minimum}${unit}`;
  if (hi !== null && n > hi) return `${input.value} is above the maximum, ${p.maximum}${unit}`;
  return "";
}

// A form's control kept on the live value `live` ({desired, reported, version}): a switch on or
// off, a field holding it, unless the user is changing it (typed, toggled, a question open).
// While a question is open, a desired value that moves under it is said there.
function syncForm(form, live) {
  if (!form) return;
  form.live = live;
  const confirm = form.querySelector(".confirm");
  if (!confirm.hidden) {
    const moved = confirm.querySelector(".moved");
    const was = form.asked || {};
    const text = moved && live.desired !== was.desired
      ? `The desired value changed to ${live.desired === "" ? "none" : live.desired} while this question was open: look again before writing.`
      : "";
    if (moved && moved.textContent !== text) moved.textContent = text;
    return;
  }
  if (form.dataset.editing) return;
  const input = form.elements.value;
  const v = live.desired !== "" && live.desired !== undefined && live.desired !== null ? live.desired : live.reported;
  if (input.type === "checkbox") input.checked = v === "true";
  else if (document.activeElement !== input && input.value !== String(v ?? "")) input.value = v ?? "";
}

// The value a desired-value form holds ("true"/"false" for a switch).
function formValue(form) {
  const input = form.elements.value;
  return input.type === "checkbox" ? String(input.checked) : input.value;
}

// A value goes to a device (a PLC): checked, said back with what the property holds now, and
// confirmed first. The value to write when this submit is the confirmation; otherwise null, the
// field's mistake put in `errors` (by property) or the question shown (the value, its unit,
// where it goes, the values now). `form.asked` keeps what was live when it was asked (with its
// version: the page writes on condition that it still holds).
function ask(e, form, where, p, errors) {
  const name = form.dataset.prop;
  const confirm = form.querySelector(".confirm");
  if (e.submitter && e.submitter.name === "confirm" && !confirm.hidden) {
    confirm.hidden = true;
    return formValue(form);
  }
  const wrong = invalid(form, p || {});
  const said = form.querySelector("p.error");
  if (wrong) {
    errors.set(name, wrong);
    said.textContent = wrong;
    confirm.hidden = true;
    form.elements.value.focus();
    return null;
  }
  errors.delete(name);
  said.textContent = "";
  const value = formValue(form);
  const unit = p && p.unit ? ` ${esc(p.unit)}` : "";
  const live = form.live || {};
  form.asked = Object.assign({}, live);
  const shown = (v) => (v === undefined || v === null || v === "" ? "none" : `${esc(v)}${unit}`);
  confirm.innerHTML = `Write <strong>${esc(value === "" ? "(empty)" : value)}${unit}</strong> to ${esc(where)}? <span class="muted now">Now: desired ${shown(live.desired)}, reported ${shown(live.reported)}.</span> <span class="moved error" role="alert"></span> <button type="submit" name="confirm">Write</button> <button type="button" class="cancel">Cancel</button>`;
  confirm.hidden = false;
  confirm.querySelector('button[name="confirm"]').focus();
  return null;
}

// The form is the user's from the first key or toggle until it is written or cancelled; a
// change after a question was asked takes the question back.
document.addEventListener("input", (e) => {
  const form = e.target.closest && e.target.closest("form.desired");
  if (!form) return;
  form.dataset.editing = "1";
  form.querySelector(".confirm").hidden = true;
});

// Done with a form (written, or cancelled): its control shows the live value again.
function settle(form) {
  delete form.dataset.editing;
  form.querySelector(".confirm").hidden = true;
  if (form.live) syncForm(form, form.live);
}

// Cancel writes nothing: a switch goes back to the value it shows; typed text stays in its field
// (to be changed and set again), the focus back on it.
document.addEventListener("click", (e) => {
  const b = e.target.closest("form.desired button.cancel");
  if (!b) return;
  const form = b.closest("form");
  if (form.elements.value.type === "checkbox") settle(form);
  else form.querySelector(".confirm").hidden = true;
  form.elements.value.focus();
});

// A list's Values cell: the first three of `values` ([{name, value, unit, stale, error}]), each
// marked failed or stale, and how many more there are.
function valuesCell(values) {
  const shown = values.slice(0, 3).map((v) => {
    const mark = v.error ? ` <span class="error" title="${esc(v.error)}">failed</span>` : v.stale ? ` <span class="stale">stale</span>` : "";
    return `<span class="muted">${esc(v.name)}</span> ${esc(v.value)}${v.unit ? ` ${esc(v.unit)}` : ""}${mark}`;
  });
  if (values.length > 3) shown.push(`<span class="muted">+${values.length - 3}</span>`);
  return shown.join(" · ");
}

// A state as a sort key: the ones that need someone first (offline, unhealthy, unknown), then
// the rest, then online; ascending order lists the problems at the top.
function stateKey(state) {
  const rank = { offline: 0, unhealthy: 1, unknown: 2, online: 4, ok: 4 }[state || "unknown"];
  return `${rank === undefined ? 3 : rank}${state || "unknown"}`;
}

function stateCell(state, reason) {
  const st = state || "unknown";
  return `<span class="state-${esc(st)}">${esc(st)}</span>${reason ? ` <span class="muted">${esc(reason)}</span>` : ""}`;
}

// Alarms, as both pages show them: `list` is [{device, rule, severity, status, message,
// condition, since, clearedAt, ackedBy, ackedAt, error}] (the gateway's API, or each Device's
// status.extensions.alarms); `canAck` whether this user may acknowledge. Most severe first,
// then unacknowledged, then newest.
const SEVERITY_RANK = { critical: 0, major: 1, minor: 2, warning: 3 };
function sortAlarms(list) {
  return list.slice().sort((a, b) => (SEVERITY_RANK[a.severity] ?? 4) - (SEVERITY_RANK[b.severity] ?? 4)
    || (!!a.ackedAt - !!b.ackedAt) || (b.since - a.since) || `${a.device}/${a.rule}`.localeCompare(`${b.device}/${b.rule}`));
}

// An alarm's status in words, as ThingsBoard's table says it (active or cleared, acknowledged
// or not), or a rule that cannot be evaluated.
function alarmStatus(a) {
  if (a.error && !a.active) return ["cannot be evaluated", a.error];
  const state = a.active ? "active" : `cleared ${clock(a.clearedAt)}`;
  const ack = a.ackedAt ? `acknowledged by ${a.ackedBy} at ${clock(a.ackedAt)}` : "unacknowledged";
  return [state, ack];
}

// The header's count: active alarms and how many of all are unacknowledged ("" when none).
function alarmCount(list) {
  const active = list.filter((a) => a.active).length;
  const unack = list.filter((a) => !a.error && !a.ackedAt).length;
  if (!active && !unack) return "";
  return `${active} alarm${active === 1 ? "" : "s"} active · ${unack} unacknowledged`;
}

// The rows of an alarm table; a stale page (`lostAt`) says its alarms may no longer hold.
function alarmRows(list, canAck, lostAt) {
  return sortAlarms(list).map((a) => {
    const [state, ack] = alarmStatus(a);
    const key = `${a.device}/${a.rule}`;
    const button = canAck && !a.ackedAt && !(a.error && !a.active)
      ? `<button type="button" data-ack="${esc(key)}" aria-label="Acknowledge ${esc(a.rule)} of ${esc(a.device)}">Acknowledge</button>`
      : "";
    const said = a.error ? `cannot be evaluated: ${a.error}` : a.message;
    return {
      key,
      attrs: `data-alarm="${esc(key)}" class="alarm-${a.active ? "active" : "cleared"}"`,
      cells: [
        `<span class="severity-${esc(a.severity)}">${esc(a.severity)}</span>`,
        `<a href="#/device/${esc(a.device)}">${esc(a.device)}</a>`,
        `${esc(a.rule)}${a.condition ? ` <span class="muted">${esc(a.condition)}</span>` : ""}`,
        `${esc(said)}${lostAt ? ` <span class="stale">may no longer hold</span>` : ""}`,
        `${clock(a.since)}`,
        `<span class="${a.active ? "error" : "muted"}">${esc(state)}</span>, ${esc(ack)} ${button}`,
      ],
    };
  });
}

// An Acknowledge button of an alarm table pressed: `url(ns, name, rule)` is where the page's
// API takes it; the button is disabled while it goes, a refusal said in `#alarm-error`.
// Resolves to the acknowledged alarm, or null.
async function acknowledgeClicked(e, url) {
  const b = e.target.closest("button[data-ack]");
  if (!b) return null;
  const k = b.dataset.ack;
  const cut = k.lastIndexOf("/");
  const [ns, name] = k.slice(0, cut).split("/");
  const rule = k.slice(cut + 1);
  b.disabled = true;
  $("alarm-error").textContent = "";
  const r = await api(url(encodeURIComponent(ns), encodeURIComponent(name), encodeURIComponent(rule)), { method: "POST" });
  const body = await r.json().catch(() => ({}));
  if (r.ok) return Object.assign(body, { device: `${ns}/${name}`, rule });
  b.disabled = false;
  $("alarm-error").textContent = `${rule} of ${ns}/${name} not acknowledged: ${body.message || body.error || r.statusText}`;
  return null;
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    UI.token = $("token").value.trim();
    sessionStorage.setItem("ui-token", UI.token);
    $("login").hidden = true;
    $("app").hidden = false;
    if (UI.onLogin) UI.onLogin();
  });
});
