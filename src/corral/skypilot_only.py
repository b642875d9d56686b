"""SkyPilot's resource settings that have no meaning on Slurm, and why: read by the task loader's warnings
(`task_compat.py`, for a task file's fields) and by the CLI (for `launch` flags typed from habit, such
as `--use-spot`). Pure data: importing it costs nothing, so the thin CLI may.
"""

from __future__ import annotations

# resources.<field> (and the `--field` flag of `sky launch`) -> why it is ignored on Slurm
IGNORED_RESOURCE_FIELDS = {
    "accelerator_args": "TPU settings; Slurm clusters have none",
    "instance_type": "a cloud VM type; a Slurm job gets nodes of its partition",
    "use_spot": "Slurm has no spot VMs; a preemptible partition or QOS belongs in the cluster's profile",
    "disk_size": "a VM disk; a job writes to the cluster's filesystems",
    "disk_tier": "a VM disk tier; a job writes to the cluster's filesystems",
    "network_tier": "a cloud network option; the cluster's interconnect is what it is",
    "max_hourly_cost": "a cloud price cap; Slurm allocations are not priced per hour",
    "ports": "no ports are opened on compute nodes; reach one through the login node with `ssh -L`",
    "labels": "VM or pod labels; Slurm jobs have none",
}
