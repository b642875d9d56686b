"""Screenshots of every dashboard page for the docs, taken on the testbed with something on each page:
a job printing output, a managed job waiting behind the H100 blockers, a dev allocation, and a minute
of GPU use samples.

Run as root with Debian's chromium (the testbed comes up if it is down):
    python scripts/dashboard_screenshots.py [--out docs/images]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, corral_argv  # noqa: E402

BLOCKER = "sbatch --parsable -p gpu -N2 -t 30 --gres=gpu:nvidia_h100_80gb_hbm3:4 --wrap 'sleep 900'"
TRAINING = "for i in $(seq 1 600); do echo \"step $i loss $(( 1000 / (i + 3) ))\"; sleep 1; done"
PAGES = {  # page -> (hash route, the element that says it is drawn)
    "infra": ("#/infra", "#usage[data-loaded=true]"),
    "cluster": ("#/cluster/alpine", "#nodes[data-loaded=true]"),
    "jobs": ("#/jobs", "#jobs[data-loaded=true]"),
    "job": ("#/job/{job}", "#job-logs"),
    "managed": ("#/managed", "#managed[data-loaded=true]"),
    "managed-job": ("#/managed/{managed}", "#mjob-why[data-loaded=true]"),
    "dev": ("#/dev", "#dev tr[data-state=READY]"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with bench_testbed() as bench:
        env = {**bench.env, "CORRAL_USAGE_SAMPLE_SECONDS": "2"}

        def corral(*argv: str) -> str:
            return subprocess.run(corral_argv(*argv), env=env, capture_output=True, text=True, check=True).stdout

        corral("server", "start")
        blocker = subprocess.run([*bench.raw_ssh("alpine"), BLOCKER], capture_output=True, text=True,
                                 check=True).stdout.strip()
        try:
            job = json.loads(corral("launch", "-d", "--json", "-n", "train-llm", "--gpus", "H100:2",
                                    "--infra", "slurm/borealis", "--", TRAINING))["job_id"]
            corral("launch", "-d", "-n", "eval", "--gpus", "L4:1", "--", "sleep 600")
            managed = corral("jobs", "launch", "-d", "-n", "finetune", "--gpus", "H100:4", "--infra", "slurm/alpine",
                             "--", "echo ran").split()[-1]
            corral("launch", "-c", "devbox", "--gpus", "L40S:1", "--idle-minutes", "60", "-d")
            time.sleep(30)  # the chart's samples (one every 2 s) and the job's output accumulate
            link = corral("dashboard", "--print-url").strip()
            base = link.split("/login")[0]
            args.out.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(link)
                for name, (route, drawn) in PAGES.items():
                    page.goto(base + "/" + route.format(job=job, managed=managed))
                    page.wait_for_selector(drawn, timeout=60_000)
                    page.wait_for_timeout(1500)  # the log tail and "… ago" columns fill in
                    page.screenshot(path=str(args.out / f"dashboard-{name}.png"), full_page=True)
                    print(f"wrote {args.out / f'dashboard-{name}.png'}")
                browser.close()
        finally:
            subprocess.run(corral_argv("cancel", "--all"), env=env, capture_output=True)
            subprocess.run(corral_argv("jobs", "cancel", "--all"), env=env, capture_output=True)
            subprocess.run(corral_argv("down", "devbox"), env=env, capture_output=True)
            subprocess.run([*bench.raw_ssh("alpine"), f"scancel {blocker}"], capture_output=True)
            corral("server", "stop")


if __name__ == "__main__":
    main()
