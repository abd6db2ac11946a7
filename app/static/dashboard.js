// privrec dashboard: sign-in, budget, chart, trainings with live progress, models, ledger.
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
const base = () => `/dashboard/api/datasets/${encodeURIComponent(dataset())}`;

// which cap binds, named: this data set's or the per-person budget it counts against
function capName(kind, dataset, personBudget) {
  if (kind === "dataset") return `data set cap (${dataset})`;
  if (kind === "person_budget") return `person budget cap (${text(personBudget)})`;
  return "no cap (the run costs nothing)";
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
  $("chart").innerHTML = s.chart.svg;  // server-rendered SVG (numbers and fixed labels only)
  $("chart").dataset.points = s.chart.points;
  showForecast(s.forecast, s.forecast_error);
  showCapChanges(pb ? pb.history : []);
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

if (dataset()) {
  $("proj-eps").addEventListener("change", loadSummary);
  $("newer").addEventListener("click", () => { ledgerOffset = Math.max(0, ledgerOffset - 20); loadLedger(); });
  $("older").addEventListener("click", () => { ledgerOffset += 20; loadLedger(); });
  $("blocks-newer").addEventListener("click", () => { blocksOffset = Math.max(0, blocksOffset - 10); loadBlocks(); });
  $("blocks-older").addEventListener("click", () => { blocksOffset += 10; loadBlocks(); });
  $("train").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("train-msg").textContent = "";
    const body = { epsilon: parseFloat($("train-eps").value) };
    if ($("train-algo").value) body.algorithm = $("train-algo").value;
    try {
      await api(`${base()}/trainings`, { method: "POST", body: JSON.stringify(body) });
      await loadRuns(); loadSummary(); loadLedger();
    } catch (e) { $("train-msg").textContent = e.message; }
  });
  loadSummary(); loadRuns(); loadModels(); loadLedger(); loadBlocks();
}
