"""The controller's HTTP API, on loopback only: health and tick figures, wake-up, managed jobs.

Every request carries the bearer token that the controller writes, readable only by its user, into
`controller.json` under CORRAL_HOME next to the port; so other users of the machine cannot drive it.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query

from corral import managed
from corral.controller.engine import LEASE
from corral.state import Store
from corral.state.store import JobNotFoundError


@dataclass
class TickFigures:
    at: float
    seconds: float
    drove: bool
    jobs: int
    submitted: int
    moved: int
    cancelled: int
    round_trips: dict[str, int]
    errors: dict[str, str]


@dataclass
class ControllerStatus:
    """What the loop shares with the API. Both run on one event loop (the endpoints are `async def`,
    so Starlette does not move them to threads): no locking needed, and `wake` is an asyncio.Event."""

    pid: int
    holder: str
    started_at: float
    interval: float
    ticks: int = 0
    last_tick: TickFigures | None = None
    wake: Any = field(default=None, repr=False)  # an asyncio.Event, set by POST /wake


def create_app(status: ControllerStatus, store: Store, token: str) -> FastAPI:
    app = FastAPI(title="Corral controller", docs_url=None, redoc_url=None, openapi_url=None)

    async def authorized(authorization: str = Header(default="")) -> None:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong token (see controller.json)")

    @app.get("/health", dependencies=[Depends(authorized)])
    async def health() -> dict[str, object]:
        lease = store.lease(LEASE)
        return {"pid": status.pid, "holder": status.holder, "started_at": status.started_at,
                "uptime_seconds": round(time.time() - status.started_at, 3), "interval": status.interval,
                "ticks": status.ticks, "last_tick": asdict(status.last_tick) if status.last_tick else None,
                "lease": {"holder": lease.holder, "expires_at": lease.expires_at} if lease else None}

    @app.post("/wake", dependencies=[Depends(authorized)])
    async def wake() -> dict[str, object]:
        status.wake.set()
        return {"woken": True, "ticks": status.ticks}

    @app.get("/jobs", dependencies=[Depends(authorized)])
    async def jobs(all: bool = False, limit: int = Query(20, ge=1, le=100_000),
                   page: int = Query(1, ge=1, le=1_000_000)) -> dict[str, object]:
        """Live managed jobs and the newest ended ones (`limit` a page; `all`: every one), newest first."""
        shown, more = managed.page(store, None if all else limit, 0 if all else (page - 1) * limit)
        return {"jobs": [v.to_json() for v in shown], "more": more}

    @app.get("/jobs/{job_id}", dependencies=[Depends(authorized)])
    async def job(job_id: str) -> dict[str, object]:
        try:
            view = managed.resolve(store, job_id)
        except JobNotFoundError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from exc
        events = [{"at": e.at, "state": e.state, "reason": e.reason} for e in store.events(view.job.id)]
        return {**view.to_json(), "events": events}

    return app
