"""The SDK surface the CLI (and later the server) call: probe clusters in parallel, report per cluster.

A cluster that is down never delays the others: each probe has its own timeout, and its failure
becomes that cluster's row instead of an exception. Probes are single-flight per process: a request
that arrives while a probe of the same cluster runs shares its answer (a server taking 200 launches at
once probes each cluster once, not 200 times). A probe's answer is kept, but answers a later caller
only where it asked for that (`max_age`: `gpus --max-age` and the dashboard's refreshes) or where
placement under a spent RPC budget would otherwise wait (`reuse_when_busy`); `gpus`, `check` and a
launch's placement otherwise probe afresh.

A cluster whose last probe failed slowly (SLOW_FAILURE seconds or more: a login node that does not
answer costs CORRAL_TIMEOUT, a frozen `slurmctld` its `scontrol ping` timeout, 5 s on the testbed) is
probed again by each caller, but waited for FAILING_PATIENCE seconds only: past that, the caller has
the last failure, said to be asked again, and the probe goes on behind it. Before, every `launch` and
`gpus` paid the whole timeout again while such a cluster stayed silent.

A caller that already knows a cluster to be slow can leave it out (`leave_out`): it gets that as the
cluster's failure, and nothing is sent there. The controller's tick leaves out each cluster whose
status query has not answered in `status_wait`; the server's launches each whose query has run
API_WAIT_AT_MOST seconds (controller/v1.py; tracker.left_out).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass, field
from time import monotonic

from corral import accounts as team_accounts
from corral import budget
from corral.accounts import Accounts
from corral.config import NOT_SET_UP, ClusterRegistry, load_registry
from corral.errors import (
    ClusterError,
    CorralError,
    NoAccountError,
    NotFoundError,
    UnknownClusterError,
    UnknownPartitionError,
    asked_again,
)
from corral.gpu_names import normalize_gpu_name
from corral.infra import connect
from corral.infra.base import ClusterSnapshot, Infra, Node
from corral.infra.selector import InfraSelector, parse_infra
from corral.inventory import UNTYPED_GPU, GpuAvailability, filter_rows, gpu_availability
from corral.profiles import Profiles
from corral.ssh import SshTransport


@dataclass(frozen=True)
class ProbeOutcome:
    cluster: str
    snapshot: ClusterSnapshot | None
    error: CorralError | None
    seconds: float
    at: float = 0.0  # when it finished (epoch seconds)

    @property
    def ok(self) -> bool:
        return self.snapshot is not None

    @property
    def error_kind(self) -> str | None:
        if self.error is None:
            return None
        return getattr(self.error, "reason", "config")

    @property
    def error_message(self) -> str | None:
        return str(self.error) if self.error else None


@dataclass(frozen=True)
class GpuReport:
    rows: list[GpuAvailability]
    failures: list[ProbeOutcome]
    outcomes: list[ProbeOutcome] = field(default_factory=list)  # every cluster's probe, failed or not


# What a probe asks besides placement's snapshot: (associations, paths, filesystems), as Infra.probe takes them.
ProbeAsk = tuple[bool, tuple[str, ...], tuple[str, ...]]
# Probes in flight, per event loop: (cluster file, cluster, timeout, what else it asks) -> the running probe.
_IN_FLIGHT: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str, float, ProbeAsk],
                                                                     asyncio.Future[ProbeOutcome]]] = \
    weakref.WeakKeyDictionary()
# Each probe's latest answer, failed or not, per (cluster file, cluster, what it asks): (monotonic start,
# monotonic end, outcome). It answers two kinds of caller instead of a new probe:
# - placement under load (`reuse_when_busy`): an answered probe of the last RECENT_PROBE_MAX_AGE seconds,
#   where the cluster's budget cannot afford a fresh probe at once (its Infra's probe_commands), rather
#   than the launch waiting for a slot or failing as busy;
# - `max_age` (`gpus --max-age`, the dashboard's refreshes): a probe started at most that long ago,
#   shared by every caller, so that watchers and a team's dashboards cost each cluster one probe per
#   period whatever their number; past half its age a new probe starts behind the answer.
_LATEST: dict[tuple[str, str, ProbeAsk], tuple[float, float, ProbeOutcome]] = {}
RECENT_PROBE_MAX_AGE = 30.0
RECENT_PROBES_KEPT = 256
SLOW_FAILURE = 2.0  # seconds: a failed probe that took this long makes the next ones wait FAILING_PATIENCE only
FAILING_PATIENCE = 1.0  # seconds a caller waits for a probe of a cluster whose last probe failed slowly
# Per (cluster file, cluster): the last probe's failure, where it failed slowly; dropped once one answers.
_FAILING_SLOWLY: dict[tuple[str, str], CorralError] = {}


class StillFailing(ClusterError):
    """A cluster whose last probe failed slowly, asked again and not answering yet: the last failure,
    of the same kind (`reason`), said to be asked again."""

    def __init__(self, last: CorralError, cluster: str, waited: float):
        detail = last.detail if isinstance(last, ClusterError) else str(last)
        super().__init__(cluster, asked_again(detail, waited))
        self.reason = getattr(last, "reason", "error")


class LeftOut(ClusterError):
    """A cluster the caller did not ask, knowing it slow: its status query under way has not answered."""

    reason = "slow"


class Client:
    def __init__(self, registry: ClusterRegistry | None = None, transport: SshTransport | None = None,
                 *, timeout: float | None = None, accounts: Accounts | None = None,
                 profiles: Profiles | None = None):
        self.registry = registry or load_registry()
        self.transport = transport or SshTransport(self.registry, timeout=timeout)
        # A team server's: whose account each user's jobs reach the clusters as (accounts.py).
        self.accounts = accounts or team_accounts.installed()
        # What differs per cluster (account, modules, paths): the server's config.yaml, read once here.
        self.profiles = profiles if profiles is not None else Profiles.load(self.registry.names())
        self._infras: dict[tuple[str, str], Infra] = {}

    def infra(self, cluster: str, owner: str = "") -> Infra:
        """The cluster's Infra, acting as `owner` (a team server's user; "" for the service account).
        One per (cluster, account): an owner who acts as the service account there shares its Infra. They
        share the transport's settings and ControlMasters. Raises NoAccountError where the owner has no
        account on the cluster."""
        key = (cluster, owner if self.accounts else "")
        found = self._infras.get(key)
        if found is None:
            self.registry.get(cluster)  # an unknown name fails here, naming the known ones
            login = self.accounts.login(owner, cluster) if self.accounts and owner else None
            if login is None and owner and self.accounts:
                # As the service account: its Infra, the one that probed (a pool places by what its probe
                # saw and what was booked since; a second one would know nothing of either).
                found = self._infras[key] = self.infra(cluster)
            else:
                found = self._infras[key] = connect(cluster, self.transport.acting_as(login))
        return found

    def refusal(self, owner: str, cluster: str) -> str | None:
        """Why `owner` may not run on `cluster` (no account there), or None."""
        try:
            self.infra(cluster, owner)
        except NoAccountError as exc:
            return str(exc)
        return None

    def cluster_users(self, cluster: str) -> list[str]:
        """The team members' accounts on `cluster` whose jobs a status query lists (none outside a team)."""
        return self.accounts.cluster_users(cluster) if self.accounts else []

    async def probe(self, clusters: list[str] | None = None, *, associations: bool = False,
                    paths: tuple[str, ...] = (), filesystems: dict[str, tuple[str, ...]] | None = None,
                    reuse_when_busy: bool = False, max_age: float = 0.0,
                    leave_out: dict[str, str] | None = None) -> list[ProbeOutcome]:
        """Each cluster's snapshot (or why not), in parallel; `associations`: with the user's accounts
        and QOS too (`corral check`); `paths`: which of these exist there (tasks' resources.paths);
        `filesystems`: per cluster, paths whose filesystem type to read (profiles' paths, for check).
        `reuse_when_busy` (placement): where the cluster's budget cannot afford a probe at once, the
        latest snapshot of the last RECENT_PROBE_MAX_AGE seconds answers instead of a wait for a slot.
        `max_age` > 0: the latest probe of each cluster answers if it started at most that many seconds ago.
        `leave_out`: clusters not to ask, each with why (LeftOut)."""
        names = [e.name for e in self.registry.select(clusters)]
        asked = tuple(sorted(set(paths)))
        skipped = leave_out or {}

        async def one(name: str) -> ProbeOutcome:
            if name in skipped:
                return ProbeOutcome(name, None, LeftOut(name, skipped[name]), 0.0, time.time())
            extras = (associations, asked, tuple((filesystems or {}).get(name, ())))
            return await self._probe_one(name, extras, reuse_when_busy, max_age)

        return list(await asyncio.gather(*(one(n) for n in names)))

    async def _probe_one(self, cluster: str, extras: ProbeAsk = (False, (), ()),
                         reuse_when_busy: bool = False, max_age: float = 0.0) -> ProbeOutcome:
        """This cluster's probe: the latest one where `max_age` or `reuse_when_busy` lets it answer, else
        the one in flight in this process if there is one, else a new one."""
        latest = _LATEST.get((str(self.registry.path), cluster, extras))
        if latest is not None:
            started, finished, outcome = latest
            age = monotonic() - started
            if 0 < max_age and age <= max_age:
                if age > max_age / 2:
                    self._in_flight(cluster, extras)  # the next caller gets a newer one
                return outcome
            if reuse_when_busy and outcome.ok and monotonic() - finished <= RECENT_PROBE_MAX_AGE \
                    and not budget.affords_now(cluster, self.infra(cluster).probe_commands):
                return outcome
        probe = asyncio.shield(self._in_flight(cluster, extras))  # a caller that goes away leaves it to the others
        failing = _FAILING_SLOWLY.get((str(self.registry.path), cluster))
        if failing is None:
            return await probe
        try:
            return await asyncio.wait_for(probe, FAILING_PATIENCE)
        except TimeoutError:
            return ProbeOutcome(cluster, None, StillFailing(failing, cluster, FAILING_PATIENCE), FAILING_PATIENCE,
                                time.time())

    def _in_flight(self, cluster: str, extras: ProbeAsk) -> asyncio.Future[ProbeOutcome]:
        """The probe of this cluster running in this process, started now if none is."""
        running = _IN_FLIGHT.setdefault(asyncio.get_running_loop(), {})
        key = (str(self.registry.path), cluster, self.transport.timeout, extras)
        probe = running.get(key)
        if probe is None:
            probe = running[key] = asyncio.ensure_future(self._probe_now(cluster, extras))
            probe.add_done_callback(lambda done: running.pop(key) if running.get(key) is done else None)
        return probe

    async def _probe_now(self, cluster: str, extras: ProbeAsk) -> ProbeOutcome:
        started = monotonic()
        associations, paths, filesystems = extras
        try:
            snapshot = await self.infra(cluster).probe(associations=associations, paths=paths,
                                                       filesystems=filesystems)
            outcome = ProbeOutcome(cluster, snapshot, None, monotonic() - started, time.time())
        except CorralError as exc:
            outcome = ProbeOutcome(cluster, None, exc, monotonic() - started, time.time())
        now = monotonic()
        _LATEST[(str(self.registry.path), cluster, extras)] = (started, now, outcome)
        if outcome.error is not None and outcome.seconds >= SLOW_FAILURE:
            _FAILING_SLOWLY[(str(self.registry.path), cluster)] = outcome.error
        elif outcome.error is None or outcome.seconds < SLOW_FAILURE / 2:  # answered, or fails fast: ask it as usual
            _FAILING_SLOWLY.pop((str(self.registry.path), cluster), None)
        if len(_LATEST) > RECENT_PROBES_KEPT:  # tasks' paths make keys of their own: drop what aged out
            for key in [k for k, (_, ended, _) in _LATEST.items() if now - ended > RECENT_PROBE_MAX_AGE]:
                del _LATEST[key]
        return outcome

    async def gpus(self, gpu: str | None = None, infra: str | None = None, max_age: float = 0.0) -> GpuReport:
        """GPUs per cluster and partition from a probe of each cluster: a new one, or with `max_age` the
        latest one started at most that many seconds ago (see _LATEST)."""
        selector = parse_infra(infra) if infra else InfraSelector()
        clusters = [selector.cluster] if selector.cluster else None
        if selector.kind and not selector.cluster:  # only the places of that kind are asked
            clusters = self.registry.names_of(selector.kind)
            if not clusters:
                raise NotFoundError(f"infra {selector.kind}: {NOT_SET_UP[selector.kind]}")
        outcomes = await self.probe(clusters, max_age=max_age)
        rows: list[GpuAvailability] = []
        failures: list[ProbeOutcome] = []
        for outcome in outcomes:
            if selector.kind and self.registry.infra_kind(outcome.cluster) != selector.kind:
                continue
            if outcome.snapshot is None:
                failures.append(outcome)
                continue
            cluster_rows = gpu_availability(outcome.snapshot)
            if selector.partition:
                known = [p.name for p in outcome.snapshot.partitions]
                if selector.partition not in known:
                    raise UnknownPartitionError(outcome.cluster, selector.partition, known)
                cluster_rows = [r for r in cluster_rows if r.partition == selector.partition]
            rows += filter_rows(cluster_rows, gpu)
        return GpuReport(rows, failures, outcomes)


def check_json(outcome: ProbeOutcome, kind: str | None = None) -> dict[str, object]:
    """`kind`: the place's Infra kind, for one that did not answer (one that did says its own)."""
    snapshot = outcome.snapshot
    return {
        "cluster": outcome.cluster,
        "kind": snapshot.kind if snapshot else kind,
        "ok": outcome.ok,
        "error": outcome.error_message,
        "error_kind": outcome.error_kind,
        "slurm_version": snapshot.slurm_version if snapshot else None,
        "partitions": [p.name for p in snapshot.partitions] if snapshot else [],
        "default_partition": next((p.name for p in snapshot.partitions if p.default), None) if snapshot else None,
        "gpu_types": snapshot.gpu_types if snapshot else [],
        "nodes": len(snapshot.nodes) if snapshot else 0,
        "seconds": round(outcome.seconds, 3),
        "home_filesystem": snapshot.home_filesystem if snapshot else None,
        "home_shared": snapshot.home_shared if snapshot else None,
        "container_runtimes": list(snapshot.container_runtimes) if snapshot else [],
    }


def health_json(outcome: ProbeOutcome, kind: str | None = None) -> dict[str, object]:
    """A cluster's health as the dashboard shows it: did its probe answer, how fast, when. `kind` as
    for check_json."""
    return {"cluster": outcome.cluster, "ok": outcome.ok, "error": outcome.error_message,
            "error_kind": outcome.error_kind, "seconds": round(outcome.seconds, 3), "probed_at": outcome.at,
            "node_count": len(outcome.snapshot.nodes) if outcome.snapshot else 0,
            "kind": outcome.snapshot.kind if outcome.snapshot else kind,
            "rpc_budget": budget.report_of(outcome.cluster)}


def node_condition(node: Node) -> str:
    """idle, mixed, allocated, drained or down: a node in the dashboard's five words."""
    if not node.usable:
        return "drained" if "drain" in node.state.lower() else "down"
    busy_gpus = sum(g.used for g in node.gpus)
    if node.cpus_alloc >= node.cpus_total > 0 or (node.gpus and busy_gpus >= sum(g.total for g in node.gpus)):
        return "allocated"
    return "mixed" if node.cpus_alloc or busy_gpus else "idle"


def cluster_json(outcome: ProbeOutcome) -> dict[str, object]:
    """One cluster's nodes (state, CPUs, memory, GPUs, partitions) and partitions, from its probe."""
    snapshot = outcome.snapshot
    nodes = [{"name": n.name, "state": n.state, "condition": node_condition(n), "reason": n.reason,
              "partitions": list(n.partitions), "cpus_total": n.cpus_total, "cpus_alloc": n.cpus_alloc,
              "memory_mb": n.memory_mb, "memory_alloc_mb": n.memory_alloc_mb,
              "gpus": [{"gpu": normalize_gpu_name(g.gres_type) if g.gres_type else UNTYPED_GPU,
                        "gres_type": g.gres_type, "total": g.total, "used": g.used} for g in n.gpus]}
             for n in (snapshot.nodes if snapshot else ())]
    partitions = [{"name": p.name, "default": p.default, "state": p.state, "max_time": p.max_time,
                   "max_nodes": p.max_nodes, "total_nodes": p.total_nodes}
                  for p in (snapshot.partitions if snapshot else ())]
    return {**health_json(outcome), "slurm_version": snapshot.slurm_version if snapshot else None,
            "nodes": nodes, "partitions": partitions}


__all__ = ["Client", "ClusterError", "GpuReport", "ProbeOutcome", "UnknownClusterError", "check_json"]
