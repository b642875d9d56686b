"""GPU use over time (usage.py): samples kept for the retention period, drawn as bounded series."""

from __future__ import annotations

from corral.state import open_store
from corral.usage import series


def sample(at: float, used: int, total: int = 8) -> dict[str, object]:
    return {"at": at, "cluster": "alpine", "partition": "gpu", "gpu": "H100", "free": total - used,
            "total": total, "pending": 0}


def test_samples_older_than_the_retention_are_dropped_and_series_are_bounded(corral_home):
    store = open_store()
    now = 1_000_000.0
    store.add_gpu_samples([sample(now - 20 * 86400, 1)], keep_after=0)  # 20 days old
    minute = [sample(now - 86400 + 60 * i, used=i % 5) for i in range(1440)]  # a day, one a minute
    minute[700] = sample(minute[700]["at"], used=8)  # a short peak
    store.add_gpu_samples(minute, keep_after=now - 14 * 86400)
    kept = store.gpu_samples(since=0)
    assert len(kept) == 1440 and min(r.at for r in kept) >= now - 86400  # the old one is gone
    [drawn] = series(kept, now - 86400, now, points=240)
    assert (drawn["cluster"], drawn["partition"], drawn["gpu"]) == ("alpine", "gpu", "H100")
    assert len(drawn["points"]) <= 241  # bounded, whatever the sampling rate
    assert max(p[1] for p in drawn["points"]) == 8  # the busiest sample of its stretch: the peak shows
    assert all(p[2] == 8 for p in drawn["points"])
