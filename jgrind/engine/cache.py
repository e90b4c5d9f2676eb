"""The host cache in front of the SSD tier: whole layers while they fit, else LRU blocks.

Keys are ``(table, block)``. A gather pins the blocks it is reading so that loading one of them
cannot evict another; pins are released when the gather is done. Writes do not go through the
cache (forward outputs are not read again until the next layer's sweep, by which time a
write-allocate policy would have evicted what that sweep needs); a write invalidates the key.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Hashable, Optional

import numpy as np


class HostCache:
    def __init__(self, capacity_bytes: int, on_change: Callable[[], None] = lambda: None):
        self.capacity = max(int(capacity_bytes), 0)
        self._entries: collections.OrderedDict[Hashable, np.ndarray] = collections.OrderedDict()
        self._pinned: collections.Counter = collections.Counter()
        # bytes of the entries whose keys are pinned, kept as they change: `fits` is asked
        # once per halo owner of a gather, which pins every block of its route (a hundred
        # on 256 partitions), and summing them on every call was most of a mixed gather's time
        self._pinned_bytes = 0
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._on_change = on_change

    def get(self, key) -> Optional[np.ndarray]:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
            return value

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` can be made room for by evicting unpinned entries."""
        with self._lock:
            return self._pinned_bytes + nbytes <= self.capacity

    def make_room(self, nbytes: int) -> bool:
        """Evict least-recently-used unpinned entries until ``nbytes`` more fit; False if
        pinned entries leave too little. For an entry built in place (`SSDTier._whole_file`):
        room is made before its buffer is filled, so the cache and the buffer together stay
        within the capacity."""
        with self._lock:
            for old in list(self._entries):
                if self.bytes + nbytes <= self.capacity:
                    break
                if self._pinned[old] == 0:
                    self.bytes -= self._entries.pop(old).nbytes
            room = self.bytes + nbytes <= self.capacity
        self._on_change()
        return room

    def put(self, key, value: np.ndarray) -> bool:
        """Insert, evicting least-recently-used unpinned entries; False if it cannot fit."""
        with self._lock:
            if key in self._entries:
                self._forget(key)
            for old in list(self._entries):
                if self.bytes + value.nbytes <= self.capacity:
                    break
                if self._pinned[old] == 0:
                    self.bytes -= self._entries.pop(old).nbytes
            if self.bytes + value.nbytes > self.capacity:
                return False
            self._entries[key] = value
            self.bytes += value.nbytes
            if self._pinned[key] > 0:
                self._pinned_bytes += value.nbytes
        self._on_change()
        return True

    def pin(self, keys) -> None:
        with self._lock:
            for key in keys:
                if self._pinned[key] == 0 and key in self._entries:
                    self._pinned_bytes += self._entries[key].nbytes
                self._pinned[key] += 1

    def unpin(self, keys) -> None:
        with self._lock:
            for key in keys:
                count = self._pinned.get(key, 0)
                if count > 1:
                    self._pinned[key] = count - 1
                elif count == 1:
                    del self._pinned[key]
                    if key in self._entries:
                        self._pinned_bytes -= self._entries[key].nbytes

    def invalidate(self, key) -> None:
        with self._lock:
            value = self._forget(key)
        if value is not None:
            self._on_change()

    def drop_table(self, table: Hashable) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == table]:
                self._forget(key)
        self._on_change()

    def _forget(self, key) -> Optional[np.ndarray]:
        """Remove ``key``'s entry (the lock held), keeping the byte counts; its value or None."""
        value = self._entries.pop(key, None)
        if value is not None:
            self.bytes -= value.nbytes
            if self._pinned[key] > 0:
                self._pinned_bytes -= value.nbytes
        return value
