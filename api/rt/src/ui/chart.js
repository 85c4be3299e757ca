// The history chart both pages draw (#history-panel, whose controls it makes): one property over 1 h, 24 h or 7 d from
// a gateway's history (its buckets: min/max as a band, the last value of each step drawn as a
// step), with the times the device was not online shaded and the line broken there. The page
// sets `Chart.source(property, query)` (its fetch of a history: the gateway's own API, or the
// fleet's through the cloud) and `Chart.property(name)` ({type, unit}), and calls
// `chartChoices` with the device's properties. Loaded after common.js.
"use strict";

const RANGES = { "1h": [3600e3, "30s", "the last hour"], "24h": [86400e3, "10m", "the last 24 hours"], "7d": [604800e3, "1h", "the last 7 days"] };
const Chart = { prop: "", range: "1h", data: null, states: null, error: "", loadedAt: 0, source: null, property: () => null };
const NUMERIC = new Set(["INT", "FLOAT", "DOUBLE", "BOOLEAN"]);
const numberOf = (v) => (v === "true" ? 1 : v === "false" ? 0 : typeof v === "number" ? v : Number.NaN);

async function loadHistory() {
  if (!Chart.source || !Chart.prop) return;
  const step = RANGES[Chart.range][1];
  const from = `-${Chart.range}`;
  Chart.loadedAt = Date.now();
  try {
    const [h, st] = await Promise.all([
      Chart.source(Chart.prop, `from=${from}&step=${step}`),
      Chart.source("$state", `from=${from}`),
    ]);
    const body = await h.json().catch(() => ({}));
    if (!h.ok) { Chart.error = body.error || body.message || `${h.status} ${h.statusText}`; Chart.data = null; }
    else { Chart.error = ""; Chart.data = body; }
    Chart.states = st.ok ? await st.json() : null;
  } catch (err) {
    if (String(err.message) === "unauthorized") return;
    Chart.error = String(err.message || err);
  }
  drawChart();
}

// The spans [a, b) of `from..to` the device was not online (no state known counts as online).
function gaps(states, from, to) {
  if (!states) return [];
  const pts = [...(states.before ? [states.before] : []), ...(states.points || [])];
  const out = [];
  for (let i = 0; i < pts.length; i++) {
    const s = pts[i].v;
    if (s === "online" || s === "ok") continue;
    const a = Math.max(from, pts[i].t), b = Math.min(to, i + 1 < pts.length ? pts[i + 1].t : to);
    if (b > a) out.push([a, b]);
  }
  return out;
}

// The parts of [a, b) outside the gaps.
function outside(a, b, gs) {
  let parts = [[a, b]];
  for (const [ga, gb] of gs) {
    parts = parts.flatMap(([x, y]) => (gb <= x || ga >= y ? [[x, y]] : [[x, Math.min(y, ga)], [Math.max(x, gb), y]].filter(([p, q]) => q > p)));
  }
  return parts;
}

function drawChart() {
  const fig = $("history-chart");
  const summary = $("history-summary");
  const c = Chart;
  const p = c.property(c.prop);
  for (const b of document.querySelectorAll("#history-ranges button")) b.setAttribute("aria-pressed", String(b.dataset.range === c.range));
  if (c.error) { fig.innerHTML = ""; summary.textContent = `no history: ${c.error}`; return; }
  const d = c.data;
  if (!d || !p) { fig.innerHTML = ""; summary.textContent = ""; return; }
  const unit = p.unit ? ` ${p.unit}` : "";
  const [, step, words] = RANGES[c.range];
  const from = d.from, to = d.to, bs = d.buckets || [];
  const gs = gaps(c.states, from, to);
  const offline = gs.reduce((s, [a, b]) => s + (b - a), 0);
  const vals = bs.flatMap((b) => [b.min, b.max, numberOf(b.last)]).concat(d.before ? [numberOf(d.before.v)] : []).filter((v) => typeof v === "number" && Number.isFinite(v));
  if (!NUMERIC.has(p.type) || !vals.length) {
    fig.innerHTML = "";
    const last = bs.length ? bs[bs.length - 1].last : d.before ? d.before.v : null;
    summary.textContent = last === null ? `${c.prop}: no value in ${words}` : `${c.prop}: last ${last}${unit} in ${words} (not a number: no chart)`;
    return;
  }
  let lo = Math.min(...vals), hi = Math.max(...vals);
  if (hi === lo) { hi += 1; lo -= 1; }
  // Drawn 640 wide and scaled to the figure: on a narrow screen the labels are drawn larger (at
  // least 12 px as shown, where they were 7) and the margin for them wider.
  const k = Math.min(2.2, Math.max(1, 640 / (fig.clientWidth || 640)));
  const W = 640, H = Math.round(220 + 20 * (k - 1)), L = Math.round(110 * k), R = 8, T = 10, B = Math.round(28 * k);
  // A presentation attribute: the pages' Content-Security-Policy allows no inline style.
  const font = `font-size="${(12 * k).toFixed(1)}"`;
  // A step begins on the clock's boundary, which may be before `from`: drawn from the left edge.
  const x = (t) => (L + ((Math.min(to, Math.max(from, t)) - from) / (to - from)) * (W - L - R)).toFixed(1);
  const y = (v) => (T + (1 - (v - lo) / (hi - lo)) * (H - T - B)).toFixed(1);
  const stepMs = d.step || 1;
  // The band: each step's min to max.
  const band = bs.filter((b) => typeof b.min === "number").map((b) => `<rect class="band" x="${x(b.t)}" y="${y(b.max)}" width="${Math.max(0.5, x(Math.min(to, b.t + stepMs)) - x(b.t)).toFixed(1)}" height="${Math.max(0.5, y(b.min) - y(b.max)).toFixed(1)}"/>`).join("");
  // The line: each value holds until the next, as a step; none through the gaps.
  const holds = [];
  if (d.before) holds.push([from, numberOf(d.before.v)]);
  for (const b of bs) holds.push([Math.max(from, b.t), numberOf(b.last)]);
  let path = "", pen = null;
  for (let i = 0; i < holds.length; i++) {
    const [t0, v] = holds[i];
    if (!Number.isFinite(v)) { pen = null; continue; }
    const t1 = i + 1 < holds.length ? holds[i + 1][0] : to;
    for (const [a, b] of outside(t0, t1, gs)) {
      if (pen !== null && pen === x(a)) path += ` V${y(v)} H${x(b)}`;
      else path += ` M${x(a)} ${y(v)} H${x(b)}`;
      pen = x(b);
    }
  }
  const shade = gs.map(([a, b]) => `<rect class="gap" x="${x(a)}" y="${T}" width="${(x(b) - x(a)).toFixed(1)}" height="${H - T - B}"><title>not online</title></rect>`).join("");
  // Fewer time labels where they are drawn larger, so that they do not run into each other.
  const ticks = (k > 1.4 ? [0, 0.5, 1] : [0, 0.25, 0.5, 0.75, 1]).map((f) => {
    const t = from + f * (to - from);
    // Over a day or more, each tick says its date as well.
    const label = new Date(t).toLocaleString([], c.range === "1h" ? { hour: "2-digit", minute: "2-digit" } : { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
    return `<text class="tick" ${font} x="${x(t)}" y="${H - 8}" text-anchor="${f === 0 ? "start" : f === 1 ? "end" : "middle"}">${esc(label)}</text>`;
  }).join("");
  const fmt = (v) => (p.type === "BOOLEAN" ? String(v >= 0.5) : (Math.round(v * 1000) / 1000).toString());
  fig.innerHTML = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-labelledby="history-summary" data-buckets="${bs.length}"><g>${shade}</g><g>${band}</g><path class="line" d="${path.trim()}"/><line class="axis" x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}"/><text class="tick" ${font} x="${L - 4}" y="${y(hi)}" text-anchor="end">${esc(fmt(hi))}${esc(unit)}</text><text class="tick" ${font} x="${L - 4}" y="${y(lo)}" text-anchor="end">${esc(fmt(lo))}${esc(unit)}</text>${ticks}</svg>`;
  const mins = bs.map((b) => b.min).filter((v) => typeof v === "number"), maxs = bs.map((b) => b.max).filter((v) => typeof v === "number");
  const last = holds.length ? holds[holds.length - 1][1] : null;
  let text = `${c.prop}, ${words} in steps of ${step}: `;
  text += mins.length ? `${fmt(Math.min(...mins))} to ${fmt(Math.max(...maxs))}${unit}, last ${fmt(last)}${unit}` : `no change, ${fmt(last)}${unit}`;
  if (offline >= 1000) text += `; not online for ${age(offline)}`;
  summary.textContent = text;
}

// The properties the chart can show (`names`, `typeOf(name)`): the select's options, and a first
// choice when the one shown is not among them (a measured value, then a switch, then any).
function chartChoices(names, typeOf) {
  const sel = $("history-prop");
  const shape = names.join(",");
  if (sel.dataset.shape !== shape) {
    sel.dataset.shape = shape;
    sel.innerHTML = names.map((n) => `<option value="${esc(n)}">${esc(n)}</option>`).join("");
  }
  if (!names.includes(Chart.prop)) {
    Chart.prop = names.find((n) => ["FLOAT", "DOUBLE", "INT"].includes(typeOf(n)))
      || names.find((n) => NUMERIC.has(typeOf(n))) || names[0] || "";
    Chart.data = null;
    Chart.error = "";
    loadHistory();
  }
  sel.value = Chart.prop;
}

// The panel's controls, the same on both pages: its title (and where the history comes from)
// from its data attributes.
function historyPanel() {
  const panel = $("history-panel");
  const from = panel.dataset.from ? ` <span class="muted">(${esc(panel.dataset.from)})</span>` : "";
  panel.innerHTML = `<h3 id="history-title">${esc(panel.dataset.title || "History")}${from}</h3>
    <div class="filters">
      <label for="history-prop">Property</label>
      <select id="history-prop"></select>
      <span id="history-ranges" role="group" aria-label="Range">${Object.keys(RANGES).map((r) => `<button type="button" data-range="${r}" aria-pressed="${r === Chart.range}">${r.replace(/(\d+)/, "$1 ")}</button>`).join("")}</span>
    </div>
    <figure id="history-chart"></figure>
    <p id="history-summary"></p>`;
}

// Deferred, after common.js and before the page's own script: the document is there.
historyPanel();
$("history-prop").addEventListener("change", (e) => { Chart.prop = e.target.value; Chart.data = null; drawChart(); loadHistory(); });
// Drawn again for a new width (a phone turned, a window resized): its labels' size depends on it.
let resized = 0;
window.addEventListener("resize", () => {
  clearTimeout(resized);
  resized = setTimeout(drawChart, 200);
});
$("history-ranges").addEventListener("click", (e) => {
  const b = e.target.closest("button[data-range]");
  if (!b) return;
  Chart.range = b.dataset.range;
  loadHistory();
});
