// Corral's dashboard: the /v1 API, as the CLI uses it, drawn as pages. No framework, no build step.
"use strict";

const HEADERS = { "X-Corral-Dashboard": "1" };  // with the session cookie: the server's CSRF check
const JOBS_PER_PAGE = 50;
const LIVE = new Set(["PENDING", "SUBMITTING", "STARTING", "RUNNING", "CANCELLING"]);
let me = null;
let jobsPage = 1;
let timer = null;

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
  if (!response.ok) {
    const detail = data.detail && (data.detail.message || data.detail);
    throw new Error(typeof detail === "string" ? detail : `${response.status} ${response.statusText}`);
  }
  return data;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function when(epoch) {
  if (!epoch) return "";
  const seconds = Math.max(0, Date.now() / 1000 - epoch);
  if (seconds < 60) return `${Math.round(seconds)}s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)}h ago`;
  return new Date(epoch * 1000).toISOString().slice(0, 16).replace("T", " ");
}

function show(page) {
  for (const name of ["infra", "jobs", "login"]) {
    document.getElementById(`page-${name}`).hidden = name !== page;
    const link = document.getElementById(`nav-${name}`);
    if (link && name === page) link.setAttribute("aria-current", "page");
    else if (link) link.removeAttribute("aria-current");
  }
}

// ---- Infra ------------------------------------------------------------------------------------
async function drawInfra() {
  const report = await api("GET", "/gpus");
  const body = document.querySelector("#infra tbody");
  body.replaceChildren();
  for (const r of report.rows) {
    const tr = document.createElement("tr");
    tr.dataset.cluster = r.cluster;
    tr.dataset.partition = r.partition;
    tr.dataset.gpu = r.gpu;
    cell(tr, r.cluster);
    cell(tr, r.partition);
    cell(tr, r.gpu);
    cell(tr, r.free, "num free");
    cell(tr, r.total, "num total");
    cell(tr, r.pending, "num pending");
    cell(tr, `${r.nodes_with_free}/${r.nodes}`, "num");
    const use = cell(tr, "");
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.setAttribute("role", "img");
    const used = r.total ? (r.total - r.free) / r.total : 0;
    bar.setAttribute("aria-label", `${Math.round(used * 100)}% in use`);
    const fill = document.createElement("span");
    fill.style.width = `${Math.round(used * 100)}%`;
    bar.appendChild(fill);
    use.appendChild(bar);
    body.appendChild(tr);
  }
  const failures = document.getElementById("infra-failures");
  failures.replaceChildren(...report.failures.map((f) => {
    const li = document.createElement("li");
    li.textContent = `${f.cluster}: ${f.error}`;
    return li;
  }));
  document.getElementById("infra-age").textContent = `Probed at ${new Date().toLocaleTimeString()}.`;
  document.getElementById("infra").dataset.loaded = "true";
}

const SVG = "http://www.w3.org/2000/svg";

function chart(series, since, until) {
  const [w, h] = [240, 60];
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
  const box = document.getElementById("usage");
  box.replaceChildren(...usage.series.map((s) => {
    const figure = document.createElement("figure");
    const name = `${s.cluster}/${s.partition} ${s.gpu}`;
    const last = s.points[s.points.length - 1];
    const peak = Math.max(...s.points.map((p) => p[1]));
    figure.dataset.series = `${s.cluster}/${s.partition}/${s.gpu}`;
    figure.dataset.points = s.points.length;
    const svg = chart(s, usage.since, usage.until);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", `${name}: ${last[1]} of ${last[2]} GPUs in use at the last sample, ` +
                                   `at most ${peak} in the last 24 hours`);
    const caption = document.createElement("figcaption");
    caption.textContent = `${name}: ${last[1]}/${last[2]} in use, peak ${peak}`;
    figure.append(svg, caption);
    return figure;
  }));
  document.getElementById("usage-hint").textContent = usage.series.length
    ? `A sample every ${usage.sample_seconds}s, kept ${usage.retention_days} days; the dashed line is the total.`
    : "No samples yet: the server takes one a minute.";
  box.dataset.loaded = "true";
}

// ---- Jobs -------------------------------------------------------------------------------------
function jobColumns() {
  const columns = ["ID", "Name"];
  if (me && me.role === "admin") columns.push("User");
  return columns.concat(["Infra", "Slurm ID", "State", "Reason", "Submitted", ""]);
}

function matches(job, filters) {
  const has = (value, wanted) => !wanted || String(value || "").toLowerCase().includes(wanted.toLowerCase());
  return has(job.name, filters.get("name")) && (!filters.get("state") || job.state === filters.get("state"))
    && has(job.cluster, filters.get("cluster")) && has(job.owner, filters.get("owner"));
}

async function cancelJob(job, button) {
  button.disabled = true;
  try {
    await api("POST", "/cancel", { jobs: [job.job_id] });
    document.getElementById("jobs-status").textContent = `Cancelled ${job.job_id}.`;
  } catch (error) {
    document.getElementById("jobs-status").textContent = `Could not cancel ${job.job_id}: ${error.message}`;
  }
  await drawJobs();
}

async function drawJobs() {
  const page = await api("GET", `/queue?limit=${JOBS_PER_PAGE}&page=${jobsPage}`);
  const head = document.querySelector("#jobs thead tr");
  head.replaceChildren(...jobColumns().map((name) => {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = name;
    return th;
  }));
  const filters = new FormData(document.getElementById("filters"));
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  for (const job of page.jobs.filter((j) => matches(j, filters))) {
    const tr = document.createElement("tr");
    tr.dataset.job = job.job_id;
    cell(tr, job.job_id);
    cell(tr, job.name);
    if (me && me.role === "admin") cell(tr, job.owner || "(server)");
    cell(tr, job.cluster ? `${job.cluster}/${job.partition}` : "-");
    cell(tr, job.slurm_job_id || "-");
    cell(tr, job.state, `state state-${job.state}`);
    cell(tr, job.reason);
    cell(tr, when(job.submitted_at));
    const actions = cell(tr, "");
    if (LIVE.has(job.state)) {  // a listed job is one this user may cancel (the API shows no other)
      const button = document.createElement("button");
      button.type = "button";
      button.className = "danger";
      button.textContent = "Cancel";
      button.setAttribute("aria-label", `Cancel job ${job.job_id}`);
      button.addEventListener("click", () => cancelJob(job, button));
      actions.appendChild(button);
    }
    body.appendChild(tr);
  }
  document.getElementById("page-number").textContent = `Page ${jobsPage}`;
  document.getElementById("prev").disabled = jobsPage === 1;
  document.getElementById("next").disabled = !page.more;
  const warnings = page.warnings.join("; ");
  document.getElementById("jobs-status").textContent = page.jobs.length ? warnings : (warnings || "No jobs.");
  document.getElementById("jobs").dataset.loaded = "true";
}

// ---- the app ------------------------------------------------------------------------------------
async function route() {
  clearTimeout(timer);
  const page = location.hash === "#/jobs" ? "jobs" : "infra";
  try {
    if (me === null) {
      me = await api("GET", "/me");
      document.getElementById("who").textContent = `${me.name} (${me.role})`;
      document.getElementById("owner-filter").hidden = me.role !== "admin";
    }
    show(page);
    const draw = page === "jobs" ? drawJobs : async () => { await drawInfra(); await drawUsage(); };
    const every = page === "jobs" ? 1000 : 15000;  // jobs live; the pool re-probed every 15 s
    const loop = async () => {
      try {
        await draw();
      } catch (error) {
        if (error instanceof NotLoggedIn) throw error;
        document.getElementById(page === "jobs" ? "jobs-status" : "infra-age").textContent = error.message;
      }
      if (!document.hidden) timer = setTimeout(loop, every);
    };
    await loop();
  } catch (error) {
    if (error instanceof NotLoggedIn) show("login");
    else throw error;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("prev").addEventListener("click", () => { jobsPage = Math.max(1, jobsPage - 1); route(); });
  document.getElementById("next").addEventListener("click", () => { jobsPage += 1; route(); });
  document.getElementById("filters").addEventListener("input", () => drawJobs());
  document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());
  document.addEventListener("visibilitychange", () => { if (!document.hidden) route(); });
  window.addEventListener("hashchange", route);
  route();
});
