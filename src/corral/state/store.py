"""The state store. Every write commits at once: a crash loses nothing that was acknowledged."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import bindparam, case, create_engine, delete, event, exists, func, insert, or_, select, tuple_, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, aliased, sessionmaker

from corral.config import private_file, private_home
from corral.errors import ConfigError, NotFoundError, UnavailableError
from corral.infra.base import TERMINAL_JOB_STATES, EndedRun, FailureClass, JobState
from corral.state import migrations
from corral.state.plain import columns_of, plain_rows
from corral.state.models import (
    AllocationRow,
    AttemptRow,
    ClusterHealthRow,
    GpuSampleRow,
    JobEventRow,
    JobRow,
    MANAGED_TERMINAL_STATES,
    LeaseRow,
    ManagedJobRow,
    ManagedState,
    RunDirState,
    UserRow,
    WebSessionRow,
)

MANAGED_TERMINAL = frozenset(state.value for state in MANAGED_TERMINAL_STATES)

DB_URL_ENV = "CORRAL_DB_URL"
# The attempt states as the store keeps them (strings), from their one definition in infra/base.py.
TERMINAL_STATES = frozenset(state.value for state in TERMINAL_JOB_STATES)
# Every attempt state that is not terminal (named, so that a query can use the index on state).
LIVE_ATTEMPT_STATES = tuple(state.value for state in JobState if state not in TERMINAL_JOB_STATES)


class JobNotFoundError(NotFoundError):
    pass


class ArrayNotOneJobError(JobNotFoundError):
    """A Slurm array's id where one job is wanted; `job_ids`: its tasks' jobs (all of them for cancel)."""

    def __init__(self, message: str, job_ids: list[str]):
        super().__init__(message)
        self.job_ids = job_ids


@dataclass(frozen=True)
class JobView:
    """A job with its current (latest) attempt."""

    job: JobRow
    attempt: AttemptRow


@dataclass(frozen=True)
class QueuePage:
    """What `queue` shows: every live job, and the newest ended ones, newest first."""

    views: list[JobView]
    more: int  # ended jobs the filters match beyond this page
    sweeps: dict[str, dict[str, int]]  # sweep id -> {state: jobs}, over the whole sweep
    sweep_times: dict[str, tuple[float | None, float | None, float | None]] = field(default_factory=dict)
    # sweep id -> (its first job's start, its last job's end once every job has ended, its first submission)


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a page shows (the dashboard's filters); empty fields match everything."""

    owner: str = ""  # exactly this user's
    state: str = ""  # the latest attempt's state (a JobState, or "live" for any unfinished one), or several, comma-separated
    cluster: str = ""  # exactly this cluster's
    name: str = ""  # names containing this, ignoring case
    since: float | None = None  # launched at or after this Unix time
    allocation: str = ""  # run in this dev allocation (`corral exec`)
    sweep: str = ""  # the jobs of this sweep (by its id, its first job's), or this one job


QUEUE_CHUNK = 1000
DENSE_MATCHES = 2000  # a state or cluster filter matching more jobs pages by a walk in creation order
DENSE_CHUNK = 500  # jobs read per step of that walk


def new_job_id() -> str:
    """A job id: 48 random bits, so that even a store of millions of jobs rarely meets a collision
    (and `Store.new_job_ids` checks the store as well)."""
    return "c-" + secrets.token_hex(6)


def default_url() -> str:
    url = os.environ.get(DB_URL_ENV)
    if url:
        return url
    return f"sqlite:///{private_home() / 'state.db'}"


def open_store(url: str | None = None) -> Store:
    return Store(url or default_url())


def _shown(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url.split("@")[-1] if "@" in url else url


def _live_ids(owner: str | None = None, allocation: str | None = None) -> Any:
    """The ids of jobs with an attempt that may still run, through the index on attempts.state (live
    ones are few); `owner`'s, and in dev allocation `allocation`, when given."""
    query = select(AttemptRow.job_id).distinct().where(AttemptRow.state.in_(LIVE_ATTEMPT_STATES))
    if owner is not None or allocation is not None:
        query = query.join(JobRow, JobRow.id == AttemptRow.job_id)
    if owner is not None:
        query = query.where(JobRow.owner == owner)
    if allocation is not None:
        query = query.where(JobRow.allocation == allocation)
    return query


class Store:
    def __init__(self, url: str):
        self.url = url
        try:
            self.engine: Engine = create_engine(url, future=True)
        except ArgumentError as exc:  # a malformed URL, or a database SQLAlchemy has no dialect for
            raise ConfigError(f"the store's URL (--db or {DB_URL_ENV}) {_shown(url)!r} is not one SQLAlchemy "
                              f"reads ({exc}); give one such as postgresql+psycopg://corral@db.example.org/corral"
                              ) from None
        sqlite_path = _sqlite_path(url)
        if sqlite_path is not None:
            _private_sqlite_files(sqlite_path)
            event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            with _schema_lock(self.engine, sqlite_path), self.engine.begin() as connection:
                migrations.upgrade(connection)
        except OperationalError as exc:
            why = str(exc.orig or exc).strip().splitlines()[0]
            raise UnavailableError(f"the store {_shown(url)} did not answer: {why}") from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def new_job_ids(self, count: int) -> list[str]:
        """`count` fresh job ids, distinct from each other and from every id in the store."""
        ids: set[str] = set()
        while len(ids) < count:
            fresh = {new_job_id() for _ in range(count - len(ids))} - ids
            with self.session() as s:
                taken = {i for chunk in _chunks(sorted(fresh), 5000)
                         for i in s.scalars(select(JobRow.id).where(JobRow.id.in_(chunk)))}
            ids |= fresh - taken
        return sorted(ids)

    def session(self) -> Session:
        return self._sessions()

    def add_jobs(self, jobs: Iterable[JobRow], attempts: Iterable[AttemptRow]) -> None:
        """Record jobs and their first attempts (state SUBMITTING) before anything reaches Slurm."""
        with self.session() as s, s.begin():
            s.add_all(list(jobs))
            s.flush()
            s.add_all(list(attempts))

    def update_attempt(self, token: str, **fields: object) -> None:
        with self.session() as s, s.begin():
            row = s.get(AttemptRow, token)
            if row is None:
                raise JobNotFoundError(f"no attempt {token}")
            for key, value in fields.items():
                setattr(row, key, value)

    def move_attempt(self, token: str, from_state: JobState, **fields: object) -> bool:
        """Change an attempt only while it is in `from_state` (one UPDATE), so that a cancel or an end
        recorded meanwhile stands; whether it changed."""
        with self.session() as s, s.begin():
            result = s.execute(update(AttemptRow).where(AttemptRow.token == token, AttemptRow.state == from_state)
                               .values(**fields))
            return bool(result.rowcount)  # type: ignore[attr-defined]

    def accept_attempts(self, handles: dict[str, str], submitted_at: float) -> None:
        """Record that the infra accepted these attempts (token -> handle): the handle always, PENDING
        only where an attempt is still SUBMITTING. A cancel recorded while it was being sent (CANCELLING)
        then stands, and goes to the job where it landed; a refresh that found it first is not undone."""
        with self.session() as s, s.begin():
            _update_in_batches(s, AttemptRow, [{"token": token, "handle": handle, "submitted_at": submitted_at}
                                               for token, handle in handles.items()])
            for chunk in _chunks(list(handles), 5000):
                s.execute(update(AttemptRow).where(AttemptRow.token.in_(chunk),
                                                   AttemptRow.state == JobState.SUBMITTING)
                          .values(state=JobState.PENDING))

    def settle_unanswered(self, settled: dict[str, dict[str, object]]) -> None:
        """Settle attempts read without a handle and not found on their cluster (SUBMIT_FAILED, or
        CANCELLED for one cancelled meanwhile), only where no handle has been written since: a
        submission answered after the refresh read them stands (accept_attempts). One statement per
        distinct set of fields (a crashed sweep's hundreds of attempts share one)."""
        alike: dict[tuple[tuple[str, object], ...], list[str]] = {}
        for token, fields in settled.items():
            alike.setdefault(tuple(sorted(fields.items())), []).append(token)
        if not alike:
            return
        with self.session() as s, s.begin():
            for fields, tokens in alike.items():
                for chunk in _chunks(tokens, 5000):
                    s.execute(update(AttemptRow).where(AttemptRow.token.in_(chunk), AttemptRow.handle.is_(None))
                              .values(**dict(fields)))

    def end_attempt(self, token: str, **fields: object) -> None:
        """Record how an attempt ended, in one transaction with reading it. One that a user's cancel
        reached meanwhile (CANCELLING or CANCELLED) ends CANCELLED, with the cancel's reason and the
        `exit_code` given."""
        with self.session() as s, s.begin():
            row = s.get(AttemptRow, token, with_for_update=True)
            if row is None:
                raise JobNotFoundError(f"no attempt {token}")
            if row.state in (JobState.CANCELLING, JobState.CANCELLED):
                fields = {"state": JobState.CANCELLED, "ended_at": row.ended_at or fields.get("ended_at"),
                          **({"exit_code": fields["exit_code"]} if "exit_code" in fields else {})}
            for key, value in fields.items():
                setattr(row, key, value)

    def undo_cancelling(self, tokens: list[str], state: JobState) -> None:
        """Put back in `state` those of these attempts still CANCELLING (a cancel that could not be sent)."""
        if not tokens:
            return
        with self.session() as s, s.begin():
            s.execute(update(AttemptRow).where(AttemptRow.token.in_(tokens), AttemptRow.state == JobState.CANCELLING)
                      .values(state=state, reason=None))

    def update_attempts(self, updates: dict[str, dict[str, object]]) -> None:
        """Change many attempts at once (one executemany per set of changed columns)."""
        if not updates:
            return
        with self.session() as s, s.begin():
            tokens = list(updates)
            known = {t for chunk in _chunks(tokens, 5000)
                     for t in s.scalars(select(AttemptRow.token).where(AttemptRow.token.in_(chunk)))}
            _update_in_batches(s, AttemptRow,
                               [{"token": token, **fields} for token, fields in updates.items() if token in known])

    def views(self, job_ids: Iterable[str] | None = None, scope: str | None = None) -> list[JobView]:
        """Jobs with their latest attempt, oldest first. `scope`: only this owner's (None: everyone's)."""
        with self.session() as s:
            query = select(JobRow).order_by(JobRow.created_at, JobRow.job_rank)
            if job_ids is not None:
                query = query.where(JobRow.id.in_(list(job_ids)))
            if scope is not None:
                query = query.where(JobRow.owner == scope)
            jobs = list(s.scalars(query))
            attempts = list(s.scalars(select(AttemptRow).where(AttemptRow.job_id.in_([j.id for j in jobs]))))
        latest: dict[str, AttemptRow] = {}
        for attempt in attempts:
            if attempt.job_id not in latest or attempt.number > latest[attempt.job_id].number:
                latest[attempt.job_id] = attempt
        return [JobView(j, latest[j.id]) for j in jobs if j.id in latest]

    def live_job_ids(self, owner: str | None = None, allocation: str | None = None) -> list[str]:
        """Jobs with an attempt that may still run (`owner`'s only, unless None; those run in dev
        allocation `allocation`, when given), from the state index."""
        with self.session() as s:
            return list(s.scalars(_live_ids(owner, allocation)))

    def live_execs(self) -> list[tuple[str, str, str]]:
        """(job id, owner, allocation) of each exec (a job run in a dev allocation) that may still run
        there: sent to it, so not one still queued until it is ready (`queued_execs`)."""
        query = (select(JobRow.id, JobRow.owner, JobRow.allocation).join(AttemptRow, AttemptRow.job_id == JobRow.id)
                 .where(AttemptRow.state.in_(LIVE_ATTEMPT_STATES), AttemptRow.submitted_at.is_not(None),
                        JobRow.allocation.is_not(None)))
        with self.session() as s:
            return [(job_id, owner, allocation) for job_id, owner, allocation in s.execute(query)]

    def queued_execs(self) -> list[str]:
        """The ids of execs queued until their allocation is ready (`exec -d` on a pending one): PENDING
        and never sent, through the index on attempts.state."""
        query = (select(AttemptRow.job_id).join(JobRow, JobRow.id == AttemptRow.job_id)
                 .where(AttemptRow.state == JobState.PENDING, AttemptRow.submitted_at.is_(None),
                        JobRow.allocation.is_not(None)))
        with self.session() as s:
            return list(s.scalars(query))

    def queue_page(self, *, limit: int | None = 20, offset: int = 0, since: float | None = None,
                   allocation: str | None = None, live: bool = True, by_sweep: bool = False,
                   scope: str | None = None) -> QueuePage:
        """Live jobs (with `live`) and the `limit` newest ended ones after `offset`, newest first; with
        `by_sweep`, a sweep counts as one (its counts per state come whole, from one aggregate). Work is
        in proportion to the page: ids come from indexed queries, rows only for what is shown."""
        unit = func.coalesce(JobRow.sweep_id, JobRow.id) if by_sweep else JobRow.id
        with self.session() as s:
            ended = select(JobRow.id, unit.label("unit"))
            if allocation is not None:
                ended = ended.where(JobRow.allocation == allocation)
            if scope is not None:
                ended = ended.where(JobRow.owner == scope)
            live_ids = set(s.scalars(_live_ids(scope, allocation)))
            if live_ids:
                ended = ended.where(JobRow.id.not_in(live_ids))
            if since is not None:
                ended = ended.where(JobRow.created_at >= since)
            units = ended.subquery()
            total = s.scalar(select(func.count(func.distinct(units.c.unit)))) or 0
            ordered = ended.order_by(JobRow.created_at.desc(), JobRow.job_rank.desc())
            if by_sweep:
                page_ids, page_units = self._page_ids(s, ordered, offset, limit)
            else:
                page_ids = list(s.scalars(select(ordered.subquery().c.id).offset(offset).limit(limit)))
                page_units = len(page_ids)
        shown = self.views((live_ids if live else set()) | set(page_ids))
        shown.sort(key=lambda v: (v.job.created_at, v.job.job_rank), reverse=True)
        counts, times = self.sweep_summaries({v.job.sweep_id for v in shown if v.job.sweep_id})
        return QueuePage(shown, max(0, total - offset - page_units), counts, times)

    def job_page(self, wanted: JobFilter, *, limit: int = 50, offset: int = 0,
                 scope: str | None = None) -> tuple[list[JobView], int]:
        """(one page of the jobs `wanted` matches, newest first; how many match in all). State and
        cluster apply to each job's latest attempt. Unfiltered, it reads the page's rows and an index
        count; a state narrows through the index on attempts.state. When a state or cluster matches
        many jobs (more than DENSE_MATCHES: most of a long history, `-t CD`), the page comes from a walk
        by creation time that stops once it is full, rather than from sorting every match. A job with
        no attempt yet (a managed job before its first placement) counts in the total but is not
        listed, as in `queue_page`."""
        query = select(JobRow.id)
        latest = None
        if wanted.state or wanted.cluster:
            # jobs whose latest attempt (none newer for the same job) is in that state, on that cluster
            newer = aliased(AttemptRow)
            latest = select(AttemptRow.job_id).where(~exists().where(newer.job_id == AttemptRow.job_id,
                                                                     newer.number > AttemptRow.number))
            if wanted.state:
                states = {s for part in wanted.state.split(",")
                          for s in (LIVE_ATTEMPT_STATES if part == "live" else (part,))}
                latest = latest.where(AttemptRow.state.in_(sorted(states)))
            if wanted.cluster:
                latest = latest.where(AttemptRow.cluster == wanted.cluster)
        if scope is not None:
            query = query.where(JobRow.owner == scope)
        if wanted.owner:
            query = query.where(JobRow.owner == wanted.owner)
        if wanted.name:
            escaped = wanted.name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(JobRow.name.ilike(f"%{escaped}%", escape="\\"))
        if wanted.since is not None:
            query = query.where(JobRow.created_at >= wanted.since)
        if wanted.allocation:
            query = query.where(JobRow.allocation == wanted.allocation)
        if wanted.sweep:
            query = query.where(or_(JobRow.sweep_id == wanted.sweep, JobRow.id == wanted.sweep))
        matching = query if latest is None else query.where(JobRow.id.in_(latest))
        with self.session() as s:
            total = s.scalar(select(func.count()).select_from(matching.subquery())) or 0
            if latest is not None and total > DENSE_MATCHES:
                ids = self._walk_newest(s, query, latest, offset, limit)
            else:
                ids = list(s.scalars(matching.order_by(JobRow.created_at.desc(), JobRow.job_rank.desc())
                                     .offset(offset).limit(limit)))
        shown = self.views(ids)
        shown.sort(key=lambda v: (v.job.created_at, v.job.job_rank), reverse=True)
        return shown, total

    @staticmethod
    def _walk_newest(s: Session, query: Any, latest: Any, offset: int, limit: int) -> list[str]:
        """Matches `offset` to `offset + limit` of `query`'s jobs whose latest attempt `latest` selects,
        newest first: jobs read by creation time a chunk at a time (keyset, through the created_at
        index), each chunk checked in one query, stopping once the page is full."""
        ids: list[str] = []
        skipped = 0
        after: tuple[float, int, str] | None = None
        while True:
            step = query.add_columns(JobRow.created_at, JobRow.job_rank)
            if after is not None:
                at, rank, job_id = after
                step = step.where((JobRow.created_at < at) | ((JobRow.created_at == at) & (
                    (JobRow.job_rank < rank) | ((JobRow.job_rank == rank) & (JobRow.id < job_id)))))
            chunk = s.execute(step.order_by(JobRow.created_at.desc(), JobRow.job_rank.desc(), JobRow.id.desc())
                              .limit(DENSE_CHUNK)).all()
            if not chunk:
                return ids
            found = set(s.scalars(latest.where(AttemptRow.job_id.in_([row[0] for row in chunk]))))
            for job_id, *_ in chunk:
                if job_id not in found:
                    continue
                if skipped < offset:
                    skipped += 1
                elif len(ids) < limit:
                    ids.append(job_id)
            if len(ids) >= limit or len(chunk) < DENSE_CHUNK:
                return ids
            after = (chunk[-1][1], chunk[-1][2], chunk[-1][0])

    @staticmethod
    def _page_ids(s: Session, ordered: Any, offset: int, limit: int | None,
                  per_sweep: int = 50) -> tuple[list[str], int]:
        """(job ids, units) of units `offset` to `offset + limit`, where a sweep is one unit and at most
        `per_sweep` of its jobs are loaded (its counts come apart); light rows, a chunk at a time."""
        index: dict[str, int] = {}  # unit -> its position, from 0
        taken: dict[str, int] = {}
        ids: list[str] = []
        position = 0
        while True:
            chunk = s.execute(ordered.offset(position).limit(QUEUE_CHUNK)).all()
            for job_id, unit in chunk:
                if unit not in index:
                    if limit is not None and len(index) >= offset + limit:
                        return ids, len(taken)
                    index[unit] = len(index)
                if index[unit] >= offset and taken.get(unit, 0) < per_sweep:
                    taken[unit] = taken.get(unit, 0) + 1
                    ids.append(job_id)
            if len(chunk) < QUEUE_CHUNK:
                return ids, len(taken)
            position += QUEUE_CHUNK

    def iter_queue(self, *, since: float | None = None, allocation: str | None = None,
                   scope: str | None = None) -> Iterator[JobView]:
        """Every job, newest first, a chunk at a time: memory stays flat whatever the history."""
        query = select(JobRow.id).order_by(JobRow.created_at.desc(), JobRow.job_rank.desc())
        if scope is not None:
            query = query.where(JobRow.owner == scope)
        if allocation is not None:
            query = query.where(JobRow.allocation == allocation)
        if since is not None:
            query = query.where(JobRow.created_at >= since)
        offset = 0
        while True:
            with self.session() as s:
                ids = list(s.scalars(query.offset(offset).limit(QUEUE_CHUNK)))
            views = {v.job.id: v for v in self.views(ids)}
            yield from (views[i] for i in ids if i in views)
            if len(ids) < QUEUE_CHUNK:
                return
            offset += QUEUE_CHUNK

    def sweep_summaries(self, sweep_ids: set[str]) -> tuple[
            dict[str, dict[str, int]], dict[str, tuple[float | None, float | None, float | None]]]:
        """Of each sweep, by its jobs' latest attempts (one aggregate query): its jobs per state, and (the
        first start, the last end once none is live, the first submission)."""
        if not sweep_ids:
            return {}, {}
        with self.session() as s:
            latest = (select(AttemptRow.job_id, func.max(AttemptRow.number).label("number"))
                      .join(JobRow, JobRow.id == AttemptRow.job_id)
                      .where(JobRow.sweep_id.in_(list(sweep_ids))).group_by(AttemptRow.job_id).subquery())
            rows = s.execute(
                select(JobRow.sweep_id, AttemptRow.state, func.count(), func.min(AttemptRow.started_at),
                       func.max(AttemptRow.ended_at), func.min(AttemptRow.submitted_at))
                .join(latest, latest.c.job_id == JobRow.id)
                .join(AttemptRow, (AttemptRow.job_id == latest.c.job_id) & (AttemptRow.number == latest.c.number))
                .group_by(JobRow.sweep_id, AttemptRow.state))
            counts: dict[str, dict[str, int]] = {}
            starts: dict[str, list[float]] = {}
            ends: dict[str, list[float]] = {}
            submissions: dict[str, list[float]] = {}
            for sweep_id, state, count, started, ended, submitted in rows:
                counts.setdefault(sweep_id, {})[state] = count
                starts.setdefault(sweep_id, []).extend([started] if started is not None else [])
                ends.setdefault(sweep_id, []).extend([ended] if ended is not None else [])
                submissions.setdefault(sweep_id, []).extend([submitted] if submitted is not None else [])
            live = {sweep for sweep, states in counts.items() if any(state in LIVE_ATTEMPT_STATES for state in states)}
            times = {sweep: (min(starts[sweep], default=None),
                             None if sweep in live else max(ends[sweep], default=None),
                             min(submissions[sweep], default=None)) for sweep in counts}
            return counts, times

    def active_attempts(self) -> list[AttemptRow]:
        """Live attempts of batch jobs (exec jobs in dev allocations are tracked by `corral exec`), as
        plain copies (state/plain.py): the tracker reads every live one each refresh."""
        with self.session() as s:
            query = (columns_of(AttemptRow).join(JobRow, JobRow.id == AttemptRow.job_id)
                     .where(AttemptRow.state.in_(LIVE_ATTEMPT_STATES), JobRow.allocation.is_(None)))
            return plain_rows(s, AttemptRow, query)

    # ---- managed jobs ----
    def add_managed_jobs(self, jobs: list[dict[str, object]], pipeline_name: str | None = None,
                         parallel: bool = False, delays: list[float | None] | None = None) -> None:
        """Record managed jobs (each a `jobs` row's columns) with their managed rows and first events, in
        one transaction: a crash records all of them or none. Through Core, not ORM objects: a sweep of
        10,000 builds no 30,000 instances the server's heap would keep the shape of. With
        `pipeline_name`, the jobs are that pipeline's tasks, in the order they run; with `parallel`, a
        job group's, with each task's termination delay (None for a primary task)."""
        now = time.time()
        first = str(jobs[0]["id"]) if jobs and pipeline_name is not None else None
        delays = delays or [None] * len(jobs)
        with self.session() as s, s.begin():
            _execute_in_batches(s, insert(JobRow), jobs)
            _execute_in_batches(s, insert(ManagedJobRow), [
                {"job_id": j["id"], "state": ManagedState.PENDING.value, "reason": None, "restarts_on_errors": 0,
                 "recoveries": 0, "moves": 0, "last_move_at": 0.0, "cancel_requested": False, "updated_at": now,
                 "pipeline_id": first, "pipeline_name": pipeline_name,
                 "pipeline_stage": stage if first is not None else None, "pipeline_parallel": parallel,
                 "termination_delay": delays[stage], "group_files_removed": False if parallel else None}
                for stage, j in enumerate(jobs)])
            _execute_in_batches(s, insert(JobEventRow), [{"job_id": j["id"], "at": now,
                                                          "state": ManagedState.PENDING.value,
                                                          "reason": "submitted"} for j in jobs])

    def managed(self, job_ids: Iterable[str] | None = None, live_only: bool = False) -> list[ManagedJobRow]:
        """Managed jobs' own rows, as plain copies (state/plain.py): each tick reads every live one."""
        with self.session() as s:
            query = columns_of(ManagedJobRow)
            if job_ids is not None:
                query = query.where(ManagedJobRow.job_id.in_(list(job_ids)))
            if live_only:
                query = query.where(ManagedJobRow.state.not_in(MANAGED_TERMINAL))
            return plain_rows(s, ManagedJobRow, query)

    def pipeline_tasks(self, pipeline_ids: Iterable[str]) -> dict[str, list[ManagedJobRow]]:
        """Every task of these pipelines, in the order they run, in one query."""
        ids = list(set(pipeline_ids))
        if not ids:
            return {}
        with self.session() as s:
            rows = plain_rows(s, ManagedJobRow, columns_of(ManagedJobRow).where(ManagedJobRow.pipeline_id.in_(ids))
                              .order_by(ManagedJobRow.pipeline_stage))
        out: dict[str, list[ManagedJobRow]] = {}
        for row in rows:
            out.setdefault(str(row.pipeline_id), []).append(row)
        return out

    def pipeline_named(self, name: str, scope: str | None = None) -> tuple[list[str], int]:
        """The job ids of the one pipeline called `name` (in the order its tasks run), and how many
        pipelines are called so (0, 1, or 2 for several: then no ids)."""
        with self.session() as s:
            query = select(ManagedJobRow.pipeline_id).where(ManagedJobRow.pipeline_name == name)
            if scope is not None:
                query = query.join(JobRow, JobRow.id == ManagedJobRow.job_id).where(JobRow.owner == scope)
            found = list(s.scalars(query.distinct().limit(2)))
            if len(found) != 1:
                return [], len(found)
            return list(s.scalars(select(ManagedJobRow.job_id).where(ManagedJobRow.pipeline_id == found[0])
                                  .order_by(ManagedJobRow.pipeline_stage))), 1

    def set_managed(self, job_id: str, state: str | None = None, reason: str | None = None,
                    **fields: object) -> None:
        """Change a managed job; a change of state is recorded as an event with its reason."""
        self.set_managed_many([(job_id, state, reason, fields)])

    def set_managed_many(self, changes: list[tuple[str, str | None, str | None, dict[str, object]]]) -> None:
        """Several `set_managed` (job id, state, reason, other fields), applied in order, in one transaction."""
        if not changes:
            return
        now = time.time()
        with self.session() as s, s.begin():
            current = self._managed_states(s, list(dict.fromkeys(job_id for job_id, *_ in changes)))
            rows: dict[str, dict[str, object]] = {}
            events: list[dict[str, object]] = []
            for job_id, state, reason, fields in changes:
                if job_id not in current:
                    raise JobNotFoundError(f"no managed job {job_id}")
                row = rows.setdefault(job_id, {"job_id": job_id})
                had_state, had_reason = current[job_id]
                if state is not None and (state, reason) != (had_state, had_reason):
                    row.update(state=state, reason=reason)
                    current[job_id] = (state, reason)
                    events.append({"job_id": job_id, "at": now, "state": state, "reason": reason})
                elif reason is not None and state is None:  # a note that keeps the state
                    events.append({"job_id": job_id, "at": now, "state": had_state, "reason": reason})
                row.update(fields, updated_at=now)
            _update_in_batches(s, ManagedJobRow, list(rows.values()))
            _execute_in_batches(s, insert(JobEventRow), events)

    @staticmethod
    def _managed_states(s: Session, job_ids: list[str]) -> dict[str, tuple[str, str | None]]:
        found: dict[str, tuple[str, str | None]] = {}
        for chunk in _chunks(job_ids, 5000):  # within every database's limit on bound parameters
            query = select(ManagedJobRow.job_id, ManagedJobRow.state, ManagedJobRow.reason).where(
                ManagedJobRow.job_id.in_(chunk))
            found.update((job_id, (state, reason)) for job_id, state, reason in s.execute(query))
        return found

    def note_managed(self, notes: dict[str, str]) -> None:
        """Events that keep each job's state (e.g. "attempt 2 submitted …"), in one transaction."""
        self.set_managed_many([(job_id, None, reason, {}) for job_id, reason in notes.items()])

    def events(self, job_id: str) -> list[JobEventRow]:
        with self.session() as s:
            return list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)))

    def pipeline_members(self, pipeline_id: str) -> list[tuple[str, str | None, bool]]:
        """One pipeline's tasks in the order they run: (job id, name, is a job group's auxiliary task),
        in one query (no task text read)."""
        with self.session() as s:
            return [(job_id, name, auxiliary) for job_id, name, auxiliary in s.execute(
                select(ManagedJobRow.job_id, JobRow.name, ManagedJobRow.termination_delay.is_not(None))
                .join(JobRow, JobRow.id == ManagedJobRow.job_id)
                .where(ManagedJobRow.pipeline_id == pipeline_id).order_by(ManagedJobRow.pipeline_stage))]

    def jobs(self, job_ids: Iterable[str]) -> dict[str, JobRow]:
        """Jobs by id, as plain copies (state/plain.py): a tick reads every job it places or may move.
        A sweep's jobs share one copy of their task's text."""
        wanted = sorted(set(job_ids))
        tasks: dict[str, str] = {}
        found: dict[str, JobRow] = {}
        with self.session() as s:
            for chunk in _chunks(wanted, 5000):
                for job in plain_rows(s, JobRow, columns_of(JobRow).where(JobRow.id.in_(chunk))):
                    job.task_json = tasks.setdefault(job.task_json, job.task_json)
                    found[job.id] = job
        return found

    def owners(self, job_ids: Iterable[str]) -> dict[str, str]:
        """Each job's owner (whose account acts on its attempts), by job id."""
        wanted = sorted(set(job_ids))
        with self.session() as s:
            return {job_id: owner for chunk in _chunks(wanted, 5000)
                    for job_id, owner in s.execute(select(JobRow.id, JobRow.owner).where(JobRow.id.in_(chunk)))}

    def ended_run_dirs(self, ended_before: float, limit: int, clusters: list[str],
                       skip: Iterable[tuple[str, str]] = (), removing: str = RunDirState.ENV_REMOVED
                       ) -> dict[tuple[str, str], list[EndedRun]]:
        """(cluster, owner) -> run directories on `clusters` of which Corral has yet to remove what
        `removing` says (RunDirState: env.sh, or the whole directory), whose every attempt (an array's
        copies share one) is in a terminal state and ended before `ended_before`, each with one of
        its attempts' handles; no live dev allocation's (its execs' attempts share it), none of the
        (cluster, owner) pairs in `skip`. At most `limit`, in one query."""
        terminal = func.sum(case((AttemptRow.state.in_(TERMINAL_STATES), 1), else_=0))
        query = (select(AttemptRow.cluster, JobRow.owner, AttemptRow.run_dir, func.max(AttemptRow.handle))
                 .join(JobRow, JobRow.id == AttemptRow.job_id)
                 .where(_yet_to_remove(removing), AttemptRow.run_dir != "",
                        AttemptRow.cluster.in_(clusters), AttemptRow.run_dir.not_in(select(AllocationRow.run_dir)))
                 .group_by(AttemptRow.cluster, JobRow.owner, AttemptRow.run_dir)
                 .having(terminal == func.count(), func.count(AttemptRow.ended_at) == func.count(),
                         func.max(AttemptRow.ended_at) < ended_before)
                 .limit(limit))
        if skipped := list(skip):
            query = query.where(tuple_(AttemptRow.cluster, JobRow.owner).not_in(skipped))
        out: dict[tuple[str, str], list[EndedRun]] = {}
        with self.session() as s:
            for cluster, owner, run_dir, handle in s.execute(query):
                out.setdefault((cluster, owner), []).append(EndedRun(run_dir, handle))
        return out

    def run_places(self) -> list[tuple[str, str]]:
        """Every (cluster, owner) that an attempt was submitted to or recorded for, in one query."""
        with self.session() as s:
            return [(c, o) for c, o in s.execute(
                select(AttemptRow.cluster, JobRow.owner).distinct().join(JobRow, JobRow.id == AttemptRow.job_id)
                .where(AttemptRow.run_dir != "").order_by(AttemptRow.cluster, JobRow.owner))]

    def ended_groups(self, ended_before: float, limit: int) -> dict[str, set[tuple[str, str]]]:
        """Job group id -> the (cluster, owner) pairs its tasks' attempts ran on, for groups whose host
        folders Corral has yet to remove, every task of which has ended (a terminal managed state),
        and whose attempts all ended before `ended_before`. At most `limit` groups, in two queries."""
        terminal = [state.value for state in MANAGED_TERMINAL_STATES]
        last_end = func.max(AttemptRow.ended_at)
        with self.session() as s:
            groups = list(s.scalars(
                select(ManagedJobRow.pipeline_id).outerjoin(AttemptRow, AttemptRow.job_id == ManagedJobRow.job_id)
                .where(ManagedJobRow.group_files_removed.is_(False))
                .group_by(ManagedJobRow.pipeline_id)
                .having(func.sum(case((ManagedJobRow.state.in_(terminal), 1), else_=0)) == func.count(),
                        func.count(AttemptRow.token) == func.count(AttemptRow.ended_at),
                        or_(last_end.is_(None), last_end < ended_before))
                .limit(limit)))
            places = s.execute(
                select(ManagedJobRow.pipeline_id, AttemptRow.cluster, JobRow.owner).distinct()
                .join(JobRow, JobRow.id == ManagedJobRow.job_id).join(AttemptRow, AttemptRow.job_id == JobRow.id)
                .where(ManagedJobRow.pipeline_id.in_(groups))).all() if groups else []
        out: dict[str, set[tuple[str, str]]] = {group: set() for group in groups}
        for group, cluster, owner in places:
            out[group].add((cluster, owner))
        return out

    def mark_groups_cleaned(self, group_ids: list[str]) -> None:
        """Say that Corral removed these job groups' host folders (ended_groups finds them no more)."""
        with self.session() as s, s.begin():
            for chunk in _chunks(group_ids, 5000):
                s.execute(update(ManagedJobRow).where(ManagedJobRow.pipeline_id.in_(chunk))
                          .values(group_files_removed=True))

    def mark_run_dirs(self, cluster: str, run_dirs: list[str], state: str) -> None:
        """Say what Corral removed of these run directories (models.RunDirState), for all their attempts
        (found through the index on run_dir_state: those it had yet to remove so much of)."""
        with self.session() as s, s.begin():
            for chunk in _chunks(run_dirs, 5000):
                s.execute(update(AttemptRow).where(_yet_to_remove(state), AttemptRow.cluster == cluster,
                                                   AttemptRow.run_dir.in_(chunk)).values(run_dir_state=state))

    def attempts_in_state(self, state: JobState) -> list[AttemptRow]:
        """Every attempt in `state`, through the index on state; plain copies (state/plain.py)."""
        with self.session() as s:
            return plain_rows(s, AttemptRow, columns_of(AttemptRow).where(AttemptRow.state == state.value))

    def attempts_by_token(self, tokens: list[str]) -> list[AttemptRow]:
        with self.session() as s:
            return [a for chunk in _chunks(tokens, 5000)
                    for a in s.scalars(select(AttemptRow).where(AttemptRow.token.in_(chunk)))]

    def jobs_without_attempts(self, since: float) -> list[JobRow]:
        """Plain jobs (not managed, not run in a dev allocation) created since `since` that have no
        attempt at all; through the index on creation time."""
        with self.session() as s:
            has_attempt = select(AttemptRow.job_id).where(AttemptRow.job_id == JobRow.id).exists()
            managed = select(ManagedJobRow.job_id).where(ManagedJobRow.job_id == JobRow.id).exists()
            return list(s.scalars(select(JobRow).where(JobRow.created_at >= since, JobRow.allocation.is_(None),
                                                       ~has_attempt, ~managed)))

    def failed_submissions(self, since: float) -> list[AttemptRow]:
        """Attempts whose submission failed since `since`: Slurm may have some after all (a lost answer)."""
        with self.session() as s:
            return list(s.scalars(select(AttemptRow).where(AttemptRow.state == JobState.SUBMIT_FAILED,
                                                           AttemptRow.ended_at >= since)))

    def clusters_with_infra_failures(self, among: Iterable[str], since: float) -> set[str]:
        """Those of `among` where an attempt ended since `since` as the infrastructure's failure."""
        among = list(among)
        if not among:
            return set()
        with self.session() as s:
            return set(s.scalars(select(AttemptRow.cluster).distinct().where(
                AttemptRow.cluster.in_(among), AttemptRow.state == JobState.FAILED,
                AttemptRow.failure == FailureClass.INFRA.value, AttemptRow.ended_at >= since)))

    def live_managed_tasks(self) -> list[str]:
        """The distinct task JSON of managed jobs not yet ended (a sweep's jobs share theirs)."""
        with self.session() as s:
            return list(s.scalars(select(JobRow.task_json).distinct()
                                  .join(ManagedJobRow, ManagedJobRow.job_id == JobRow.id)
                                  .where(ManagedJobRow.state.not_in(MANAGED_TERMINAL))))

    def attempts_of_live_managed(self) -> dict[str, list[AttemptRow]]:
        """Every attempt of every managed job not yet ended, by job, in attempt order: one query (a
        join, not a list of ids), whatever their number; plain copies (state/plain.py)."""
        with self.session() as s:
            rows = plain_rows(s, AttemptRow, columns_of(AttemptRow)
                              .join(ManagedJobRow, ManagedJobRow.job_id == AttemptRow.job_id)
                              .where(ManagedJobRow.state.not_in(MANAGED_TERMINAL))
                              .order_by(AttemptRow.job_id, AttemptRow.number))
            out: dict[str, list[AttemptRow]] = {}
            for row in rows:
                out.setdefault(row.job_id, []).append(row)
            return out

    def attempts_of(self, job_ids: Iterable[str]) -> dict[str, list[AttemptRow]]:
        with self.session() as s:
            rows = s.scalars(select(AttemptRow).where(AttemptRow.job_id.in_(list(job_ids)))
                             .order_by(AttemptRow.number))
            out: dict[str, list[AttemptRow]] = {}
            for row in rows:
                out.setdefault(row.job_id, []).append(row)
            return out

    def acquire_lease(self, name: str, holder: str, ttl: float, now: float | None = None,
                      note: str | None = None) -> bool:
        """Take or renew the lease, with the holder's `note` (if given); False while another holder's
        lease has not expired."""
        from sqlalchemy import or_, update
        from sqlalchemy.exc import IntegrityError

        now = time.time() if now is None else now
        with self.session() as s, s.begin():
            result = s.execute(update(LeaseRow).where(LeaseRow.name == name,
                                                      or_(LeaseRow.holder == holder, LeaseRow.expires_at < now))
                               .values(holder=holder, expires_at=now + ttl,
                                       **({"note": note} if note is not None else {})))
            if result.rowcount:
                return True
            if s.get(LeaseRow, name) is not None:
                return False
        try:
            with self.session() as s, s.begin():
                s.add(LeaseRow(name=name, holder=holder, expires_at=now + ttl, note=note))
            return True
        except IntegrityError:
            return False

    def release_lease(self, name: str, holder: str) -> None:
        from sqlalchemy import delete

        with self.session() as s, s.begin():
            s.execute(delete(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder))

    def lease(self, name: str) -> LeaseRow | None:
        with self.session() as s:
            return s.get(LeaseRow, name)

    def leases(self, prefix: str = "") -> list[LeaseRow]:
        """Every lease whose name starts with `prefix`, expired or not, by name."""
        with self.session() as s:
            return list(s.scalars(select(LeaseRow).where(LeaseRow.name.startswith(prefix, autoescape=True))
                                  .order_by(LeaseRow.name)))

    def renew_leases(self, holder: str, prefix: str, ttl: float, now: float | None = None) -> int:
        """Extend, in one statement, the holder's leases under `prefix` that have not expired (an expired
        one may be another holder's by now: it is taken again through `acquire_lease`)."""
        now = time.time() if now is None else now
        with self.session() as s, s.begin():
            return s.execute(update(LeaseRow).where(LeaseRow.name.startswith(prefix, autoescape=True),
                                                    LeaseRow.holder == holder, LeaseRow.expires_at >= now)
                             .values(expires_at=now + ttl)).rowcount

    def release_leases(self, holder: str, prefix: str = "") -> None:
        """Give up every lease of the holder under `prefix` (a replica stopping)."""
        with self.session() as s, s.begin():
            s.execute(delete(LeaseRow).where(LeaseRow.name.startswith(prefix, autoescape=True),
                                             LeaseRow.holder == holder))

    def forget_leases(self, prefix: str, expired_before: float) -> None:
        """Remove leases under `prefix` that expired before then (replicas long gone)."""
        with self.session() as s, s.begin():
            s.execute(delete(LeaseRow).where(LeaseRow.name.startswith(prefix, autoescape=True),
                                             LeaseRow.expires_at < expired_before))

    def health(self) -> dict[str, ClusterHealthRow]:
        with self.session() as s:
            return {r.cluster: r for r in s.scalars(select(ClusterHealthRow))}

    def set_health(self, cluster: str, **fields: object) -> None:
        with self.session() as s, s.begin():
            row = s.get(ClusterHealthRow, cluster) or ClusterHealthRow(cluster=cluster, failures=0,
                                                                        unhealthy_until=0.0)
            for key, value in fields.items():
                setattr(row, key, value)
            s.merge(row)

    # ---- dev allocations ----
    def allocations(self, owner: str | None = None) -> list[AllocationRow]:
        """One user's dev allocations (None: everyone's), oldest first."""
        query = select(AllocationRow).order_by(AllocationRow.created_at)
        if owner is not None:
            query = query.where(AllocationRow.owner == owner)
        with self.session() as s:
            return list(s.scalars(query))

    def allocation(self, name: str, owner: str = "") -> AllocationRow | None:
        with self.session() as s:
            return s.get(AllocationRow, (owner, name))

    def put_allocation(self, row: AllocationRow) -> None:
        with self.session() as s, s.begin():
            s.merge(row)

    def set_allocation_held(self, name: str, owner: str, cpus: int | None, memory_mb: int | None) -> None:
        """Record what the infra gave allocation `name` per node (once its holder has said)."""
        with self.session() as s, s.begin():
            row = s.get(AllocationRow, (owner, name), with_for_update=True)
            if row is not None:
                row.held_cpus, row.held_memory_mb = cpus, memory_mb

    def delete_allocation(self, name: str, owner: str = "") -> None:
        with self.session() as s, s.begin():
            row = s.get(AllocationRow, (owner, name))
            if row is not None:
                s.delete(row)

    # ---- users of a team server ----
    def users(self) -> list[UserRow]:
        with self.session() as s:
            return list(s.scalars(select(UserRow).order_by(UserRow.name)))

    def user(self, name: str) -> UserRow | None:
        with self.session() as s:
            return s.get(UserRow, name)

    def user_by_token_hash(self, token_hash: str) -> UserRow | None:
        with self.session() as s:
            return s.scalars(select(UserRow).where(UserRow.token_hash == token_hash)).first()

    def add_user(self, row: UserRow) -> bool:
        """Add a user; False if the name is taken (nothing is changed then)."""
        from sqlalchemy.exc import IntegrityError

        try:
            with self.session() as s, s.begin():
                s.add(row)
        except IntegrityError:
            return False
        return True

    def add_gpu_samples(self, rows: list[dict[str, Any]], keep_after: float) -> None:
        """Record one sample (a row per cluster, partition and GPU type) and drop those older than
        `keep_after`, in one transaction."""
        with self.session() as s, s.begin():
            if rows:
                s.execute(insert(GpuSampleRow), rows)
            s.execute(delete(GpuSampleRow).where(GpuSampleRow.at < keep_after))

    def gpu_samples(self, since: float) -> list[GpuSampleRow]:
        with self.session() as s:
            return list(s.scalars(select(GpuSampleRow).where(GpuSampleRow.at >= since)
                                  .order_by(GpuSampleRow.at, GpuSampleRow.id)))

    def add_web_session(self, id_hash: str, kind: str, owner: str, expires_at: float) -> None:
        """Record a dashboard login code or session (by hash); expired ones are dropped on the way."""
        with self.session() as s, s.begin():
            s.execute(delete(WebSessionRow).where(WebSessionRow.expires_at < time.time()))
            s.add(WebSessionRow(id_hash=id_hash, kind=kind, owner=owner, expires_at=expires_at))

    def take_web_code(self, id_hash: str) -> str | None:
        """Use a one-time login code: its owner, and the code is gone (a second use finds nothing)."""
        with self.session() as s, s.begin():
            row = s.get(WebSessionRow, id_hash)
            if row is None or row.kind != "code":
                return None
            gone = s.execute(delete(WebSessionRow).where(WebSessionRow.id_hash == id_hash)).rowcount
            return row.owner if gone == 1 and row.expires_at > time.time() else None

    def web_session(self, id_hash: str) -> str | None:
        """The owner of a live browser session, or None."""
        with self.session() as s:
            row = s.get(WebSessionRow, id_hash)
        if row is None or row.kind != "session" or row.expires_at <= time.time():
            return None
        return row.owner

    def set_user_key(self, name: str, public: str, sealed: str) -> None:
        """Give a user the key the server reaches their cluster accounts with (once: a key already
        there is kept, so two replicas making one at the same time agree on the first)."""
        with self.session() as s, s.begin():
            s.execute(update(UserRow).where(UserRow.name == name, UserRow.ssh_public_key.is_(None))
                      .values(ssh_public_key=public, ssh_key_sealed=sealed))

    def set_unix_users(self, name: str, unix_users: dict[str, str]) -> bool:
        """Replace a user's {cluster: Unix account} mapping; False if there is no such user."""
        with self.session() as s, s.begin():
            row = s.get(UserRow, name)
            if row is None:
                return False
            row.unix_users = json.dumps(unix_users)
            return True

    def remove_user(self, name: str) -> bool:
        with self.session() as s, s.begin():
            row = s.get(UserRow, name)
            if row is None:
                return False
            s.delete(row)
            return True

    def matching_ids(self, job_ref: str, managed_only: bool = False, scope: str | None = None) -> list[str]:
        """Job ids a reference may mean: the id itself, else ids it prefixes, else jobs of that name, else
        jobs the infra knows by that handle (a Slurm job id; at most 6; indexed look-ups, not a scan of the
        history); with `scope`, only that owner's."""
        def query(*conditions: Any) -> Any:
            q = select(JobRow.id).where(*conditions)
            if scope is not None:
                q = q.where(JobRow.owner == scope)
            if managed_only:
                q = q.join(ManagedJobRow, ManagedJobRow.job_id == JobRow.id)
            return q.limit(6)

        with self.session() as s:
            found = list(s.scalars(query(JobRow.id == job_ref)))
            if not found and job_ref:
                escaped = job_ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                found = list(s.scalars(query(JobRow.id.like(escaped + "%", escape="\\"))))
            if not found:
                found = list(s.scalars(query(JobRow.name == job_ref)))
            if not found and job_ref:  # the id Slurm gave it (4711, 4711_3), as `corral queue` shows it
                found = list(s.scalars(query(JobRow.id.in_(select(AttemptRow.job_id).where(
                    AttemptRow.handle == job_ref))).order_by(JobRow.created_at.desc())))
        return found

    def sweep_sizes(self, sweep_ids: set[str]) -> dict[str, int]:
        """How many jobs each sweep has (one query)."""
        if not sweep_ids:
            return {}
        with self.session() as s:
            rows = s.execute(select(JobRow.sweep_id, func.count()).where(JobRow.sweep_id.in_(list(sweep_ids)))
                             .group_by(JobRow.sweep_id))
            return {sweep_id: count for sweep_id, count in rows}

    def sweep_named(self, name: str, managed_only: bool = False, scope: str | None = None) -> list[str]:
        """Every job id of the one sweep called `name` when all the jobs of that name are in it (then the
        name means the sweep, as `corral cancel NAME` uses it), else none."""
        def scoped(query: Any) -> Any:
            query = query.where(JobRow.owner == scope) if scope is not None else query
            return query.join(ManagedJobRow, ManagedJobRow.job_id == JobRow.id) if managed_only else query

        with self.session() as s:
            sweeps = list(s.scalars(scoped(select(JobRow.sweep_id).where(JobRow.name == name)).distinct().limit(2)))
            if len(sweeps) != 1 or sweeps[0] is None:
                return []
            return sorted(s.scalars(scoped(select(JobRow.id).where(JobRow.sweep_id == sweeps[0]))))

    def managed_page(self, limit: int | None, offset: int = 0, scope: str | None = None,
                     since: float | None = None) -> tuple[list[str], int]:
        """Live managed jobs, then the `limit` newest ended ones (launched since `since`, if given) after
        `offset`; and how many more."""
        with self.session() as s:
            live_query = select(ManagedJobRow.job_id).where(ManagedJobRow.state.not_in(MANAGED_TERMINAL))
            ended = (select(ManagedJobRow.job_id).join(JobRow, JobRow.id == ManagedJobRow.job_id)
                     .where(ManagedJobRow.state.in_(MANAGED_TERMINAL)))
            if since is not None:
                ended = ended.where(JobRow.created_at >= since)
            if scope is not None:
                live_query = live_query.join(JobRow, JobRow.id == ManagedJobRow.job_id).where(JobRow.owner == scope)
                ended = ended.where(JobRow.owner == scope)
            live = list(s.scalars(live_query))
            total = s.scalar(select(func.count()).select_from(ended.subquery())) or 0
            ordered = ended.order_by(JobRow.created_at.desc(), JobRow.job_rank.desc()).offset(offset)
            page = list(s.scalars(ordered.limit(limit) if limit is not None else ordered))
        return live + page, max(0, total - offset - len(page))

    def resolve_all(self, job_ref: str, scope: str | None = None) -> list[JobView]:
        """The job `job_ref` names (resolve), or every job of the sweep it names (its name, when only
        that sweep's jobs carry it: sweep_named), or of the Slurm array it names (its id, as scancel's)."""
        try:
            return [self.resolve(job_ref, scope)]
        except JobNotFoundError as missing:
            tasks = missing.job_ids if isinstance(missing, ArrayNotOneJobError) else []  # resolve looked them up
            if ids := self.sweep_named(job_ref, scope=scope) or tasks:
                return self.views(ids)
            raise

    def resolve_or_newest_in(self, job_ref: str, scope: str | None = None) -> JobView:
        """The job `job_ref` names (resolve), or else the newest job of the dev allocation of that name,
        as `sky logs CLUSTER` shows a cluster's latest job (`corral logs dev`)."""
        try:
            return self.resolve(job_ref, scope)
        except JobNotFoundError:
            query = select(JobRow.id).where(JobRow.allocation == job_ref)
            query = query.where(JobRow.owner == scope) if scope is not None else query
            with self.session() as s:
                newest = s.scalar(query.order_by(JobRow.created_at.desc(), JobRow.job_rank.desc()).limit(1))
            views = self.views([newest]) if newest is not None else []
            if not views:
                raise
            return views[0]

    def allocation_job_ids(self, name: str, owner: str, since: float) -> list[str]:
        """The ids of the jobs run in `owner`'s dev allocation `name` since `since` (when it was made:
        an older allocation of that name had its own), oldest first. The n-th is the allocation's job n,
        as SkyPilot numbers a cluster's jobs 1, 2, … (`sky logs CLUSTER 2`)."""
        query = (select(JobRow.id).where(JobRow.allocation == name, JobRow.owner == owner, JobRow.created_at >= since)
                 .order_by(JobRow.created_at, JobRow.job_rank, JobRow.id))
        with self.session() as s:
            return list(s.scalars(query))

    def _array_tasks(self, handle: str, scope: str | None) -> list[str]:
        """The jobs whose handles are the tasks of the array `handle` names (`4711` for `4711_0`…, as
        `scancel 4711` means the whole array), when they are on one cluster; else none."""
        if not handle or not handle.isdigit():
            return []
        # an array task's handle is `<array>_<index>` (RunsArrays.array_handle, Slurm's form, the only
        # infra with arrays). LIKE, not a range of the index: PostgreSQL's usual collations do not sort
        # `_` bytewise. It reads the handle index whole, on this fallback path only (a digits-only ref).
        query = (select(AttemptRow.job_id, AttemptRow.cluster).join(JobRow, JobRow.id == AttemptRow.job_id)
                 .where(AttemptRow.handle.like(handle + "\\_%", escape="\\")))
        if scope is not None:
            query = query.where(JobRow.owner == scope)
        with self.session() as s:
            found = s.execute(query).all()
        if len({cluster for _, cluster in found}) > 1:
            on = ", ".join(sorted({cluster for _, cluster in found}))
            raise JobNotFoundError(f"array {handle} is on several clusters ({on}): give its sweep's name or "
                                   "Corral's job ids (`corral queue -x` lists them)")
        return sorted({job_id for job_id, _ in found})

    def clusters_of_native_job(self, native_id: str, scope: str | None = None) -> list[str]:
        """The clusters where Corral submitted the native job `native_id` (a Slurm job id, or an array's
        id: its tasks' handles are `<id>_<index>`), with `scope` among that owner's jobs only."""
        def clusters(condition: Any) -> list[str]:
            query = select(AttemptRow.cluster).join(JobRow, JobRow.id == AttemptRow.job_id).where(condition)
            query = query.where(JobRow.owner == scope) if scope is not None else query
            with self.session() as s:
                return sorted(set(s.scalars(query.distinct())))

        if not native_id.isdigit():
            return []
        return clusters(AttemptRow.handle == native_id) or clusters(
            AttemptRow.handle.like(native_id + "\\_%", escape="\\"))  # an array: LIKE, as in _array_tasks

    def resolve(self, job_ref: str, scope: str | None = None) -> JobView:
        """A job by id or unique id prefix, or by name if unique (indexed look-ups, not a scan of history);
        with `scope`, among that owner's jobs only: another user's job is not found, as if it did not exist."""
        views = self.views(self.matching_ids(job_ref, scope=scope))
        exact = [v for v in views if v.job.id == job_ref]
        if exact:
            return exact[0]
        prefixed = views
        if len(prefixed) == 1:
            return prefixed[0]
        if not prefixed:
            tasks = self._array_tasks(job_ref, scope)
            if tasks:  # where one job is wanted (logs): say which ones there are
                raise ArrayNotOneJobError(f"Slurm job {job_ref} is an array of {len(tasks)} tasks: give one of them "
                                          f"({job_ref}_… or Corral's id; `corral queue -x` lists them); `corral "
                                          f"cancel {job_ref}` takes them all", tasks)
            raise JobNotFoundError(f"no job {job_ref!r}; see `corral queue` for job ids")
        ids = ", ".join(v.job.id for v in prefixed[:5])
        if not any(v.job.id.startswith(job_ref) or v.job.name == job_ref for v in prefixed):  # by handle
            on = ", ".join(f"{v.job.id} on {v.attempt.cluster}" for v in prefixed[:5])
            raise JobNotFoundError(f"Slurm job {job_ref} is several jobs of Corral's ({on}): give Corral's id")
        if len({v.job.sweep_id for v in prefixed}) == 1 and prefixed[0].job.sweep_id is not None:
            raise JobNotFoundError(f"{job_ref!r} is a sweep ({ids}…): give one job's id (`corral queue -x` lists "
                                   "them); `corral cancel` takes the sweep's name for all of them")
        raise JobNotFoundError(f"{job_ref!r} matches several jobs ({ids}…); give more of the id")


def _sqlite_path(url: str) -> Path | None:
    """The database file of a file-backed SQLite URL (None for other databases and :memory:)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _private_sqlite_files(path: Path) -> None:
    """The database and its -wal/-shm files are the user's alone: SQLite gives the journal files the
    database file's mode, so creating that one 600 first is enough; older stores are tightened."""
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal"):
        extra = path.with_name(path.name + suffix)
        if extra.exists() and extra.stat().st_mode & 0o077:
            extra.chmod(0o600)


@contextmanager
def _schema_lock(engine: Engine, sqlite_path: Path | None) -> Iterator[None]:
    """One process at a time creates or upgrades the schema: two commands opening a new store at the
    same moment would otherwise both try CREATE TABLE, and one would fail."""
    if sqlite_path is not None:
        from corral.locks import held

        with held(sqlite_path.with_name(sqlite_path.name + ".lock")):
            yield
    elif engine.dialect.name == "postgresql":
        from sqlalchemy import text

        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(7316520841)"))  # any constant: Corral's schema lock
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(7316520841)"))
                conn.commit()
    else:
        yield


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


T = TypeVar("T")
WRITE_BATCH = 1000  # rows per executemany: a tick's write of 10,000 changes builds 1,000 rows' parameters at a time


def _execute_in_batches(s: Session, statement: Any, rows: list[dict[str, object]]) -> None:
    """One bulk INSERT or UPDATE by primary key, sent WRITE_BATCH rows at a time in the caller's
    transaction: the server's heap peaks at a batch's worth, not at the whole write's."""
    for batch in _chunks(rows, WRITE_BATCH):
        s.execute(statement, batch)


def _update_in_batches(s: Session, model: type, rows: list[dict[str, object]]) -> None:
    """Bulk UPDATE by primary key through Core, one executemany per set of changed columns, WRITE_BATCH
    rows at a time in the caller's transaction. The ORM's bulk UPDATE does the same, but inspects every
    row first (a tick writing 10,000 jobs' first states spent a tenth of its CPU there)."""
    table = model.__table__  # type: ignore[attr-defined]
    [key] = table.primary_key.columns
    by_columns: dict[tuple[str, ...], list[dict[str, object]]] = {}
    for row in rows:
        values = {name: value for name, value in row.items() if name != key.key}
        by_columns.setdefault(tuple(sorted(values)), []).append({"_key": row[key.key], **values})
    for columns, group in by_columns.items():
        if not columns:
            continue
        # No .values(): Core sets the columns the parameters name (the same in every row of a group).
        statement = table.update().where(key == bindparam("_key"))
        for batch in _chunks(group, WRITE_BATCH):
            s.execute(statement, batch)


def _yet_to_remove(removing: str) -> Any:
    """Attempts whose run directory Corral has yet to remove `removing` of (each RunDirState removes
    more than the one before it): NULL, or an earlier state."""
    order = list(RunDirState)
    earlier = [state.value for state in order[:order.index(RunDirState(removing))]]
    return or_(AttemptRow.run_dir_state.is_(None), AttemptRow.run_dir_state.in_(earlier))


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
