"""`logs --sync-down` and `jobs logs --sync-down` (as `sky logs --sync-down`): a job's output, as it is
now, saved to files under ~/corral_logs/<job id>/ on this machine. API calls only: the output comes
from the server's logs route, whichever server it is, so it works as well against a team server."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from corral.cli.common import handle_in

LOGS_DIR = "corral_logs"  # in the home directory, as SkyPilot's ~/sky_logs


def save(chunks: Iterable[bytes], path: Path) -> int:
    """Write the chunks to `path` whole or not at all (a new file renamed into place); its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    size = 0
    try:
        with partial.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return size


def job_folder(job_id: str) -> Path:
    return Path.home() / LOGS_DIR / job_id


def sync_down_job(client: Any, job: str) -> Path:
    """A job's output (all nodes) to ~/corral_logs/<job id>/run.log, and its script's --error file, where
    stderr goes apart, to run.err beside it; says where, and whether it runs on."""
    found = client.job(job)
    path = job_folder(found.job_id) / "run.log"
    saved = [(path, save(client.logs(found.job_id), path))]
    if found.stderr_path:
        errors = path.with_suffix(".err")
        saved.append((errors, save(client.logs(found.job_id, stderr=True), errors)))
    _said(found.job_id, saved, str(found.state), live=not found.ended)
    return path


def sync_down_managed(client: Any, job: str) -> list[Path]:
    """Each attempt's output that reached a cluster, to ~/corral_logs/<job id>/attempt-<n>.log."""
    from corral.sdk.types import ManagedJob

    found = client.managed_job(job)
    saved = []
    for attempt in found["attempt_list"]:
        if handle_in(attempt):
            path = job_folder(found["job_id"]) / f"attempt-{attempt['number']}.log"
            saved.append((path, save(client.managed_logs(found["job_id"], attempt["number"]), path)))
    _said(found["job_id"], saved, found["state"], live=not ManagedJob.from_json(found).ended)
    return [path for path, _ in saved]


def _said(job_id: str, saved: list[tuple[Path, int]], state: str, *, live: bool) -> None:
    if not saved:
        click.echo(f"corral: {job_id} has no output yet ({state}): nothing saved", err=True)
        return
    for path, size in saved:
        click.echo(str(path))
        click.echo(f"corral: {job_id}: {size} bytes saved to {path}"
                   + (f" (it is {state}: its output so far)" if live else ""), err=True)
