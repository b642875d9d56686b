"""Corral's Jobs and pods in a namespace, kept current by the API's watches (a list, then a watch from
its resourceVersion), so that a status query costs no request at all once they are synced.

One daemon thread per KubeInfra: for each kind, LIST, then WATCH from the list's resourceVersion,
applying ADDED/MODIFIED/DELETED to the cache; a watch that ends is opened again from the last version
seen (bookmarks keep it current), and one the server has expired (410) starts over with a LIST. A
caller that finds a job missing from the cache (just submitted, say) lists instead: the cache only
ever saves requests, it never answers with less than a list would.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

WATCH_SECONDS = 290  # the server ends a watch after this (timeoutSeconds); it is opened again at once
RETRY_SECONDS = 2.0


class ListFailed(Exception):
    pass


class Cache:
    """Objects of one kind by name, and the resourceVersion to watch from."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.version: str | None = None
        self.synced = False


class Watcher:
    """`list_fn(path, query) -> (items, resourceVersion)` and `stream_fn(path, query) -> iterator of
    bytes chunks` make the requests (KubeInfra's); paths are the kinds' collection paths."""

    def __init__(self, paths: dict[str, str], selector: str,
                 list_fn: Callable[[str, list[tuple[str, str]]], tuple[list[dict[str, Any]], str | None]],
                 stream_fn: Callable[[str, list[tuple[str, str]]], Any]):
        self.paths = paths
        self.selector = selector
        self._list = list_fn
        self._stream = stream_fn
        self.lock = threading.Lock()
        self.caches = {kind: Cache() for kind in paths}
        self.errors: dict[str, str] = {}
        self._threads = [threading.Thread(target=self._run, args=(kind,), daemon=True, name=f"corral-watch-{kind}")
                         for kind in paths]
        for thread in self._threads:
            thread.start()

    @property
    def synced(self) -> bool:
        with self.lock:
            return all(cache.synced for cache in self.caches.values())

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        with self.lock:
            return {kind: list(cache.items.values()) for kind, cache in self.caches.items()}

    def replace(self, kind: str, items: list[dict[str, Any]], version: str | None) -> None:
        """A fresh list (the watcher's own, or a caller's fallback) replaces the cache."""
        with self.lock:
            cache = self.caches[kind]
            cache.items = {i["metadata"]["name"]: i for i in items}
            if version:
                cache.version = version

    def _run(self, kind: str) -> None:
        cache = self.caches[kind]
        query = [("labelSelector", self.selector)]
        while True:
            try:
                if cache.version is None or not cache.synced:
                    items, version = self._list(self.paths[kind], query)
                    self.replace(kind, items, version)
                    with self.lock:
                        cache.synced = True
                self._follow(kind, query)
            except Exception as exc:  # the API down, a network error: the cache is not trusted until a relist
                with self.lock:
                    cache.synced = False
                    self.errors[kind] = str(exc)
                time.sleep(RETRY_SECONDS)

    def _follow(self, kind: str, query: list[tuple[str, str]]) -> None:
        cache = self.caches[kind]
        watch = [*query, ("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(WATCH_SECONDS)), ("resourceVersion", cache.version or "")]
        buffer = b""
        for chunk in self._stream(self.paths[kind], watch):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    self._apply(kind, json.loads(line))

    def _apply(self, kind: str, event: dict[str, Any]) -> None:
        cache = self.caches[kind]
        kind_of, obj = event.get("type"), event.get("object") or {}
        meta = obj.get("metadata") or {}
        with self.lock:
            if kind_of == "ERROR":  # 410 Gone: the version is too old; list again
                cache.synced = False
                cache.version = None
                raise ListFailed(str(obj.get("message") or "the watch expired"))
            if meta.get("resourceVersion"):
                cache.version = meta["resourceVersion"]
            if kind_of in ("ADDED", "MODIFIED") and meta.get("name"):
                cache.items[meta["name"]] = obj
            elif kind_of == "DELETED":
                cache.items.pop(meta.get("name"), None)
