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
