"""A job script as a task: what its `#SBATCH` directives and sbatch command-line options ask for, in the
terms placement understands (nodes, GPUs of a type, CPUs and memory per node, walltime), and what keeps
it from being routed at all.

The script itself is not changed here: it travels in the task (`slurm.script`), and the Slurm backend
rewrites only its site-specific options for the cluster placement picks (`infra/slurm/userscript.py`).
Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from corral.infra.base import ClusterSnapshot
from corral.placement import NO_NODES, Plan
from corral.sbatch_script import (
    CORRAL_JOB_REF,
    Option,
    ScriptError,
    array_indices,
    effective,
    expand_hostlist,
    parse_options,
    read_script,
)
from corral.task import JobScript, Task, parse_task

_COUNT = re.compile(r"^\d+\Z", re.ASCII)
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?\Z", re.I | re.ASCII)
_MB_PER_UNIT = {"K": 1 / 1024, "M": 1, "": 1, "G": 1024, "T": 1024 * 1024}
GPU_OPTIONS = ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket")
# Options that take the job away from Corral, or change what sbatch itself does.
REFUSED = {
    "clusters": "the script names Slurm clusters (-M/--clusters): Corral chooses the cluster; remove it, or pin "
                "one with --infra slurm/<cluster>",
    "wrap": "--wrap replaces the script: give the command as `corral sbatch [OPTIONS] --wrap COMMAND`, "
            "without a script",
    "test-only": "give --test-only (or --dryrun) on corral sbatch's command line: it shows the plan, with the "
                 "start each cluster predicts, and the exact script each would receive",
    "wait": "give -W/--wait on corral sbatch's command line: Corral waits on your side, not in a script's "
            "#SBATCH line",
    "help": "corral sbatch --help lists what Corral reads", "usage": "corral sbatch --help lists what Corral reads",
    "version": "corral --version",
}


@dataclass(frozen=True)
class ScriptAsk:
    """What a script asks for, per node, after the command line and the directives are merged."""

    options: dict[str, Option]
    num_nodes: int
    gpu_type: str | None
    gpus_per_node: int
    cpus_per_node: int | None
    memory_mb_per_node: int | None  # None: the partition's default (also for --mem=0, all of a node's)
    time: str | None
    partition: str | None
    job_name: str
    array: tuple[int, ...] | None
    dependency_ids: tuple[str, ...]  # Slurm job ids the dependency names (each means a job of one cluster)


def read_ask(script: JobScript) -> ScriptAsk:
    """The resources the script asks for; ScriptError naming the option and what to do. A heterogeneous
    job (`#SBATCH hetjob`) asks for the nodes of all its components, each the shape of the largest."""
    parsed = read_script(script.text, script.file_name)
    command_line = _command_line(script)
    options = effective(command_line, parsed.directives)
    for component in range(parsed.components):
        for name, why in REFUSED.items():
            if name in (mine := effective(command_line, parsed.directives, component)):
                raise ScriptError(f"{_where(mine[name], script)}: {why}")
    shapes = [_shape(effective(command_line, parsed.directives, c), script) for c in range(parsed.components)]
    gpu_type = next((t for _, t, _, _, _ in shapes if t), None)
    cpus = [c for _, _, _, c, _ in shapes if c is not None]
    memory = [m for _, _, _, _, m in shapes if m is not None]
    array = None
    if "array" in options:
        array = array_indices(options["array"].value or "", _where(options["array"], script))[0]
    name = options["job-name"].value if "job-name" in options and options["job-name"].value else script.file_name
    return ScriptAsk(options, sum(n for n, _, _, _, _ in shapes), gpu_type, max(g for _, _, g, _, _ in shapes),
                     max(cpus) if cpus else None, max(memory) if memory else None,
                     options["time"].value if "time" in options else None,
                     options["partition"].value if "partition" in options else None, name or script.file_name,
                     array, _dependency_ids(options, script))


def _shape(options: dict[str, Option], script: JobScript) -> tuple[int, str | None, int, int | None, int | None]:
    """One component's (nodes, GPU type, GPUs per node, CPUs per node or None, memory MB per node or None)."""
    nodes = _count(options, "nodes", script, default=1, range_ok=True) or 1
    tasks = _count(options, "ntasks", script, default=None)
    per_node_tasks = _count(options, "ntasks-per-node", script, default=None)
    if per_node_tasks is None:
        # -n 8 alone: Slurm may pack the tasks on one node; ask for one such node.
        per_node_tasks = math.ceil(tasks / nodes) if tasks else 1
    cpus_per_task = _count(options, "cpus-per-task", script, default=1) or 1
    gpu_type, gpus_per_node = _gpus(options, script, nodes, per_node_tasks)
    cpus = per_node_tasks * cpus_per_task
    if "cpus-per-gpu" in options and gpus_per_node:
        cpus = max(cpus, gpus_per_node * (_count(options, "cpus-per-gpu", script, default=1) or 1))
    if "mincpus" in options:
        cpus = max(cpus, _count(options, "mincpus", script, default=1) or 1)
    asked = any(n in options for n in ("cpus-per-task", "ntasks", "ntasks-per-node", "cpus-per-gpu", "mincpus"))
    return nodes, gpu_type, gpus_per_node, cpus if asked else None, _memory(options, script, cpus, gpus_per_node)


def task_from_script(script: JobScript, source: str, *, infra: str | None = None, envs: dict[str, Any] | None = None,
                     workdir: str | None = None, find_job: JobFinder | None = None,
                     find_clusters: ClusterFinder | None = None) -> Task:
    """The task that runs `script` as it is. A dependency must stay within one cluster: on Corral jobs
    (`afterok:c-…`, found with `find_job`), it pins the script to their cluster; on Slurm job ids, to the
    one cluster where Corral submitted them (`find_clusters`), unless a cluster is pinned already."""
    ask = read_ask(script)
    corral_ids = corral_dependency_ids(ask.options, script)
    if corral_ids:
        infra, script = _pinned_to_dependencies(script, ask.options, corral_ids, infra, find_job)
    if ask.dependency_ids and not (infra and infra.count("/") >= 1):
        infra = f"slurm/{_cluster_of_slurm_ids(script, ask, find_clusters)}"
    resources: dict[str, Any] = {}
    if ask.gpus_per_node:
        resources["accelerators"] = f"{ask.gpu_type or 'gpu'}:{ask.gpus_per_node}"
    if ask.cpus_per_node:
        resources["cpus"] = ask.cpus_per_node
    if ask.memory_mb_per_node:
        resources["memory"] = f"{ask.memory_mb_per_node}MB"
    if infra:
        resources["infra"] = infra
    slurm: dict[str, Any] = {"script": script.model_dump()}
    if ask.time:
        slurm["time"] = ask.time
    data: dict[str, Any] = {"name": ask.job_name[:200], "num_nodes": ask.num_nodes, "resources": resources,
                            "slurm": slurm, "envs": envs or {}}
    if workdir:
        data["workdir"] = workdir
    return parse_task(data, source)


JobFinder = Callable[[str], tuple[str, str | None]]  # Corral job id -> (cluster, Slurm id or None); KeyError if none
ClusterFinder = Callable[[str], list[str]]  # Slurm job id -> the clusters where Corral submitted a job of that id


def _cluster_of_slurm_ids(script: JobScript, ask: ScriptAsk, find_clusters: ClusterFinder | None) -> str:
    """The one cluster where every Slurm job the dependency names was submitted through Corral: a Slurm
    job id means a job of one cluster only."""
    where = _where(ask.options["dependency"], script)
    pin = "pin the cluster with --infra slurm/<cluster> (or drop the dependency)"
    found = {slurm_id: find_clusters(slurm_id) if find_clusters is not None else []
             for slurm_id in ask.dependency_ids}
    if unknown := [slurm_id for slurm_id, clusters in found.items() if not clusters]:
        raise ScriptError(f"{where}: names Slurm job {', '.join(unknown)}, which Corral did not submit, so it "
                          f"cannot tell which cluster's {'jobs they are' if len(unknown) > 1 else 'job it is'}; "
                          f"{pin}")
    common = set.intersection(*(set(clusters) for clusters in found.values()))
    if len(common) == 1:
        return common.pop()
    said = "; ".join(f"{slurm_id} on {', '.join(clusters)}" for slurm_id, clusters in found.items())
    if common:
        raise ScriptError(f"{where}: Corral submitted a Slurm job of that id on more than one cluster ({said}); "
                          f"{pin}, or name the job by Corral's id (afterok:c-…)")
    raise ScriptError(f"{where}: the Slurm jobs it waits for are on different clusters ({said}); a Slurm "
                      "dependency stays within one cluster")


def corral_dependency_ids(options: dict[str, Option], script: JobScript) -> tuple[str, ...]:
    option = options.get("dependency")
    return tuple(dict.fromkeys(m.group(1) for m in CORRAL_JOB_REF.finditer(option.value or ""))
                 ) if option is not None else ()


def _said_clusters(option: Option) -> dict[str, str]:
    """The cluster each Corral job was written with (c-…;alpine, as `--parsable` prints it)."""
    return {m.group(1): m.group(2) for m in CORRAL_JOB_REF.finditer(option.value or "") if m.group(2)}


def _pinned_to_dependencies(script: JobScript, options: dict[str, Option], ids: tuple[str, ...], infra: str | None,
                            find_job: JobFinder | None) -> tuple[str, JobScript]:
    where = _where(options["dependency"], script)
    if find_job is None:
        raise ScriptError(f"{where}: names Corral jobs ({', '.join(ids)}), which only a server can look up")
    found: dict[str, tuple[str, str]] = {}
    for job_id in ids:
        try:
            cluster, handle = find_job(job_id)
        except KeyError:
            raise ScriptError(f"{where}: no job {job_id} (see corral queue)") from None
        if not handle:
            raise ScriptError(f"{where}: {job_id} has not reached its cluster yet; submit this script once it has")
        said = _said_clusters(options["dependency"]).get(job_id)
        if said is not None and said != cluster:
            raise ScriptError(f"{where}: {job_id} runs on {cluster}, not {said}")
        found[job_id] = (cluster, handle)
    clusters = sorted({cluster for cluster, _ in found.values()})
    if len(clusters) > 1:
        by = "; ".join(f"{c}: {', '.join(j for j, (k, _) in found.items() if k == c)}" for c in clusters)
        raise ScriptError(f"{where}: the jobs it waits for run on different clusters ({by}); a Slurm dependency "
                          "stays within one cluster")
    pinned = infra.split("/")[1] if infra and infra.count("/") >= 1 else None
    if pinned and pinned != clusters[0]:
        raise ScriptError(f"{where}: the jobs it waits for run on {clusters[0]}, not {pinned}")
    infra = infra if pinned else f"slurm/{clusters[0]}"
    return infra, script.model_copy(update={"dependencies": {j: h for j, (_, h) in found.items()}})


def copy_indices(task: Task) -> tuple[int, ...] | None:
    """A script's array indices, in order (its copies, as Slurm numbers them); None when not an array."""
    script = task.slurm.script
    return read_ask(script).array if script is not None else None


def script_constraint(task: Task) -> str | None:
    """The `--constraint` a script's job is submitted with (the command line's over its directives'), for
    placement to check against node features. None for a heterogeneous job: each component has its
    own, and Slurm checks those."""
    script = task.slurm.script
    if script is None:
        return None
    parsed = read_script(script.text, script.file_name)
    if parsed.components > 1:
        return None
    option = effective(_command_line(script), parsed.directives).get("constraint")
    return option.value if option is not None else None


def script_copies(tasks: list[tuple[Task, str]], num_jobs: int) -> int:
    """How many copies a launch makes when a job script is among its tasks: its --array's tasks."""
    scripts = [(task, source) for task, source in tasks if task.slurm.script is not None]
    if not scripts:
        return num_jobs
    if len(tasks) > 1:
        raise ScriptError(f"{scripts[0][1]}: a job script is launched on its own, not with other tasks")
    if num_jobs > 1:
        raise ScriptError(f"{scripts[0][1]}: a job script's copies come from its own --array (e.g. #SBATCH "
                          "--array=0-9); --num-jobs is for task files")
    indices = copy_indices(scripts[0][0])
    return len(indices) if indices else 1


def script_partitions(plan: Plan, task: Task) -> Plan:
    """A partition on sbatch's command line is a pin: only partitions of that name are candidates. One in
    the script is this site's name: a cluster that has it runs the script there; on the others,
    placement chooses (and the partition is rewritten)."""
    assert task.slurm.script is not None
    script = task.slurm.script
    pinned = [o for o in _command_line(script) if o.name == "partition"]
    named = [o for o in read_script(script.text, script.file_name).directives if o.name == "partition"]
    pin = set((pinned[-1].value or "").split(",")) if pinned else set()
    wanted = set((named[-1].value or "").split(",")) if named and not pinned else set()
    has = {(c.cluster, c.partition) for c in plan.candidates}
    out = []
    for c in plan.candidates:
        if c.feasible and pin and c.partition not in pin:
            c = c.refused(f"the command line pins --partition={pinned[-1].value}")
        elif c.feasible and wanted and c.partition not in wanted and any((c.cluster, p) in has for p in wanted):
            c = c.refused(f"the script asks for partition {named[-1].value}, which this cluster has")
        out.append(c)
    plan.candidates = out
    return plan


def script_nodes(plan: Plan, task: Task, snapshots: Mapping[str, ClusterSnapshot]) -> Plan:
    """`-w/--nodelist` names nodes of one site: a partition that lacks one of them cannot run the script
    (Slurm would refuse it there, at the cost of a failover each); one whose named nodes are not all up
    cannot start it now. A nodelist read from a file (a name with a slash) is left to Slurm. `snapshots`:
    as probed, before without_excluded; a partition `-x` emptied says so."""
    assert task.slurm.script is not None
    script = task.slurm.script
    options = _effective_options(script)
    if "exclude" in options:  # without_excluded took them out: say so where that left a partition empty
        plan.candidates = [replace(c, reason=f"{options['exclude'].spelling} leaves this partition no node")
                           if c.reason == NO_NODES and c.cluster in snapshots
                           and snapshots[c.cluster].nodes_in(c.partition) else c for c in plan.candidates]
    hosts = _named_hosts(options, "nodelist", script)
    if hosts is None:
        return plan
    out = []
    for c in plan.candidates:
        snapshot = snapshots.get(c.cluster)
        if c.feasible and snapshot is not None and snapshot.kind == "slurm":
            here = {n.name: n for n in snapshot.nodes if c.partition in n.partitions}
            missing = next((h for h in hosts if h not in here), None)
            if missing is not None:
                elsewhere = any(n.name == missing for n in snapshot.nodes)
                why = "not a node of this partition" if elsewhere else "no such node on this cluster"
                c = c.refused(f"--nodelist {missing}: {why}")
            elif not all(here[h].usable for h in hosts):
                c = replace(c, startable_now=False, startable_copies=0)
        out.append(c)
    plan.candidates = out
    return plan


def without_excluded(task: Task, snapshots: Mapping[str, ClusterSnapshot]) -> dict[str, ClusterSnapshot]:
    """The snapshots placement should read for a script with `-x/--exclude`: its excluded nodes taken out
    (Slurm never runs it there, so their free GPUs cannot start it). A file of names is left to Slurm."""
    script = task.slurm.script
    hosts = _named_hosts(_effective_options(script), "exclude", script) if script is not None else None
    if hosts is None:
        return dict(snapshots)
    excluded = set(hosts)
    return {cluster: replace(snapshot, nodes=tuple(n for n in snapshot.nodes if n.name not in excluded))
            if snapshot.kind == "slurm" else snapshot for cluster, snapshot in snapshots.items()}


def _effective_options(script: JobScript) -> dict[str, Option]:
    """The options that count for the script's (first) component: its command line's over its lines'."""
    return effective(_command_line(script), read_script(script.text, script.file_name).directives)


def _named_hosts(options: dict[str, Option], name: str, script: JobScript) -> list[str] | None:
    """The nodes a hostlist option (`nodelist`, `exclude`) names; None without one, or when it names a
    file of them (a value with a slash), which is Slurm's to read."""
    option = options.get(name)
    if option is None or not option.value or "/" in option.value:
        return None
    return expand_hostlist(option.value, _where(option, script))


def _command_line(script: JobScript) -> list[Option]:
    """The sbatch options given on the command line (`corral sbatch -p gpu script.sh`), as parsed."""
    return parse_options([(w, 0, 0) for w in script.options], "command line")


def _where(option: Option, script: JobScript) -> str:
    if option.line is None:
        return f"command line {option.spelling}"
    return f"{script.file_name}:{option.line + 1} {option.spelling}"


def _count(options: dict[str, Option], name: str, script: JobScript, *, default: int | None,
           range_ok: bool = False) -> int | None:
    option = options.get(name)
    if option is None:
        return default
    value = (option.value or "").strip()
    if range_ok and "-" in value:  # -N 2-4: at least 2 nodes; placement asks for the minimum
        value = value.split("-", 1)[0]
    if not _COUNT.match(value) or int(value) < 1 or int(value) > 100_000:
        raise ScriptError(f"{_where(option, script)}={option.value}: expected a count from 1 to 100,000")
    return int(value)


def _gpu_items(value: str, gres: bool) -> list[tuple[str | None, int]]:
    """(type, count) per GPU entry of a --gres value (`gpu:h100:2,shard:1`: its `gpu` entries) or of a
    --gpus* value (`h100:2`, `2`)."""
    out: list[tuple[str | None, int]] = []
    for item in value.split(","):
        parts = item.split("(")[0].split(":")
        if gres:
            if parts[0] != "gpu":
                continue
            parts = parts[1:]
        if not parts or parts == [""]:
            out.append((None, 1))
        elif len(parts) == 1:
            out.append((None, int(parts[0])) if parts[0].isdigit() else (parts[0] or None, 1))
        elif parts[-1].isdigit():
            out.append((parts[0] or None, int(parts[-1])))
        else:
            raise ValueError(item)
    return out


def _gpus(options: dict[str, Option], script: JobScript, nodes: int, tasks_per_node: int) -> tuple[str | None, int]:
    """(GPU type or None, GPUs per node) from --gpus-per-node, --gres, --gpus-per-task, --gpus or
    --gpus-per-socket (the first of these the script gives)."""
    for name in ("gpus-per-node", "gres", "gpus-per-task", "gpus", "gpus-per-socket"):
        option = options.get(name)
        if option is None or not option.value:
            continue
        try:
            items = _gpu_items(option.value, gres=name == "gres")
        except ValueError:
            raise ScriptError(f"{_where(option, script)}={option.value}: expected "
                              + ("gpu[:type][:count]" if name == "gres" else "[type:]count, e.g. h100:2")) from None
        if not items:
            continue  # --gres without a gpu entry
        gpu_type, count = items[0]
        if name == "gpus":
            count = math.ceil(count / nodes)
        elif name == "gpus-per-task":
            count *= tasks_per_node
        elif name == "gpus-per-socket":
            count *= _count(options, "sockets-per-node", script, default=1) or 1
        return gpu_type, count
    return None, 0


def _memory(options: dict[str, Option], script: JobScript, cpus: int, gpus: int) -> int | None:
    for name, times in (("mem", 1), ("mem-per-cpu", cpus), ("mem-per-gpu", gpus)):
        option = options.get(name)
        if option is None:
            continue
        match = _MEMORY.match((option.value or "").strip())
        if not match:
            raise ScriptError(f"{_where(option, script)}={option.value}: expected a size such as 4000, 16G or 512M")
        megabytes = float(match.group(1)) * _MB_PER_UNIT[match.group(2).upper()] * max(times, 1)
        return math.ceil(megabytes) if megabytes > 0 else None  # --mem=0: all of a node's memory
    return None


_DEPENDENCY_ID = re.compile(r"(?<![A-Za-z0-9_])(\d+)(?:_\d+)?(?:\+\d+)?", re.ASCII)


def _dependency_ids(options: dict[str, Option], script: JobScript) -> tuple[str, ...]:
    option = options.get("dependency")
    if option is None or not option.value:
        return ()
    ids = []
    for part in re.split(r"[,?]", CORRAL_JOB_REF.sub("", option.value)):
        kind, _, rest = part.partition(":")
        if kind in ("singleton", "expand") and not rest:
            continue
        ids += [m.group(1) for m in _DEPENDENCY_ID.finditer(rest)]
    return tuple(dict.fromkeys(ids))


__all__ = ["ScriptAsk", "ScriptError", "copy_indices", "read_ask", "script_constraint", "script_copies",
           "script_nodes", "script_partitions", "task_from_script", "without_excluded"]
