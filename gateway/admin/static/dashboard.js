// The analytics dashboard (docs/ANALYTICS.md, "The dashboard").
//
// Reads GET /analytics/rolling (the streaming job's per-minute aggregates) and
// GET /analytics/latency (batch percentiles) for the chosen range and feed, and
// draws the charts as SVG elements made here: no third-party code, no HTML built
// from data (text goes in with textContent). The bearer token is the one the live
// page keeps in sessionStorage for this tab, or one pasted here.

const TOKEN_KEY = "restms-page.token"; // shared with the live page (same origin)
const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 30_000;
const W = 640, H = 260, LEFT = 56, RIGHT = 16, TOP = 16, BOTTOM = 32;

const $ = (id) => document.getElementById(id);
const state = { token: sessionStorage.getItem(TOKEN_KEY) || "", timer: 0, loading: false };

function say(text) {
  $("status").textContent = text;
}

function notice(text) {
  const box = $("notice");
  box.textContent = text;
  box.hidden = !text;
}

async function getJSON(path) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const reply = await fetch(path, { headers, cache: "no-store" });
  if (!reply.ok) {
    const reason = (await reply.text()).trim();
    throw new Error(`${reply.status}: ${reason}`);
  }
  return reply.json();
}

function query(name) {
  const form = $("controls").elements;
  // The charts are per minute whatever the bucket; it only has to fit the range
  // (at most 10,000 buckets), so a week asks for 5-minute ones.
  const bucket = form.range.value === "7d" ? "5m" : "1m";
  const params = new URLSearchParams({ since: form.range.value, bucket });
  const feed = form.feed.value.trim();
  if (feed) params.set("feed", feed);
  return getJSON(`/analytics/${name}?${params}`);
}

function rowsOf(result) {
  return result.rows.map((row) => Object.fromEntries(result.columns.map((c, i) => [c, row[i]])));
}

// Per-minute totals over the feeds shown, oldest first.
function minutes(rolling) {
  const byMinute = new Map();
  for (const row of rowsOf(rolling)) {
    const m = byMinute.get(row.minute) || { minute: row.minute, published: 0, delivered: 0, sum: 0, count: 0 };
    m.published += row.published;
    m.delivered += row.delivered;
    m.sum += row.deliver_latency_sum_ms;
    m.count += row.deliver_latency_count;
    byMinute.set(row.minute, m);
  }
  return [...byMinute.values()].sort((a, b) => (a.minute < b.minute ? -1 : 1));
}

function make(tag, attrs, parent) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (parent) parent.appendChild(node);
  return node;
}

function label(parent, x, y, text, anchor = "middle") {
  make("text", { x, y, "text-anchor": anchor }, parent).textContent = text;
}

function hhmm(iso) {
  return iso.slice(11, 16);
}

// A line chart of points [{minute, <key>...}] for each series [{key, cls, name}],
// its time axis the range asked for ({since, until} of the answer).
function chart(svg, points, series, range) {
  svg.replaceChildren();
  svg.dataset.points = String(points.length);
  if (!points.length) {
    label(svg, W / 2, H / 2, "No traffic in this range.");
    return;
  }
  const values = points.flatMap((p) => series.map((s) => p[s.key]).filter((v) => v !== null));
  const top = Math.max(1, ...values);
  const t0 = Date.parse(range.since);
  const span = Math.max(60_000, Date.parse(range.until) - t0);
  const x = (p) => LEFT + ((Date.parse(p.minute) - t0) / span) * (W - LEFT - RIGHT);
  const y = (v) => H - BOTTOM - (v / top) * (H - TOP - BOTTOM);
  make("line", { class: "axis", x1: LEFT, y1: H - BOTTOM, x2: W - RIGHT, y2: H - BOTTOM }, svg);
  make("line", { class: "axis", x1: LEFT, y1: TOP, x2: LEFT, y2: H - BOTTOM }, svg);
  for (const v of [0, top / 2, top]) label(svg, LEFT - 6, y(v) + 4, formatNumber(v), "end");
  label(svg, LEFT, H - 10, hhmm(range.since), "start");
  label(svg, W - RIGHT, H - 10, hhmm(range.until), "end");
  for (const s of series) {
    const shown = points.filter((p) => p[s.key] !== null);
    const line = make("polyline", { class: `line ${s.cls}` }, svg);
    line.setAttribute("points", shown.map((p) => `${x(p).toFixed(1)},${y(p[s.key]).toFixed(1)}`).join(" "));
    for (const p of shown) {
      const dot = make("circle", { class: `dot ${s.cls}`, cx: x(p).toFixed(1), cy: y(p[s.key]).toFixed(1), r: 3 }, svg);
      make("title", {}, dot).textContent = `${hhmm(p.minute)} ${s.name}: ${formatNumber(p[s.key])}`;
    }
  }
}

function formatNumber(v) {
  if (v === null || v === undefined) return "–";
  return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 1);
}

function percentiles(latency) {
  const body = $("percentiles").tBodies[0];
  body.replaceChildren();
  for (const row of rowsOf(latency)) {
    const tr = body.insertRow();
    const cells = [row.feed, row.delivered, row.deliver_p50_ms, row.deliver_p90_ms, row.deliver_p99_ms,
      row.deliver_max_ms, row.acked, row.ack_p50_ms, row.ack_p99_ms];
    for (const value of cells) tr.insertCell().textContent = typeof value === "string" ? value : formatNumber(value);
  }
}

async function load() {
  if (state.loading) return;
  state.loading = true;
  say("Loading…");
  try {
    const [rolling, latency] = await Promise.all([query("rolling"), query("latency")]);
    const points = minutes(rolling).map((m) => ({ ...m, mean: m.count ? m.sum / m.count : null }));
    chart($("throughput-chart"), points, [
      { key: "published", cls: "published", name: "published" },
      { key: "delivered", cls: "delivered", name: "delivered" },
    ], rolling);
    chart($("latency-chart"), points, [{ key: "mean", cls: "latency", name: "mean ms" }], rolling);
    const total = (key) => points.reduce((n, p) => n + p[key], 0);
    $("throughput-total").textContent = `${total("published")} published, ${total("delivered")} delivered`;
    const count = total("count");
    $("latency-total").textContent = count
      ? `mean ${formatNumber(total("sum") / count)} ms over ${count} deliveries`
      : "No deliveries in this range.";
    percentiles(latency);
    notice("");
    say(`Updated at ${new Date().toLocaleTimeString()}.`);
  } catch (error) {
    notice(`Could not load the analytics: ${error.message}`);
    say("");
  } finally {
    state.loading = false;
    document.body.dataset.ready = "";
  }
}

function showAuth() {
  $("auth-state").textContent = state.token
    ? "A bearer token is in use (kept for this tab only)."
    : "No token: acting as the loopback guest, if the gateway allows one.";
  $("token-forget").disabled = !state.token;
}

function schedule() {
  clearInterval(state.timer);
  state.timer = $("auto").checked ? setInterval(load, REFRESH_MS) : 0;
}

function setToken(token) {
  state.token = token;
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  showAuth();
  load();
}

$("controls").addEventListener("submit", (event) => {
  event.preventDefault();
  load();
});
$("range").addEventListener("change", load);
$("auto").addEventListener("change", schedule);
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const field = $("token");
  const token = field.value.trim();
  field.value = ""; // not left in the page
  setToken(token);
});
$("token-forget").addEventListener("click", () => setToken(""));

showAuth();
schedule();
load();
