"""A small in-process LRU cache with a time to live and a byte budget (``WebFetchTool``'s ``enable_cache``).

Entries are evicted least recently used first until a new one fits the budget; an entry larger than the whole
budget is not stored; an expired entry is dropped when it is next looked up. Used from one event loop: every
method runs without awaiting, so no lock is needed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class TTLCache(Generic[V]):
    def __init__(self, *, ttl_seconds: float, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_seconds = max(0.0, float(ttl_seconds))
        self.max_bytes = max(0, int(max_bytes))
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, int, V]] = OrderedDict()
        self.size_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        stored_at, size, value = entry
        if self._clock() - stored_at > self.ttl_seconds:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: V, size: int) -> bool:
        """Store ``value`` (``size`` bytes); False when it is larger than the whole budget."""
        if size > self.max_bytes or self.ttl_seconds <= 0:
            return False
        if key in self._entries:
            self._drop(key)
        while self._entries and self.size_bytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[key] = (self._clock(), size, value)
        self.size_bytes += size
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.size_bytes = 0

    def _drop(self, key: str) -> None:
        _, size, _ = self._entries.pop(key)
        self.size_bytes -= size
