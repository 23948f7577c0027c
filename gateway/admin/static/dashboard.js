// The analytics dashboard (docs/ANALYTICS.md, "The dashboard").
//
// Reads GET /analytics/rolling (the streaming job's aggregates per minute and feed),
// GET /analytics/latency (batch percentiles per feed) and GET /analytics (whose
// `worker`, where the gateway reports one, is the Spark worker's state) for the
// chosen range, and charts them with uPlot, vendored unchanged under vendor/uplot/
// (see the README there). What is ours: one series per chosen feed, the feed
// choice, zooming with the wheel, and one zoom for both charts (a drag, a wheel turn
// or a double-click on either sets both). No HTML is built from data: text goes in
// with textContent, and uPlot writes its labels the same way. The bearer token is
// the one the live page keeps in sessionStorage for this tab, or one pasted here.

import uPlot from "./vendor/uplot/uPlot.esm.js";

const TOKEN_KEY = "restms-page.token"; // shared with the live page (same origin)
const REFRESH_MS = 30_000;
const HEIGHT = 260; // px of plot and axes; the legend goes below
const MINUTE = 60; // the time axis counts seconds, as uPlot does
const SHOWN_AT_FIRST = 8; // until the user chooses, the busiest feeds are charted
const NARROWEST = 2 * MINUTE; // a zoom never shows less than this
const WHEEL_KEEPS = 0.8; // share of the span one wheel step in keeps
const SYNC = "dashboard"; // both charts show the cursor at the same minute
// Ten colours that stay distinct on light and dark backgrounds, one per feed in the
// order feeds are first seen (a feed keeps its colour across refreshes).
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const LINE = { show: false }; // a count every minute: the line alone reads better
const DOTS = { show: true, size: 6 };
const WORKER_POLL_MS = 5_000; // while the worker starts
const WORKER_STATES = new Set(["stopped", "starting", "ready", "idle-released", "failed"]);

const $ = (id) => document.getElementById(id);
const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  timer: 0,
  workerTimer: 0,
  loading: false,
  feeds: new Map(), // name -> {colour, shown}, every feed seen since the page loaded
  chosen: false, // the user picked feeds: new ones are no longer shown by default
  hidden: new Set(), // labels of series hidden from a chart's legend
  view: null, // what the last answers give to draw: see digest()
  zoom: null, // [min, max] in seconds while zoomed in, else null
  charts: [], // uPlot's, throughput then latency
  labels: "", // of the charts' series, to know when new data fits them
};

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
  const range = $("range").value;
  // `rolling` is per minute whatever the bucket, but the bucket is checked against
  // the range (at most 10,000 of them), so a week asks for 5-minute ones.
  const bucket = range === "7d" ? "5m" : "1m";
  return getJSON(`/analytics/${name}?${new URLSearchParams({ since: range, bucket })}`);
}

function rowsOf(result) {
  return result.rows.map((row) => Object.fromEntries(result.columns.map((c, i) => [c, row[i]])));
}

function formatNumber(v) {
  if (v === null || v === undefined) return "–";
  return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 1);
}

function stamp(seconds) {
  return new Date(seconds * 1000).toISOString().slice(0, 16).replace("T", " ");
}

// Time axis labels in UTC, 24-hour: the time alone, with the day over longer spans.
function ticks(chart, splits) {
  const days = chart.scales.x.max - chart.scales.x.min > 86_400;
  return splits.map((s) => stamp(s).slice(days ? 5 : 11));
}

// The answers as arrays on one time axis: every minute of the range (uPlot wants a
// value per series at each x), zero where a feed had no traffic, no mean latency
// where it had no deliveries. Feeds busiest first.
function digest(rolling, latency) {
  const first = Math.floor(Date.parse(rolling.since) / 1000 / MINUTE) * MINUTE;
  const last = Math.floor((Date.parse(rolling.until) / 1000 - 1) / MINUTE) * MINUTE; // until is excluded
  const size = Math.max(1, (last - first) / MINUTE + 1);
  const minutes = Array.from({ length: size }, (_, i) => first + i * MINUTE);
  const feeds = new Map();
  for (const row of rowsOf(rolling)) {
    const at = (Date.parse(row.minute) / 1000 - first) / MINUTE;
    if (!(at >= 0 && at < size)) continue;
    let feed = feeds.get(row.feed);
    if (!feed) {
      feed = { name: row.feed, published: Array(size).fill(0), delivered: Array(size).fill(0),
        sum: Array(size).fill(0), count: Array(size).fill(0) };
      feeds.set(row.feed, feed);
    }
    feed.published[at] += row.published;
    feed.delivered[at] += row.delivered;
    feed.sum[at] += row.deliver_latency_sum_ms;
    feed.count[at] += row.deliver_latency_count;
  }
  const total = (values) => values.reduce((n, v) => n + v, 0);
  for (const feed of feeds.values()) {
    feed.mean = feed.sum.map((s, i) => (feed.count[i] ? s / feed.count[i] : null));
    feed.totals = { published: total(feed.published), delivered: total(feed.delivered),
      sum: total(feed.sum), count: total(feed.count) };
  }
  const busiest = [...feeds.values()].sort((a, b) =>
    b.totals.published - a.totals.published || b.totals.delivered - a.totals.delivered
      || (a.name < b.name ? -1 : 1));
  return { minutes, extent: [first, last], feeds: busiest, percentiles: rowsOf(latency) };
}

// Remember feeds not seen before: each gets the next colour, and is shown while
// fewer than SHOWN_AT_FIRST feeds are (unless the user has chosen for themselves).
function learn(feeds) {
  let shown = [...state.feeds.values()].filter((f) => f.shown).length;
  for (const { name } of feeds) {
    if (state.feeds.has(name)) continue;
    const show = !state.chosen && shown < SHOWN_AT_FIRST;
    state.feeds.set(name, { colour: PALETTE[state.feeds.size % PALETTE.length], shown: show });
    if (show) shown += 1;
  }
}

function shownFeeds() {
  return state.view ? state.view.feeds.filter((f) => state.feeds.get(f.name).shown) : [];
}

function choose(name, shown) {
  state.chosen = true;
  state.feeds.get(name).shown = shown;
  for (const kind of ["published", "delivered", "mean ms"]) {
    state.hidden.delete(`${name} ${kind}`); // a feed chosen again shows whole
  }
}

function listFeeds() {
  const box = $("feeds");
  box.replaceChildren();
  const feeds = state.view.feeds;
  for (const feed of feeds) {
    const known = state.feeds.get(feed.name);
    const label = document.createElement("label");
    label.className = "feed";
    const check = document.createElement("input");
    check.type = "checkbox";
    check.checked = known.shown;
    check.addEventListener("change", () => {
      choose(feed.name, check.checked);
      draw();
    });
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = known.colour; // CSSOM, allowed by the page's policy
    const name = document.createElement("span");
    name.textContent = feed.name;
    const count = document.createElement("span");
    count.className = "count";
    count.textContent = `${feed.totals.published} published`;
    label.append(check, swatch, name, count);
    box.append(label);
  }
  const shown = shownFeeds().length;
  $("feeds-about").textContent = feeds.length
    ? `${shown} of ${feeds.length} feed${feeds.length === 1 ? "" : "s"} with traffic in this range charted, busiest first.`
    : "No traffic in this range.";
}

function colours() {
  const style = getComputedStyle(document.body);
  const read = (name) => style.getPropertyValue(name).trim();
  return { text: read("--muted"), line: read("--line") };
}

// One chart: `series` are [{label, colour, values, dash?, points?}] over the view's
// minutes.
function plot(container, series) {
  const { text, line } = colours();
  const axis = { stroke: text, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 } };
  const options = {
    width: Math.max(200, container.clientWidth),
    height: HEIGHT,
    tzDate: (seconds) => uPlot.tzDate(new Date(seconds * 1000), "Etc/UTC"),
    scales: {
      x: { time: true },
      y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] }, // from zero, some room on top
    },
    series: [
      { label: "UTC", value: (u, v) => (v === null ? "–" : stamp(v)) },
      ...series.map((s) => ({
        label: s.label, stroke: s.colour, width: 2, dash: s.dash, spanGaps: false, points: s.points,
        show: !state.hidden.has(s.label), value: (u, v) => formatNumber(v),
      })),
    ],
    axes: [
      { ...axis, space: 90, values: ticks },
      { ...axis, size: 56, values: (u, splits) => splits.map(formatNumber) },
    ],
    cursor: { drag: { x: true, y: false, setScale: false }, sync: { key: SYNC, setSeries: false } },
    legend: { live: true },
    hooks: { setSelect: [selected], setScale: [zoomed], setSeries: [remember] },
  };
  container.replaceChildren(); // "No feed chosen." and the like
  const chart = new uPlot(options, [state.view.minutes, ...series.map((s) => s.values)], container);
  chart.over.addEventListener("wheel", (event) => wheel(chart, event), { passive: false });
  return chart;
}

// uPlot's setSelect hook: a drag across a chart ended. Zoom to the minutes it spans,
// widened to whole ones (the data's own step), so that a drag ending a few pixels
// short of a minute, or of the chart's edge, still shows that minute.
function selected(chart) {
  const { left, width } = chart.select;
  if (chart.status !== 1 || width < 2) return; // a click, not a drag
  chart.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
  const [first, last] = state.view.extent;
  let min = Math.max(first, Math.floor(chart.posToVal(left, "x") / MINUTE) * MINUTE);
  let max = Math.min(last, Math.ceil(chart.posToVal(left + width, "x") / MINUTE) * MINUTE);
  if (max - min < NARROWEST) {
    max = Math.min(last, min + NARROWEST);
    min = Math.max(first, max - NARROWEST);
  }
  chart.setScale("x", { min, max });
}

// A wheel step zooms in (or out) around the minute under the pointer.
function wheel(chart, event) {
  if (!event.deltaY) return; // sideways: not a zoom
  event.preventDefault();
  const [first, last] = state.view.extent;
  const { min, max } = chart.scales.x;
  const at = chart.posToVal(event.offsetX, "x");
  const keep = event.deltaY < 0 ? WHEEL_KEEPS : 1 / WHEEL_KEEPS;
  const span = Math.min(last - first, Math.max(NARROWEST, (max - min) * keep));
  const low = Math.max(first, Math.min(at - ((at - min) / (max - min)) * span, last - span));
  chart.setScale("x", { min: low, max: low + span });
}

// uPlot's setScale hook: one chart's time range changed (a drag, a wheel step, a
// double-click, Reset zoom); give the same to the other and remember it. Hooks
// fired while a chart is built (status 0) are its initial range, not a choice.
function zoomed(chart, key) {
  if (key !== "x" || chart.status !== 1) return;
  const [first, last] = state.view.extent;
  const { min, max } = chart.scales.x;
  for (const other of state.charts) {
    if (other !== chart && (other.scales.x.min !== min || other.scales.x.max !== max)) {
      other.setScale("x", { min, max });
    }
  }
  state.zoom = min > first || max < last ? [min, max] : null;
  showZoom();
}

// uPlot's setSeries hook: a series hidden or shown from the legend stays so across
// refreshes.
function remember(chart, index, change) {
  if (chart.status !== 1 || change.show === undefined) return;
  const label = chart.series[index].label;
  if (change.show) state.hidden.delete(label);
  else state.hidden.add(label);
}

function showZoom() {
  if (!state.view) return;
  const [first, last] = state.zoom || state.view.extent;
  const whole = `${stamp(state.view.extent[0])} to ${stamp(state.view.extent[1])}`;
  $("zoom").textContent = state.zoom
    ? `Zoomed in: ${stamp(first)} to ${stamp(last)} (of ${whole}).`
    : `The whole range: ${whole}.`;
  $("zoom-reset").disabled = !state.zoom;
}

function resetZoom() {
  const [min, max] = state.view.extent;
  state.charts[0]?.setScale("x", { min, max }); // the hook gives it to the other chart
}

// The series of both charts for these feeds.
function seriesOf(feeds) {
  const colour = (f) => state.feeds.get(f.name).colour;
  return [
    feeds.flatMap((f) => [
      { label: `${f.name} published`, colour: colour(f), values: f.published, points: LINE },
      { label: `${f.name} delivered`, colour: colour(f), values: f.delivered, dash: [6, 4], points: LINE },
    ]),
    // A mean exists only in minutes with deliveries: a lone one is a dot, at any width.
    feeds.map((f) => ({ label: `${f.name} mean ms`, colour: colour(f), values: f.mean,
      points: { ...DOTS, fill: colour(f) } })),
  ];
}

// Draw the view for the chosen feeds, keeping the zoom. New data for the same series
// goes into the charts there are (a refresh does not cut short a drag or a hover);
// other series need new charts.
function draw() {
  listFeeds();
  const feeds = shownFeeds();
  const [throughput, latency] = [$("throughput-chart"), $("latency-chart")];
  const [first, last] = state.view.extent;
  if (state.zoom) {
    const [min, max] = state.zoom;
    state.zoom = min < last && max > first ? [Math.max(min, first), Math.min(max, last)] : null;
  }
  const wanted = seriesOf(feeds);
  const labels = JSON.stringify(wanted.map((series) => series.map((s) => s.label)));
  const data = (series) => [state.view.minutes, ...series.map((s) => s.values)];
  if (feeds.length && state.charts.length && labels === state.labels) {
    const [min, max] = state.zoom || state.view.extent;
    state.charts.forEach((chart, i) => {
      chart.setData(data(wanted[i]), false);
      chart.setScale("x", { min, max });
    });
  } else {
    for (const chart of state.charts) chart.destroy();
    state.charts = [];
    state.labels = labels;
    if (feeds.length) {
      state.charts = [plot(throughput, wanted[0]), plot(latency, wanted[1])];
      if (state.zoom) {
        const [min, max] = state.zoom;
        for (const chart of state.charts) chart.setScale("x", { min, max });
      }
    } else {
      for (const box of [throughput, latency]) {
        const empty = document.createElement("p");
        empty.className = "empty";
        empty.textContent = state.view.feeds.length ? "No feed chosen." : "No traffic in this range.";
        box.replaceChildren(empty);
      }
    }
  }
  const minutesWithTraffic = state.view.minutes.filter((_, i) =>
    feeds.some((f) => f.published[i] || f.delivered[i])).length;
  throughput.dataset.points = String(minutesWithTraffic);
  const total = (key) => feeds.reduce((n, f) => n + f.totals[key], 0);
  $("throughput-total").textContent = `${total("published")} published, ${total("delivered")} delivered`;
  const count = total("count");
  $("latency-total").textContent = count
    ? `mean ${formatNumber(total("sum") / count)} ms over ${count} deliveries`
    : "No deliveries in this range.";
  percentiles(new Set(feeds.map((f) => f.name)));
  showZoom();
}

function percentiles(shown) {
  const body = $("percentiles").tBodies[0];
  body.replaceChildren();
  for (const row of state.view.percentiles) {
    if (!shown.has(row.feed)) continue;
    const tr = body.insertRow();
    const cells = [row.feed, row.delivered, row.deliver_p50_ms, row.deliver_p90_ms, row.deliver_p99_ms,
      row.deliver_max_ms, row.acked, row.ack_p50_ms, row.ack_p99_ms];
    for (const value of cells) tr.insertCell().textContent = typeof value === "string" ? value : formatNumber(value);
  }
}

// The Spark worker's state (and since when, and why it failed) where the gateway's
// answer has one; nothing otherwise. While it starts, it is asked again sooner than
// the refresh, to show when it is ready.
function showWorker(index) {
  const worker = index && typeof index.worker === "object" ? index.worker : null;
  const known = worker && typeof worker.state === "string";
  $("worker").hidden = !known;
  const text = $("worker-state");
  text.textContent = known ? worker.state : "";
  text.className = known && WORKER_STATES.has(worker.state) ? `state ${worker.state}` : "state";
  const since = known && Date.parse(worker.since);
  const reason = known && typeof worker.reason === "string" ? worker.reason : "";
  $("worker-detail").textContent = (since ? ` since ${stamp(since / 1000)} UTC` : "")
    + (reason ? `: ${reason}` : "");
  clearTimeout(state.workerTimer);
  if (known && worker.state === "starting") state.workerTimer = setTimeout(loadWorker, WORKER_POLL_MS);
}

// Events the mirror dropped in the range, where the answers say (`lost`): the charts
// cannot count them, and say so.
function showLost(...answers) {
  const lost = Math.max(0, ...answers.map((a) => a.lost).filter(Number.isInteger));
  const box = $("lost");
  box.textContent = lost
    ? `The mirror dropped ${lost} event${lost === 1 ? "" : "s"} in this range: they are not counted here.`
    : "";
  box.hidden = !lost;
}

async function loadWorker() {
  try {
    showWorker(await getJSON("/analytics"));
  } catch {
    showWorker(null); // its reason is the same as the queries', shown below
  }
}

async function load() {
  if (state.loading) return;
  state.loading = true;
  say("Loading…");
  try {
    const [rolling, latency] = await Promise.all([query("rolling"), query("latency"), loadWorker()]);
    state.view = digest(rolling, latency);
    showLost(rolling, latency);
    learn(state.view.feeds);
    draw();
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

function chooseAll(shown) {
  if (!state.view) return;
  for (const feed of state.view.feeds) choose(feed.name, shown);
  draw();
}

// A canvas does not follow the page's colours by itself: new charts when the theme
// changes.
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
  state.labels = "";
  if (state.view) draw();
});

// The charts follow their cards' width.
const resized = new ResizeObserver(() => {
  for (const chart of state.charts) {
    const width = Math.max(200, chart.root.parentElement.clientWidth);
    if (width !== chart.width) chart.setSize({ width, height: HEIGHT });
  }
});
for (const id of ["throughput-chart", "latency-chart"]) resized.observe($(id));

$("controls").addEventListener("submit", (event) => {
  event.preventDefault();
  load();
});
$("range").addEventListener("change", () => {
  state.zoom = null; // a new range is seen whole
  load();
});
$("auto").addEventListener("change", schedule);
$("feeds-all").addEventListener("click", () => chooseAll(true));
$("feeds-none").addEventListener("click", () => chooseAll(false));
$("zoom-reset").addEventListener("click", resetZoom);
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
