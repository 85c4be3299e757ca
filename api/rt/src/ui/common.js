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

// The value a desired-value form holds ("true"/"false" for a switch).
function formValue(form) {
  const input = form.elements.value;
  return input.type === "checkbox" ? String(input.checked) : input.value;
}

// A value goes to a device (a PLC): said back and confirmed first. Whether this submit is the
// confirmation; if not, the question is shown (the value, its unit, where it goes) and false.
function confirmWrite(e, form, where, value, unit) {
  const confirm = form.querySelector(".confirm");
  if (e.submitter && e.submitter.name === "confirm") {
    confirm.hidden = true;
    return true;
  }
  confirm.innerHTML = `Write <strong>${esc(value === "" ? "(empty)" : value)}${unit ? ` ${esc(unit)}` : ""}</strong> to ${esc(where)}? <button type="submit" name="confirm">Write</button> <button type="button" class="cancel">Cancel</button>`;
  confirm.hidden = false;
  confirm.querySelector('button[name="confirm"]').focus();
  return false;
}

document.addEventListener("click", (e) => {
  const b = e.target.closest("form.desired button.cancel");
  if (!b) return;
  const form = b.closest("form");
  form.querySelector(".confirm").hidden = true;
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

function stateCell(state, reason) {
  const st = state || "unknown";
  return `<span class="state-${esc(st)}">${esc(st)}</span>${reason ? ` <span class="muted">${esc(reason)}</span>` : ""}`;
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
