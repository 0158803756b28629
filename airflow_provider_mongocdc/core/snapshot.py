"""Snapshots: when one is needed, how it is planned in chunks, and how one chunk is copied.

A snapshot (seed 000, "Performing a snapshot") records the current position of the change stream,
marks the snapshot as started in the offsets, copies every captured collection as *read* events
(``op`` ``r``, ``source.snapshot`` ``"true"``), then hands the recorded position to streaming.
Here the copy is cut into chunks that run in parallel (Spark tasks in ``spark_apps/snapshot.py``):

Planning
    Each collection is split into ranges of ``_id`` of about ``snapshot.chunk.size`` documents.
    The boundaries come from a random sample of ``_id`` values sorted by the server
    (``$sample`` + ``$sort``, :data:`SAMPLES_PER_CHUNK` samples per chunk; every document when
    the collection is small), which works through mongos, on every MongoDB version the connector
    supports and with read privileges only. The first range has no lower bound and the last no
    upper bound, so documents inserted after planning still fall into a range. The plan is
    stored in the offsets topic (:meth:`SnapshotPlan.records`) in the same transaction as the
    "snapshot started" offset, so that a restarted snapshot copies exactly the same ranges.
    Boundaries are the ``_id`` values as stored: binary ones (UUIDs) stay BSON binary whatever
    ``uuidRepresentation`` the connection sets, and dates outside Python's years 1-9999 decode
    (see :func:`bound_codec_options`).
Ranges over mixed ``_id`` types
    A range is half-open, ``[lower, upper)``, in MongoDB's BSON comparison order (MinKey < null <
    numbers < strings < objects < binary < ObjectId < booleans < dates < timestamps < ... <
    MaxKey). Query operators compare values of one type only ("type bracketing"), so
    ``{$gte: 5, $lt: "k"}`` would match nothing and ``{$lt: 5}`` would miss a ``null`` id;
    :func:`range_query` therefore reads a range within one type with ``{_id: {$gte, $lt}}`` and
    any other range (the unbounded first and last ones, or one across types) with ``$expr``
    comparisons, which follow the BSON order across types. Consecutive ranges share their
    boundary, so each document is read exactly once.
Copying a chunk
    :class:`ChunkCopier` reads a range sorted by ``_id`` (``snapshot.fetch.size`` documents per
    batch) and sends its read events through a :class:`~.writer.TransactionalWriter` whose
    ``transactional.id`` is stable per chunk (``mongocdc-<prefix>-snapshot-<snapshot id>-<chunk
    id>``); the chunk's marker (:meth:`~.offsets.OffsetStore.chunk_record`) is committed in the
    same transaction. A restarted chunk's writer aborts whatever the killed one left open, and
    committed chunks are skipped, so every document's read event is delivered exactly once to
    ``read_committed`` consumers.
The "last" event
    Debezium marks the final record of a snapshot with ``source.snapshot`` ``"last"``. Chunks run
    in parallel and finish in any order, so the plan designates one *final chunk*: the last chunk,
    in plan order, that held documents when planned. It is copied only after every other chunk
    committed, and its last document carries ``"last"``; it is thus the last read event in time
    too, and it is emitted exactly once (a resumed snapshot skips it once committed). If every
    document of the final chunk was deleted between planning and copying, no event carries
    ``"last"``; the offset still records the completed snapshot.
Snapshot modes (``snapshot.mode``)
    :func:`decide` applies them to the stored offsets: ``initial`` snapshots when there is no
    offset, ``always`` on every run, ``initial_only`` like initial, ``no_data`` only records the
    position, ``when_needed`` like initial and also when the stored resume point has been purged
    from the oplog (:func:`resume_point_purged`). A snapshot found in progress is always resumed.
    ``always`` with a stored offset still in the oplog leaves that offset where it is
    (``Decision.reset_offset`` False): as Debezium's ``always`` snapshots at every start and then
    streams on from the stored offset, the next window streams every change since the previous
    one (deletes included) after the snapshot's read events, instead of skipping them to the
    snapshot's start. A purged stored offset is replaced by the snapshot's start, as in
    ``when_needed``.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bson import json_util
from bson.binary import UuidRepresentation
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.json_util import CANONICAL_JSON_OPTIONS
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from airflow_provider_mongocdc.core.config import ConnectorConfig
from airflow_provider_mongocdc.core.connection import redact_uri
from airflow_provider_mongocdc.core.errors import (
    ConfigError,
    ConnectionFailedError,
    OffsetError,
)
from airflow_provider_mongocdc.core.events import EventBuilder, Record
from airflow_provider_mongocdc.core.filters import BUILT_IN_DATABASES, Filters
from airflow_provider_mongocdc.core.offsets import (
    SNAPSHOT_COMPLETED,
    SNAPSHOT_IN_PROGRESS,
    ChunkMarker,
    OffsetPartition,
    OffsetState,
    OffsetStore,
    Position,
)

log = logging.getLogger(__name__)

SAMPLES_PER_CHUNK = 10
PLAN_CHUNK_PREFIX = "plan-"  # chunk ids of the plan records (data chunks are numbers)
PLAN_CHUNKS_PER_RECORD = 1000  # keeps each plan record well under Kafka's 1 MB default
PLAN_FORMAT = 1


# Snapshot decisions
RESUME, SNAPSHOT, RECORD_POSITION, NOTHING = "resume", "snapshot", "record_position", "nothing"


# -- _id ranges in BSON order ----------------------------------------------------------------------
# Types whose values the query operators order within the type: a range bounded on both sides by
# values of one of these types is read with plain $gte/$lt (an index range on any version).
_ORDERED_TYPES = frozenset({"number", "string", "object", "binData", "objectId", "bool", "date", "timestamp"})


def id_type(value: Any) -> str:
    """The ``$type`` alias of a BSON value's canonical type (as pymongo decodes it)."""
    if isinstance(value, MinKey):
        return "minKey"
    if isinstance(value, MaxKey):
        return "maxKey"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float, Decimal128)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (bytes, uuid.UUID)):  # Binary is a bytes subclass
        return "binData"
    if isinstance(value, ObjectId):
        return "objectId"
    if isinstance(value, Timestamp):
        return "timestamp"
    if isinstance(value, Regex) or type(value).__name__ == "Pattern":
        return "regex"
    if isinstance(value, Code):
        return "javascriptWithScope" if value.scope is not None else "javascript"
    if isinstance(value, (Mapping, DBRef)):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, datetime) or type(value).__name__ == "DatetimeMS":
        return "date"
    raise ConfigError(
        f"Unsupported _id value type {type(value).__name__}",
        fix="report the collection's _id type to the connector's maintainers",
    )


def _is_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, Decimal128):
        return value.to_decimal().is_nan()
    return False


def same_type_range(lower: Any, upper: Any) -> bool:
    """Whether ``[lower, upper)`` lies within one type that plain ``$gte``/``$lt`` order."""
    if lower is None or upper is None or _is_nan(lower) or _is_nan(upper):
        return False
    kind = id_type(lower)
    return kind == id_type(upper) and kind in _ORDERED_TYPES


def range_query(lower: Any = None, upper: Any = None) -> dict[str, Any]:
    """The filter matching every ``_id`` in ``[lower, upper)`` of the BSON order (None: unbounded).

    Query operators compare values of one type only ("type bracketing"): ``{$gte: 5, $lt: "k"}``
    matches nothing, and ``{$lt: 5}`` misses ``null`` or MinKey ids. A range within one ordered
    type uses ``{_id: {$gte, $lt}}``; any other range (unbounded, or across types) uses ``$expr``
    comparisons, which follow the BSON order across types (and use the ``_id`` index on MongoDB
    5.0 and later).
    """
    if lower is None and upper is None:
        return {}
    if same_type_range(lower, upper):
        return {"_id": {"$gte": lower, "$lt": upper}}
    conditions = []
    if lower is not None:
        conditions.append({"$gte": ["$_id", {"$literal": lower}]})
    if upper is not None:
        conditions.append({"$lt": ["$_id", {"$literal": upper}]})
    return {"$expr": conditions[0] if len(conditions) == 1 else {"$and": conditions}}


# How the snapshot decodes what it reads. Dates: DATETIME_AUTO, so that every BSON date (a signed
# 64-bit count of milliseconds, also outside Python's years 1-9999) decodes, out-of-range ones as
# bson.DatetimeMS. Chunk bounds are sampled with uuid_representation UNSPECIFIED: binary _ids (UUIDs
# of any subtype) stay bson.Binary, so the bounds stored in the plan and sent in range queries are
# the stored bytes whatever uuidRepresentation the connection sets. Documents are read with the
# client's own UUID representation, as the window's change stream reads them, so that a document's
# read event and its change events carry the same key.
_BOUNDS_JSON = CANONICAL_JSON_OPTIONS.with_options(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def bound_codec_options(client: MongoClient) -> CodecOptions:
    """The codec options of planning reads: ``_id`` values exactly as stored."""
    return client.codec_options.with_options(
        uuid_representation=UuidRepresentation.UNSPECIFIED,
        datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    )


def document_codec_options(client: MongoClient) -> CodecOptions:
    """The codec options of chunk reads: the client's, with every BSON date decodable."""
    return client.codec_options.with_options(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def _ejson(value: Any) -> str | None:
    return None if value is None else json_util.dumps(value, json_options=_BOUNDS_JSON)


def _from_ejson(text: str | None) -> Any:
    return None if text is None else json_util.loads(text, json_options=_BOUNDS_JSON)


# -- the plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chunk:
    """One range of one collection: ``[lower, upper)`` of ``_id`` (None: unbounded)."""

    chunk_id: str
    database: str
    collection: str
    lower: Any = None
    upper: Any = None
    estimated: int = 0
    final: bool = False

    @property
    def namespace(self) -> str:
        return f"{self.database}.{self.collection}"

    def query(self, snapshot_filter: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The filter reading this chunk (with the collection's snapshot filter, if any)."""
        query = range_query(self.lower, self.upper)
        if not snapshot_filter:
            return query
        return {"$and": [dict(snapshot_filter), query]} if query else dict(snapshot_filter)

    def describe(self) -> str:
        def bound(value: Any) -> str:
            text = _ejson(value)
            return text if len(text) <= 60 else text[:57] + "..."

        lower = "-inf" if self.lower is None else bound(self.lower)
        upper = "+inf" if self.upper is None else bound(self.upper)
        return f"{self.namespace} [{lower}, {upper})"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.chunk_id,
            "db": self.database,
            "coll": self.collection,
            "lower": _ejson(self.lower),
            "upper": _ejson(self.upper),
            "estimated": self.estimated,
        }
        if self.final:
            data["final"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Chunk:
        return cls(
            str(data["id"]),
            data["db"],
            data["coll"],
            _from_ejson(data.get("lower")),
            _from_ejson(data.get("upper")),
            int(data.get("estimated") or 0),
            bool(data.get("final", False)),
        )


@dataclass(frozen=True)
class SnapshotPlan:
    """Everything a (restarted) snapshot needs to copy the same ranges again."""

    snapshot_id: str
    chunks: tuple[Chunk, ...]
    mode: str = "initial"
    reset_offset: bool = True
    collections: tuple[str, ...] = ()
    created_at: str | None = None

    @property
    def size(self) -> int:
        return len(self.chunks)

    @property
    def final_chunk(self) -> Chunk | None:
        return next((chunk for chunk in self.chunks if chunk.final), None)

    def chunk(self, chunk_id: str) -> Chunk:
        for chunk in self.chunks:
            if chunk.chunk_id == chunk_id:
                return chunk
        raise KeyError(chunk_id)

    def header(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "snapshot": self.snapshot_id,
            "mode": self.mode,
            "reset_offset": self.reset_offset,
            "collections": list(self.collections),
            "created_at": self.created_at,
            "chunks": self.size,
        }

    def records(self, store: OffsetStore, partition: OffsetPartition) -> list[Record]:
        """The plan as records of the offsets topic (chunk ids ``plan-0000``, ...), to commit
        with the "snapshot started" offset."""
        parts = [
            self.chunks[index : index + PLAN_CHUNKS_PER_RECORD]
            for index in range(0, max(1, self.size), PLAN_CHUNKS_PER_RECORD)
        ]
        records = []
        for number, part in enumerate(parts):
            body = {
                "plan": self.header() | {"part": number, "parts": len(parts)},
                "chunks": [chunk.to_json() for chunk in part],
            }
            records.append(
                store.chunk_record(
                    partition,
                    self.snapshot_id,
                    plan_chunk_id(number),
                    {"plan": json.dumps(body, separators=(",", ":"))},
                )
            )
        return records

    @classmethod
    def from_markers(cls, snapshot_id: str, markers: Mapping[str, ChunkMarker]) -> SnapshotPlan | None:
        """The plan stored with :meth:`records`, or None when it is not (completely) stored."""
        bodies = []
        for chunk_id, marker in markers.items():
            if is_plan_chunk(chunk_id):
                bodies.append(json.loads(marker.stats["plan"]))
        if not bodies:
            return None
        bodies.sort(key=lambda body: body["plan"]["part"])
        header = bodies[0]["plan"]
        if len(bodies) != header["parts"] or header["snapshot"] != snapshot_id:
            return None
        chunks = tuple(Chunk.from_json(item) for body in bodies for item in body["chunks"])
        if len(chunks) != header["chunks"]:
            return None
        return cls(
            snapshot_id,
            chunks,
            header.get("mode", "initial"),
            bool(header.get("reset_offset", True)),
            tuple(header.get("collections") or ()),
            header.get("created_at"),
        )


def plan_chunk_id(number: int) -> str:
    return f"{PLAN_CHUNK_PREFIX}{number:04d}"


def is_plan_chunk(chunk_id: str) -> bool:
    return str(chunk_id).startswith(PLAN_CHUNK_PREFIX)


def data_chunks_finished(markers: Mapping[str, ChunkMarker]) -> dict[str, ChunkMarker]:
    """The markers of finished data chunks (the plan records left out)."""
    return {chunk_id: marker for chunk_id, marker in markers.items() if not is_plan_chunk(chunk_id)}


def new_snapshot_id(now: datetime | None = None) -> str:
    """A snapshot id: UTC start time and a random suffix, e.g. ``20250101T120000Z-1a2b3c4d``."""
    now = now or datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"


# -- what to copy -----------------------------------------------------------------------------------
def parse_namespaces(collections: Iterable[str] | str | None) -> list[tuple[str, str]] | None:
    """``["db.coll", ...]`` (or a comma-separated string) -> ``[(db, coll), ...]``; None: all."""
    if collections is None:
        return None
    if isinstance(collections, str):
        text = collections.strip()
        if text.startswith("["):
            try:
                collections = json.loads(text)
            except ValueError:
                raise ConfigError(
                    "The collections parameter is not a valid JSON list",
                    cause=f"got {text[:80]!r}",
                    fix='give a list such as ["inventory.customers"]',
                ) from None
        else:
            collections = [item for item in text.split(",")]
    names = [str(item).strip() for item in collections if str(item).strip()]
    if not names:
        return None
    parsed = []
    for name in names:
        database, _, collection = name.partition(".")
        if not database or not collection:
            raise ConfigError(
                f"{name!r} does not name a collection",
                fix='name collections as "<database>.<collection>", e.g. "inventory.customers"',
            )
        parsed.append((database, collection))
    return sorted(set(parsed))


def snapshot_collections(
    client: MongoClient, config: ConnectorConfig, collections: Sequence[tuple[str, str]] | None = None
) -> list[tuple[str, str]]:
    """The collections a snapshot copies, sorted.

    Without ``collections``: every collection (``listCollections`` type ``collection``: views
    and time-series collections are skipped, as are ``system.*`` collections and the ``admin``,
    ``config`` and ``local`` databases) that the filters capture and that
    ``snapshot.include.collection.list`` selects. With ``collections`` (a re-snapshot of chosen
    collections): those, each of which must be captured.
    """
    filters = Filters(config if config.snapshots_data else config.replace(**{"snapshot.mode": "initial"}))
    if collections is not None:
        refused = [f"{db}.{coll}" for db, coll in collections if not filters.collection_included(db, coll)]
        if refused:
            raise ConfigError(
                f"The collections {', '.join(refused)} are not captured by this connector",
                cause="the include/exclude lists (or capture.scope) leave them out, so their events "
                "would never be streamed",
                fix="choose captured collections, or change the connector's include lists first",
            )
        return sorted(collections)
    try:
        if config.capture_scope in ("database", "collection") and config.capture_target:
            databases = [config.capture_target.partition(".")[0]]
        else:
            databases = client.list_database_names()
        found = []
        for database in sorted(databases):
            if database in BUILT_IN_DATABASES or not filters.database_included(database):
                continue
            for info in client[database].list_collections():
                if info.get("type", "collection") != "collection":
                    continue  # views and time-series collections hold no documents of their own
                name = info["name"]
                if filters.snapshot_included(database, name):
                    found.append((database, name))
        return sorted(found)
    except OperationFailure as error:
        raise ConnectionFailedError(
            "MongoDB refused to list the databases and collections to snapshot",
            cause=f"{error.code}: {_error_text(error)}",
            fix="grant the connector's user the read role on the captured databases (listDatabases "
            "and listCollections), or name the collections to copy",
        ) from None


def plan_collection(
    client: MongoClient,
    database: str,
    collection: str,
    chunk_size: int,
    *,
    snapshot_filter: Mapping[str, Any] | None = None,
    samples_per_chunk: int = SAMPLES_PER_CHUNK,
) -> list[tuple[Any, Any, int]]:
    """``[(lower, upper, estimated documents), ...]``: ranges of about ``chunk_size`` documents
    in ``_id`` order, the first without lower and the last without upper bound. Bounds are the
    ``_id`` values as stored (see :func:`bound_codec_options`)."""
    coll = client[database].get_collection(collection, codec_options=bound_codec_options(client))
    try:
        total = (
            coll.count_documents(dict(snapshot_filter))
            if snapshot_filter
            else coll.estimated_document_count()
        )
        chunks = max(1, math.ceil(total / chunk_size))
        if chunks == 1:
            return [(None, None, total)]
        pipeline: list[dict[str, Any]] = [{"$match": dict(snapshot_filter)}] if snapshot_filter else []
        pipeline += [
            {"$sample": {"size": chunks * samples_per_chunk}},
            {"$project": {"_id": 1}},
            {"$sort": {"_id": 1}},
        ]
        sample = [doc["_id"] for doc in coll.aggregate(pipeline, allowDiskUse=True)]
    except OperationFailure as error:
        raise ConnectionFailedError(
            f"MongoDB refused to plan the snapshot of {database}.{collection}",
            cause=f"{error.code}: {_error_text(error)}",
            fix="grant the connector's user the read role on the collection",
        ) from None
    boundaries: list[Any] = []
    for number in range(1, chunks):
        if not sample:
            break
        value = sample[min(len(sample) - 1, (number * len(sample)) // chunks)]
        if boundaries and _ejson(boundaries[-1]) == _ejson(value):
            continue  # $sample may return a document twice
        boundaries.append(value)
    if not boundaries:
        return [(None, None, total)]
    bounds = [None, *boundaries, None]
    share = max(1, round(total / (len(bounds) - 1)))
    return [(bounds[index], bounds[index + 1], share) for index in range(len(bounds) - 1)]


def build_plan(
    snapshot_id: str,
    ranges: Mapping[tuple[str, str], list[tuple[Any, Any, int]]],
    *,
    mode: str,
    reset_offset: bool,
    collections: Sequence[str] = (),
) -> SnapshotPlan:
    """Number the chunks in plan order (collections by name, ranges by ``_id``) and designate the
    final chunk (see the module documentation)."""
    chunks: list[Chunk] = []
    width = max(4, len(str(sum(len(r) for r in ranges.values()))))
    for database, collection in sorted(ranges):
        for lower, upper, estimated in ranges[(database, collection)]:
            chunks.append(Chunk(f"{len(chunks):0{width}d}", database, collection, lower, upper, estimated))
    final_index = next(
        (index for index in range(len(chunks) - 1, -1, -1) if chunks[index].estimated > 0), len(chunks) - 1
    )
    if chunks:
        last = chunks[final_index]
        chunks[final_index] = Chunk(
            last.chunk_id, last.database, last.collection, last.lower, last.upper, last.estimated, final=True
        )
    return SnapshotPlan(
        snapshot_id,
        tuple(chunks),
        mode,
        reset_offset,
        tuple(collections),
        datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
    )


def distribute(chunks: Sequence[Chunk], tasks: int) -> list[list[Chunk]]:
    """Deal chunks to at most ``tasks`` groups in plan order (round robin), no empty group."""
    tasks = max(1, min(tasks, len(chunks)))
    groups: list[list[Chunk]] = [[] for _ in range(tasks)]
    for index, chunk in enumerate(chunks):
        groups[index % tasks].append(chunk)
    return [group for group in groups if group]


# -- when a snapshot runs ---------------------------------------------------------------------------
def resume_point_purged(client: MongoClient, config: ConnectorConfig, position: Position) -> bool:
    """Whether the change stream can no longer resume from ``position`` (oplog rules: MongoDB
    refuses to open it with ChangeStreamHistoryLost and friends, see
    :func:`~.change_stream.is_history_lost`)."""
    from airflow_provider_mongocdc.core.change_stream import (
        is_history_lost,
        is_unusable_position,
        open_stream,
        unusable_position_error,
    )

    try:
        with open_stream(client, config, position, max_await_time_ms=100) as stream:
            stream.try_next()
        return False
    except OperationFailure as error:
        if is_history_lost(error):
            log.info(
                "The stored resume point (%s) is no longer in the oplog: %s",
                position.describe(),
                _error_text(error),
            )
            return True
        if is_unusable_position(error):  # a wrong offset, not a purged oplog
            raise unusable_position_error(config, None, position, error) from None
        raise ConnectionFailedError(
            "MongoDB refused to open the change stream at the stored position",
            cause=f"{error.code}: {_error_text(error)}",
            fix="check the user's roles (changeStream, find on the captured "
            "collections) and the server's state",
        ) from None


def needs_snapshot(state: OffsetState | None, mode: str, *, purged: Callable[[], bool]) -> str | None:
    """Why ``snapshot.mode`` asks for a new snapshot for a partition in ``state``, or None.

    ``purged()`` is called only for ``when_needed`` with a stored position (it opens a change
    stream, see :func:`resume_point_purged`). A snapshot in progress is not covered here: it is
    resumed whatever the mode.
    """
    has_offset = state is not None and (
        state.position is not None or state.snapshot.status == SNAPSHOT_COMPLETED
    )
    if mode == "no_data":
        return None
    if not has_offset:
        return "no offset is stored"
    if mode == "always":
        return "snapshot.mode=always snapshots on every run"
    if mode == "when_needed" and state.position is not None and purged():
        return "the stored resume point is no longer in the oplog"
    return None


@dataclass(frozen=True)
class Decision:
    """What a snapshot run does: ``resume``, ``snapshot``, ``record_position`` or ``nothing``.

    ``reset_offset`` (new snapshots): whether completion moves the stored offsets to the
    snapshot's start; None leaves it to the run's ``reset_offset`` parameter.
    """

    action: str
    reason: str
    snapshot_id: str | None = None
    reset_offset: bool | None = None


def decide(
    states: Mapping[OffsetPartition, OffsetState | None],
    mode: str,
    *,
    force: bool = False,
    purged: Callable[[OffsetPartition, Position], bool] | None = None,
) -> Decision:
    """Apply ``snapshot.mode`` (and ``force``) to the stored states of the connector's partitions."""
    running = {
        state.snapshot.snapshot_id
        for state in states.values()
        if state is not None and state.snapshot.status == SNAPSHOT_IN_PROGRESS
    }
    if len(running) > 1:
        raise OffsetError(
            "The offsets hold more than one snapshot in progress",
            cause=f"snapshots {', '.join(sorted(running))}",
            fix="reset the connector's offsets (mongocdc offsets reset) and snapshot again",
        )
    if running:
        snapshot_id = running.pop()
        return Decision(RESUME, f"snapshot {snapshot_id} was interrupted; it resumes", snapshot_id)
    if force:
        return Decision(SNAPSHOT, "a re-snapshot was requested")
    reasons = []
    for partition, state in states.items():

        def check(partition=partition, state=state) -> bool:
            return bool(purged and state and state.position and purged(partition, state.position))

        reason = needs_snapshot(state, mode, purged=check)
        if reason:
            reasons.append(reason if len(states) == 1 else f"{partition.rs}: {reason}")
    if reasons:
        reset_offset = None
        stored = {p: s.position for p, s in states.items() if s is not None and s.position is not None}
        if mode == "always" and stored:
            # Streaming stays continuous: the stored offsets stay, unless one was purged.
            lost = [p.rs for p, position in stored.items() if purged and purged(p, position)]
            reset_offset = bool(lost)
            reasons.append(
                f"the stored resume point of {', '.join(lost)} is no longer in the oplog: streaming "
                "restarts from this snapshot's start"
                if lost
                else "streaming continues from the stored offset"
            )
        return Decision(SNAPSHOT, "; ".join(reasons), reset_offset=reset_offset)
    missing = [p for p, state in states.items() if state is None or state.position is None]
    if mode == "no_data" and missing:
        return Decision(
            RECORD_POSITION, "snapshot.mode=no_data: the position is recorded without copying data"
        )
    completed = [
        state
        for state in states.values()
        if state is not None and state.snapshot.status == SNAPSHOT_COMPLETED
    ]
    if completed:
        ids = ", ".join(sorted({state.snapshot.snapshot_id for state in completed}))
        return Decision(NOTHING, f"snapshot {ids} is already completed (snapshot.mode={mode})")
    return Decision(NOTHING, f"an offset is stored (snapshot.mode={mode})")


# -- copying one chunk ------------------------------------------------------------------------------
@dataclass
class ChunkResult:
    chunk_id: str
    namespace: str
    documents: int = 0
    events: int = 0
    skipped_oversize: int = 0
    bytes: int = 0
    seconds: float = 0.0
    last: bool = False
    already_committed: bool = False

    def stats(self) -> dict[str, Any]:
        return {
            "ns": self.namespace,
            "docs": self.documents,
            "events": self.events,
            "bytes": self.bytes,
            "skipped_oversize": self.skipped_oversize,
            "seconds": round(self.seconds, 3),
            "last": self.last,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"chunk": self.chunk_id, **self.stats(), "already_committed": self.already_committed}


def chunk_transactional_id(topic_prefix: str, snapshot_id: str, chunk_id: str) -> str:
    return f"mongocdc-{topic_prefix}-snapshot-{snapshot_id}-{chunk_id}"


def control_transactional_id(topic_prefix: str) -> str:
    """The writer of a connector's snapshot offsets (start, plan, completion)."""
    return f"mongocdc-{topic_prefix}-snapshot-control"


def fence_chunks(
    kafka_config: Mapping[str, Any],
    topic_prefix: str,
    snapshot_id: str,
    chunk_ids: Iterable[str],
    *,
    workers: int = 8,
) -> int:
    """Take over the ``transactional.id`` of each chunk (``init_transactions``), so that every
    transaction a killed run left open for them is finished (aborted, or completed when its
    commit was already under way). Until then such a transaction holds back what
    ``read_committed`` readers see of the offsets topic, so a resumed snapshot calls this before
    it reads which chunks committed. Returns how many ids were fenced."""
    from concurrent.futures import ThreadPoolExecutor

    from airflow_provider_mongocdc.core.writer import TransactionalWriter

    ids = sorted(set(chunk_ids))

    def fence(chunk_id: str) -> None:
        TransactionalWriter(kafka_config, chunk_transactional_id(topic_prefix, snapshot_id, chunk_id)).close()

    if not ids:
        return 0
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(ids)))) as pool:
        list(pool.map(fence, ids))
    return len(ids)


@dataclass
class ChunkCopier:
    """Copies chunks of one snapshot: reads a range and commits its read events with its marker."""

    config: ConnectorConfig
    kafka_config: Mapping[str, Any]
    snapshot_id: str
    start: Position
    partition: OffsetPartition
    replica_set: str
    batch_size: int = 0  # events per send(); 0: max.batch.size
    _builder: EventBuilder | None = field(default=None, init=False, repr=False)
    _filters: Filters | None = field(default=None, init=False, repr=False)

    @property
    def store(self) -> OffsetStore:
        return OffsetStore(self.kafka_config, self.config.offsets_topic)

    def copy(
        self, client: MongoClient, chunk: Chunk, *, committed: Callable[[str], bool] | None = None
    ) -> ChunkResult:
        """Copy ``chunk`` in one Kafka transaction together with its marker.

        ``committed(chunk_id)``, when given, is asked after the chunk's writer took over its
        ``transactional.id`` (so no earlier writer of the chunk can still commit): a chunk found
        committed then is not copied again (a retried Spark task, or another run that resumed
        the same snapshot).
        """
        from airflow_provider_mongocdc.core.writer import TransactionalWriter

        started = time.monotonic()
        if self._builder is None:
            self._builder = EventBuilder(self.config, replica_set=self.replica_set)
            self._filters = Filters(self.config)
        builder, filters = self._builder, self._filters
        result = ChunkResult(chunk.chunk_id, chunk.namespace)
        transactional_id = chunk_transactional_id(self.config.topic_prefix, self.snapshot_id, chunk.chunk_id)
        batch_size = self.batch_size or self.config.max_batch_size
        with TransactionalWriter(self.kafka_config, transactional_id) as writer:
            if committed is not None and committed(chunk.chunk_id):
                result.already_committed = True
                return result
            writer.begin()
            batch: list[Record] = []
            position = self.start.cluster_time
            for document, is_last in self._documents(
                client, chunk, filters.snapshot_filter(chunk.database, chunk.collection)
            ):
                records = builder.build_snapshot(
                    document, chunk.database, chunk.collection, last=is_last, position=position
                )
                result.documents += 1
                if not records:
                    result.skipped_oversize += 1
                    continue
                result.last = result.last or is_last
                for record in records:
                    result.events += 1
                    result.bytes += record.size
                batch.extend(records)
                if len(batch) >= batch_size:
                    writer.send(batch)
                    batch = []
            if batch:
                writer.send(batch)
            result.seconds = time.monotonic() - started
            marker = self.store.chunk_record(self.partition, self.snapshot_id, chunk.chunk_id, result.stats())
            writer.commit([marker])
        result.seconds = time.monotonic() - started
        return result

    def _documents(
        self, client: MongoClient, chunk: Chunk, snapshot_filter: Mapping[str, Any]
    ) -> Iterator[tuple[dict[str, Any], bool]]:
        """The chunk's documents in ``_id`` order, each with "is the snapshot's last event"."""
        collection = client[chunk.database].get_collection(
            chunk.collection, codec_options=document_codec_options(client)
        )
        fetch = self.config.snapshot_fetch_size
        previous = None
        try:
            cursor = collection.find(chunk.query(snapshot_filter), sort=[("_id", 1)])
            if fetch:
                cursor = cursor.batch_size(fetch)
            for document in cursor:
                if previous is not None:
                    yield previous, False
                previous = document
        except PyMongoError as error:
            raise ConnectionFailedError(
                f"Reading snapshot chunk {chunk.chunk_id} ({chunk.describe()}) failed",
                cause=_error_text(error),
                fix="check that MongoDB is reachable and the user may read the collection, then run "
                "the snapshot again: committed chunks are skipped",
            ) from None
        if previous is not None:
            yield previous, chunk.final


def _error_text(error: BaseException) -> str:
    if isinstance(error, OperationFailure) and error.details:
        return redact_uri(str(error.details.get("errmsg", error)))
    return redact_uri(str(error).split(", Timeout:")[0].split(" (configured timeouts")[0])


# -- progress ---------------------------------------------------------------------------------------
@dataclass
class Progress:
    """Counts finished chunks as their markers appear and formats one log line per chunk."""

    plan: SnapshotPlan
    started: float = field(default_factory=time.monotonic)
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: int = 0  # chunks committed before this run
    copied_documents: int = 0

    def preload(self, markers: Mapping[str, ChunkMarker]) -> None:
        """Chunks committed by an earlier run (a resumed snapshot)."""
        for chunk_id, marker in data_chunks_finished(markers).items():
            if chunk_id not in self.seen:
                self.seen[chunk_id] = dict(marker.stats)
                self.skipped += 1

    def update(self, markers: Mapping[str, ChunkMarker]) -> list[str]:
        """Log lines for chunks finished since the last call."""
        lines = []
        for chunk_id, marker in sorted(data_chunks_finished(markers).items()):
            if chunk_id in self.seen:
                continue
            stats = dict(marker.stats)
            self.seen[chunk_id] = stats
            self.copied_documents += int(stats.get("docs", 0))
            elapsed = max(time.monotonic() - self.started, 1e-6)
            done = len(self.seen)
            lines.append(
                f"Snapshot {self.plan.snapshot_id}: chunk {chunk_id} of {stats.get('ns')} committed "
                f"({stats.get('docs', 0)} documents, {_size(stats.get('bytes', 0))}); "
                f"{done}/{self.plan.size} chunks ({100.0 * done / max(1, self.plan.size):.0f}%), "
                f"{self.copied_documents} documents copied in this run, "
                f"{self.copied_documents / elapsed:.0f} docs/s"
            )
        return lines

    def totals(self) -> dict[str, Any]:
        per_collection: dict[str, int] = {}
        total_bytes = events = 0
        for stats in self.seen.values():
            ns = str(stats.get("ns"))
            per_collection[ns] = per_collection.get(ns, 0) + int(stats.get("docs", 0))
            total_bytes += int(stats.get("bytes", 0))
            events += int(stats.get("events", 0))
        return {
            "documents": sum(per_collection.values()),
            "events": events,
            "bytes": total_bytes,
            "collections": dict(sorted(per_collection.items())),
        }


def _size(count: Any) -> str:
    value = float(count or 0)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def check_complete(plan: SnapshotPlan, markers: Mapping[str, ChunkMarker]) -> None:
    """Raise unless every chunk of ``plan`` has a committed marker."""
    missing = sorted({chunk.chunk_id for chunk in plan.chunks} - set(data_chunks_finished(markers)))
    if missing:
        raise OffsetError(
            f"Snapshot {plan.snapshot_id} is not complete: {len(missing)} of {plan.size} chunks have "
            "no committed marker",
            cause=f"chunks {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} did not commit",
            fix="run the snapshot again: it resumes and copies the missing chunks only",
        )
