"""One view and overflow across kinds: `corral gpus` over the 3 Slurm clusters, the 4 SSH machines of a
pool and one Kubernetes context (the testbed's FAKE API server, testbed/kubeapi.py), and a 100-job sweep
that overflows to the pool and the context with every Slurm node taken.

Run as root on a machine with the testbed:  python bench/bench_overflow.py
Baselines, measured in the same run against the same places:
- one place's raw probe: `ssh <cluster> sinfo`, `ssh <machine> nvidia-smi`, `curl` of the context's
  node list (each on a new connection); the slowest of them, and all of them at once in parallel;
- a 100-job submission: `ssh alpine sbatch --array=0-99 --wrap true` (one Slurm array, new connection);
- a 400-task sweep pinned to the pool: one ssh round trip to its machine that starts 400 `setsid true`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, close_masters, corral_argv, median_of, print_table, time_command  # noqa: E402

BLOCKERS = {"alpine": [("gpu", 2), ("cpu", 1), ("inference", 1)], "borealis": [("h100-cluster", 2), ("l40s", 1)],
            "cirrus": [("b300", 2), ("debug", 1)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--pool-sweep", type=int, default=400, help="tasks of the sweep pinned to the pool")
    args = parser.parse_args()
    from testbed import Testbed
    from testbed.kubeapi import FakeKubernetes

    with bench_testbed() as bench:
        machines = Testbed().machines
        machines.up()
        kube = FakeKubernetes(bench.scratch / "kube")
        kube.up()
        try:
            run(args, bench, machines, kube)
        finally:
            kube.down()


def run(args: argparse.Namespace, bench, machines, kube) -> None:
    config = bench.scratch / "cluster-file"
    config.write_text(Path(bench.config).read_text() + "\n" + machines.ssh_config.read_text())
    hosts = [m.name for m in machines.machines]
    settings = {"pools": {"lab": {"hosts": hosts, "gpus": {"lab4": "A10G:1"}}},
                "kubernetes": {"allowed_contexts": [kube.context], "kubeconfig": str(kube.kubeconfig)}}
    env = {**bench.env, "CORRAL_SLURM_CONFIG": str(config)}

    def home(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.yaml").write_text(json.dumps(settings))
        return path

    home(Path(env["CORRAL_HOME"]))
    raw = ["ssh", "-F", str(config), "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none"]
    probes = ([[*raw, c, "sinfo"] for c in bench.clusters]
              + [[*raw, h, "bash -lc 'nvidia-smi -L || true'"] for h in hosts]  # lab4 has none: the round trip
              + [["curl", "-sf", "-H", f"Authorization: Bearer {kube.token}",
                  f"http://127.0.0.1:{kube.port}/api/v1/nodes", "-o", "/dev/null"]])

    def slowest_probe() -> float:
        return max(time_command(p) for p in probes)

    def parallel_probes() -> float:
        started = time.perf_counter()
        procs = [subprocess.Popen(p, stdout=subprocess.DEVNULL) for p in probes]
        if any(p.wait() for p in procs):
            raise SystemExit("a raw probe failed")
        return time.perf_counter() - started

    counter = iter(range(10**6))

    def gpus_cold() -> float:
        cold = home(bench.scratch / f"cold-home-{next(counter)}")
        seconds = time_command(corral_argv("gpus"), env={**env, "CORRAL_HOME": str(cold)})
        close_masters(cold.parent)
        return seconds

    slowest = median_of(args.runs, slowest_probe)
    parallel = median_of(args.runs, parallel_probes)
    table_cold = median_of(args.runs, gpus_cold)
    table_warm = median_of(args.runs, lambda: time_command(corral_argv("gpus"), env=env))

    # The sweep: every Slurm node taken first.
    blockers = [(c, subprocess.run([*raw, c, f"sbatch --parsable -p {p} -N{n} --exclusive -t 30 --wrap 'sleep 1800'"],
                                   capture_output=True, text=True, check=True).stdout.strip())
                for c, parts in BLOCKERS.items() for p, n in parts]
    try:
        deadline = time.monotonic() + 60
        while any(subprocess.run([*raw, c, f"squeue -h -j {j} -o %T"], capture_output=True, text=True).stdout.strip()
                  != "RUNNING" for c, j in blockers):
            if time.monotonic() > deadline:
                raise SystemExit("the blockers did not start")
            time.sleep(0.5)
        task = bench.scratch / "sweep.yaml"
        task.write_text(json.dumps({"name": "overflow", "resources": {"cpus": 1}, "run": "true"}))
        started = time.perf_counter()
        out = subprocess.run(corral_argv("launch", "-d", "--json", "--num-jobs", "100", str(task)), env=env,
                             capture_output=True, text=True, check=True).stdout
        sweep = time.perf_counter() - started
        landed: dict[str, int] = {}
        for share in json.loads(out):
            landed[share["cluster"]] = landed.get(share["cluster"], 0) + 1
        array = time_command([*raw, "alpine", "sbatch --parsable --array=0-99 -p cpu --wrap true"])
    finally:
        for cluster, job in blockers:
            subprocess.run([*raw, cluster, f"scancel {job}; scancel -u corral-test"], capture_output=True)
        subprocess.run(corral_argv("cancel", "--all"), env=env, capture_output=True)
    # A sweep pinned to the pool: it spreads over the machines' cores, the tasks beyond them wait in
    # the machines' queues (claims.py), and the submissions to a machine go together (submissions.py).
    pinned = bench.scratch / "pinned.yaml"
    pinned.write_text(json.dumps({"name": "pinned", "resources": {"infra": "ssh/lab"}, "run": "true"}))
    started = time.perf_counter()
    out = subprocess.run(corral_argv("launch", "-d", "--json", "--num-jobs", str(args.pool_sweep), str(pinned)),
                         env=env, capture_output=True, text=True, check=True).stdout
    pool_sweep = time.perf_counter() - started
    spread = sorted({share["slurm_job_id"].split("/")[0] for share in json.loads(out)})
    machine = spread[0]
    raw_starts = time_command([*raw, machine,
                               f"for i in $(seq {args.pool_sweep}); do setsid true </dev/null & done; wait"])
    print_table(
        f"one view over {len(bench.clusters)} clusters, {len(hosts)} pool machines and 1 Kubernetes context "
        f"(median of {args.runs} runs)",
        [
            ("corral gpus (table), first call: starts the server (vs slowest raw probe)", table_cold, slowest, "-"),
            ("corral gpus (table), first call (vs all raw probes in parallel)", table_cold, parallel, "-"),
            ("corral gpus (table), server up (vs slowest raw probe)", table_warm, slowest, "-"),
            ("corral gpus (table), server up (vs all raw probes in parallel)", table_warm, parallel, "-"),
        ],
    )
    print_table(
        "100-job sweep with every Slurm node taken (one run; landed: "
        + ", ".join(f"{k} {v}" for k, v in sorted(landed.items())) + ")",
        [("corral launch -d --num-jobs 100 (vs ssh alpine sbatch --array=0-99)", sweep, array, "-")],
    )
    print_table(
        f"{args.pool_sweep}-task sweep pinned to the pool (one run; spread over {', '.join(spread)}; accepted, "
        "not ended)",
        [(f"corral launch -d --num-jobs {args.pool_sweep} --infra ssh/lab (vs ssh {machine}: {args.pool_sweep} "
          "setsid true)", pool_sweep, raw_starts, "-")],
    )


if __name__ == "__main__":
    main()
