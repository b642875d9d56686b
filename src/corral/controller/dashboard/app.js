// Corral's dashboard: the /v1 API, as the CLI uses it, drawn as pages. No framework, no build step.
// Pages are hash routes (#/jobs, #/job/ID, ...); each has a draw function and a refresh period.
"use strict";

const HEADERS = { "X-Corral-Dashboard": "1" };  // with the session cookie: the server's CSRF check
const JOBS_PER_PAGE = 50;
const LOG_CHARS = 500_000;  // the tail a log view keeps; older output is dropped from the page
const LIVE = new Set(["PENDING", "SUBMITTING", "STARTING", "RUNNING", "CANCELLING"]);
const MANAGED_LIVE = new Set(["PENDING", "SUBMITTING", "STARTING", "RUNNING", "RECOVERING", "CANCELLING"]);
let me = null;
let jobsPage = 1;
let timer = null;
let tail = null;  // the AbortController of the log stream the shown page follows
let ticker = null;  // redraws "… ago" and idle timers between refreshes

class NotLoggedIn extends Error {}

async function api(method, path, body) {
  const options = { method, credentials: "same-origin", headers: { ...HEADERS } };
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch("/v1" + path, options);
  if (response.status === 401) throw new NotLoggedIn();
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(problem(data, response));
  return data;
}

function problem(data, response) {
  const detail = data.detail && (data.detail.message || data.detail);
  return typeof detail === "string" ? detail : `${response.status} ${response.statusText}`;
}

const $ = (id) => document.getElementById(id);
const q = encodeURIComponent;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function cell(row, text, className) {
  const td = el("td", text === null || text === undefined ? "" : text, className);
  row.appendChild(td);
  return td;
}

function linkCell(row, text, href) {
  const td = cell(row, "");
  const a = el("a", text);
  a.href = href;
  td.appendChild(a);
  return td;
}

function header(table, columns) {
  table.querySelector("thead tr").replaceChildren(...columns.map((name) => {
    const th = el("th", name);
    th.scope = "col";
    return th;
  }));
}

function button(label, text, onClick, className = "") {
  const b = el("button", text, className);
  b.type = "button";
  b.setAttribute("aria-label", label);
  b.addEventListener("click", () => onClick(b));
  return b;
}

function duration(seconds) {
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
  return `${Math.floor(seconds / 86400)}d ${Math.floor((seconds % 86400) / 3600)}h`;
}

// "3m 4s ago" / "in 5m": kept current by the ticker through data-at.
function relative(epoch, node) {
  if (!epoch) return "";
  if (node) node.dataset.at = epoch;
  const seconds = epoch - Date.now() / 1000;
  if (Math.abs(seconds) > 7 * 86400) return new Date(epoch * 1000).toISOString().slice(0, 16).replace("T", " ");
  return seconds > 0 ? `in ${duration(seconds)}` : `${duration(-seconds)} ago`;
}

function timeCell(row, epoch) {
  const td = cell(row, "");
  td.textContent = relative(epoch, td);
  if (epoch) td.title = new Date(epoch * 1000).toLocaleString();
  return td;
}

function tick() {
  for (const node of document.querySelectorAll("[data-at]")) node.textContent = relative(+node.dataset.at);
  for (const node of document.querySelectorAll("[data-idle-since]")) {
    const idle = Date.now() / 1000 - +node.dataset.idleSince;
    node.textContent = idleText(idle, +node.dataset.idleLimit || null);
  }
}

function facts(dl, pairs) {
  dl.replaceChildren();
  for (const [name, value] of pairs) {
    if (value === null || value === undefined || value === "") continue;
    const dd = el("dd");
    if (value instanceof Node) dd.appendChild(value);
    else dd.textContent = String(value);
    dl.append(el("dt", name), dd);
  }
}

const PAGES = ["infra", "cluster", "jobs", "job", "managed", "managed-job", "dev", "login"];
const NAV = { cluster: "infra", job: "jobs", "managed-job": "managed" };

function show(page) {
  for (const name of PAGES) $(`page-${name}`).hidden = name !== page;
  for (const name of ["infra", "jobs", "managed", "dev"]) {
    const link = $(`nav-${name}`);
    if (name === (NAV[page] || page)) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

// ---- Infra ------------------------------------------------------------------------------------
function useBar(used, total) {
  const bar = el("span", null, "bar");
  bar.setAttribute("role", "img");
  const share = total ? used / total : 0;
  bar.setAttribute("aria-label", `${Math.round(share * 100)}% in use`);
  const fill = el("span");
  fill.style.width = `${Math.round(share * 100)}%`;
  bar.appendChild(fill);
  return bar;
}

const KINDS = { slurm: "Slurm", ssh: "SSH pool", k8s: "Kubernetes" };

const INFRA_EVERY = 15000;  // ms between the Infra page's refreshes

async function drawInfra(first) {
  // Opening the page probes every cluster; its refreshes share the server's latest probes, so that
  // any number of open dashboards costs each cluster one probe per period.
  const report = await api("GET", first ? "/gpus" : `/gpus?max_age=${INFRA_EVERY / 1000}`);
  const health = $("health").querySelector("tbody");
  health.replaceChildren(...report.clusters.map((c) => {
    const tr = el("tr");
    tr.dataset.cluster = c.cluster;
    linkCell(tr, c.cluster, `#/cluster/${q(c.cluster)}`);
    cell(tr, c.ok ? "answering" : `not answering: ${c.error}`, c.ok ? "ok" : "bad");
    cell(tr, c.ok ? c.node_count : "", "num");
    cell(tr, `${c.seconds.toFixed(2)} s`, "num");
    timeCell(tr, c.probed_at);
    cell(tr, KINDS[c.kind] || c.kind || "", "kind");
    const used = c.rpc_budget;  // what Corral has sent it, against its budget (rpc_budget)
    cell(tr, used ? `${used.used_last_minute} of ${used.commands_per_minute}` +
      (used.busy_reason ? `, backing off: ${used.busy_reason}` : "") : "", "num budget");
    return tr;
  }));
  const body = $("infra").querySelector("tbody");
  body.replaceChildren(...report.rows.map((r) => {
    const tr = el("tr");
    Object.assign(tr.dataset, { cluster: r.cluster, partition: r.partition, gpu: r.gpu });
    const slurm = !r.infra || r.infra.startsWith("slurm/");  // a pool or a context has no partitions
    linkCell(tr, slurm ? r.cluster : r.infra, `#/cluster/${q(r.cluster)}`);
    cell(tr, slurm ? r.partition : "-");
    cell(tr, r.gpu);
    cell(tr, r.free, "num free");
    cell(tr, r.total, "num total");
    cell(tr, r.pending, "num pending");
    cell(tr, `${r.nodes_with_free}/${r.nodes}`, "num");
    cell(tr, "").appendChild(useBar(r.total - r.free, r.total));
    return tr;
  }));
  $("infra").dataset.loaded = "true";
}

const SVG = "http://www.w3.org/2000/svg";

// The chart spans from the series' first point (a server up for an hour draws that hour, not a
// sliver at the right of 24) to now. One point (samples younger than one of the 240 stretches the
// server folds the window into) is drawn as a flat line.
function chart(series, since, until) {
  const [w, h] = [240, 60];
  if (series.points.length === 1) {
    const [at, ...values] = series.points[0];
    series = { ...series, points: [[Math.min(at, until - 1), ...values], [until, ...values]] };
  }
  since = Math.max(since, series.points[0][0]);
  const top = Math.max(1, ...series.points.map((p) => p[2]));
  const x = (at) => ((at - since) / Math.max(1, until - since)) * w;
  const y = (value) => h - (value / top) * (h - 4) - 2;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  const line = (cls, index) => {
    const path = document.createElementNS(SVG, "polyline");
    path.setAttribute("class", cls);
    path.setAttribute("points", series.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[index]).toFixed(1)}`).join(" "));
    svg.appendChild(path);
  };
  line("total", 2);
  line("used", 1);
  return svg;
}

async function drawUsage() {
  const usage = await api("GET", "/usage?hours=24");
  $("usage").replaceChildren(...usage.series.map((s) => {
    const figure = el("figure");
    const name = `${s.cluster}/${s.partition} ${s.gpu}`;
    const last = s.points[s.points.length - 1];
    const peak = Math.max(...s.points.map((p) => p[1]));
    figure.dataset.series = `${s.cluster}/${s.partition}/${s.gpu}`;
    figure.dataset.points = s.points.length;
    const svg = chart(s, usage.since, usage.until);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", `${name}: ${last[1]} of ${last[2]} GPUs in use at the last sample, ` +
                                   `at most ${peak} in the last 24 hours`);
    const from = new Date(Math.max(usage.since, s.points[0][0]) * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    figure.append(svg, el("figcaption", `${name}: ${last[1]}/${last[2]} in use, peak ${peak} (since ${from})`));
    return figure;
  }));
  $("usage-hint").textContent = usage.series.length
    ? `A sample every ${usage.sample_seconds}s, kept ${usage.retention_days} days; the dashed line is the total.`
    : "No samples yet: the server takes one a minute.";
  $("usage").dataset.loaded = "true";
}

// ---- Cluster ----------------------------------------------------------------------------------
function gib(mb) {
  return `${(mb / 1024).toFixed(mb >= 10240 ? 0 : 1)} GiB`;
}

async function drawCluster(name) {
  const c = await api("GET", `/clusters/${q(name)}`);
  $("cluster-title").textContent = `Cluster ${c.cluster}`;
  $("cluster-status").textContent = c.ok
    ? `Slurm ${c.slurm_version || "(version unknown)"}; probed in ${c.seconds.toFixed(2)} s.`
    : `Not answering: ${c.error}`;
  $("partitions").querySelector("tbody").replaceChildren(...c.partitions.map((p) => {
    const tr = el("tr");
    tr.dataset.partition = p.name;
    cell(tr, p.default ? `${p.name} (default)` : p.name);
    cell(tr, p.state, p.state === "UP" ? "ok" : "bad");
    cell(tr, p.total_nodes, "num");
    cell(tr, p.max_time);
    cell(tr, p.max_nodes === null ? "no limit" : p.max_nodes, "num");
    return tr;
  }));
  $("nodes").querySelector("tbody").replaceChildren(...c.nodes.map((n) => {
    const tr = el("tr");
    tr.dataset.node = n.name;
    tr.dataset.condition = n.condition;
    cell(tr, n.name);
    const state = cell(tr, n.condition, `node node-${n.condition}`);
    state.title = `Slurm: ${n.state}`;
    cell(tr, n.partitions.join(", "));
    const gpus = cell(tr, n.gpus.length ? "" : "none", "gpus");
    for (const g of n.gpus) {
      const item = el("span", `${g.gpu}: ${g.used}/${g.total} `);
      item.dataset.gpu = g.gpu;
      item.dataset.total = g.total;
      item.dataset.used = g.used;
      item.appendChild(useBar(g.used, g.total));
      gpus.appendChild(item);
    }
    cell(tr, `${n.cpus_alloc}/${n.cpus_total}`, "num");
    cell(tr, `${gib(n.memory_alloc_mb)}/${gib(n.memory_mb)}`, "num");
    cell(tr, n.reason);
    return tr;
  }));
  $("nodes").dataset.loaded = "true";
}

// ---- Jobs -------------------------------------------------------------------------------------
function where(job) {
  return job.infra || (job.cluster ? `${job.cluster}/${job.partition}` : "-");
}

// "Slurm ID" while every row shown is on Slurm, as a Slurm user reads it; "Infra ID" once a pool's or a
// context's handle (lab1/d575218a0cac) is among them (the CLI's handle_header).
function handleTitle(rows) {
  return rows.filter((r) => r.cluster).every((r) => String(r.infra || "slurm/").startsWith("slurm/"))
    ? "Slurm ID" : "Infra ID";
}

async function cancelJobs(ids, status, redraw) {
  try {
    const answer = await api("POST", "/cancel", { jobs: ids });
    const done = answer.jobs.filter((j) => j.cancelled).map((j) => j.job_id);
    status.textContent = done.length ? `Cancelled ${done.join(", ")}.` : `Nothing to cancel: ${ids.join(", ")} had ended.`;
  } catch (error) {
    status.textContent = `Could not cancel ${ids.join(", ")}: ${error.message}`;
  }
  await redraw();
}

function cancelButton(job, status, redraw) {
  // A job the API lists is one this user may cancel: it shows no other.
  return button(`Cancel job ${job.job_id}`, "Cancel", (b) => {
    b.disabled = true;
    return cancelJobs([job.job_id], status, redraw);
  }, "danger");
}

let clustersListed = false;

async function listClusters() {
  if (clustersListed) return;
  const select = $("filters").elements.cluster;
  const { clusters } = await api("GET", "/check?timeout=5").catch(() => ({ clusters: [] }));
  select.append(...clusters.map((c) => Object.assign(el("option", c.cluster), { value: c.cluster })));
  clustersListed = true;
}

function jobQuery() {
  const filters = new FormData($("filters"));
  const params = new URLSearchParams({ limit: JOBS_PER_PAGE, page: jobsPage });
  for (const key of ["name", "state", "cluster", "owner"]) {
    const value = String(filters.get(key) || "").trim();
    if (value) params.set(key, value);
  }
  return params.toString();
}

async function drawJobs() {
  const page = await api("GET", `/jobs?${jobQuery()}`);
  const admin = me && me.role === "admin";
  header($("jobs"), ["ID", "Name", ...(admin ? ["User"] : []), "Infra", handleTitle(page.jobs), "State", "Reason",
                     "Predicted start", "Attempt", "Submitted", "Actions"]);
  const body = $("jobs").querySelector("tbody");
  body.replaceChildren(...page.jobs.map((job) => {
    const tr = el("tr");
    tr.dataset.job = job.job_id;
    linkCell(tr, job.job_id, job.managed ? `#/managed/${q(job.job_id)}` : `#/job/${q(job.job_id)}`);
    cell(tr, job.managed ? `${job.name} (managed)` : job.name);
    if (admin) cell(tr, job.owner || "(server)");
    cell(tr, where(job));
    cell(tr, job.handle || "-");
    cell(tr, job.state, `state state-${job.state}`);
    cell(tr, job.reason);
    timeCell(tr, job.expected_start);
    cell(tr, job.attempt, "num");
    timeCell(tr, job.submitted_at);
    const actions = cell(tr, "");
    if (job.managed) actions.appendChild(managedCancelButton(job, $("jobs-status"), drawJobs));
    else if (LIVE.has(job.state)) actions.appendChild(cancelButton(job, $("jobs-status"), drawJobs));
    return tr;
  }));
  $("page-number").textContent = `Page ${page.page} of ${page.pages} (${page.total} jobs)`;
  $("prev").disabled = page.page <= 1;
  $("next").disabled = page.page >= page.pages;
  $("jobs-status").textContent = page.warnings.join("; ") || (page.total ? "" : "No jobs match.");
  $("jobs").dataset.loaded = "true";
}

// ---- one job and its output -------------------------------------------------------------------
function stopTail() {
  if (tail) tail.abort();
  tail = null;
}

// Output without the server's last line when it could not read on (errors.stream_error_line), and
// that line's message (null when the output is whole): said, not shown as output.
function cutShort(text) {
  const cut = text.match(/(^|\n)corral: error: ([^\n]*) \(([A-Za-z]\w*), exit (\d+)\)\n$/);
  return cut ? [text.slice(0, cut.index + cut[1].length), cut[2]] : [text, null];
}

// Stream `path` (raw output bytes) into `pre`, keeping the newest LOG_CHARS; `status` says how it goes.
async function follow(path, pre, status) {
  stopTail();
  const controller = (tail = new AbortController());
  pre.textContent = "";
  pre.dataset.following = "true";
  status.textContent = "Following the output as it comes…";
  try {
    const response = await fetch("/v1" + path, { credentials: "same-origin", headers: HEADERS,
                                                 signal: controller.signal });
    if (response.status === 401) throw new NotLoggedIn();
    if (!response.ok) throw new Error(problem(await response.json().catch(() => ({})), response));
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = (pre.textContent + decoder.decode(value, { stream: true })).slice(-LOG_CHARS);
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
    const [output, stopped] = cutShort(pre.textContent);
    if (stopped) {
      pre.textContent = output;
      status.textContent = `The output stopped: ${stopped}`;
      return;
    }
    status.textContent = "The output ended: the job's tasks are over.";
  } catch (error) {
    if (controller.signal.aborted) return;
    if (error instanceof NotLoggedIn) show("login");
    status.textContent = `The output stopped: ${error.message}`;
  } finally {
    if (tail === controller) pre.dataset.following = "false";
  }
}

async function drawJob(id, first) {
  const job = await api("GET", `/jobs/${q(id)}`);
  $("job-title").textContent = `Job ${job.job_id}: ${job.name}`;
  const state = el("span", job.state, `state state-${job.state}`);
  const rows = [["State", state], ["Reason", job.reason], ["User", me.role === "admin" ? job.owner || "(server)" : ""],
                ["Infra", where(job)], [handleTitle([job]), job.handle], ["Attempt", job.attempt],
                ["Submitted", relative(job.submitted_at)], ["Predicted start", relative(job.expected_start)],
                ["Started", relative(job.started_at)], ["Ended", relative(job.ended_at)], ["Exit code", job.exit_code]];
  facts($("job-facts"), rows);
  $("job-facts").dataset.state = job.state;
  const actions = $("job-actions");
  actions.replaceChildren();
  if (LIVE.has(job.state)) actions.appendChild(cancelButton(job, $("job-status"), () => drawJob(id, false)));
  if (first) follow(`/jobs/${q(id)}/logs?follow=true`, $("job-logs"), $("job-logs-status"));
  readStderr(job);
}

// A script's --error file, apart from its output (where its traceback is): read whole when the page
// opens, and once more when the job has ended, not followed.
async function readStderr(job) {
  const part = $("job-stderr-part");
  part.hidden = !job.stderr_path;
  const ended = String(!LIVE.has(job.state));
  if (!job.stderr_path || part.dataset.read === ended) return;
  part.dataset.read = ended;
  const status = $("job-stderr-status");
  try {
    const asked = location.hash;
    const response = await fetch(`/v1/jobs/${q(job.job_id)}/logs?stderr=true`,
                                 { credentials: "same-origin", headers: HEADERS });
    if (response.status === 401) throw new NotLoggedIn();
    if (!response.ok) throw new Error(problem(await response.json().catch(() => ({})), response));
    const [text, stopped] = cutShort(await response.text());
    if (location.hash !== asked) return;  // the page has moved on to another job meanwhile
    $("job-stderr").textContent = text.slice(-LOG_CHARS);
    status.textContent = stopped ? `Not read whole: ${stopped}` : ended === "true" ? ""
      : "As it was when the page opened; read again once the job ends.";
  } catch (error) {
    if (error instanceof NotLoggedIn) show("login");
    status.textContent = `Could not read it: ${error.message}`;
  }
}

// ---- managed jobs -----------------------------------------------------------------------------
async function cancelManaged(id, status, redraw) {
  try {
    await api("POST", "/managed/cancel", { jobs: [id] });
    status.textContent = `Cancelling ${id}: the controller stops its attempt and will not recover it.`;
  } catch (error) {
    status.textContent = `Could not cancel ${id}: ${error.message}`;
  }
  await redraw();
}

function managedCancelButton(job, status, redraw) {
  if (job.managed_state && !MANAGED_LIVE.has(job.managed_state)) return el("span");
  return button(`Cancel managed job ${job.job_id}`, "Cancel", (b) => {
    b.disabled = true;
    return cancelManaged(job.job_id, status, redraw);
  }, "danger");
}

// A pipeline's task is named with its pipeline and its place in it, as `corral jobs queue` names it.
function managedName(job) {
  return job.pipeline ? `${job.pipeline.name}/${job.pipeline.task}: ${job.name}` : job.name;
}

// A pipeline's task: its pipeline's tasks in the order they run, each a link but this one; a job
// group's tasks run side by side (its auxiliary ones marked so).
function pipelineLinks(job) {
  if (!job.pipeline || !job.pipeline_tasks) return null;
  const group = job.pipeline.execution === "parallel";
  const auxiliary = new Set(job.pipeline_auxiliary || []);
  const list = el("span", `${job.pipeline.name}${group ? " (job group)" : ""}: `, "pipeline");
  job.pipeline_tasks.forEach((id, number) => {
    if (number) list.append(group ? " · " : " → ");
    const label = `task ${number}${auxiliary.has(id) ? " (auxiliary)" : ""}`;
    if (id === job.job_id) {
      list.appendChild(el("strong", label));
    } else {
      const a = el("a", label);
      a.href = `#/managed/${q(id)}`;
      list.appendChild(a);
    }
  });
  return list;
}

async function drawManaged() {
  const { jobs } = await api("GET", "/managed?limit=100");
  const admin = me && me.role === "admin";
  header($("managed"), ["ID", "Name", ...(admin ? ["User"] : []), "State", "Infra", handleTitle(jobs),
                        "Predicted start", "Attempts", "Recoveries", "Moves", "Reason", "Actions"]);
  $("managed").querySelector("tbody").replaceChildren(...jobs.map((job) => {
    const tr = el("tr");
    tr.dataset.job = job.job_id;
    linkCell(tr, job.job_id, `#/managed/${q(job.job_id)}`);
    cell(tr, managedName(job), "name");
    if (admin) cell(tr, job.owner || "(server)");
    cell(tr, job.state, `state state-${job.state}`);
    cell(tr, where(job));
    cell(tr, job.handle || "-");
    timeCell(tr, job.expected_start);
    cell(tr, job.attempts, "num");
    cell(tr, job.recoveries, "num");
    cell(tr, job.moves, "num");
    cell(tr, job.reason);
    const actions = cell(tr, "");
    if (MANAGED_LIVE.has(job.state)) actions.appendChild(managedCancelButton(job, $("managed-status"), drawManaged));
    return tr;
  }));
  $("managed-status").textContent = jobs.length ? "" : "No managed jobs. Start one with `corral jobs launch`.";
  $("managed").dataset.loaded = "true";
}

let whyAsked = 0;

async function drawManagedJob(id, first) {
  const job = await api("GET", `/managed/${q(id)}`);
  $("mjob-title").textContent = `Managed job ${job.job_id}: ${managedName(job)}`;
  facts($("mjob-facts"), [["State", el("span", job.state, `state state-${job.state}`)], ["Reason", job.reason],
                          ["Pipeline", pipelineLinks(job)],
                          ["Infra", where(job)], [handleTitle([job]), job.handle],
                          ["Predicted start", relative(job.expected_start)],
                          ["Recoveries", job.recoveries], ["Moves", job.moves],
                          ["Restarts after errors", job.restarts_on_errors]]);
  const actions = $("mjob-actions");
  actions.replaceChildren();
  if (MANAGED_LIVE.has(job.state)) {
    actions.appendChild(managedCancelButton(job, $("mjob-status"), () => drawManagedJob(id, false)));
  }
  $("mjob-attempts").querySelectorAll("thead th")[2].textContent = handleTitle(job.attempt_list);
  $("mjob-attempts").querySelector("tbody").replaceChildren(...job.attempt_list.map((a) => {
    const tr = el("tr");
    tr.dataset.attempt = a.number;
    cell(tr, a.number, "num");
    cell(tr, where(a));
    cell(tr, a.handle || "-");
    cell(tr, a.state, `state state-${a.state}`);
    cell(tr, a.failure ? `${a.reason || ""} (${a.failure})` : a.reason);
    timeCell(tr, a.submitted_at);
    timeCell(tr, a.started_at);
    timeCell(tr, a.ended_at);
    cell(tr, a.exit_code, "num");
    return tr;
  }));
  $("mjob-events").replaceChildren(...job.events.map((e) => {
    const li = el("li");
    const at = el("time", new Date(e.at * 1000).toLocaleString());
    at.dateTime = new Date(e.at * 1000).toISOString();
    li.append(at, " ", el("strong", e.state), e.reason ? ` ${e.reason}` : "");
    return li;
  }));
  $("mjob-events").dataset.count = job.events.length;
  // Why it waits comes from a fresh plan (a probe of every cluster): asked at most every 15 s.
  // (a job no place could run yet has no attempt: pending all the same)
  const pending = job.attempt_state === "PENDING" || job.attempt_state === "SUBMITTING" ||
    (job.state === "PENDING" && !job.attempt_state);
  if (!pending) $("mjob-why").textContent = `Not pending: ${job.state}.`;
  else if (first || Date.now() - whyAsked > 15_000) {
    whyAsked = Date.now();
    const asked = location.hash;
    api("GET", `/managed/${q(id)}/why`).then((why) => {
      if (location.hash !== asked) return;  // the page has moved on to another job meanwhile
      $("mjob-why").textContent = why.lines.join("\n");
      $("mjob-why").dataset.loaded = "true";
    }).catch((error) => { $("mjob-why").textContent = error.message; });
  }
  const latest = job.attempt_list.filter((a) => a.handle).pop();
  const logs = $("mjob-logs");
  if (latest && logs.dataset.attempt !== String(latest.number)) {
    logs.dataset.attempt = latest.number;
    follow(`/managed/${q(id)}/attempts/${latest.number}/logs?follow=true`, logs, $("mjob-logs-status"));
  } else if (!latest) {
    $("mjob-logs-status").textContent = "No attempt has reached a cluster yet.";
  }
  $("mjob-facts").dataset.state = job.state;
}

// ---- dev allocations --------------------------------------------------------------------------
function idleText(idle, limit) {
  if (idle === null || Number.isNaN(idle)) return "not used yet";
  return limit ? `idle ${duration(idle)} of ${duration(limit)}` : `idle ${duration(idle)} (no limit)`;
}

async function copy(text, status) {
  try {
    await navigator.clipboard.writeText(text);
    status.textContent = "Copied the ssh command.";
  } catch {
    status.textContent = "Your browser would not copy: select the command and copy it.";
  }
}

async function release(name, status) {
  try {
    const answer = await api("DELETE", `/dev/${q(name)}`);
    status.textContent = answer.released ? `Released ${name}.` : `${name} was already released.`;
  } catch (error) {
    status.textContent = `Could not release ${name}: ${error.message}`;
  }
  await drawDev();
}

// What an allocation holds per node, as `corral status` says it: what it asked for, then what Slurm gave.
function heldText(a) {
  const mem = a.memory_gb_per_node;
  const given = (a.cpus_per_node ? `, cpu=${a.cpus_per_node}` : "") +
    (mem ? `, mem=${Number.isInteger(mem) ? `${mem}G` : `${Math.round(mem * 1024)}M`}` : "");
  return `${a.num_nodes}x ${a.accelerators || a.gres || "cpu"}${given}`;
}

async function drawDev() {
  const { allocations } = await api("GET", "/dev");
  const admin = me && me.role === "admin";
  header($("dev"), ["Name", ...(admin ? ["User"] : []), "State", "Infra", "Resources", "Nodes", "Idle",
                    "Time left", "Shell", "Actions"]);
  const now = Date.now() / 1000;
  $("dev").querySelector("tbody").replaceChildren(...allocations.map((a) => {
    const tr = el("tr");
    tr.dataset.allocation = a.name;
    tr.dataset.state = a.state;
    cell(tr, a.name);
    if (admin) cell(tr, a.owner || "(server)");
    cell(tr, a.reason ? `${a.state}: ${a.reason}` : a.state, `state state-${a.state}`);
    cell(tr, where(a));
    cell(tr, heldText(a), "resources");
    cell(tr, a.nodes.join(", ") || "-");
    const idle = cell(tr, idleText(a.idle_seconds, a.idle_limit_seconds));
    if (a.idle_seconds !== null) {
      idle.dataset.idleSince = now - a.idle_seconds;
      idle.dataset.idleLimit = a.idle_limit_seconds || "";
    }
    cell(tr, a.time_left);
    const shell = cell(tr, "");
    if (a.ssh_command) {
      const code = el("code", a.ssh_command, "command");
      shell.append(code, " ", button(`Copy the ssh command of ${a.name}`, "Copy", () => copy(a.ssh_command, $("dev-status"))));
    }
    const actions = cell(tr, "");
    if (a.owner === me.name || !a.owner || admin) {
      actions.appendChild(button(`Release ${a.name}`, "Release", (b) => {
        b.disabled = true;
        return release(a.name, $("dev-status"));
      }, "danger"));
    }
    return tr;
  }));
  $("dev-status").textContent = allocations.length ? "" : "No dev allocations.";
  $("dev").dataset.loaded = "true";
}

// ---- the engine's own health ----------------------------------------------------------------------
const ENGINE_EVERY = 10000;  // ms between checks of whether this server drives jobs
let engineCheckedAt = 0;

// A server that drives nothing says so on every page: its replicas read different cluster lists
// (shards.py fails closed), so jobs wait until an admin gives them the same clusters file.
async function drawEngine() {
  if (Date.now() - engineCheckedAt < ENGINE_EVERY) return;
  engineCheckedAt = Date.now();
  const health = await api("GET", "/health");
  const why = health.last_tick && health.last_tick.disagreement;
  $("engine").textContent = why ? `This server drives no jobs: ${why}` : "";
  $("engine").hidden = !why;
  $("engine").dataset.checkedAt = engineCheckedAt;
}

// ---- the app ------------------------------------------------------------------------------------
function parseRoute() {
  const [page, arg] = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const pages = {
    jobs: [() => drawJobs(), 1000, "jobs-status"],
    managed: [() => drawManaged(), 2000, "managed-status"],
    dev: [() => drawDev(), 5000, "dev-status"],
  };
  if (page === "cluster" && arg) return ["cluster", (first) => drawCluster(arg, first), 15000, "cluster-status"];
  if (page === "job" && arg) return ["job", (first) => drawJob(arg, first), 2000, "job-status"];
  if (page === "managed" && arg) return ["managed-job", (first) => drawManagedJob(arg, first), 2000, "mjob-status"];
  if (pages[page]) return [page, ...pages[page]];
  return ["infra", async (first) => { await drawInfra(first); await drawUsage(); }, INFRA_EVERY, "usage-hint"];
}

async function route() {
  clearTimeout(timer);
  stopTail();
  $("mjob-logs").dataset.attempt = "";
  $("mjob-why").dataset.loaded = "";  // another job's answer is not this one's
  $("mjob-why").textContent = "";
  $("job-stderr-part").dataset.read = "";
  $("job-stderr").textContent = "";
  const [page, draw, every, statusId] = parseRoute();
  try {
    if (me === null) {
      me = await api("GET", "/me");
      $("who").textContent = `${me.name} (${me.role})`;
      $("owner-filter").hidden = me.role !== "admin";
    }
    show(page);
    if (page === "jobs") listClusters();
    let first = true;
    const loop = async () => {
      try {
        await Promise.all([draw(first), drawEngine()]);
      } catch (error) {
        if (error instanceof NotLoggedIn) throw error;
        $(statusId).textContent = error.message;
      }
      first = false;
      if (!document.hidden) timer = setTimeout(loop, every);
    };
    await loop();
  } catch (error) {
    if (error instanceof NotLoggedIn) show("login");
    else throw error;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("prev").addEventListener("click", () => { jobsPage = Math.max(1, jobsPage - 1); route(); });
  $("next").addEventListener("click", () => { jobsPage += 1; route(); });
  $("filters").addEventListener("input", () => { jobsPage = 1; route(); });
  $("filters").addEventListener("submit", (event) => event.preventDefault());
  document.addEventListener("visibilitychange", () => { if (!document.hidden) route(); });
  window.addEventListener("hashchange", () => { route(); $("main").focus({ preventScroll: true }); });
  ticker = setInterval(tick, 1000);
  route();
});
