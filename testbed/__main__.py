"""python -m testbed up|down|status|install|sinfo, and the fault switches tests use."""

from __future__ import annotations

import argparse
import json
import sys
import time

from testbed.bed import Testbed, daemons_memory_mb, install_packages, scale_testbed, sinfo_summary
from testbed.processes import TestbedError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    scale = argparse.ArgumentParser(add_help=False)
    scale.add_argument("--clusters", type=int, default=0, metavar="N",
                       help="the scale mode: N (1-50) small clusters s01… of their own, beside the main three")
    sub.add_parser("install", help="apt-get install the Slurm, munge and OpenSSH packages")
    up = sub.add_parser("up", help="start every cluster (idempotent)", parents=[scale])
    up.add_argument("--no-user-config", action="store_true", help="do not write ~/.slurm/config")
    up.add_argument("--machines", action="store_true", help="also the plain SSH machines (lab1-lab4)")
    down = sub.add_parser("down", help="stop every daemon", parents=[scale])
    down.add_argument("--purge", action="store_true", help="also delete the testbed directory")
    sub.add_parser("status", help="which daemons run (JSON)", parents=[scale])
    sub.add_parser("sinfo", help="sinfo of every cluster", parents=[scale])
    sub.add_parser("config-path", help="print the path of the generated cluster file", parents=[scale])
    for name, what in [("stop-controller", "cluster"), ("start-controller", "cluster"),
                       ("stop-login", "cluster"), ("start-login", "cluster"),
                       ("freeze-login", "cluster"), ("thaw-login", "cluster"),
                       ("kill-node", "node"), ("start-node", "node"), ("freeze-node", "node"),
                       ("thaw-node", "node"), ("drain", "node"),
                       ("resume", "node"), ("stop-machine", "machine"), ("start-machine", "machine"),
                       ("unplug-machine", "machine"), ("plug-machine", "machine")]:
        sub.add_parser(name).add_argument(what)
    light = sub.add_parser("light-squeue", help="give a login node a squeue with --only-job-state (off: plain)")
    light.add_argument("cluster")
    light.add_argument("switch", choices=["on", "off"])
    limit = sub.add_parser("limit-jobs", help="restart a controller with MaxJobCount=COUNT (0: the default)")
    limit.add_argument("cluster")
    limit.add_argument("count", type=int)
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        bed = scale_testbed(args.clusters) if getattr(args, "clusters", 0) else Testbed()
        if args.command == "install":
            install_packages()
        elif args.command == "up":
            bed.up(install_user_config=not args.no_user_config, machines=args.machines)
            names = ", ".join(s.name for s in bed.clusters)
            if not bed.main:
                names = f"{len(bed.clusters)} clusters ({bed.clusters[0].name}-{bed.clusters[-1].name}), " \
                        f"{daemons_memory_mb(bed):.0f} MB resident"
            print(f"testbed up in {time.monotonic() - started:.1f}s: {names}; "
                  f"cluster file {bed.cluster_config}")
            if args.machines:
                print(f"SSH machines: {', '.join(m.name for m in bed.machines.machines)}; "
                      f"ssh config {bed.machines.ssh_config}")
        elif args.command == "down":
            bed.down(purge=args.purge)
        elif args.command == "status":
            report: dict[str, object] = dict(bed.status())
            if bed.machines.root.exists():
                report["machines"] = bed.machines.status()
            print(json.dumps(report, indent=2))
        elif args.command in ("stop-machine", "start-machine", "unplug-machine", "plug-machine"):
            getattr(bed.machines, args.command.replace("-", "_"))(args.machine)
        elif args.command == "sinfo":
            print(sinfo_summary(bed))
        elif args.command == "config-path":
            print(bed.cluster_config)
        elif args.command == "light-squeue":
            print(f"calls logged in {bed.light_squeue(args.cluster, args.switch == 'on')}")
        elif args.command == "limit-jobs":
            bed.limit_jobs(args.cluster, args.count or None)
        else:
            target = getattr(args, "cluster", None) or getattr(args, "node", None)
            getattr(bed, args.command.replace("-", "_"))(target)
    except (TestbedError, ValueError) as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
