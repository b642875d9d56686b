"""Removing from the clusters what ended jobs no longer need: each ended attempt's `env.sh`, which
holds the job's env values, secrets included, in clear (mode 600) in the user's home on the cluster.
Slurm itself keeps a job's script and environment only until it purges the job's record; Corral's
copy stayed for good until this pass. With `run_dirs: {keep_days: N}` in config.yaml, also the whole
run directory N days after its attempts ended (its log, and its copy of the workdir, whose folders
count against a home's inode quota): off by default, since a task may write its results there.

On an SSH pool, each rank's files go from its own machine; on Kubernetes, the job's env values are
its Secret, deleted with its ConfigMap (the Job, and so its log, stays until its TTL). A job group's
host files (`~/.corral/groups/<group id>`, by which its tasks find each other) go once all its
tasks have ended, from every cluster they ran on. Once a day, the per-folder workdir caches that no
launch has used for `workdir_cache: {keep_days: N}` days (14 by default) go too (infra/caches.py).

It runs on the server (the chores' holder, one replica), every INTERVAL seconds, over attempts that
ended at least GRACE seconds ago: past Slurm's default MinJobAge (300 s), after which no `scontrol
requeue` can run the job's script again. A run directory shared by an array's copies waits for the
last of them; a live dev allocation's is left alone (`corral down` removes it whole). The job's log
and the rest of its run directory stay: `corral logs` still shows it.

Cost: one store query per cluster per batch, and one round trip (no Slurm command) per cluster and
user per batch of BATCH directories, every cluster's at once, within each cluster's session limit; no
round trip at all when no attempt has ended. The caches' prune: one query, and one round trip per
cluster and user that ever ran an attempt, once a day.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from corral.config import env_number, load_user_settings
from corral.errors import CorralError
from corral.infra import caches
from corral.infra.base import HostsJobGroups, PrunesWorkdirCaches, RemovesRunFiles
from corral.state.models import RunDirState

CACHES_INTERVAL = 86400.0  # seconds between prunes of the workdir caches (CORRAL_CACHES_INTERVAL)
GRACE = 600.0  # seconds after an attempt ended before its env.sh goes (CORRAL_RUN_FILES_GRACE)
INTERVAL = 600.0  # seconds between passes (CORRAL_RUN_FILES_INTERVAL)
FIRST_PASS = 60.0  # seconds after the server starts (or INTERVAL, if shorter)
BATCH = 1000  # run directories per cluster per store query, and so at most per round trip
MAX_BATCHES = 20  # per pass: a store upgraded with a long history is cleaned over several passes


def grace_seconds() -> float:
    return env_number("CORRAL_RUN_FILES_GRACE", GRACE, note="; a site whose MinJobAge is longer wants more")


def interval_seconds() -> float:
    return env_number("CORRAL_RUN_FILES_INTERVAL", INTERVAL, minimum=1.0)


def keep_days() -> float | None:
    """`run_dirs: {keep_days: N}` in the server's config.yaml: how long a run directory stays, whole,
    after its attempts ended; None (the default): for good."""
    value = load_user_settings().get("run_dirs")
    return float(value["keep_days"]) if isinstance(value, dict) else None


def cache_keep_days() -> float:
    """`workdir_cache: {keep_days: N}` in the server's config.yaml."""
    value = load_user_settings().get("workdir_cache")
    return float(value["keep_days"]) if isinstance(value, dict) else caches.KEEP_DAYS


def caches_interval_seconds() -> float:
    return env_number("CORRAL_CACHES_INTERVAL", CACHES_INTERVAL, minimum=1.0)


@dataclass
class RemovalReport:
    removed: dict[str, int] = field(default_factory=dict)  # cluster -> run directories cleaned
    errors: dict[str, str] = field(default_factory=dict)  # cluster -> why it was not (tried again next pass)


async def remove_env_files(client: Any, store: Any, now: float, *, grace: float = GRACE,
                           batch: int = BATCH, max_batches: int = MAX_BATCHES) -> RemovalReport:
    """One pass: the env.sh of every run directory whose attempts all ended `grace` seconds before
    `now`, on every cluster whose infra can remove it, each as its owner's account."""
    return await _pass(client, store, now - grace, RunDirState.ENV_REMOVED, batch, max_batches)


async def remove_run_dirs(client: Any, store: Any, now: float, keep_days: float, *, grace: float = GRACE,
                          batch: int = BATCH, max_batches: int = MAX_BATCHES) -> RemovalReport:
    """One pass: every run directory, whole, whose attempts all ended `keep_days` days before `now`
    (and `grace` seconds at least, whatever `keep_days` says)."""
    return await _pass(client, store, now - max(keep_days * 86400, grace), RunDirState.REMOVED, batch, max_batches)


async def _pass(client: Any, store: Any, ended_before: float, removing: RunDirState, batch: int,
                max_batches: int) -> RemovalReport:
    report = RemovalReport()
    pending = [c for c in client.registry.names() if _removes(client, c)]
    failed: set[tuple[str, str]] = set()  # (cluster, owner): left for the next pass, not asked again in this one
    for _ in range(max_batches):
        # A batch per cluster (one query each), all clusters' removals at once.
        found = {key: dirs for cluster in pending for key, dirs in store.ended_run_dirs(
            ended_before, batch, clusters=[cluster], skip=failed, removing=removing).items()}
        removal = "remove_run_dirs" if removing is RunDirState.REMOVED else "remove_env_files"
        outcomes = await asyncio.gather(*(_call_as(client, cluster, owner, removal, dirs)
                                          for (cluster, owner), dirs in found.items()))
        for ((cluster, owner), dirs), (_, error) in zip(found.items(), outcomes):
            if error is None:
                store.mark_run_dirs(cluster, [e.run_dir for e in dirs], removing)
                report.removed[cluster] = report.removed.get(cluster, 0) + len(dirs)
            else:
                report.errors[cluster] = error
                failed.add((cluster, owner))
        # A cluster whose batch was full may have more.
        pending = [c for c in pending if sum(len(d) for (cluster, _), d in found.items() if cluster == c) >= batch]
        if not pending:
            break
    return report


async def remove_group_dirs(client: Any, store: Any, now: float, *, grace: float = GRACE, batch: int = BATCH
                            ) -> RemovalReport:
    """One pass: the host files' folder (CORRAL_JOBGROUP_HOSTS) of every job group whose tasks all
    ended `grace` seconds before `now`, from each cluster (as each owner) its tasks ran on, every
    round of it at once: one round trip per cluster and owner. A group is marked done once every
    cluster it ran on has answered; one that failed is tried again next pass."""
    report = RemovalReport()
    groups = store.ended_groups(now - grace, batch)
    places: dict[tuple[str, str], list[str]] = {}
    for group, used in groups.items():
        for place in used:
            places.setdefault(place, []).append(group)
    places = {(cluster, owner): ids for (cluster, owner), ids in places.items()
              if _removes(client, cluster, HostsJobGroups)}
    outcomes = await asyncio.gather(*(_call_as(client, cluster, owner, "remove_group_files", sorted(ids))
                                      for (cluster, owner), ids in places.items()))
    failed: set[str] = set()
    for ((cluster, _), ids), (_, error) in zip(places.items(), outcomes):
        if error is None:
            report.removed[cluster] = report.removed.get(cluster, 0) + len(ids)
        else:
            report.errors[cluster] = error
            failed.update(ids)
    store.mark_groups_cleaned(sorted(set(groups) - failed))
    return report


async def prune_workdir_caches(client: Any, store: Any, keep_days: float) -> RemovalReport:
    """One pass: on every cluster (as every user) that ran an attempt, the workdir caches no launch
    used for `keep_days` days; one round trip per cluster and user, all at once."""
    report = RemovalReport()
    places = [(cluster, owner) for cluster, owner in store.run_places()
              if _removes(client, cluster, PrunesWorkdirCaches)]
    outcomes = await asyncio.gather(*(_call_as(client, cluster, owner, "prune_workdir_caches", keep_days)
                                      for cluster, owner in places))
    for (cluster, _), (pruned, error) in zip(places, outcomes):
        if error is not None:
            report.errors[cluster] = error
        elif pruned:
            report.removed[cluster] = report.removed.get(cluster, 0) + pruned
    return report


def _removes(client: Any, cluster: str, ability: type = RemovesRunFiles) -> bool:
    try:
        return isinstance(client.infra(cluster), ability)
    except CorralError:
        return False


async def _call_as(client: Any, cluster: str, owner: str, method: str, *args: Any) -> tuple[Any, str | None]:
    """Call the infra's `method` (remove_env_files, remove_run_dirs, remove_group_files,
    prune_workdir_caches) with `args` on one cluster as one user: (its answer, None), or (None, why not)."""
    try:
        return await getattr(client.infra(cluster, owner), method)(*args), None
    except (CorralError, ValueError) as exc:
        return None, str(exc)
