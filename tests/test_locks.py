"""Store locks: one holder at a time across processes and replicas on one store; a dead holder's lock
lapses."""

from __future__ import annotations

import asyncio

import pytest

from corral import locks
from corral.state import Store


def test_holders_of_one_store_lock_take_turns_across_store_connections(tmp_path):
    """Two servers on one store (two Store objects on one database): the second waits for the first,
    a lock of another name does not wait, and the lock is given up when the block ends."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    one, two = Store(url), Store(url)
    order: list[str] = []

    async def hold(store: Store, name: str, label: str, inside: asyncio.Event, leave: asyncio.Event) -> None:
        async with locks.in_store(store, "dev", name):
            order.append(f"{label} in")
            inside.set()
            await leave.wait()
            order.append(f"{label} out")

    async def scenario() -> None:
        first_in, first_leave, second_in, second_leave = (asyncio.Event() for _ in range(4))
        first = asyncio.create_task(hold(one, "ada/box", "first", first_in, first_leave))
        await first_in.wait()
        second = asyncio.create_task(hold(two, "ada/box", "second", second_in, second_leave))
        other_in, other_leave = asyncio.Event(), asyncio.Event()
        other_leave.set()
        await asyncio.wait_for(hold(two, "bob/box", "other", other_in, other_leave), 5)  # another name: no wait
        assert not second_in.is_set()  # still held by the first
        first_leave.set()
        await asyncio.wait_for(second_in.wait(), 5)
        second_leave.set()
        await asyncio.gather(first, second)
        assert order == ["first in", "other in", "other out", "first out", "second in", "second out"]
        assert not [lease for lease in one.leases() if lease.name.startswith(locks.STORE_LOCK)]  # all given up

    asyncio.run(scenario())


def test_a_dead_holders_store_lock_is_taken_once_it_lapses_and_a_live_ones_is_renewed(tmp_path, monkeypatch):
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    store.acquire_lease(f"{locks.STORE_LOCK}dev:ada/box", "a dead server", ttl=0.2)
    monkeypatch.setattr(locks, "STORE_LOCK_POLL", 0.01)

    async def scenario() -> None:
        async with locks.in_store(store, "dev", "ada/box", ttl=0.3):  # waits ~0.2 s for the dead one's to lapse
            [lease] = [lease for lease in store.leases() if lease.name == f"{locks.STORE_LOCK}dev:ada/box"]
            assert lease.holder != "a dead server"
            # Held past its own ttl, it is renewed: another holder still waits.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(locks.in_store(store, "dev", "ada/box").__aenter__(), 0.6)

    asyncio.run(scenario())
