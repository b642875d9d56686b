"""The watches' cache on its own, with list and watch answers as the API gives them: events applied in
order, a watch that ends opened again from the last version, a 410 answered by a new list."""

from __future__ import annotations

import json
import threading

from corral.infra.kube.watch import Watcher
from tests.conftest import wait_for


def job(name: str, version: int, phase: str = "active") -> dict:
    return {"metadata": {"name": name, "resourceVersion": str(version)}, "status": {phase: 1}}


def lines(*events: dict) -> list[bytes]:
    raw = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    return [raw[:7], raw[7:]]  # split mid-line, as chunks arrive


def test_events_then_expiry_then_a_new_list():
    lists, watches = [], []
    answers = iter([
        lines({"type": "ADDED", "object": job("b", 11)}, {"type": "MODIFIED", "object": job("a", 12, "succeeded")}),
        lines({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}},
              {"type": "DELETED", "object": job("b", 21)}),
        lines({"type": "ERROR", "object": {"code": 410, "message": "too old resource version: 21"}}),
    ])
    done = threading.Event()

    def list_fn(path, query):
        lists.append(query)
        return ([job("a", 10)], "10") if len(lists) == 1 else ([job("c", 30)], "30")

    def stream_fn(path, query):
        watches.append(dict(query)["resourceVersion"])
        try:
            yield from next(answers)
        except StopIteration:
            done.set()
            threading.Event().wait()  # the last watch stays open

    watcher = Watcher({"jobs": "/jobs"}, "app=x", list_fn, stream_fn)
    wait_for("the third watch", done.is_set, timeout=10)
    assert watches[:3] == ["10", "12", "21"]  # each from the last version seen (a bookmark's too)
    assert len(lists) == 2  # the 410 made it list again
    assert watcher.synced and [j["metadata"]["name"] for j in watcher.snapshot()["jobs"]] == ["c"]
    assert watches[3] == "30"
