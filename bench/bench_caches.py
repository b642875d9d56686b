"""The per-folder workdir caches on a login node (infra/caches.py): what marking a sync's use costs,
and what the prune costs.

1. A workdir of 200 small files synced into its cache over an open ControlMaster, nothing changed
   (the usual relaunch), with the hold (the marker touched, its lock held while rsync writes) and
   without, against a raw `rsync -a --delete` over the same master. Medians of --runs, alternated.
2. The prune over N caches on one login node, half of them last used 30 days ago: one round trip
   (SlurmInfra.prune_workdir_caches), against a raw `ssh … find -mtime +14 … rm -rf` of the same
   shape on as many caches, over the master. Each side on caches of its own.

Run as root on a machine with the testbed:  python bench/bench_caches.py [--caches 1000] [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, print_table  # noqa: E402

CLUSTER = "alpine"


def make_caches(ssh: list[str], keys: list[str], old: set[str]) -> None:
    """Each key's cache (a folder with a file) and its marker; those in `old` last used 30 days ago."""
    script = ('umask 077; mkdir -p "$HOME"/.corral/cache && cd "$HOME"/.corral/cache && for k in ' + " ".join(keys)
              + '; do mkdir -p $k && echo x > $k/f && : > $k.used; done && touch -d "30 days ago" '
              + " ".join(f"{k}.used" for k in old))
    subprocess.run([*ssh, script], check=True, capture_output=True)


def left(ssh: list[str], keys: list[str]) -> int:
    script = 'cd "$HOME"/.corral/cache && n=0; for k in ' + " ".join(keys) + '; do [ -d $k ] && n=$((n+1)); done; echo $n'
    return int(subprocess.run([*ssh, script], check=True, capture_output=True, text=True).stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--caches", type=int, default=1000, help="caches on the login node for the prune")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with bench_testbed() as bench, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(CORRAL_SLURM_CONFIG=bench.config, CORRAL_HOME=bench.env["CORRAL_HOME"])
        from corral.client import Client
        from corral.infra import caches

        work = Path(tmp) / "work"
        work.mkdir()
        for i in range(200):
            (work / f"module_{i}.py").write_text(f"VALUE = {i}\n" * 20)
        mux = bench.raw_ssh(CLUSTER)
        client = Client()
        transport = client.transport
        key = secrets.token_hex(8)
        cache = caches.cache_path(key)
        ssh_e = " ".join(mux[:-1])  # the raw ssh with its master, for rsync -e (without the host)

        def raw_rsync() -> float:
            started = time.perf_counter()
            subprocess.run(["rsync", "-a", "--mkpath", "--delete", "-e", ssh_e, f"{work}/", f"{mux[-1]}:.corral/bench-raw/{key}/"],
                           check=True, capture_output=True)
            return time.perf_counter() - started

        async def corral_sync(hold: bool) -> float:
            started = time.perf_counter()
            await transport.sync(CLUSTER, work, cache + "/", mirror=True, hold=caches.marker_path(key) if hold else None)
            return time.perf_counter() - started

        async def syncs() -> dict[str, list[float]]:
            await corral_sync(True)  # the first copy, and the connection
            raw_rsync()
            times: dict[str, list[float]] = {"hold": [], "plain": [], "raw": []}
            for _ in range(args.runs):
                times["hold"].append(await corral_sync(True))
                times["plain"].append(await corral_sync(False))
                times["raw"].append(raw_rsync())
            return times

        times = asyncio.run(syncs())
        infra = client.infra(CLUSTER)
        keys = [secrets.token_hex(8) for _ in range(args.caches)]
        old = set(keys[: args.caches // 2])
        make_caches(mux, keys, old)
        trips = transport.round_trips[CLUSTER]
        started = time.perf_counter()
        pruned = asyncio.run(infra.prune_workdir_caches(14))
        prune = time.perf_counter() - started
        trips = transport.round_trips[CLUSTER] - trips
        kept = left(mux, keys)
        raw_keys = [secrets.token_hex(8) for _ in range(args.caches)]
        make_caches(mux, raw_keys, set(raw_keys[: args.caches // 2]))
        started = time.perf_counter()
        subprocess.run([*mux, 'cd "$HOME"/.corral/cache && find . -maxdepth 1 -name "*.used" -mtime +14 | '
                              'while read -r m; do rm -rf -- "${m%.used}" "$m"; done'], check=True)
        raw_prune = time.perf_counter() - started
        subprocess.run([*mux, 'cd "$HOME"/.corral && rm -rf bench-raw cache/' + key + " cache/" + key + ".used "
                        + " ".join(f"cache/{k} cache/{k}.used" for k in keys + raw_keys)], check=True)

    print(f"\nsyncs: {args.runs} of each, alternated; prune: {args.caches} caches, half last used 30 days ago: "
          f"pruned {pruned}, {kept} left, {trips} round trip(s)")
    median = statistics.median
    print_table("workdir caches", [
        ("sync of an unchanged 200-file workdir into its cache, with the hold (vs raw rsync over the master)",
         median(times["hold"]), median(times["raw"]), "-"),
        ("the same without the hold (vs raw rsync over the master)", median(times["plain"]), median(times["raw"]), "-"),
        (f"prune of {args.caches} caches, half old (vs raw ssh find … rm -rf over the master)", prune, raw_prune, "-"),
    ])


if __name__ == "__main__":
    main()
