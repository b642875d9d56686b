"""The load Corral puts on each cluster's Slurm controller: a budget of Slurm commands per minute per
login node, and a back-off when the controller says it is busy. One state per cluster in this process
(the server), whatever the number of clients or requests; pure apart from the clock it is given.

- Each round trip to a login node spends the Slurm commands it runs (a probe: its `scontrol ping` and
  its queries; a status refresh: squeue and sacct, and the light squeue where the site has it; a
  submission, a cancel: one). A refresh is charged for all of them before it goes, and given back
  those its script did not run (the light query found nothing changed). The budget
  (`rpc_budget: {commands_per_minute: N}` in config.yaml, per cluster under `clusters:`; 600 by
  default) holds in every 60 s window: never more than N commands in any minute. Within it, a token
  bucket of a quarter of N, refilled at N/60 a second, spreads them: a burst of N/4 passes at once,
  and the rest follow at the budget's rate instead of the whole minute's going in the first second.
- A round trip whose answer says the controller is overloaded (`BUSY_MARKERS`: "Socket timed out",
  "Resource temporarily unavailable", …) starts a back-off: no round trip to that cluster for 2 s,
  doubling with each busy answer in a row up to 60 s; the first answer without them ends it.
- A caller waits for its slot, up to its own timeout; past that it gets ClusterBusyError, saying
  when the next slot comes. A status poll does not wait out a back-off: it gets ClusterBusyError at
  once, keeps the statuses it had, and the next tick asks again (a tick that waited would hold up
  every other cluster's news for as long). `report()` is what `corral server status` and the dashboard show.
- Several server replicas on one store split each cluster's budget evenly (`share_between`, set by
  the controller each tick from the live replicas): together they stay within it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_PER_MINUTE = 600
BACKOFF_FIRST = 2.0
BACKOFF_MAX = 60.0
BUSY_MARKERS = ("Socket timed out on send/recv operation", "Resource temporarily unavailable",
                "temporarily unable to accept job", "Slurm controller not responding",
                "Unable to contact slurm controller")


@dataclass
class Budget:
    """One cluster's budget: at most `per_minute` Slurm commands in any minute, spread by a token bucket
    of a quarter of that; and its back-off."""

    configured: int  # the cluster's whole budget, commands per minute
    clock: Callable[[], float] = time.monotonic
    replicas: int = 1  # live replicas sharing it: this one may spend per_minute of it
    tokens: float = field(init=False)
    updated: float = field(init=False)
    spent: deque[tuple[float, int]] = field(default_factory=deque)  # (when, commands) in the last minute
    waiting: int = 0
    backoff: float = 0.0
    busy_until: float = 0.0
    busy_reason: str | None = None

    def __post_init__(self) -> None:
        self.tokens = self.burst
        self.updated = self.clock()

    @property
    def per_minute(self) -> int:
        """This replica's part of the budget."""
        return max(1, self.configured // max(1, self.replicas))

    @property
    def burst(self) -> float:
        """What may go at once: a quarter of the minute's budget (at least one command)."""
        return max(1.0, self.per_minute / 4)

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.per_minute / 60.0)
        self.updated = now
        while self.spent and self.spent[0][0] <= now - 60.0:
            self.spent.popleft()

    def wait_seconds(self, cost: int) -> float:
        """How long until `cost` commands may go (0: now): the bucket's refill, the minute's window (a
        round trip dearer than the burst, or than the whole budget, waits for a full bucket or an empty
        window only), and the back-off."""
        now = self.clock()
        self._refill(now)
        short = max(0.0, min(cost, self.burst) - self.tokens) * 60.0 / self.per_minute
        excess = sum(c for _, c in self.spent) + min(cost, self.per_minute) - self.per_minute
        window = 0.0
        for when, spent in self.spent:  # oldest first: until enough of the minute's commands have aged out
            if excess <= 0:
                break
            excess -= spent
            window = when + 60.0 - now
        return max(short, window, self.busy_until - now, 0.0)

    def spend(self, cost: int) -> None:
        now = self.clock()
        self._refill(now)
        self.tokens -= min(cost, self.burst)
        self.spent.append((now, cost))

    def give_back(self, commands: int) -> None:
        """Commands a round trip was charged for but did not run (its script found nothing to do)."""
        now = self.clock()
        self._refill(now)
        left = commands
        for i in range(len(self.spent) - 1, -1, -1):  # newest first: the round trip that just answered
            when, spent = self.spent[i]
            taken = min(spent, left)
            self.spent[i] = (when, spent - taken)
            left -= taken
            if not left:
                break
        self.tokens = min(self.burst, self.tokens + commands - left)

    def answered(self, text: str) -> None:
        """What a round trip printed: a busy controller backs off, any other answer ends the back-off."""
        marker = next((m for m in BUSY_MARKERS if m in text), None)
        if marker is None:
            self.backoff, self.busy_reason = 0.0, None
            return
        self.backoff = min(BACKOFF_MAX, max(BACKOFF_FIRST, self.backoff * 2))
        self.busy_until = self.clock() + self.backoff
        self.busy_reason = marker

    def backing_off(self) -> bool:
        return self.busy_until > self.clock()

    def why_short(self, wait: float) -> str:
        """Why a round trip cannot go for `wait` seconds, as ClusterBusyError and a refresh tell it."""
        now = self.clock()
        if self.busy_until > now and self.busy_reason:
            return (f"its Slurm controller is busy ({self.busy_reason}); Corral backs off for "
                    f"{round(self.busy_until - now, 1)} s")
        return (f"Corral's budget of {self.per_minute} Slurm commands a minute there is spent (rpc_budget in "
                f"config.yaml); the next slot comes in {next_slot_text(wait)}")

    def report(self) -> dict[str, object]:
        now = self.clock()
        self._refill(now)
        return {"commands_per_minute": self.per_minute, "configured_per_minute": self.configured,
                "replicas": self.replicas, "used_last_minute": sum(c for _, c in self.spent),
                "waiting": self.waiting, "backoff_seconds": round(max(0.0, self.busy_until - now), 1),
                "busy_reason": self.busy_reason if self.busy_until > now else None}


_BUDGETS: dict[str, Budget] = {}
_REPLICAS = 1


def budget_for(cluster: str, per_minute: int | None = None) -> Budget:
    """This process's budget for the cluster (created with `per_minute`, or the config's)."""
    found = _BUDGETS.get(cluster)
    if found is None:
        found = _BUDGETS[cluster] = Budget(per_minute or configured_per_minute(cluster), replicas=_REPLICAS)
    return found


def share_between(replicas: int) -> None:
    """Every cluster's budget, in this process, is now one of `replicas` equal parts."""
    global _REPLICAS
    _REPLICAS = max(1, replicas)
    for found in _BUDGETS.values():
        if found.replicas != _REPLICAS:
            found.tokens = min(found.tokens, max(1.0, found.configured // _REPLICAS / 4))
            found.replicas = _REPLICAS


def configured_per_minute(cluster: str) -> int:
    from corral.config import load_user_settings

    settings = load_user_settings()
    per_cluster = ((settings.get("clusters") or {}).get(cluster) or {}) if isinstance(settings.get("clusters"),
                                                                                     dict) else {}
    for source in (per_cluster, settings):
        value = (source.get("rpc_budget") or {}).get("commands_per_minute") if isinstance(source, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_PER_MINUTE


def give_back(cluster: str, commands: int) -> None:
    budget_for(cluster).give_back(commands)


def affords_now(cluster: str, commands: int) -> bool:
    """Can `commands` Slurm commands go to the cluster at once (no wait for the budget or a back-off)?"""
    return budget_for(cluster).wait_seconds(commands) == 0


def report_of(cluster: str) -> dict[str, object] | None:
    """The cluster's budget as this process has used it, or None before its first round trip."""
    found = _BUDGETS.get(cluster)
    return found.report() if found is not None else None


def report() -> dict[str, dict[str, object]]:
    """Every cluster's budget as this process has used it."""
    return {cluster: budget.report() for cluster, budget in sorted(_BUDGETS.items())}


def next_slot_text(seconds: float) -> str:
    return f"{math.ceil(seconds)} s"
