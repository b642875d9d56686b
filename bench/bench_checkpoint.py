"""A managed job's checkpoint carried from one cluster to another, as the controller does when it
recovers the job elsewhere (engine `CarriedCheckpoint`, with the new attempt's submission): straight
from the old cluster's login node to the new one's, through a pipe between two ssh sessions
(`send_dir`), and, for comparison, the way it went before and still goes where the two cannot stream
(a Kubernetes target): fetched into a scratch folder on the server, then sent (`fetch_dir`, then
`upload`). Against what a person types for the same: one pipe, `ssh alpine tar -c … | ssh borealis
tar -x …`, over masters of its own. Also the copying process's peak memory (VmHWM: its own, not the
forked parent's that ru_maxrss keeps across exec), which must not grow with the checkpoint.

Each side copies into a folder of its own; the Corral side runs in a child process so that its peak
memory is its own. Medians of --runs, alternated.

Run as root on a machine with the testbed:  python bench/bench_checkpoint.py [--mb 500] [--runs 3]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, print_table  # noqa: E402

SOURCE, TARGET = "alpine", "borealis"

# The controller's carry, in a child process that reports its peak memory (MB) when it ends: `direct`
# (send_dir) or `through` the server (fetch_dir, then upload).
CARRY = """
import asyncio, sys, tempfile
from pathlib import Path
from corral.client import Client
how, source, target, remote, into = sys.argv[1:]
client = Client()
async def carry():
    if how == "direct":
        assert await client.infra(source).send_dir(remote, client.infra(target), into + "/")
        return
    with tempfile.TemporaryDirectory(prefix="corral-ckpt-") as tmp:
        assert await client.infra(source).fetch_dir(remote, Path(tmp))
        await client.infra(target).upload(Path(tmp), into + "/")
asyncio.run(carry())
print(int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) // 1024)
"""
WAYS = ("direct", "through")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=500, help="the checkpoint's size (one file of random bytes)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with bench_testbed() as bench:
        source, target = bench.raw_ssh(SOURCE), bench.raw_ssh(TARGET)
        folder = f".corral/bench-ckpt-{secrets.token_hex(4)}"
        subprocess.run([*source, f"mkdir -p {folder}/src && head -c {args.mb}M /dev/urandom > {folder}/src/model.pt"],
                       check=True)

        def corral(how: str, run: int) -> tuple[float, int]:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", CARRY, how, SOURCE, TARGET, f"{folder}/src",
                                   f"{folder}/{how}-{run}"], env=bench.env, check=True, capture_output=True, text=True)
            return time.perf_counter() - started, int(done.stdout.split()[-1])

        def raw(run: int) -> float:
            started = time.perf_counter()
            sender = subprocess.Popen([*source, f"tar -cf - -C {folder}/src ."], stdout=subprocess.PIPE)
            subprocess.run([*target, f"mkdir -p {folder}/raw-{run} && tar -xf - -C {folder}/raw-{run}"],
                           stdin=sender.stdout, check=True)
            assert sender.wait() == 0
            return time.perf_counter() - started

        times: dict[str, list[float]] = {way: [] for way in (*WAYS, "raw")}
        peaks: dict[str, list[int]] = {way: [] for way in WAYS}
        for run in range(args.runs):
            for way in WAYS:
                took, peak = corral(way, run)
                times[way].append(took)
                peaks[way].append(peak)
            times["raw"].append(raw(run))
        sizes = subprocess.run([*target, f"du -sm {folder}/direct-0 {folder}/through-0 {folder}/raw-0"], check=True,
                               capture_output=True, text=True).stdout.split()[::2]
        for host in (source, target):
            subprocess.run([*host, f"rm -rf {folder}"], check=True)

    print(f"\n{args.mb} MB checkpoint, {SOURCE} to {TARGET}; {args.runs} runs each, alternated; arrived (direct, "
          f"through, raw): {sizes} MB; the Corral side's peak memory: "
          + ", ".join(f"{way} {max(peaks[way])} MB (max of {peaks[way]})" for way in WAYS))
    raw_median = statistics.median(times["raw"])
    print_table("carrying a checkpoint", [
        (f"send_dir of {args.mb} MB, login node to login node (vs ssh tar -c | ssh tar -x)",
         statistics.median(times["direct"]), raw_median, "-"),
        (f"fetch_dir + upload of {args.mb} MB, through the server (vs the same)", statistics.median(times["through"]),
         raw_median, "-"),
    ])


if __name__ == "__main__":
    main()
