// The live page: a small client of the gateway's public RestMS JSON API.
//
// Everything goes through the same HTTP requests any client makes (docs/PROTOCOL.md,
// docs/EXTENSIONS.md): the domain document lists the feeds, a POST to the domain
// creates a feed or a pipe, a POST to a feed publishes, a POST to the pipe joins it to
// a feed, a GET on the pipe with "Accept: text/event-stream" streams its messages as
// Server-Sent Events, and a DELETE on a message acknowledges it and every older one.
//
// The stream is read with fetch() and a ReadableStream rather than EventSource, so
// that the bearer token can go in an Authorization header. When the stream ends (the
// gateway's stream_max, a restart) it is opened again with Last-Event-ID, so nothing
// still held is skipped and nothing already shown is shown twice.
//
// Safety: text from the gateway (message contents, addresses, error reasons) is put in
// the page with textContent only, never parsed as HTML. The token lives in memory and
// in sessionStorage (this tab only), never in localStorage or a cookie.

const JSON_TYPE = "application/restms+json";
const DOMAIN = "/restms/domain/default";
const TOKEN_KEY = "restms-page.token";
const PIPE_KEY = "restms-page.pipe";
const MAX_SHOWN = 200; // messages kept on the page; older ones leave the list (not the pipe)
const MAX_TEXT = 4000; // characters of one content shown
const MAX_EVENT = 8 * 1024 * 1024; // characters of one SSE event at most
const MAX_RETRIES = 8; // failed stream openings in a row before giving up
const DEPTH_DELAY = 250; // ms: a burst of events refreshes the depth once
const REQUEST_TIMEOUT = 30000; // ms for any request but the stream

const $ = (id) => document.getElementById(id);

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  feeds: [], // feed elements of the domain document
  pipe: null, // {path, name, lastId}
  stream: null, // AbortController of the open stream
  depthTimer: 0,
};

// ------------------------------------------------------------------ HTTP

class HttpError extends Error {
  constructor(status, reason) {
    super(`${status} ${reason}`);
    this.status = status;
  }
}

// The path of a URI the gateway wrote. The gateway resolves URIs by path alone (U5),
// and the page talks to its own origin whatever host the gateway put in them.
function localPath(uri) {
  const url = new URL(uri, location.href);
  return url.pathname + url.search;
}

async function call(method, path, { doc, accept = JSON_TYPE, signal, headers = {} } = {}) {
  const sent = { Accept: accept, ...headers };
  if (state.token) sent.Authorization = `Bearer ${state.token}`;
  let body;
  if (doc !== undefined) {
    sent["Content-Type"] = JSON_TYPE;
    body = JSON.stringify({ restms: doc });
  }
  const reply = await fetch(path, {
    method,
    headers: sent,
    body,
    cache: "no-store",
    // No cookies and no browser-managed credentials: the only credential is the header
    // above. This also keeps a 401 with a Basic challenge from opening a login dialog.
    credentials: "omit",
    signal: signal || AbortSignal.timeout(REQUEST_TIMEOUT),
  });
  if (!reply.ok) {
    // Every 4xx and 5xx body is one line of text/plain: the reason, shown as it is.
    const reason = (await reply.text()).trim().slice(0, 500);
    throw new HttpError(reply.status, reason || reply.statusText);
  }
  return reply;
}

async function exchange(method, path, doc) {
  const reply = await call(method, path, { doc });
  const text = await reply.text();
  const parsed = text ? JSON.parse(text) : {};
  return { restms: parsed.restms || {}, location: reply.headers.get("Location"), status: reply.status };
}

// ------------------------------------------------------------------ notices

function showError(error, what) {
  const notice = $("notice");
  const reason = error instanceof HttpError ? error.message : `${error.name}: ${error.message}`;
  notice.textContent = `${what} failed: ${reason}`;
  notice.hidden = false;
}

function clearError() {
  $("notice").hidden = true;
  $("notice").textContent = "";
}

function say(text) {
  $("status").textContent = text;
}

// Run an action from a form or button: one at a time per control, errors shown.
async function act(what, control, action) {
  control.disabled = true;
  clearError();
  say(""); // what the last action said no longer applies
  try {
    await action();
  } catch (error) {
    if (error.name !== "AbortError") showError(error, what);
  } finally {
    control.disabled = false;
  }
}

function onSubmit(id, what, action) {
  const form = $(id);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const button = form.querySelector("button[type=submit]");
    act(what, button, () => action(form));
  });
}

// ------------------------------------------------------------------ feeds

function chosenFeed() {
  return state.feeds.find((feed) => feed.name === $("feed-select").value) || null;
}

function describeFeed() {
  const feed = chosenFeed();
  const about = $("feed-about");
  for (const label of document.querySelectorAll(".feed-label")) {
    label.textContent = feed ? feed.name : "the feed";
  }
  if (!feed) {
    about.textContent = "";
    return;
  }
  const parts = [`type ${feed.type || "default"}`];
  if (feed.title) parts.push(`“${feed.title}”`);
  about.textContent = parts.join(", ");
}

async function loadFeeds(select) {
  const { restms } = await exchange("GET", DOMAIN);
  const domain = (restms.domain || [])[0] || {};
  $("domain-name").textContent = domain.name || "default";
  state.feeds = (domain.feed || []).filter((feed) => feed.name && feed.href);
  const list = $("feed-select");
  const keep = select || list.value;
  list.replaceChildren(
    ...state.feeds.map((feed) => {
      const option = document.createElement("option");
      option.value = feed.name;
      option.textContent = `${feed.name} (${feed.type || "default"})`;
      return option;
    }),
  );
  if (state.feeds.some((feed) => feed.name === keep)) list.value = keep;
  describeFeed();
}

async function createFeed(form) {
  const name = form.elements.name.value.trim();
  const type = form.elements.type.value;
  const { status } = await exchange("POST", DOMAIN, { feed: [{ name, type }] });
  await loadFeeds(name);
  say(status === 201 ? `Feed ${name} created.` : `Feed ${name} already exists; chosen.`);
  form.elements.name.value = "";
}

// ------------------------------------------------------------------ publishing

async function publish(form) {
  const feed = chosenFeed();
  if (!feed) throw new Error("choose a feed first");
  const address = form.elements.address.value;
  const text = form.elements.text.value;
  const message = { address, content: [{ type: "text/plain", value: text }] };
  const { restms } = await exchange("POST", localPath(feed.href), { message: [message] });
  const count = ((restms.message || [])[0] || {}).count || "0";
  $("publish-result").textContent =
    `Published to ${feed.name}: taken by ${count} ${count === "1" ? "pipe" : "pipes"}.`;
}

// ------------------------------------------------------------------ the pipe

function savePipe() {
  if (state.pipe) sessionStorage.setItem(PIPE_KEY, JSON.stringify(state.pipe));
  else sessionStorage.removeItem(PIPE_KEY);
}

function showPipe() {
  const pipe = state.pipe;
  $("pipe-name").textContent = pipe ? pipe.name : "none yet";
  $("pipe-join").textContent = pipe ? "Join this feed too" : "Create pipe and join";
  $("pipe-delete").hidden = !pipe;
  if (!pipe) {
    $("pipe-depth").textContent = "–";
    $("join-list").replaceChildren();
    setStream("closed");
  }
}

// The stream's state, shown as text (and as a coloured dot, from the first word).
function setStream(text) {
  const shown = $("stream-state");
  shown.textContent = text;
  shown.dataset.state = text.split(":")[0];
}

function feedName(uri) {
  const path = localPath(uri);
  const known = state.feeds.find((feed) => localPath(feed.href) === path);
  return known ? known.name : path.split("/").pop();
}

// The pipe document: depth (messages held, the asynclet not counted) and joins.
async function refreshPipe() {
  const pipe = state.pipe;
  if (!pipe) return;
  const { restms } = await exchange("GET", pipe.path);
  if (state.pipe !== pipe) return;
  const element = (restms.pipe || [])[0] || {};
  const listed = element.message || [];
  const held = listed.filter((message) => message.async !== "1").length;
  const capped = !listed.some((message) => message.async === "1"); // A8: more than listed
  $("pipe-depth").textContent = `${held}${capped ? "+" : ""} held`;
  $("join-list").replaceChildren(
    ...(element.join || [])
      .filter((join) => join.address !== pipe.name) // the default join, to the default feed
      .map((join) => {
        const item = document.createElement("li");
        item.textContent = `${feedName(join.feed)} ← ${join.address || "(any address)"}`;
        return item;
      }),
  );
}

function refreshPipeSoon() {
  clearTimeout(state.depthTimer);
  state.depthTimer = setTimeout(() => {
    refreshPipe().catch((error) => showError(error, "Reading the pipe"));
  }, DEPTH_DELAY);
}

async function joinFeed(form) {
  const feed = chosenFeed();
  if (!feed) throw new Error("choose a feed first");
  if (!state.pipe) {
    const { restms, location } = await exchange("POST", DOMAIN, { pipe: [{ title: "live page" }] });
    const element = (restms.pipe || [])[0] || {};
    state.pipe = { path: localPath(location), name: element.name || "", lastId: 0 };
    savePipe();
    showPipe();
    openStream(state.pipe);
  }
  const address = form.elements.address.value;
  await exchange("POST", state.pipe.path, { join: [{ feed: localPath(feed.href), address }] });
  say(`Pipe joined to ${feed.name} for “${address}”.`);
  await refreshPipe();
}

function forgetPipe() {
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.pipe = null;
  savePipe();
  showPipe();
  clearMessages();
}

async function deletePipe() {
  const pipe = state.pipe;
  if (!pipe) return;
  forgetPipe();
  await call("DELETE", pipe.path);
  say("Pipe deleted.");
}

// ------------------------------------------------------------------ the stream

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

// Server-Sent Events from a fetch() body: calls onEvent({event, id, data}) for each
// event, returns at the end of the stream. Keep-alive comments are skipped.
async function readEvents(body, onEvent, onRetry) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { event: "message", id: "", data: [] };
  let size = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop(); // an unfinished line waits for more
    if (buffer.length > MAX_EVENT) throw new Error("an event of the stream is too large");
    for (const line of lines) {
      if (line === "") {
        if (event.data.length) onEvent({ ...event, data: event.data.join("\n") });
        event = { event: "message", id: "", data: [] };
        size = 0;
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      size += text.length;
      if (size > MAX_EVENT) throw new Error("an event of the stream is too large");
      if (field === "data") event.data.push(text);
      else if (field === "event") event.event = text;
      else if (field === "id") event.id = text;
      else if (field === "retry" && /^\d+$/.test(text)) onRetry(Number(text));
    }
  }
}

async function openStream(pipe) {
  const controller = new AbortController();
  if (state.stream) state.stream.abort();
  state.stream = controller;
  const { signal } = controller;
  let retry = 2000;
  let failures = 0;
  while (!signal.aborted && state.pipe === pipe) {
    let ended = "";
    try {
      setStream("connecting");
      const headers = pipe.lastId ? { "Last-Event-ID": String(pipe.lastId) } : {};
      const reply = await call("GET", pipe.path, { accept: "text/event-stream", signal, headers });
      setStream("open");
      failures = 0;
      await readEvents(
        reply.body,
        (event) => {
          if (event.event === "message") received(pipe, event);
          else if (event.event === "gap") lost(event);
          else if (event.event === "deleted" || event.event === "expired") ended = event.event;
        },
        (ms) => {
          retry = Math.min(Math.max(ms, 500), 30000);
        },
      );
    } catch (error) {
      if (signal.aborted) return;
      failures += 1;
      showError(error, "Reading the pipe");
      const final = error instanceof HttpError && [401, 403, 404].includes(error.status);
      if (final || failures >= MAX_RETRIES) {
        setStream("stopped");
        if (error instanceof HttpError && error.status === 404) forgetPipe();
        return;
      }
    }
    if (ended === "deleted") {
      say("The pipe was deleted.");
      forgetPipe();
      return;
    }
    if (ended === "expired") {
      setStream("stopped: the access token expired");
      return;
    }
    setStream("reconnecting");
    await sleep(retry * Math.min(2 ** failures, 8), signal);
  }
}

// ------------------------------------------------------------------ messages

function clearMessages() {
  $("messages").replaceChildren();
  updateMessageControls();
}

function updateMessageControls() {
  const count = $("messages").children.length;
  $("messages-empty").hidden = count > 0;
  $("ack-all").disabled = count === 0;
}

function contentText(content) {
  if (content.href && content.value === undefined) {
    return `[linked content, ${content.type || "application/octet-stream"}]`;
  }
  const value = content.value || "";
  if (content.encoding !== "base64") return value;
  if (!(content.type || "").startsWith("text/")) {
    return `[${Math.floor((value.length * 3) / 4)} bytes of ${content.type || "binary data"}]`;
  }
  try {
    const bytes = Uint8Array.from(atob(value), (c) => c.charCodeAt(0));
    return new TextDecoder().decode(bytes);
  } catch {
    return "[content that is not valid base64]";
  }
}

function clip(text) {
  return text.length > MAX_TEXT ? `${text.slice(0, MAX_TEXT)}…` : text;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// A gap event: messages this page would have been shown went unacknowledged (expired,
// dropped by overflow, dead-lettered, or lost in a restart) while it was away.
function lost(event) {
  let gap;
  try {
    gap = JSON.parse(event.data);
  } catch {
    return; // not ours to understand: the messages that follow are what matters
  }
  const from = Number(gap.first);
  const to = Number(gap.last);
  if (!Number.isSafeInteger(from) || !Number.isSafeInteger(to)) return;
  const which = from === to ? `position ${from}` : `positions ${from} to ${to}`;
  say(`Messages were lost before they were acknowledged (${which}).`);
}

function received(pipe, event) {
  const id = Number(event.id);
  if (!Number.isSafeInteger(id) || id <= pipe.lastId) return; // already shown
  let message;
  try {
    message = JSON.parse(event.data).restms.message[0];
  } catch {
    showError(new Error("an event that is not a RestMS JSON message"), "Reading the pipe");
    return;
  }
  pipe.lastId = id;
  savePipe();

  const item = element("li", "message");
  item.dataset.id = String(id);
  item.dataset.href = localPath(message.href);
  const head = element("div", "message-head");
  head.append(
    element("span", "seq", `#${id}`),
    element("span", "address", message.address || "(no address)"),
    element("span", "from", message.feed ? `from ${feedName(message.feed)}` : ""),
    element("time", "when", new Date().toLocaleTimeString()),
  );
  if (message.delivery_count) {
    head.append(element("span", "again", `delivered ${Number(message.delivery_count) + 1}×`));
  }
  const ack = element("button", "secondary small", "Acknowledge");
  ack.type = "button";
  ack.setAttribute("aria-label", `Acknowledge message ${id} and older`);
  ack.addEventListener("click", () => act("Acknowledging", ack, () => acknowledge(id)));
  head.append(ack);
  item.append(head);
  for (const content of message.content || []) {
    item.append(element("pre", "content", clip(contentText(content))));
  }
  const list = $("messages");
  list.append(item);
  while (list.children.length > MAX_SHOWN) list.firstElementChild.remove();
  updateMessageControls();
  refreshPipeSoon();
}

// DELETE on a message acknowledges it and every older message of the pipe (D4).
async function acknowledge(id) {
  const list = $("messages");
  const item = list.querySelector(`li[data-id="${id}"]`);
  if (!item) return;
  await call("DELETE", item.dataset.href);
  for (const node of [...list.children]) {
    if (Number(node.dataset.id) <= id) node.remove();
  }
  updateMessageControls();
  if (document.activeElement === document.body) $("messages-heading").focus(); // its button went
  say(`Acknowledged message ${id} and older.`);
  await refreshPipe();
}

async function acknowledgeAll() {
  const last = $("messages").lastElementChild;
  if (last) await acknowledge(Number(last.dataset.id));
}

// ------------------------------------------------------------------ credentials

function showAuth() {
  $("auth-state").textContent = state.token
    ? "A bearer token is in use (kept for this tab only)."
    : "No token: acting as the loopback guest.";
  $("token-forget").disabled = !state.token;
}

// Another principal cannot see this pipe: it is left to its owner, and the page
// starts again with the feeds the new credentials can see.
async function setToken(token) {
  state.token = token;
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  forgetPipe();
  showAuth();
  await loadFeeds();
}

// ------------------------------------------------------------------ start

async function resumePipe() {
  let saved = null;
  try {
    saved = JSON.parse(sessionStorage.getItem(PIPE_KEY) || "null");
  } catch {
    saved = null;
  }
  if (!saved || typeof saved.path !== "string" || !saved.path.startsWith("/restms/")) return;
  state.pipe = { path: saved.path, name: String(saved.name || ""), lastId: 0 };
  showPipe();
  try {
    await refreshPipe();
  } catch (error) {
    forgetPipe();
    if (!(error instanceof HttpError && error.status === 404)) throw error;
    return;
  }
  openStream(state.pipe); // from the oldest message held: the list starts empty again
}

function start() {
  onSubmit("feed-choose", "Loading the feeds", () => loadFeeds());
  onSubmit("feed-create", "Creating the feed", createFeed);
  onSubmit("publish-form", "Publishing", publish);
  onSubmit("pipe-form", "Joining", joinFeed);
  onSubmit("token-form", "Loading the feeds", async (form) => {
    const token = form.elements.token.value.trim();
    form.elements.token.value = ""; // not left in the page
    await setToken(token);
    say(token ? "Token set." : "Token cleared.");
  });
  $("token-forget").addEventListener("click", (event) =>
    act("Loading the feeds", event.currentTarget, async () => {
      await setToken("");
      say("Token forgotten.");
    }),
  );
  $("feed-select").addEventListener("change", describeFeed);
  $("pipe-delete").addEventListener("click", (event) =>
    act("Deleting the pipe", event.currentTarget, deletePipe),
  );
  $("ack-all").addEventListener("click", (event) =>
    act("Acknowledging", event.currentTarget, acknowledgeAll),
  );
  showAuth();
  showPipe();
  updateMessageControls();
  loadFeeds()
    .then(resumePipe)
    .then(() => {
      document.body.dataset.ready = "1";
    })
    .catch((error) => {
      showError(error, "Loading the feeds");
      document.body.dataset.ready = "1";
    });
}

start();
