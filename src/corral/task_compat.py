"""SkyPilot task files on Slurm: which of SkyPilot's fields have no meaning here, and the one warning
line that names each one a task sets. Pure: no I/O, a few microseconds a task.

What the other fields become (autostop, job_recovery, secrets, cloud/region/zone, the mapping form of
file_mounts) is in `task.py`, next to each field; `docs/tasks.md` has the whole table.
"""

from __future__ import annotations

from typing import Any

from corral.skypilot_only import IGNORED_RESOURCE_FIELDS
from corral.task import Resources, Task, foreign_alternatives


def ignored_fields(task: Task, *, dev: bool = False) -> list[str]:
    """One line per SkyPilot field the task sets that has no meaning on Slurm (`dev`: launched as a dev
    allocation, where autostop is honoured)."""
    lines: list[str] = []
    for path, resources in _resource_blocks(task.resources):
        for field, why in IGNORED_RESOURCE_FIELDS.items():
            if getattr(resources, field) is not None:
                lines.append(f"{path}.{field}: ignored on Slurm ({why})")
        image = resources.image_id
        if image is not None and not (isinstance(image, str) and image.startswith("docker:")):
            lines.append(f"{path}.image_id: ignored on Slurm (a VM image; a container image is docker:<image>)")
        autostop = resources.autostop
        if autostop is not None and not dev:
            lines.append(f"{path}.autostop: applies to dev allocations (`corral launch -c NAME`); a job's "
                         "nodes are released when it ends")
        elif autostop is not None and (autostop.hook or autostop.hook_timeout):
            lines.append(f"{path}.autostop.hook: not run by Corral (the allocation is released without it)")
    foreign = foreign_alternatives(task.resources)
    if foreign:
        lines.append(f"resources: alternatives on {', '.join(foreign)} skipped (Corral runs on Slurm clusters, "
                     "SSH pools and Kubernetes)")
    if task.config:
        kube = task.config.get("kubernetes")
        for key in kube if isinstance(kube, dict) else ():
            if key != "pod_config":
                lines.append(f"config.kubernetes.{key}: ignored (Corral passes pod_config to Kubernetes, nothing "
                             "else)")
        others = [str(key) for key in task.config if key != "kubernetes"]
        if others:
            lines.append(f"config: {', '.join(others)} ignored (settings for SkyPilot's clouds; Corral reads "
                         "config.kubernetes.pod_config only)")
    if task.service:
        lines.append("service: ignored; Corral runs the task as a job and sets up no SkyServe service")
    return lines


def _resource_blocks(resources: Resources) -> list[tuple[str, Resources]]:
    blocks = [("resources", resources)]
    for kind in ("any_of", "ordered"):
        blocks += [(f"resources.{kind}[{i}]", r) for i, r in enumerate(getattr(resources, kind) or [])]
    return blocks


def autostop_minutes(task: Task) -> float | None:
    """A dev allocation's idle limit from the task's autostop (None: not set; 0: never)."""
    autostop: Any = task.resources.autostop
    return None if autostop is None else autostop.idle_minutes
