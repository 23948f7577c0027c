// The API page (docs/API.md): lists every operation of GET /openapi.json.
//
// No third-party code and no HTML built from data: every element is made here and
// every text from the description goes in with textContent. References
// ("#/components/...") are followed within the document, a bounded number of hops.

const $ = (id) => document.getElementById(id);
const VERBS = ["get", "head", "post", "put", "patch", "delete", "options", "trace"];
const MAX_HOPS = 8;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function notice(text) {
  const box = $("notice");
  box.textContent = text;
  box.hidden = !text;
}

// The object a "$ref" names, with the referring object's own keys over it
// (OpenAPI 3.1 lets a reference carry its own description).
function resolve(spec, node) {
  let hops = 0;
  let own = {};
  while (node && typeof node.$ref === "string" && node.$ref.startsWith("#/") && hops < MAX_HOPS) {
    const { $ref, ...rest } = node;
    own = { ...rest, ...own };
    node = $ref.slice(2).split("/").reduce((at, part) => (at ? at[part.replace(/~1/g, "/").replace(/~0/g, "~")] : undefined), spec);
    hops += 1;
  }
  return { ...(node || {}), ...own };
}

function table(head, rows) {
  const t = el("table");
  const tr = el("tr");
  for (const h of head) tr.append(el("th", h));
  t.append(el("thead"));
  t.tHead.append(tr);
  const body = el("tbody");
  for (const row of rows) {
    const r = el("tr");
    for (const cell of row) r.append(cell instanceof Node ? cell : el("td", cell));
    body.append(r);
  }
  t.append(body);
  return t;
}

function operation(spec, path, verb, op, shared) {
  const box = el("details", null, "op");
  const words = [verb, path, ...(op.tags || []), op.summary || "", op.operationId || ""];
  box.dataset.words = words.join(" ").toLowerCase();
  const head = el("summary");
  head.append(el("span", verb, "method"), el("span", path, "path"), el("span", op.summary || "", "summary"));
  if (Array.isArray(op.security) && op.security.length === 0) head.append(el("span", "no credentials", "public"));
  box.append(head);
  if (op.description) box.append(el("div", op.description, "text"));
  const params = [...(shared || []), ...(op.parameters || [])].map((p) => resolve(spec, p));
  if (params.length) {
    box.append(el("h4", "Parameters"));
    box.append(table(["Name", "In", "Required", "Description"], params.map((p) => [p.name, p.in, p.required ? "yes" : "", p.description || ""])));
  }
  if (op.requestBody) {
    const body = resolve(spec, op.requestBody);
    box.append(el("h4", "Request body"));
    if (body.description) box.append(el("div", body.description, "text"));
    box.append(el("p", Object.keys(body.content || {}).join(", "), "types"));
  }
  const responses = Object.entries(op.responses || {}).map(([status, reply]) => {
    const r = resolve(spec, reply);
    const description = el("td", r.description || "");
    const types = Object.keys(r.content || {});
    if (types.length) description.append(el("div", types.join(", "), "types"));
    return [el("td", status, "status"), description];
  });
  box.append(el("h4", "Responses"));
  box.append(table(["Status", "Description"], responses));
  return box;
}

function render(spec) {
  const info = spec.info || {};
  $("title").textContent = info.title || "API";
  document.title = `${info.title || "API"}: operations`;
  $("version").textContent = `OpenAPI ${spec.openapi}, version ${info.version || "?"}`;
  $("description").textContent = info.description || "";
  const byTag = new Map();
  for (const tag of spec.tags || []) byTag.set(tag.name, { tag, ops: [] });
  let count = 0;
  for (const [path, item] of Object.entries(spec.paths || {})) {
    for (const verb of VERBS) {
      const op = item[verb];
      if (!op) continue;
      const name = (op.tags && op.tags[0]) || "other";
      if (!byTag.has(name)) byTag.set(name, { tag: { name }, ops: [] });
      byTag.get(name).ops.push(operation(spec, path, verb, op, item.parameters));
      count += 1;
    }
  }
  const list = $("operations");
  for (const { tag, ops } of byTag.values()) {
    if (!ops.length) continue;
    const section = el("section", null, "card tag");
    section.append(el("h2", tag.name));
    if (tag.description) section.append(el("p", tag.description, "hint text"));
    section.append(...ops);
    list.append(section);
  }
  $("status").textContent = `${count} operations`;
  document.body.dataset.operations = String(count);
}

function filter() {
  const words = $("filter").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  for (const section of document.querySelectorAll("section.tag")) {
    let shown = 0;
    for (const op of section.querySelectorAll("details.op")) {
      const hit = words.every((w) => op.dataset.words.includes(w));
      op.hidden = !hit;
      if (hit) shown += 1;
    }
    section.hidden = shown === 0;
  }
}

async function start() {
  $("filter-form").addEventListener("submit", (event) => event.preventDefault());
  $("filter").addEventListener("input", filter);
  try {
    const reply = await fetch("/openapi.json", { headers: { Accept: "application/json" } });
    if (!reply.ok) throw new Error(`${reply.status}: ${(await reply.text()).trim()}`);
    render(await reply.json());
  } catch (error) {
    $("status").textContent = "";
    notice(`The description could not be loaded (${error.message})`);
  }
  document.body.dataset.ready = "1";
}

start();
