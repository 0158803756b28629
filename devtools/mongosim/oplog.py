"""The cluster clock and ``local.oplog.rs``.

One clock per simulator process (shared by every shard and mongos, like a cluster whose nodes
gossip ``$clusterTime``): ``Timestamp(seconds, increment)``, strictly increasing. The oplog keeps
entries in timestamp order and drops the oldest ones beyond a retention limit (entries and/or
bytes), which can be changed while running.
"""

from __future__ import annotations

import bisect
import datetime
import time

from bson.int64 import Int64
from bson.timestamp import Timestamp

from devtools.mongosim import bsonutil

DEFAULT_OPLOG_MAX_BYTES = 1024 * 1024 * 1024  # reported as maxSize when no byte limit is set
INITIATING_SET = "initiating set"  # o.msg of the first entry of a replica set's oplog


class ClusterClock:
    """Hybrid logical clock: wall-clock seconds plus an increment (callers hold the big lock)."""

    def __init__(self):
        self.last = Timestamp(int(time.time()), 0)

    def tick(self) -> Timestamp:
        now = int(time.time())
        if now > self.last.time:
            self.last = Timestamp(now, 1)
        else:
            self.last = Timestamp(self.last.time, self.last.inc + 1)
        return self.last

    def peek_next(self) -> Timestamp:
        """The timestamp the next write will get at the earliest (not reserved)."""
        now = int(time.time())
        if now > self.last.time:
            return Timestamp(now, 1)
        return Timestamp(self.last.time, self.last.inc + 1)

    @property
    def now(self) -> Timestamp:
        return self.last


_EPOCH = datetime.datetime(1970, 1, 1)
_last_wall: list = [0, _EPOCH]


def wall_now() -> datetime.datetime:
    """UTC wall-clock time with millisecond precision (BSON dates are milliseconds)."""
    millis = int(time.time() * 1000)
    if millis != _last_wall[0]:
        _last_wall[0] = millis
        _last_wall[1] = _EPOCH + datetime.timedelta(milliseconds=millis)
    return _last_wall[1]


class Oplog:
    """Entries in ts order with a retention limit; ``keys`` holds the ts as integers for bisect."""

    def __init__(self, max_entries: int | None = None, max_bytes: int | None = None):
        self.entries: list[dict] = []
        self.keys: list[int] = []
        self.sizes: list[int] = []
        self.total_bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.dropped_through = -1  # ts key of the newest entry dropped by retention
        self.on_truncate = None  # callback(oldest_key) used to drop pre-images

    def append(self, entry: dict) -> None:
        size = bsonutil.bson_size(entry)
        self.entries.append(entry)
        self.keys.append(bsonutil.ts_key(entry["ts"]))
        self.sizes.append(size)
        self.total_bytes += size
        self.enforce()

    def set_retention(self, max_entries: int | None, max_bytes: int | None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.enforce()

    def enforce(self) -> None:
        drop = 0
        count = len(self.entries)
        total = self.total_bytes
        if self.max_entries is not None and count - drop > self.max_entries:
            drop = count - max(self.max_entries, 1)
            total -= sum(self.sizes[:drop])
        if self.max_bytes is not None:
            while total > self.max_bytes and count - drop > 1:
                total -= self.sizes[drop]
                drop += 1
        if drop:
            self.dropped_through = self.keys[drop - 1]
            del self.entries[:drop]
            del self.keys[:drop]
            del self.sizes[:drop]
            self.total_bytes = total
            if self.on_truncate is not None:
                self.on_truncate(self.keys[0] if self.keys else self.dropped_through + 1)

    @property
    def oldest_key(self) -> int | None:
        return self.keys[0] if self.keys else None

    @property
    def starts_at_initiation(self) -> bool:
        """Whether the oldest entry is the replica set's initiation (``op: "n"``, ``o.msg:
        "initiating set"``): no entry was ever dropped, so the oplog holds all of this replica
        set's history, and MongoDB resumes a change stream from any earlier time on it."""
        if not self.entries:
            return False
        first = self.entries[0]
        o = first.get("o")
        return first.get("op") == "n" and isinstance(o, dict) and o.get("msg") == INITIATING_SET

    def covers(self, key: int) -> bool:
        """MongoDB's resumability rule for one oplog: a change stream can start at ``key`` when
        the oplog's first entry is at or before it, or is the replica set's initiation (the
        server's ``isNewRS``); an empty oplog lost nothing either."""
        return not self.keys or self.keys[0] <= key or self.starts_at_initiation

    @property
    def latest_key(self) -> int | None:
        return self.keys[-1] if self.keys else None

    def index_after(self, key: int) -> int:
        """Index of the first entry with ts > key."""
        return bisect.bisect_right(self.keys, key)

    def index_at_or_after(self, key: int) -> int:
        return bisect.bisect_left(self.keys, key)

    def entries_at(self, key: int) -> list[dict]:
        start = bisect.bisect_left(self.keys, key)
        end = bisect.bisect_right(self.keys, key)
        return self.entries[start:end]

    def stats(self, ns: str = "local.oplog.rs") -> dict:
        count = len(self.entries)
        size = self.total_bytes
        max_size = self.max_bytes if self.max_bytes is not None else DEFAULT_OPLOG_MAX_BYTES
        return {
            "ns": ns,
            "size": size,
            "count": count,
            "avgObjSize": (size // count) if count else 0,
            "storageSize": max(4096, (size + 4095) // 4096 * 4096),
            "capped": True,
            "max": Int64(self.max_entries) if self.max_entries is not None else Int64(0),
            "maxSize": Int64(max_size),
            "nindexes": 0,
            "totalIndexSize": 0,
            "indexSizes": {},
        }
