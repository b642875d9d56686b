"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a team server on
the real testbed: its one-time login, the GPU pool as `corral gpus --json` has it and a cluster's nodes
as `sinfo` has them, a job launched from the CLI appearing live with its output streaming in and
cancelled from the page, a managed job's attempts, timeline and why it waits, a dev allocation's ssh
command, idle timer and release, and a second user seeing none of it."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.controller.test_team import add_user, call
from tests.helpers import fill_h100s, free_port, job_state, logged_in, ssh_login

@pytest.fixture
def dashboard_server(corral, corral_env, clean_queues):
    home = Path(corral_env["CORRAL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("submit_as: service\n")  # about the pages, not the accounts
    port = free_port()
    # A usage sample every second (a minute by default), so the chart has points within the test.
    fast = {**corral_env, "CORRAL_USAGE_SAMPLE_SECONDS": "1", "CORRAL_CONTROLLER_INTERVAL": "1"}
    started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port), env=fast)
    assert started.exit_code == 0, started.stderr
    yield f"http://127.0.0.1:{port}"
    corral("server", "stop")


# Basic accessibility, as the issue asks, checked on each page the tests draw: every control has a name
# (a label, its text or aria-label), and every piece of visible text has WCAG AA contrast (4.5:1)
# against the background it is drawn on.
ACCESSIBILITY_PROBLEMS = """() => {
  const problems = [];
  for (const control of document.querySelectorAll("input, select, button, a[href]")) {
    if (control.closest("[hidden]")) continue;
    const name = (control.getAttribute("aria-label") || control.textContent || "").trim()
      || (control.labels && [...control.labels].map(l => l.textContent).join("").trim());
    if (!name) problems.push(`unnamed ${control.tagName} ${control.outerHTML.slice(0, 80)}`);
  }
  const rgb = (text) => (text.match(/[\\d.]+/g) || []).map(Number);
  const luminance = ([r, g, b]) => [r, g, b].map(v => v / 255).map(v => v <= 0.03928 ? v / 12.92
                                                        : ((v + 0.055) / 1.055) ** 2.4)
                                     .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const background = (node) => {
    for (; node; node = node.parentElement) {
      const color = rgb(getComputedStyle(node).backgroundColor);
      if (color.length === 3 || (color.length === 4 && color[3] > 0)) return color.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  while (walker.nextNode()) {
    const node = walker.currentNode.parentElement;
    if (!walker.currentNode.textContent.trim() || seen.has(node) || !node.getClientRects().length) continue;
    seen.add(node);
    const [a, b] = [luminance(rgb(getComputedStyle(node).color).slice(0, 3)), luminance(background(node))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5) problems.push(`contrast ${ratio.toFixed(2)} for "${node.textContent.trim().slice(0, 30)}"`);
  }
  return problems;
}"""


def accessible(page) -> list[str]:
    """What keeps the shown page from basic accessibility (nothing, when it passes)."""
    return page.evaluate(ACCESSIBILITY_PROBLEMS)


def admin_token(env: dict[str, str]) -> str:
    return json.loads((Path(env["CORRAL_HOME"]) / "controller.json").read_text())["token"]


def test_login_link_the_gpu_pool_as_corral_gpus_has_it_and_a_clusters_nodes(browser, corral, corral_env,
                                                                            dashboard_server, testbed):
    context, page, link = logged_in(browser, corral)
    page.wait_for_selector("#infra[data-loaded=true]", timeout=30_000)
    assert page.url.rstrip("/") == dashboard_server
    shown = page.eval_on_selector_all("#infra tbody tr", """rows => rows.map(r => [r.dataset.cluster,
        r.dataset.partition, r.dataset.gpu, +r.querySelector('.free').textContent,
        +r.querySelector('.total').textContent, +r.querySelector('.pending').textContent])""")
    cli = [[r["cluster"], r["partition"], r["gpu"], r["free"], r["total"], r["pending"]]
           for r in corral("gpus", "--json").json() if "partition" in r]
    assert shown and sorted(shown) == sorted(cli)
    assert page.get_by_text("(admin)").is_visible()
    from corral.controller.web import ASSETS

    assert sum(f.stat().st_size for f in ASSETS.iterdir()) <= 300_000  # the first-load budget

    # GPU use over time: a chart per row, whose last sample is what the table shows (an idle testbed).
    def charted() -> list[list]:
        page.reload()
        page.wait_for_selector("#usage[data-loaded=true]", timeout=30_000)
        return page.eval_on_selector_all("#usage figure", "figs => figs.map(f => [f.dataset.series, +f.dataset.points, "
                                         "f.querySelector('svg').getAttribute('aria-label')])")
    figures = wait_for("a chart per row", lambda: (lambda f: f if len(f) == len(shown) else None)(charted()),
                       timeout=60, interval=1)
    by_series = {series: label for series, _, label in figures}
    for cluster, partition, gpu, free, total, _pending in shown:
        assert f"{total - free} of {total} GPUs in use" in by_series[f"{cluster}/{partition}/{gpu}"]
    # Samples keep coming (one a second here): over the last minute each series has several points.
    def recent_points() -> list[int]:
        status, text = call(dashboard_server, "GET", "/v1/usage?hours=0.02", admin_token(corral_env))
        assert status == 200, text
        return [len(s["points"]) for s in json.loads(text)["series"]]
    wait_for("several samples per series", lambda: (lambda n: len(n) == len(shown) and min(n) >= 3)(
        recent_points()), timeout=30, interval=1)

    assert accessible(page) == []
    # From the keyboard: the first Tab reaches the skip link, and the page's links are reached and followed.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.focus("#nav-jobs")
    page.keyboard.press("Enter")
    page.wait_for_selector("#jobs[data-loaded=true]", timeout=10_000)
    assert page.url.endswith("#/jobs") and accessible(page) == []
    page.go_back()
    page.wait_for_selector("#page-infra:not([hidden])", timeout=10_000)

    # Every cluster answers, and a cluster's page lists its nodes as sinfo does, with the GPUs the table counts.
    health = page.eval_on_selector_all("#health tbody tr", "rows => rows.map(r => [r.dataset.cluster, "
                                       "r.cells[1].textContent])")
    assert sorted(health) == sorted([c, "answering"] for c in {row[0] for row in shown})
    page.get_by_role("link", name="alpine").first.click()
    page.wait_for_selector("#nodes[data-loaded=true]", timeout=30_000)
    nodes = page.eval_on_selector_all("#nodes tbody tr", """rows => rows.map(r => [r.dataset.node,
        r.dataset.condition, r.cells[2].textContent,
        [...r.querySelectorAll('[data-gpu]')].map(g => [g.dataset.gpu, +g.dataset.total])])""")
    sinfo = {}
    for line in ssh_login(testbed.cluster_config, "alpine", "sinfo -h -N -o '%N|%t|%P'").splitlines():
        node, state, partition = line.split("|")
        entry = sinfo.setdefault(node, [{"idle": "idle", "mix": "mixed", "alloc": "allocated"}.get(state, state), []])
        entry[1].append(partition.rstrip("*"))
    assert {n: [cond, sorted(parts.split(", "))] for n, cond, parts, _ in nodes} == \
        {n: [cond, sorted(parts)] for n, (cond, parts) in sinfo.items()}
    assert accessible(page) == []
    for _cluster, partition, gpu, _free, total, _pending in (r for r in shown if r[0] == "alpine"):
        assert total == sum(t for _, _, parts, gpus in nodes if partition in parts.split(", ")
                            for g, t in gpus if g == gpu)

    # The link was good once; a browser without the session sees the login page, not data.
    again = browser.new_context()
    used = again.new_page().goto(link)
    assert used is not None and used.status == 401
    stranger = again.new_page()
    stranger.goto(dashboard_server + "/")
    stranger.wait_for_selector("#page-login:not([hidden])", timeout=10_000)
    assert stranger.locator("#infra tbody tr").count() == 0
    again.close()
    context.close()


def test_a_job_appears_live_is_cancelled_from_the_page_and_others_see_nothing(browser, corral, corral_env,
                                                                             dashboard_server, testbed):
    alice_env = {**corral_env, "CORRAL_API_URL": dashboard_server, "CORRAL_API_TOKEN": add_user(corral, "alice")}
    bob_env = {**corral_env, "CORRAL_API_URL": dashboard_server, "CORRAL_API_TOKEN": add_user(corral, "bob")}
    context, page, _ = logged_in(browser, corral, alice_env)
    page.goto(dashboard_server + "/#/jobs")
    page.wait_for_selector("#jobs[data-loaded=true]", timeout=10_000)

    launched = corral("launch", "-d", "--json", "--infra", "slurm/cirrus", "--cpus", "1", "--",
                      "for i in $(seq 1 300); do echo line $i; sleep 0.5; done", env=alice_env)
    assert launched.exit_code == 0, launched.stderr
    job, slurm_id = launched.json()["job_id"], launched.json()["slurm_job_id"]
    seen_after = time.monotonic()
    row = page.wait_for_selector(f'tr[data-job="{job}"]', timeout=2_000)  # live: within 2 s
    appeared = time.monotonic() - seen_after
    assert row is not None and appeared <= 2.0
    assert accessible(page) == []

    # Another user's page: none of alice's jobs, and no control for them.
    bobs, bob_page, _ = logged_in(browser, corral, bob_env)
    bob_page.goto(dashboard_server + "/#/jobs")
    bob_page.wait_for_selector("#jobs[data-loaded=true]", timeout=10_000)
    assert bob_page.locator(f'tr[data-job="{job}"]').count() == 0
    assert bob_page.get_by_role("button", name=f"Cancel job {job}").count() == 0
    # The session cookie alone cannot change anything: a cross-site form has no dashboard header.
    forged = bobs.request.post(dashboard_server + "/v1/cancel", data={"jobs": [job]})
    assert forged.status == 401
    bobs.close()

    # Its page streams its output as it comes: the lines grow while we watch.
    page.get_by_role("link", name=job).click()
    page.wait_for_function("() => document.querySelector('#job-logs').textContent.includes('line 2\\n')",
                           timeout=30_000)
    def lines() -> int:
        return page.eval_on_selector("#job-logs", "pre => pre.textContent.split('\\n').filter(l => l).length")
    seen = lines()
    wait_for("more lines to stream in", lambda: lines() >= seen + 3, timeout=20, interval=0.2)
    assert accessible(page) == []
    assert page.eval_on_selector("#job-logs", "pre => pre.textContent").startswith("line 1\nline 2\n")

    page.go_back()
    page.wait_for_selector(f'tr[data-job="{job}"]', timeout=10_000)
    page.get_by_role("button", name=f"Cancel job {job}").click()
    wait_for("Slurm to cancel the job", lambda: ssh_login(
        testbed.cluster_config, "cirrus", f"squeue -h -j {slurm_id} -o %T").strip() in ("", "CANCELLED", "COMPLETING"),
        timeout=30)
    page.wait_for_selector(f'tr[data-job="{job}"] .state-CANCELLED', timeout=10_000)

    # A script's --error file shows under its output, where its traceback is (it was shown nowhere).
    failed = corral("sbatch", "--infra", "slurm/cirrus", "-W", "-c", "1", "-e", "err-%j.txt", "--wrap",
                    "echo out; echo Traceback >&2; exit 3", env=alice_env)
    assert failed.exit_code == 3, failed.stderr
    page.goto(f"{dashboard_server}/#/job/{failed.stdout.split()[3]}")
    page.wait_for_function("() => document.querySelector('#job-stderr').textContent === 'Traceback\\n'",
                           timeout=10_000)
    assert page.is_visible("#job-stderr") and not page.is_visible("#job-stderr-status:not(:empty)")
    page.wait_for_function("() => document.querySelector('#job-logs').textContent === 'out\\n'", timeout=10_000)
    assert accessible(page) == []
    page.goto(f"{dashboard_server}/#/job/{job}")  # no --error: no such part
    page.wait_for_function(f"() => document.querySelector('#job-title').textContent.includes('{job}')", timeout=10_000)
    assert page.is_hidden("#job-stderr-part")
    context.close()


def test_managed_jobs_timeline_and_why_pending_and_a_dev_allocations_shell_idle_timer_and_release(
        browser, corral, corral_env, dashboard_server, testbed, tmp_path):
    alice_env = {**corral_env, "CORRAL_API_URL": dashboard_server, "CORRAL_API_TOKEN": add_user(corral, "alice")}
    context, page, _ = logged_in(browser, corral, alice_env)
    fill_h100s(testbed.cluster_config)  # alpine's and borealis's H100s are taken: the managed job waits
    launched = corral("jobs", "launch", "-d", "--gpus", "H100:4", "--infra", "slurm/alpine", "-n", "waits",
                      "--", "echo ran", env=alice_env)
    assert launched.exit_code == 0, launched.stderr
    job = launched.stdout.split()[-1]
    (tmp_path / "pipe.yaml").write_text("name: pipe\n---\nname: first\nrun: sleep 600\n---\nname: second\nrun: echo 2\n")
    pipeline = corral("jobs", "launch", "-d", str(tmp_path / "pipe.yaml"), env=alice_env)
    assert pipeline.exit_code == 0, pipeline.stderr
    second = pipeline.stdout.split()[-1]
    page.goto(dashboard_server + "/#/managed")
    page.wait_for_selector(f'#managed tr[data-job="{job}"]', timeout=30_000)
    # a pipeline's task says which pipeline it belongs to, and its place in it
    assert page.locator(f'#managed tr[data-job="{second}"] td.name').text_content() == "pipe/1: second"
    page.goto(dashboard_server + f"/#/managed/{second}")  # its page links the pipeline's other tasks
    pipeline_facts = page.wait_for_selector("#mjob-facts .pipeline", timeout=10_000)
    assert pipeline_facts.text_content() == "pipe: task 0 → task 1"
    first = pipeline.stdout.split()[0]
    assert page.locator("#mjob-facts .pipeline a").get_attribute("href") == f"#/managed/{first}"
    (tmp_path / "group.yaml").write_text("name: grp\nexecution: parallel\nprimary_tasks: [a]\n---\nname: a\n"
                                         "run: sleep 600\n---\nname: b\nrun: sleep 600\n")
    group = corral("jobs", "launch", "-d", str(tmp_path / "group.yaml"), env=alice_env)
    assert group.exit_code == 0, group.stderr
    page.goto(dashboard_server + f"/#/managed/{group.stdout.split()[0]}")  # a job group's tasks run side by side
    group_facts = page.locator("#mjob-facts .pipeline", has_text="grp")  # once the page shows this job
    group_facts.wait_for(timeout=10_000)
    assert group_facts.text_content() == "grp (job group): task 0 · task 1 (auxiliary)"
    page.goto(dashboard_server + "/#/managed")
    assert corral("jobs", "cancel", "pipe", env=alice_env).exit_code == 0
    assert corral("jobs", "cancel", "grp", env=alice_env).exit_code == 0
    page.get_by_role("link", name=job).click()
    why = page.wait_for_selector("#mjob-why[data-loaded=true]", timeout=60_000)
    assert f"{job} is pending on slurm/alpine/gpu" in why.text_content()
    assert accessible(page) == []
    assert page.locator('#mjob-attempts tr[data-attempt="1"]').count() == 1
    wait_for("the timeline to show the attempt", lambda: any(
        "submitted to slurm/alpine/gpu" in e for e in page.locator("#mjob-events li").all_text_contents()),
        timeout=10, interval=0.2)
    assert page.locator('#mjob-attempts tr[data-attempt="1"] td').nth(1).text_content() == "slurm/alpine/gpu"
    slurm_id = page.locator('#mjob-attempts tr[data-attempt="1"] td').nth(2).text_content()
    page.get_by_role("button", name=f"Cancel managed job {job}").click()
    page.wait_for_selector("#mjob-facts[data-state=CANCELLED]", timeout=60_000)
    assert job_state(testbed.cluster_config, "alpine", slurm_id) in ("", "CANCELLED")
    assert any("CANCELLED" in e for e in page.locator("#mjob-events li").all_text_contents())
    # One no place can run has no attempt: its page says why all the same (it said "Not pending: PENDING.")
    nowhere = corral("jobs", "launch", "-d", "--gpus", "B300:64", "--", "true", env=alice_env).stdout.split()[-1]
    page.goto(dashboard_server + f"/#/managed/{nowhere}")
    why = page.wait_for_selector("#mjob-why[data-loaded=true]", timeout=30_000)
    assert why.text_content().startswith(f"{nowhere} is PENDING: no cluster can run it now:\n  ")
    assert "slurm/cirrus/b300: needs 1 node(s) with B300:64" in why.text_content()
    assert corral("jobs", "cancel", nowhere, env=alice_env).exit_code == 0

    held = corral("launch", "-c", "box", "--infra", "slurm/cirrus/debug", "--cpus", "1", "--idle-minutes", "30",
                  "-d", env=alice_env)
    assert held.exit_code == 0, held.stderr
    page.goto(dashboard_server + "/#/dev")
    row = page.wait_for_selector('#dev tr[data-allocation="box"][data-state=READY]', timeout=90_000)
    command = row.query_selector("code.command").text_content()
    # what it holds per node: what it asked for, and what Slurm gave it (the holder's own reading)
    assert re.fullmatch(r"1x cpu, cpu=1, mem=\d+[MG]", row.query_selector("td.resources").text_content())
    # alice logs in herself (submit_as: service here, so as the cluster's account): ssh, then a step there.
    assert command.startswith("ssh -t cirrus ") and "srun --jobid=" in command
    assert '--pty "${inside[@]}" bash -l' in command  # in the allocation's image, where it has one
    idle = row.query_selector("[data-idle-since]")
    assert accessible(page) == []
    first = idle.text_content()
    assert first.startswith("idle ") and "of 30m" in first
    wait_for("the idle timer to count", lambda: idle.text_content() != first, timeout=5, interval=0.2)
    slurm_id = command.split("--jobid=")[1].split()[0]
    page.get_by_role("button", name="Release box").click()
    page.wait_for_selector('#dev tr[data-allocation="box"]', state="detached", timeout=60_000)
    wait_for("Slurm to end the allocation", lambda: job_state(testbed.cluster_config, "cirrus", slurm_id)
             in ("", "CANCELLED", "COMPLETED"), timeout=30)
    context.close()


def test_the_infra_page_shows_every_kind_side_by_side(browser, corral, corral_env, kube, machines, testbed, tmp_path):
    """The three Slurm clusters, the SSH pool and the Kubernetes context (the fake API server) on one page."""
    from tests.cli.test_kube import kube_settings
    from tests.conftest import POOL

    config = tmp_path / "cluster-file"
    config.write_text(testbed.cluster_config.read_text() + "\n" + machines.ssh_config.read_text())
    home = Path(corral_env["CORRAL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(json.dumps({"submit_as": "service", **POOL, **kube_settings(kube)}))
    env = {**corral_env, "CORRAL_SLURM_CONFIG": str(config)}
    port = free_port()
    started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port), env=env)
    assert started.exit_code == 0, started.stderr
    try:
        context, page, _ = logged_in(browser, corral, env)
        page.wait_for_selector("#infra[data-loaded=true]", timeout=30_000)
        kinds = dict(page.eval_on_selector_all("#health tbody tr", "rows => rows.map(r => [r.dataset.cluster, "
                                               "r.querySelector('.kind').textContent])"))
        assert kinds == {"alpine": "Slurm", "borealis": "Slurm", "cirrus": "Slurm", "lab": "SSH pool",
                         "kind-fake": "Kubernetes"}
        rows = page.eval_on_selector_all("#infra tbody tr", "rows => rows.map(r => [r.dataset.cluster, r.dataset.gpu])")
        assert ["kind-fake", "A100"] in rows and ["lab", "A100"] in rows and ["alpine", "H100"] in rows
        places = page.eval_on_selector_all("#infra tbody tr", "rows => rows.map(r => [...r.cells].slice(0, 3)"
                                           ".map(c => c.textContent))")
        assert ["ssh/lab", "-", "A100"] in places and ["k8s/kind-fake", "-", "A100"] in places  # as `corral gpus`
        assert ["alpine", "gpu", "H100"] in places
        assert accessible(page) == []

        # A pool's job: its handle is no Slurm id, and a log its machine cannot give is said to have stopped.
        launched = corral("launch", "-d", "--json", "--infra", "ssh/lab", "--gpus", "A10G:1", "--",
                          "echo one; sleep 300", env=env)
        assert launched.exit_code == 0, launched.stderr
        job, host = launched.json()["job_id"], launched.json()["handle"].split("/")[0]
        page.goto(page.url.split("#")[0] + "#/jobs")
        page.wait_for_selector(f'tr[data-job="{job}"]', timeout=10_000)
        titles = page.eval_on_selector_all("#jobs thead th", "cells => cells.map(c => c.textContent)")
        assert "Infra ID" in titles and "Slurm ID" not in titles, titles
        machines.stop_machine(host)
        try:
            page.get_by_role("link", name=job).click()
            page.wait_for_function("() => document.querySelector('#job-logs-status').textContent"
                                   ".startsWith('The output stopped: ')", timeout=60_000)
            said = page.eval_on_selector("#job-logs-status", "p => p.textContent")
            assert said.startswith(f"The output stopped: {host}: ") and "machine" in said, said
            assert "corral: error" not in page.eval_on_selector("#job-logs", "pre => pre.textContent")
        finally:
            machines.start_machine(host)
            corral("cancel", job, env=env)
        context.close()
    finally:
        corral("server", "stop", env=env)
