"""The per-folder workdir caches on a login node (infra/caches.py): a sync marks its cache's use
and holds its lock while it writes; the prune removes only caches whose marker is old and whose lock
is free. On the real testbed over real SSH (the clusters share one home, so one cache folder)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from corral.client import Client
from corral.infra import caches
from tests.conftest import wait_for


def remote(script: str) -> str:
    return asyncio.run(Client().transport.run("alpine", script, timeout=30, check=False)).stdout


def new_key() -> str:
    return secrets.token_hex(8)


def synced(tmp_path, key: str, content: str = "v1") -> None:
    folder = tmp_path / key
    folder.mkdir(exist_ok=True)
    (folder / "train.py").write_text(content)
    asyncio.run(Client().infra("alpine").upload_workdir(folder, key, f".corral/test-caches/{key}/workdir"))


def test_keys_are_checked_before_they_name_a_path():
    assert caches.marker_path("0123456789abcdef") == ".corral/cache/0123456789abcdef.used"
    for bad in ("../../etc", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef/x"):
        with pytest.raises(ValueError, match="not a workdir cache's key"):
            caches.cache_path(bad)
    assert caches.read_pruned("some login banner\npruned 3\n") == 3
    assert caches.read_pruned("") == 0


@pytest.mark.parametrize("remote_rsync", ["rsync", "/nonexistent/rsync"])
def test_a_sync_touches_its_caches_marker(corral_env, testbed, tmp_path, monkeypatch, remote_rsync):
    """By rsync, or by the tar stream where the cluster has no rsync: the marker is there, fresh, and
    the attempt's copy has the file."""
    monkeypatch.setenv("CORRAL_REMOTE_RSYNC", remote_rsync)
    key = new_key()
    synced(tmp_path, key)
    marker = caches.marker_path(key)
    assert remote(f'find "$HOME"/{marker} -mmin -5; cat "$HOME"/.corral/test-caches/{key}/workdir/train.py'
                  ).split() == [f"/home/corral-test/{marker}", "v1"]
    remote(f'rm -rf "$HOME"/.corral/test-caches/{key} "$HOME"/{caches.cache_path(key)} "$HOME"/{marker}')


@pytest.fixture
def four_keys(corral_env, testbed):
    """Keys for the test's caches; whatever it leaves (a failed run included) is removed after it, so
    that no old marker of its own is left for the next run's prune to count."""
    keys = [new_key() for _ in range(4)]
    yield keys
    remote(f'pkill -f "hold-({"|".join(keys)})"; cd "$HOME"/.corral/cache && rm -rf '
           + " ".join(f"{k} {k}.used" for k in keys) + ' "$HOME"/.corral/test-caches')


def test_the_prune_removes_only_caches_unused_for_keep_days_and_not_in_use(four_keys, tmp_path):
    """Four caches: used now, last used 3 days ago, last used 3 days ago but a sync holds its lock,
    and one from before markers. With keep_days 1, one round trip removes the old free one alone; the
    legacy one gets a marker (its days start now); once the lock is free, the next prune takes the
    busy one."""
    fresh, old, busy, legacy = four_keys
    for key in (fresh, old, busy):
        synced(tmp_path, key)
    remote(f'cd "$HOME"/.corral/cache && touch -d "3 days ago" {old}.used {busy}.used && mkdir -p {legacy} '
           f'&& echo x > {legacy}/f')
    # A sync's hold on the busy one, as held_by takes it (a shared lock for as long as it writes).
    remote(f'cd "$HOME"/.corral/cache && (exec 9<{busy}.used && flock -s 9 && '
           f'exec -a hold-{busy} sleep 120 >/dev/null 2>&1 < /dev/null &)')
    wait_for("the lock to be held", lambda: remote(
        f'cd "$HOME"/.corral/cache && flock -n -x {busy}.used true || echo held').strip() == "held", timeout=20)
    client = Client()
    infra = client.infra("alpine")
    trips = client.transport.round_trips["alpine"]
    assert asyncio.run(infra.prune_workdir_caches(1)) == 1
    assert client.transport.round_trips["alpine"] - trips == 1
    left = remote(f'cd "$HOME"/.corral/cache && for k in {fresh} {old} {busy} {legacy}; do '
                  '[ -d $k ] && echo dir; [ -e $k.used ] && echo marker; echo ,; done; ls -a | grep -c "^\\.gone" || true')
    assert [part.split() for part in left.split(",")[:4]] == [["dir", "marker"], [], ["dir", "marker"], ["dir", "marker"]]
    assert left.split(",")[4].split() == ["0"]  # the renamed folder went in the same round trip
    remote(f'pkill -f hold-{busy}')
    wait_for("the lock to be free", lambda: remote(
        f'cd "$HOME"/.corral/cache && flock -n -x {busy}.used true && echo free').strip() == "free", timeout=20)
    assert asyncio.run(infra.prune_workdir_caches(1)) == 1
    assert remote(f'cd "$HOME"/.corral/cache && ls -d {busy} {busy}.used 2>/dev/null | wc -l').strip() == "0"
    assert asyncio.run(infra.prune_workdir_caches(1)) == 0  # the others are fresh: nothing more
