"""`corral` commands. Heavy imports (asyncio, rich, the engine) stay inside the commands so that
`corral --help` starts in well under 0.3 s."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from corral import __version__


def _reports_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Print a CorralError as one line on stderr and exit with its code, instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from corral.errors import CorralError

        try:
            return func(*args, **kwargs)
        except CorralError as exc:
            click.echo(f"corral: error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def _print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def cli() -> None:
    """Corral: many independent Slurm clusters, one GPU pool.

    Clusters are the Host entries of ~/.slurm/config (OpenSSH syntax; CORRAL_SLURM_CONFIG overrides).
    """


@cli.command()
@click.argument("clusters", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per cluster.")
@click.option("--timeout", default=5, show_default=True, help="Seconds to wait for each Slurm controller.")
@_reports_errors
def check(clusters: tuple[str, ...], as_json: bool, timeout: int) -> None:
    """Check that each cluster's login node and Slurm controller answer.

    Exits non-zero if any cluster fails, with the reason per cluster.
    """
    import asyncio

    from corral.client import Client, check_json

    client = Client(slurm_timeout=timeout)
    outcomes = asyncio.run(client.probe(list(clusters)))
    if as_json:
        _print_json([check_json(o) for o in outcomes])
    else:
        from corral.cli.render import render_check

        render_check(outcomes)
    if not all(o.ok for o in outcomes):
        sys.exit(1)


@cli.command()
@click.argument("gpu", required=False)
@click.option("--infra", help="Only this infra: slurm/<cluster>[/<partition>].")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of rows (and of unreachable clusters).")
@click.option("--timeout", default=5, show_default=True, help="Seconds to wait for each Slurm controller.")
@_reports_errors
def gpus(gpu: str | None, infra: str | None, as_json: bool, timeout: int) -> None:
    """GPUs across every cluster: type, free/total, nodes and pending demand.

    GPU filters by name tolerantly: H100 matches the GRES type nvidia_h100_80gb_hbm3; L4 does not
    match L40.
    """
    import asyncio

    from corral.client import Client

    report = asyncio.run(Client(slurm_timeout=timeout).gpus(gpu, infra))
    if as_json:
        _print_json(
            [r.to_json() for r in report.rows]
            + [{"cluster": f.cluster, "error": f.error_message, "error_kind": f.error_kind}
               for f in report.failures]
        )
    else:
        from corral.cli.render import render_gpus

        render_gpus(report, gpu)
    if report.failures and not report.rows:
        sys.exit(1)


def main() -> None:
    cli(prog_name="corral")
