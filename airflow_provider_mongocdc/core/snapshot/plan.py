"""The snapshot plan: which collections a snapshot copies, their ``_id`` ranges of about
``snapshot.chunk.size`` documents (:func:`plan_collection`), the numbered chunks with one final
chunk (:func:`build_plan`; both: :func:`plan_snapshot`), and the plan's records in the offsets topic, which let a restarted
snapshot copy exactly the same ranges. See docs/design.md, "Snapshots".
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure

from airflow_provider_mongocdc.core.base.errors import ConfigError, ConnectionFailedError
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import CaptureScope, SnapshotMode
from airflow_provider_mongocdc.core.events.filters import BUILT_IN_DATABASES, Filters
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.offsets.model import ChunkMarker, OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.snapshot.id_ranges import (
    bound_codec_options,
    bound_from_json,
    bound_json,
    range_query,
)

SAMPLES_PER_CHUNK = 10
PLAN_CHUNK_PREFIX = "plan-"  # chunk ids of the plan records (data chunks are numbers)
PLAN_CHUNKS_PER_RECORD = 1000  # keeps each plan record well under Kafka's 1 MB default
PLAN_FORMAT = 1


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
            text = bound_json(value)
            return text if len(text) <= 60 else text[:57] + "..."

        lower = "-inf" if self.lower is None else bound(self.lower)
        upper = "+inf" if self.upper is None else bound(self.upper)
        return f"{self.namespace} [{lower}, {upper})"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.chunk_id,
            "db": self.database,
            "coll": self.collection,
            "lower": bound_json(self.lower),
            "upper": bound_json(self.upper),
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
            bound_from_json(data.get("lower")),
            bound_from_json(data.get("upper")),
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
    filters = Filters(
        config if config.snapshots_data else config.replace(**{"snapshot.mode": SnapshotMode.INITIAL.value})
    )
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
        if config.capture_scope in (CaptureScope.DATABASE, CaptureScope.COLLECTION) and config.capture_target:
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
            cause=f"{error.code}: {error_text(error, brief=True)}",
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
            cause=f"{error.code}: {error_text(error, brief=True)}",
            fix="grant the connector's user the read role on the collection",
        ) from None
    boundaries: list[Any] = []
    for number in range(1, chunks):
        if not sample:
            break
        value = sample[min(len(sample) - 1, (number * len(sample)) // chunks)]
        if boundaries and bound_json(boundaries[-1]) == bound_json(value):
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
    final chunk (see docs/design.md, "Snapshots")."""
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
        iso_z(datetime.now(timezone.utc)),
    )


def plan_snapshot(
    client: MongoClient,
    config: ConnectorConfig,
    snapshot_id: str,
    collections: Sequence[tuple[str, str]] | None,
    *,
    reset_offset: bool,
) -> SnapshotPlan:
    """The plan of a new snapshot: the captured collections (or ``collections``), each cut into
    ranges of about ``snapshot.chunk.size`` documents that its snapshot filter selects."""
    namespaces = snapshot_collections(client, config, collections)
    filters = Filters(config)
    ranges = {
        (database, collection): plan_collection(
            client,
            database,
            collection,
            config.snapshot_chunk_size,
            snapshot_filter=filters.snapshot_filter(database, collection),
        )
        for database, collection in namespaces
    }
    return build_plan(
        snapshot_id,
        ranges,
        mode=config.snapshot_mode,
        reset_offset=reset_offset,
        collections=[f"{db}.{coll}" for db, coll in namespaces],
    )


def distribute(chunks: Sequence[Chunk], tasks: int) -> list[list[Chunk]]:
    """Deal chunks to at most ``tasks`` groups in plan order (round robin), no empty group."""
    tasks = max(1, min(tasks, len(chunks)))
    groups: list[list[Chunk]] = [[] for _ in range(tasks)]
    for index, chunk in enumerate(chunks):
        groups[index % tasks].append(chunk)
    return [group for group in groups if group]
