"""Which clusters this replica drives: replicas on one store share the work by leasing clusters.

Each replica renews a heartbeat lease (`replica:<holder>`) and holds a fair share of the configured
clusters (`cluster:<name>`): ceil(clusters / live replicas). The holder of a cluster is the only
replica that refreshes its jobs' states (one status query per cluster per tick, whatever the number
of replicas) and drives the managed jobs whose home it is (`home_cluster`): the cluster of the job's
latest attempt, or, before its first attempt, one picked from the job id. So every managed job is
driven by exactly one replica, and a replica that dies hands its clusters over once their leases
lapse: the others are then below their share and take them on their next tick, which the server's
loop times for that moment (`seconds_to_next_lapse`).

`rebalance` decides; `Shards.claim` does the store's part, once per tick: a heartbeat, one read of
every lease, one renewal of the replica's own, and one statement per lease taken or given up.
Replicas must share the cluster list (the same clusters file, the same order): a job not yet placed
is homed by it, and a replica that lacks a cluster homes that cluster's jobs elsewhere. So each
heartbeat says which list its replica reads (`cluster_list_note`), and while any two live replicas
disagree, none holds a cluster: no managed job is driven, rather than some driven twice, and
`corral server status` says why until every replica reads the same file.
"""

from __future__ import annotations

import hashlib
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.state import Store

CLUSTER = "cluster:"
REPLICA = "replica:"
FORGET_REPLICAS_AFTER = 86400.0  # a replica's heartbeat row is removed this long after it lapsed


def fair_share(clusters: int, replicas: int) -> int:
    """The most clusters one replica should hold: clusters over replicas, rounded up."""
    return math.ceil(clusters / max(1, replicas))


@dataclass(frozen=True)
class Rebalance:
    wanted: int  # how many more clusters to take
    free: list[str]  # the free ones, in the order to try them (another replica may take one first)
    release: list[str]

    @property
    def take(self) -> list[str]:
        """What to take if no other replica takes any of them first."""
        return self.free[:self.wanted]


def rebalance(holder: str, configured: list[str], holders: dict[str, str], replicas: int) -> Rebalance:
    """What to take and give up so that this replica holds its fair share. It gives up what is beyond
    the share rounded up (a replica has joined); it takes free clusters up to the share rounded down,
    plus one while fewer other replicas than the remainder hold that one more, so that 7 clusters
    over 3 replicas split 3, 2, 2. Free clusters are tried in an order of the holder's own, so that
    replicas starting together mostly ask for different ones."""
    replicas = max(1, replicas)
    mine = [c for c in configured if holders.get(c) == holder]
    release = sorted(c for c, h in holders.items() if h == holder and c not in configured)  # gone from the file
    release += mine[fair_share(len(configured), replicas):]
    kept = min(len(mine), fair_share(len(configured), replicas))
    floor, remainder = divmod(len(configured), replicas)
    counts: dict[str, int] = {}
    for cluster, other in holders.items():
        if other != holder and cluster in configured:
            counts[other] = counts.get(other, 0) + 1
    target = floor + (1 if sum(1 for n in counts.values() if n > floor) < remainder else 0)
    free = [c for c in configured if c not in holders]
    if free:
        start = zlib.crc32(holder.encode()) % len(free)
        free = free[start:] + free[:start]
    return Rebalance(wanted=max(0, target - kept), free=free, release=release)


@dataclass(frozen=True)
class LiveLeases:
    """The leases that have not lapsed, read from the store at one moment."""

    clusters: dict[str, str]  # cluster -> its holder
    replicas: dict[str, float]  # live replica -> when its heartbeat lapses
    expiries: list[tuple[str, float]]  # (holder, expiry) of every cluster lease and heartbeat
    cluster_lists: dict[str, str | None] = field(default_factory=dict)  # live replica -> its cluster_list_note


def live_leases(store: Store, now: float) -> LiveLeases:
    rows = [r for r in store.leases() if r.expires_at >= now and r.name.startswith((CLUSTER, REPLICA))]
    heartbeats = [r for r in rows if r.name.startswith(REPLICA)]
    return LiveLeases(clusters={r.name[len(CLUSTER):]: r.holder for r in rows if r.name.startswith(CLUSTER)},
                      replicas={r.holder: r.expires_at for r in heartbeats},
                      expiries=[(r.holder, r.expires_at) for r in rows],
                      cluster_lists={r.holder: r.note for r in heartbeats})


def cluster_list_note(configured: list[str]) -> str:
    """What a replica's heartbeat says about the clusters it reads: how many, and a digest of their
    names in order (the order homes the jobs not yet placed)."""
    digest = hashlib.sha256("\n".join(configured).encode()).hexdigest()[:12]
    return f"{len(configured)} clusters, digest {digest}"


def disagreement(holder: str, note: str, cluster_lists: dict[str, str | None]) -> str | None:
    """Why this replica must drive nothing: live replicas that read another cluster list; else None."""
    others = sorted((other, theirs) for other, theirs in cluster_lists.items() if other != holder and theirs != note)
    if not others:
        return None
    described = "; ".join(f"{other} reads {theirs or 'a list it does not say (an older Corral)'}"
                          for other, theirs in others)
    return (f"replicas read different cluster lists (this one, {holder}, reads {note}; {described}): none drives "
            "managed jobs until every replica reads the same clusters file, with the clusters in the same order")


def home_cluster(job_id: str, latest_cluster: str | None, configured: list[str]) -> str | None:
    """The cluster whose holder drives this job: its latest attempt's, else (no attempt yet, or one on
    a cluster no longer configured) one chosen by the job id, the same on every replica."""
    if latest_cluster and latest_cluster in configured:
        return latest_cluster
    if not configured:
        return None
    return configured[zlib.crc32(job_id.encode()) % len(configured)]


@dataclass
class Shards:
    """This replica's clusters, claimed from the store once per tick."""

    store: Store
    holder: str
    ttl: float
    configured: Callable[[], list[str]]
    held: set[str] = field(default_factory=set)
    replicas: int = 1
    valid_until: float = 0.0  # time.monotonic() until which the held leases are safely this replica's
    next_lapse: float | None = None  # time.time() at which another replica's lease lapses unless renewed
    clock: Callable[[], float] = time.time  # the store's leases are in wall-clock time
    disagreement: str | None = None  # why this replica holds no cluster: replicas read different lists

    def claim(self, keep: frozenset[str] | set[str] = frozenset()) -> set[str]:
        """Renew this replica's leases, then take or give up clusters towards its fair share. Clusters in
        `keep` (the homes of jobs whose submission still runs here) are never given up meanwhile: another
        replica that took one would place those jobs again."""
        now = self.clock()
        started = time.monotonic()
        configured = self.configured()
        note = cluster_list_note(configured)
        self.store.acquire_lease(REPLICA + self.holder, self.holder, self.ttl, now=now, note=note)
        self.store.renew_leases(self.holder, CLUSTER, self.ttl, now=now)
        live = live_leases(self.store, now)
        self.replicas = max(1, len(live.replicas))
        self.next_lapse = min((expiry for holder, expiry in live.expiries if holder != self.holder), default=None)
        self.disagreement = disagreement(self.holder, note, live.cluster_lists)
        if self.disagreement:  # fail closed: no job driven rather than one driven twice
            self._release_all_but(keep, live.clusters)
            self.held = set()
            return set()
        holders = dict(live.clusters)
        mine = {c for c, h in holders.items() if h == self.holder}
        plan = rebalance(self.holder, configured, holders, self.replicas)
        for cluster in plan.release:
            if cluster in keep:
                continue
            self.store.release_lease(CLUSTER + cluster, self.holder)
            mine.discard(cluster)
            holders.pop(cluster, None)
        wanted = plan.wanted
        for cluster in plan.free:  # past one another replica took just now, on to the next
            if wanted == 0:
                break
            if self.store.acquire_lease(CLUSTER + cluster, self.holder, self.ttl, now=now):
                mine.add(cluster)
                holders[cluster] = self.holder
                wanted -= 1
        self.held = mine
        # Another replica can take a lease only once it lapses: until a third of the lease before then,
        # decisions made under it are this replica's alone (clocks agreeing to well within that).
        self.valid_until = started + self.ttl * 2 / 3
        return set(mine)

    def seconds_to_next_lapse(self) -> float | None:
        """How long until another replica's lease lapses if it is not renewed: the tick after that moment
        takes a dead replica's clusters, so the loop wakes then rather than up to an interval later."""
        return None if self.next_lapse is None else max(0.0, self.next_lapse - self.clock())

    def lapsing(self) -> bool:
        """Has this tick run so long that its leases may be taken by now? Then it stops deciding."""
        return time.monotonic() > self.valid_until

    def forget_gone_replicas(self) -> None:
        self.store.forget_leases(REPLICA, expired_before=self.clock() - FORGET_REPLICAS_AFTER)

    def release_all(self, keep: frozenset[str] | set[str] = frozenset()) -> None:
        """Give up every lease (a replica stopping), but those of clusters in `keep`: left to lapse."""
        self._release_all_but(keep, live_leases(self.store, self.clock()).clusters if keep else {})
        self.store.release_lease(REPLICA + self.holder, self.holder)
        self.held = set()

    def _release_all_but(self, keep: frozenset[str] | set[str], holders: dict[str, str]) -> None:
        if not keep:
            self.store.release_leases(self.holder, CLUSTER)
            return
        for cluster, holder in holders.items():
            if holder == self.holder and cluster not in keep:
                self.store.release_lease(CLUSTER + cluster, self.holder)
