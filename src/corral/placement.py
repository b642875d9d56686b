"""Placement: which (cluster, partition) can run a task, and which should.

1. Feasibility per (cluster, partition, resource option): GPU type present (tolerant matching), enough
   nodes of the right shape and features (`--constraint`), CPUs, memory, time limit, container
   runtime. Infeasible candidates carry the reason.
2. Ranking, deterministic: can start now (enough free GPUs, CPUs and memory on enough usable nodes)
   first, and of those a cluster whose RPC budget can take the submission at once before one whose
   cannot; then earliest predicted start (`sbatch --test-only`); then the kind of place (Slurm, then
   SSH pools, then Kubernetes, unless the config's `infra_order` or the task's `ordered` list says
   otherwise); then no GPUs wasted on a CPU-only task; then queue pressure; then the user's `ordered`
   preference; then cluster file order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import TYPE_CHECKING

from corral.constraints import Constraint, parse_constraint
from corral.gpu_names import gpu_matches, normalize_gpu_name
from corral.infra.base import ClusterSnapshot, Node, Partition
from corral.infra.shell import WRAPPED_RUNTIMES
from corral.task import ResourceOption, Task

if TYPE_CHECKING:
    from corral.profiles import RunSettings

GENERIC_GPU = "gpu"
NO_NODES = "partition has no nodes"  # a Slurm partition's reason; a job script's plan looks for it


@dataclass(frozen=True)
class Candidate:
    cluster: str
    partition: str
    option: ResourceOption
    feasible: bool
    reason: str | None = None
    gres_type: str | None = None  # the site's GRES type chosen for the request
    gres: str | None = None  # what goes to --gres
    free_gpus: int = 0
    startable_now: bool = False
    startable_copies: int = 0  # how many copies of the task could start now (for sweeps)
    pressure: float = 0.0  # GPUs wanted by pending jobs / GPUs in the partition
    wastes_gpus: bool = False
    predicted_start: float | None = None  # epoch seconds, from sbatch --test-only
    prediction_note: str | None = None
    cluster_index: int = 0
    partition_index: int = 0
    runs_with: RunSettings | None = None  # the cluster's profile under the task (profiles.py)
    container_runtime: str | None = None  # how the task's image runs there (CONTAINER_RUNTIMES), if it has one
    kind: str = "slurm"  # the place's Infra kind: slurm, ssh (a pool, whose one partition is itself), k8s
    kind_rank: int = 0  # the kind's place in the kind order (build_plan): overflow goes to later kinds
    budget_short: bool = False  # its cluster's RPC budget cannot take a submission at once (budget.py)
    fits: bool = False  # refused though its resources fit (`refused`): its reason leads the others'

    def refused(self, reason: str) -> Candidate:
        """This place, unable to run the task, saying why."""
        return replace(self, feasible=False, startable_now=False, startable_copies=0, reason=reason,
                       fits=self.feasible or self.fits)

    def with_prediction(self, start: float | None, note: str | None) -> Candidate:
        return replace(self, predicted_start=start, prediction_note=note)

    def rank_key(self) -> tuple[object, ...]:
        return (
            not self.feasible,
            not self.fits,  # of places that cannot run it, those that fell only for a reason past its resources
            not self.startable_now,
            self.startable_now and self.budget_short,  # of places that start it now, one Corral may submit to now
            self.predicted_start if self.predicted_start is not None else math.inf,
            self.kind_rank,  # overflow: later kinds only where no earlier kind starts it sooner
            self.wastes_gpus,
            round(self.pressure, 3),
            self.option.preference,
            self.cluster_index,
            self.partition_index,
        )

    @property
    def infra(self) -> str:
        return f"{self.kind}/{self.cluster}" if self.partition == self.cluster and self.kind != "slurm" else (
            f"{self.kind}/{self.cluster}/{self.partition}")


def named(places: list[str], most: int = 4) -> str:
    """Places as a list that stays short: the first three and how many more, past `most`."""
    if len(places) <= most:
        return ", ".join(places)
    return f"{', '.join(places[:most - 1])} and {len(places) - most + 1} more"


@dataclass
class Plan:
    candidates: list[Candidate]
    unreachable: dict[str, str] = field(default_factory=dict)  # cluster -> error
    kinds: dict[str, str] = field(default_factory=dict)  # place -> its Infra kind, where not slurm
    not_set_up: list[str] = field(default_factory=list)  # kinds the task asks for that have no place

    def place_infra(self, cluster: str) -> str:
        """How an unreachable place is written: slurm/<cluster>, ssh/<pool>, k8s/<context>."""
        return f"{self.kinds.get(cluster, 'slurm')}/{cluster}"

    def refusals(self) -> list[str]:
        """Why each place that answered cannot run the task, best first, one line a reason: places with
        the same reason share its line, so that fifty clusters alike say it once."""
        places: dict[str, list[str]] = {}
        for candidate in self.ranked():
            if not candidate.feasible and candidate.reason:
                places.setdefault(candidate.reason, []).append(candidate.infra)
        return [f"{named(where)}: {reason}" for reason, where in places.items()]

    def unanswered(self) -> list[str]:
        """Each place that did not answer, with why (its name said once, though the error names it too)."""
        return [f"{self.place_infra(cluster)}: {error.removeprefix(f'{cluster}: ')}"
                for cluster, error in self.unreachable.items()]

    def ranked(self) -> list[Candidate]:
        return sorted(self.candidates, key=Candidate.rank_key)

    def feasible(self) -> list[Candidate]:
        return [c for c in self.ranked() if c.feasible]


def slurm_minutes(text: str | None) -> float | None:
    """Minutes in a Slurm time string (`90`, `4:00:00`, `2-00:00:00`, `UNLIMITED`); None if unset."""
    if text is None:
        return None
    text = text.strip().upper()
    if text in ("UNLIMITED", "INFINITE", "NONE"):
        return math.inf
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(p) for p in text.split(":")] + [0, 0]
        hours, minutes, seconds = parts[0], parts[1], parts[2]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            return float(parts[0])
        if len(parts) == 2:
            return parts[0] + parts[1] / 60
        hours, minutes, seconds = parts
    return days * 1440 + hours * 60 + minutes + seconds / 60


def _gpu_pool_types(nodes: list[Node], name: str) -> list[str | None]:
    types = {p.gres_type for n in nodes for p in n.gpus}
    if name.lower() == GENERIC_GPU:
        return sorted(types, key=lambda t: (t is None, t or ""))
    return sorted(t for t in types if t is not None and gpu_matches(name, t))


def gres_option(gres_type: str | None, gpus: int) -> str:
    """What goes to --gres for `gpus` GPUs per node of `gres_type` (any type: None)."""
    return f"gpu:{gres_type}:{gpus}" if gres_type else f"gpu:{gpus}"


def gres_type_of(gres: str | None) -> str | None:
    """The GPU type a --gres value from `gres_option` names (None: untyped, or no GPU)."""
    parts = (gres or "").split(":")
    return parts[1] if len(parts) == 3 else None


def _fits(node: Node, gres_type: str | None, gpus: int, cpus: int, memory_mb: int, any_type: bool) -> bool:
    if gpus:
        pools = [p for p in node.gpus if any_type or p.gres_type == gres_type]
        if not any(p.total >= gpus for p in pools):
            return False
    return node.cpus_total >= cpus and node.memory_mb >= memory_mb


def _most_a_node(nodes: list[Node], gres_type: str | None, gpus: int, cpus: int, memory_mb: int, any_type: bool,
                 gpu_name: str) -> str:
    """What no node has as much of as asked, as the most one has (" (at most H100:4 a node)"), so that the
    asker knows what would fit; "" when each is on some node (not on the same one, or too few such)."""
    short = []
    if gpus:
        most = max((p.total for n in nodes for p in n.gpus if any_type or p.gres_type == gres_type), default=0)
        if most < gpus:
            short.append(f"{gpu_name}:{most}")
    if cpus and (most := max(n.cpus_total for n in nodes)) < cpus:
        short.append(f"{most} CPUs")
    if memory_mb and (most := max(n.memory_mb for n in nodes)) < memory_mb:
        short.append(f"{round(most / 1024, 1):g} GB of memory")
    return f" (at most {', '.join(short)} a node)" if short else ""


def _free_now(node: Node, gres_type: str | None, gpus: int, cpus: int, memory_mb: int, any_type: bool) -> bool:
    if not node.usable or node.cpus_free < max(cpus, 1):
        return False
    if node.memory_mb - node.memory_alloc_mb < memory_mb:
        return False
    if gpus:
        if any_type:
            return any(node.gpus_free(p.gres_type) >= gpus for p in node.gpus)
        return node.gpus_free(gres_type) >= gpus
    return True


def _copies(node: Node, gres_type: str | None, gpus: int, cpus: int, memory_mb: int, any_type: bool) -> int:
    """How many one-node copies fit on a node now."""
    limits = [node.cpus_free // max(cpus, 1)]
    if memory_mb:
        limits.append((node.memory_mb - node.memory_alloc_mb) // memory_mb)
    if gpus:
        free = sum(node.gpus_free(p.gres_type) // gpus for p in node.gpus) if any_type else node.gpus_free(gres_type) // gpus
        limits.append(free)
    return max(0, min(limits))


def _matching(nodes: list[Node], constraint: Constraint) -> list[Node] | str:
    """The nodes whose features satisfy the constraint, or why the partition cannot."""
    matching = [n for n in nodes if constraint.node_ok(frozenset(n.features))]
    if not matching:
        present = sorted({f for n in nodes for f in n.features})
        has = f"its nodes have {', '.join(present)}" if present else "its nodes have no features"
        return f"no node matches --constraint={constraint.text} ({has})"
    return constraint.short_of([frozenset(n.features) for n in nodes]) or matching


def evaluate(
    task: Task,
    option: ResourceOption,
    snapshot: ClusterSnapshot,
    partition: Partition,
    cluster_index: int,
    partition_index: int,
    constraint: Constraint | None = None,
) -> Candidate:
    """One candidate: is it feasible, can it start now, what would it ask Slurm for. `constraint`: the
    `--constraint` it would be submitted with; only nodes whose features satisfy it count (Slurm only)."""
    base = Candidate(snapshot.cluster, partition.name, option, feasible=False,
                     cluster_index=cluster_index, partition_index=partition_index, kind=snapshot.kind)
    if snapshot.kind != "slurm" and task.slurm.script is not None:
        return replace(base, reason="a job script runs on Slurm clusters only")
    nodes = snapshot.nodes_in(partition.name)
    if not partition.up:
        return replace(base, reason=f"partition is {partition.state}")
    if not nodes:
        return replace(base, reason=NO_NODES if snapshot.kind == "slurm" else f"{_holder(snapshot.kind)} has no nodes")
    missing = [p for p in option.paths if snapshot.existing_paths is not None and p not in snapshot.existing_paths]
    if missing:
        return replace(base, reason=f"needs {', '.join(missing)}, which {snapshot.cluster} does not have")
    runtime = container_runtime(snapshot) if option.image_id else None
    if option.image_id and runtime is None:
        return replace(base, reason="image_id needs a container runtime (Pyxis, Apptainer or Singularity); "
                                    f"{snapshot.cluster} has none")
    base = replace(base, container_runtime=runtime)
    limit = slurm_minutes(partition.max_time if partition.max_time != "UNLIMITED" else None)
    wanted = slurm_minutes(task.slurm.time)
    if wanted is not None and limit is not None and wanted > limit:
        return replace(base, reason=f"time {task.slurm.time} exceeds the partition's limit {partition.max_time}")
    if partition.max_nodes is not None and task.num_nodes > partition.max_nodes:
        return replace(base, reason=f"{task.num_nodes} nodes exceed the partition's MaxNodes={partition.max_nodes}")
    cpus = math.ceil(option.cpus.value) if option.cpus else 0
    memory_mb = math.ceil(option.memory_gb.value * 1024) if option.memory_gb else 0
    accel = option.accelerator
    gpus = accel.count if accel else 0
    any_type = bool(accel and accel.name.lower() == GENERIC_GPU)
    gres_type: str | None = None
    if accel:
        types = _gpu_pool_types(nodes, accel.name)
        if not types:
            present = sorted({normalize_gpu_name(p.gres_type) if p.gres_type else GENERIC_GPU
                              for n in nodes for p in n.gpus})
            has = f"has {', '.join(present)}" if present else "has no GPUs"
            return replace(base, reason=f"no {accel.name} GPUs ({has})")
    if constraint is not None and snapshot.kind == "slurm":
        nodes_or_why = _matching(nodes, constraint)
        if isinstance(nodes_or_why, str):
            return replace(base, reason=nodes_or_why)
        nodes = nodes_or_why
    if accel:
        types = _gpu_pool_types(nodes, accel.name)
        if not types:
            return replace(base, reason=f"no {accel.name} GPUs on the nodes that match --constraint")
        # Among matching types, the one with the most free GPUs.
        gres_type = max(types, key=lambda t: sum(n.gpus_free(t) for n in nodes)) if not any_type else None
    shaped = [n for n in nodes if _fits(n, gres_type, gpus, cpus, memory_mb, any_type)]
    if len(shaped) < task.num_nodes:
        need = f"{task.num_nodes} node(s) with {option.describe()}"
        most = _most_a_node(nodes, gres_type, gpus, cpus, memory_mb, any_type, accel.name if accel else "")
        return replace(base, reason=f"needs {need}; {_holder(snapshot.kind)} has {len(shaped)}{most}")
    free_nodes = [n for n in shaped if _free_now(n, gres_type, gpus, cpus, memory_mb, any_type)]
    per_node = [_copies(n, gres_type, gpus, cpus, memory_mb, any_type) for n in free_nodes]
    copies = sum(per_node) if task.num_nodes == 1 else len(free_nodes) // task.num_nodes
    partition_gpus = sum(p.total for n in nodes for p in n.gpus if any_type or p.gres_type == gres_type)
    pending = sum(d.gpus for d in snapshot.pending if partition.name in d.partitions
                  and (any_type or d.gres_type in (None, gres_type)))
    free_gpus = sum(n.gpus_free(gres_type) if not any_type else sum(n.gpus_free(p.gres_type) for p in n.gpus)
                    for n in nodes) if accel else 0
    return replace(
        base,
        feasible=True,
        gres_type=gres_type,
        gres=gres_option(gres_type, gpus) if accel else None,
        free_gpus=free_gpus,
        startable_now=len(free_nodes) >= task.num_nodes,
        startable_copies=copies,
        pressure=pending / partition_gpus if partition_gpus else 0.0,
        wastes_gpus=not accel and any(n.gpus for n in nodes),
    )


# The runtimes Corral runs a task's image with, in order of preference: Pyxis (Slurm's own plugin,
# `srun --container-image`), then Apptainer, then Singularity; on Kubernetes, every pod is one.
CONTAINER_RUNTIMES = ("pyxis", "apptainer", "singularity", "kubernetes")


def container_runtime(snapshot: ClusterSnapshot) -> str | None:
    """The runtime a task's image would run with on this cluster, or None."""
    return next((r for r in CONTAINER_RUNTIMES if r in snapshot.container_runtimes), None)


def holding_runtime(candidate: Candidate, snapshot: ClusterSnapshot) -> Candidate:
    """A feasible candidate of a dev allocation with an image, as it holds it: with Apptainer or
    Singularity where the cluster has one, else not feasible, saying why: its setup, execs and shells
    each enter the image with a wrapper (`container_wrapper`), which Pyxis, an option of each srun
    step, does not fit."""
    if not candidate.feasible or candidate.container_runtime != "pyxis":
        return candidate
    runtime = next((r for r in WRAPPED_RUNTIMES if r in snapshot.container_runtimes), None)
    if runtime is not None:
        return replace(candidate, container_runtime=runtime)
    return candidate.refused(f"a dev allocation runs its image with Apptainer or Singularity; {snapshot.cluster} "
                             "offers only Pyxis (a task without -c runs there)")


# Among places that can start a task equally soon: Slurm clusters first, then SSH pools, then Kubernetes.
DEFAULT_KIND_ORDER = ("slurm", "ssh", "k8s")


def _holder(kind: str) -> str:
    """What holds a place's nodes, in its kind's words: a Slurm partition, an SSH pool (its machines), a
    Kubernetes context."""
    return {"ssh": "pool", "k8s": "context"}.get(kind, "partition")


def kind_ranks(options: list[ResourceOption], kind_order: tuple[str, ...] = DEFAULT_KIND_ORDER) -> dict[str, int]:
    """Each kind's rank among equal starts: the config's order, or none at all for a task whose `ordered`
    list states its own preference (then that list decides, as it does between clusters)."""
    if len({option.preference for option in options}) > 1 and any(option.infra.kind for option in options):
        return {}
    order = list(dict.fromkeys([*kind_order, *DEFAULT_KIND_ORDER]))
    return {kind: index for index, kind in enumerate(order)}


def build_plan(
    task: Task,
    options: list[ResourceOption],
    snapshots: dict[str, ClusterSnapshot],
    cluster_order: list[str],
    unreachable: dict[str, str] | None = None,
    kind_order: tuple[str, ...] = DEFAULT_KIND_ORDER,
    constraint_at: Callable[[str, str], str | None] | None = None,
) -> Plan:
    """Every (place, option) evaluated and ranked. `constraint_at(cluster, partition)`: the `--constraint`
    a job would be submitted with there (the task's or its profile's), which placement checks against
    the nodes' features."""
    ranks = kind_ranks(options, kind_order)
    parsed: dict[str, Constraint | None] = {}

    def constraint(cluster: str, partition: str) -> Constraint | None:
        text = constraint_at(cluster, partition) if constraint_at else None
        if not text:
            return None
        if text not in parsed:
            parsed[text] = parse_constraint(text)
        return parsed[text]

    candidates: list[Candidate] = []
    for option in options:
        for cluster_index, cluster in enumerate(cluster_order):
            snapshot = snapshots.get(cluster)
            if snapshot is None or (option.infra.cluster and option.infra.cluster != cluster) or (
                    option.infra.kind and option.infra.kind != snapshot.kind):
                continue
            for partition_index, partition in enumerate(snapshot.partitions):
                if option.infra.partition and option.infra.partition != partition.name:
                    continue
                candidates.append(replace(evaluate(task, option, snapshot, partition, cluster_index, partition_index,
                                                   constraint(cluster, partition.name)),
                                          kind_rank=ranks.get(snapshot.kind, 0)))
    # One candidate per place: the best option for it (an `ordered` list may name a place twice).
    best: dict[tuple[str, str], Candidate] = {}
    for candidate in sorted(candidates, key=Candidate.rank_key):
        best.setdefault((candidate.cluster, candidate.partition), candidate)
    return Plan(sorted(best.values(), key=Candidate.rank_key), dict(unreachable or {}))
