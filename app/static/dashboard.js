// privrec dashboard: sign-in, budget gauges, chart, trainings with live progress, models, ledger,
// refreshed every REFRESH_MS (pausable) without touching the forms.
// The admin token is sent once to /dashboard/session and never stored; writes carry the CSRF token.
"use strict";

const $ = (id) => document.getElementById(id);
const text = (v) => (v === null || v === undefined ? "" : String(v));
const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
const dataset = () => document.body.dataset.dataset;

async function api(path, options = {}) {
  const headers = { "Content-Type": "application/json", ...(options.headers || {}) };
  if (options.method && options.method !== "GET") headers["X-CSRF-Token"] = csrf();
  const r = await fetch(path, { credentials: "same-origin", ...options, headers });
  const body = r.status === 204 ? null : await r.json();
  if (!r.ok) throw new Error((body && body.error && body.error.message) || r.statusText);
  return body;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = text(c);
    tr.appendChild(td);
  }
  return tr;
}

// ------------------------------------------------------------------ sign-in
const login = $("login");
if (login) {
  login.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const field = $("token");
    try {
      await api("/dashboard/session", { method: "POST", body: JSON.stringify({ token: field.value }) });
      field.value = "";
      window.location.reload();
    } catch (e) { field.value = ""; $("login-error").textContent = e.message; }
  });
}

// ------------------------------------------------------------------ dashboard
// an empty list shows its message instead of an empty table
function emptyState(tbody, message, empty) {
  $(tbody).closest("table").hidden = empty;
  $(message).hidden = !empty;
}

const base = () => `/dashboard/api/datasets/${encodeURIComponent(dataset())}`;

// which cap binds, named: this data set's or the per-person budget it counts against
function capName(kind, dataset, personBudget) {
  if (kind === "dataset") return `data set cap (${dataset})`;
  if (kind === "person_budget") return `person budget cap (${text(personBudget)})`;
  return "no cap (the run costs nothing)";
}

// ------------------------------------------------------------------ gauges
const LOW_SHARE = 0.25;  // under a quarter of a cap left: "low"
const STATE_LABELS = { ok: "ok", low: "low: under 25 % left", exhausted: "exhausted: nothing left" };
const SVG_NS = "http://www.w3.org/2000/svg";

function gaugeState(remaining, cap) {
  if (!(remaining > 0)) return "exhausted";
  return remaining < LOW_SHARE * cap ? "low" : "ok";
}

function svgRect(cls, width) {
  const r = document.createElementNS(SVG_NS, "rect");
  r.setAttribute("class", cls);
  r.setAttribute("width", String(width));
  r.setAttribute("height", "12");
  return r;
}

function span(cls, value) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = value;
  return s;
}

// one cap's remaining ε out of the cap: a bar, the numbers and the state in words (not colour alone)
function gauge(kind, name, remaining, cap, binding) {
  const state = gaugeState(remaining, cap);
  const share = cap > 0 ? Math.min(1, Math.max(0, remaining / cap)) : 0;
  const g = document.createElement("div");
  g.id = `gauge-${kind}`;
  g.className = `gauge state-${state}${binding ? " binding" : ""}`;
  Object.assign(g.dataset, { state, remaining: String(remaining), cap: String(cap) });
  const bar = document.createElementNS(SVG_NS, "svg");
  bar.setAttribute("class", "gauge-bar");
  bar.setAttribute("width", "200"); bar.setAttribute("height", "12"); bar.setAttribute("viewBox", "0 0 200 12");
  bar.setAttribute("role", "img");
  bar.setAttribute("aria-label", `${name}: ${remaining} of ${cap} ε left, ${state}`);
  bar.append(svgRect("track", 200), svgRect("fill", (200 * share).toFixed(1)));
  g.append(span("gauge-name", name + (binding ? " (binds)" : "")), bar,
           span("gauge-value", `${remaining} of ${cap} ε left (${Math.floor(share * 100)} %)`),
           span("gauge-state", STATE_LABELS[state]));
  return g;
}

function showGauges(b, block) {
  const pb = b.person_budget;
  const shown = [gauge("dataset", "data set cap", b.dataset_remaining_epsilon ?? b.remaining_epsilon, b.epsilon_cap,
                       b.binding_cap === "dataset")];
  if (pb) shown.push(gauge("person", `person budget (${pb.name})`, pb.remaining_epsilon, pb.epsilon_cap,
                           b.binding_cap === "person_budget"));
  if (block) shown.push(gauge("block", `current block (${block.cohort})`, block.remaining_epsilon, block.epsilon_cap, false));
  $("gauges").replaceChildren(...shown);
}

function showCap(id, kind, dataset, personBudget) {
  $(id).textContent = capName(kind, dataset, personBudget);
  $(id).dataset.cap = text(kind);
}

async function loadSummary() {
  const eps = parseFloat($("proj-eps").value) || 1;
  const s = await api(`${base()}/summary?epsilon=${eps}`);
  const b = s.budget;
  $("spent-rdp").textContent = b.spent_epsilon_rdp;
  $("spent-pld").textContent = text(b.spent_epsilon_pld);
  $("cap").textContent = b.epsilon_cap;
  $("delta").textContent = b.delta;
  $("relations").textContent = (b.neighbouring_relations || []).join(", ") || "none charged yet";
  $("account-relation").textContent = text(b.neighbouring_relation);
  const pb = b.person_budget;
  showGauges(b, s.current_block);
  $("remaining").textContent = b.remaining_epsilon;
  showCap("binding-cap", b.binding_cap, b.dataset, pb && pb.name);
  $("dataset-remaining").textContent = text(b.dataset_remaining_epsilon);
  $("person-remaining").textContent = pb ? `${pb.remaining_epsilon} (${pb.name})` : "no person budget";
  $("person-budget").textContent = pb
    ? `${pb.name}: spent ${pb.spent_epsilon_rdp} (RDP; PLD ${text(pb.spent_epsilon_pld)}) of cap ${pb.epsilon_cap} at δ ${pb.delta}, ` +
      `${pb.neighbouring_relation}; data sets ${pb.datasets.join(", ")} (the unit is a user id)`
    : "none";
  $("cap-warning").textContent = pb && b.epsilon_cap > pb.epsilon_cap
    ? `this data set's cap (${b.epsilon_cap}) exceeds its person budget's (${pb.epsilon_cap}, ${pb.name}): ` +
      "the person budget binds first, so the data set's cap promises more than it can spend"
    : "";
  const c = s.chain;
  $("chain").innerHTML = "";
  const mark = document.createElement("span");
  mark.className = c.ok ? "ok" : "bad";
  mark.textContent = c.ok ? `verified (${c.n_entries} entries)` : `BROKEN at #${c.bad_seq}: ${c.reason}`;
  $("chain").appendChild(mark);
  const p = s.projection;
  $("projection").textContent = p
    ? `a ${p.algorithm} run at ε = ${p.epsilon} composes to ${p.composed_epsilon_rdp} (RDP; PLD ${p.composed_epsilon_pld}) of cap ${p.epsilon_cap}` +
      (p.person_budget ? `; person budget ${p.person_budget}: ${p.person_composed_epsilon_rdp} of cap ${p.person_epsilon_cap}` : "")
    : `no projection: ${text(s.projection_error)}`;
  $("affordable").textContent = !p ? "unknown" :
    p.affordable_runs === null ? "unlimited (such runs cost nothing)" :
      `${p.affordable_runs}${p.affordable_runs_capped ? "+" : ""}`;
  if (p) showCap("projection-binding", p.binding_cap, p.dataset, p.person_budget);
  else { $("projection-binding").textContent = "unknown"; $("projection-binding").dataset.cap = ""; }
  const empty = s.chart.points === 0;
  $("chart-empty").hidden = !empty;
  $("chart").innerHTML = empty ? "" : s.chart.svg;  // server-rendered SVG (numbers, times, escaped names)
  $("chart").dataset.points = s.chart.points;
  showForecast(s.forecast, s.forecast_error);
  showCapChanges(pb ? pb.history : []);
  emptyState("cap-changes", "cap-changes-empty", !pb);
}

// the block forecast's warnings (at least 14 retrain intervals ahead) as a banner, and its summary
function showForecast(f, error) {
  const banner = $("block-warning");
  banner.innerHTML = "";
  const warnings = f ? f.warnings : [];
  for (const w of warnings) {
    const p = document.createElement("p");
    p.textContent = w;
    banner.appendChild(p);
  }
  banner.hidden = warnings.length === 0;
  banner.dataset.count = warnings.length;
  $("forecast").textContent = !f ? `no forecast: ${text(error)}` :
    `retrain policy: every ${f.policy.interval_s} s at ε = ${f.policy.epsilon} (one run alone ${f.run_epsilon_rdp}), ` +
    `at least ${f.policy.min_payable_blocks} payable block(s), ` +
    `${f.policy.read_current_block ? "reading" : "not reading"} the open block; next run ${f.next_run_at}; ` +
    `${f.payable_blocks} block(s) can pay it; ` +
    (f.shortfall_at ? `fewer than the minimum from ${f.shortfall_at}` : "no shortfall in sight") +
    (f.legacy_retires_at ? `; legacy retires ${f.legacy_retires_at}` : "");
}

function showCapChanges(history) {
  const body = $("cap-changes");
  body.innerHTML = "";
  for (const h of [...history].reverse()) body.appendChild(row([h.seq, h.at, h.actor, h.old_cap, h.new_cap, h.reason]));
}

let blocksOffset = 0;
async function loadBlocks() {
  const page = await api(`${base()}/blocks?offset=${blocksOffset}&limit=10`);
  const body = $("block-rows");
  body.innerHTML = "";
  for (const b of page.items) {
    const left = b.runs_left === null ? "" : `${b.runs_left}${b.runs_left_capped ? "+" : ""}`;
    const tr = row([b.cohort, b.epsilon_cap, b.spent_epsilon_rdp, b.spent_epsilon_pld, b.remaining_epsilon, b.n_runs,
      left, b.retired ? "retired" : text(b.retires_at)]);
    tr.dataset.cohort = b.cohort;
    if (b.retired) tr.className = "retired";
    body.appendChild(tr);
  }
  emptyState("block-rows", "blocks-empty", page.total === 0);
  $("blocks-page").textContent = `${page.total ? blocksOffset + 1 : 0}–${blocksOffset + page.items.length} of ${page.total} (current first)`;
  $("blocks-newer").disabled = blocksOffset === 0;
  $("blocks-older").disabled = blocksOffset + page.items.length >= page.total;
}

function duration(started, finished) {
  if (!started || !finished) return "";
  const s = Math.max(0, (Date.parse(finished) - Date.parse(started)) / 1000);
  return s < 120 ? `${s.toFixed(1)} s` : `${(s / 60).toFixed(1)} min`;
}

let polling = null;
async function loadRuns() {
  const page = await api(`${base()}/trainings?limit=10`);
  const body = $("runs");
  body.innerHTML = "";
  let live = false;
  for (const r of page.items) {
    const bar = document.createElement("progress");
    bar.max = 1; bar.value = r.progress;
    const objective = r.config && r.config.objective;
    const tr = row([r.id, r.algorithm + (objective ? ` (${objective})` : ""), r.requested_epsilon, r.status, bar, r.stage,
                    r.trigger, r.actor, r.created_at, duration(r.started_at, r.finished_at), r.error]);
    tr.dataset.run = r.id; tr.dataset.status = r.status; tr.dataset.stage = text(r.stage);
    body.appendChild(tr);
    if (r.status === "queued" || r.status === "running") live = true;
  }
  emptyState("runs", "runs-empty", page.total === 0);
  if (live && !polling) polling = setInterval(refreshLive, 1000);
  if (!live && polling) { clearInterval(polling); polling = null; loadSummary(); loadModels(); loadLedger(); loadBlocks(); }
}

async function refreshLive() { try { await loadRuns(); } catch (e) { /* next tick */ } }

async function loadModels() {
  const page = await api(`${base()}/models?limit=20`);
  const body = $("versions");
  body.innerHTML = "";
  const active = page.items.find((m) => m.active);
  const waiting = active && active.pinned ? page.items.filter((m) => m.dataset_version > active.dataset_version) : [];
  const pin = $("pin");
  pin.innerHTML = "";
  if (active && active.pinned) {
    pin.textContent = waiting.length
      ? `pinned to version ${active.dataset_version}; a newer version waits (${waiting[0].dataset_version}) `
      : `pinned to version ${active.dataset_version} `;
    const unpin = document.createElement("button");
    unpin.textContent = "Unpin";
    unpin.id = "unpin";
    unpin.addEventListener("click", async () => { await api(`${base()}/models/unpin`, { method: "POST" }); await loadModels(); });
    pin.appendChild(unpin);
  }
  for (const m of page.items) {
    let action = m.pinned ? "active (pinned)" : "active";
    if (!m.active) {
      action = document.createElement("button");
      action.textContent = "Activate";
      action.className = "activate";
      action.addEventListener("click", async () => {
        await api(`${base()}/models/${m.id}/activate`, { method: "POST" });
        await loadModels();
      });
    }
    const tr = row([m.dataset_version, m.model_version, m.algorithm, m.epsilon, m.epsilon_pld, m.delta, m.n_items, m.rank, m.created_at, action]);
    tr.dataset.version = m.model_version;
    body.appendChild(tr);
  }
  emptyState("versions", "versions-empty", page.total === 0);
  try {
    const served = await fetch(`/v1/datasets/${encodeURIComponent(dataset())}/model`).then((r) => (r.ok ? r.json() : null));
    $("served").textContent = served ? `${served.algorithm}, id ${served.model_version}` : "none";
    $("served").dataset.version = served ? served.model_version : "";
  } catch (e) { $("served").textContent = "unknown"; }
}

let ledgerOffset = 0;
async function loadLedger() {
  const page = await api(`${base()}/ledger?offset=${ledgerOffset}&limit=20`);
  const body = $("entries");
  body.innerHTML = "";
  for (const e of page.items) {
    body.appendChild(row([e.seq, e.kind, e.run_id, e.epsilon, e.spent_epsilon_rdp, e.epsilon_cap, e.actor, e.reason, e.created_at]));
  }
  emptyState("entries", "entries-empty", page.total === 0);
  $("ledger-page").textContent = `${page.total ? ledgerOffset + 1 : 0}–${ledgerOffset + page.items.length} of ${page.total} (newest first)`;
  $("newer").disabled = ledgerOffset === 0;
  $("older").disabled = ledgerOffset + page.items.length >= page.total;
}

// no inline handlers: the pages' Content-Security-Policy allows only this file's script
const picker = $("dataset-select");
if (picker) picker.addEventListener("change", () => picker.form.submit());

const logout = $("logout");
if (logout) {
  logout.addEventListener("click", async () => { await api("/dashboard/logout", { method: "POST" }); window.location.reload(); });
}

// ------------------------------------------------------------------ objective selector
// the objectives the selected algorithm takes (from the server's list); none: the field is disabled
function fillObjectives() {
  const algo = $("train-algo").selectedOptions[0];
  const objectives = text(algo && algo.dataset.objectives).split(" ").filter(Boolean);
  const select = $("train-objective");
  const kept = select.value;
  const options = [new Option(objectives.length ? `default (${objectives[0]})` : "not applicable", "")];
  for (const o of objectives) options.push(new Option(o, o));
  select.replaceChildren(...options);
  select.disabled = objectives.length === 0;
  select.value = objectives.includes(kept) ? kept : "";
}

// ------------------------------------------------------------------ auto-refresh
const REFRESH_MS = 10000;
let refreshPaused = false;
let refreshing = false;
const pad2 = (n) => String(n).padStart(2, "0");

// every list and figure, one request after another; the forms are never touched
async function refreshAll() {
  if (refreshing) return;
  refreshing = true;
  try {
    await loadSummary(); await loadRuns(); await loadModels(); await loadLedger(); await loadBlocks();
    const now = new Date();
    $("updated").textContent = `updated ${pad2(now.getHours())}:${pad2(now.getMinutes())}:${pad2(now.getSeconds())}`;
    $("updated").dataset.at = now.toISOString();
    $("refresh-error").textContent = "";
  } catch (e) {
    $("refresh-error").textContent = `refresh failed: ${e.message}`;
  } finally {
    refreshing = false;
  }
}

function toggleRefresh() {
  refreshPaused = !refreshPaused;
  const button = $("refresh-toggle");
  button.setAttribute("aria-pressed", String(refreshPaused));
  button.textContent = refreshPaused ? "Resume auto-refresh" : "Pause auto-refresh";
  if (!refreshPaused) refreshAll();
}

if (dataset()) {
  $("proj-eps").addEventListener("change", loadSummary);
  $("refresh-toggle").addEventListener("click", toggleRefresh);
  $("train-algo").addEventListener("change", fillObjectives);
  fillObjectives();
  $("newer").addEventListener("click", () => { ledgerOffset = Math.max(0, ledgerOffset - 20); loadLedger(); });
  $("older").addEventListener("click", () => { ledgerOffset += 20; loadLedger(); });
  $("blocks-newer").addEventListener("click", () => { blocksOffset = Math.max(0, blocksOffset - 10); loadBlocks(); });
  $("blocks-older").addEventListener("click", () => { blocksOffset += 10; loadBlocks(); });
  $("train").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("train-msg").textContent = "";
    const body = { epsilon: parseFloat($("train-eps").value) };
    if ($("train-algo").value) body.algorithm = $("train-algo").value;
    if ($("train-objective").value) body.objective = $("train-objective").value;
    try {
      await api(`${base()}/trainings`, { method: "POST", body: JSON.stringify(body) });
      await loadRuns(); loadSummary(); loadLedger();
    } catch (e) { $("train-msg").textContent = e.message; }
  });
  refreshAll();
  setInterval(() => { if (!refreshPaused && !document.hidden) refreshAll(); }, REFRESH_MS);
}
