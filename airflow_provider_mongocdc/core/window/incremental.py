"""Incremental snapshots: collections copied chunk by chunk at the end of stream windows.

A request (:class:`IncrementalRequest`, one record per connector in the offsets topic) names the
collections; each window, after streaming to its end (:mod:`airflow_provider_mongocdc.core.window.incremental_phase`), reads the next
chunks by ``_id`` with the watermark de-duplication of DBLog (:class:`ChunkReader`,
:meth:`Chunk.apply`; docs/design.md, "Incremental snapshots") and commits each chunk's read events
(``source.snapshot`` ``"incremental"``) together with its progress (:class:`IncrementalProgress`,
kept in the partition's offset) in one Kafka transaction. A row dropped for a change whose event
does not carry the document (an update delta) is read again in a later chunk of its own
(``IncrementalProgress.reread``), so that every document reaches the topic whole.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from typing import Any

import bson
from bson import json_util
from bson.codec_options import CodecOptions
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern

from airflow_provider_mongocdc.core.base.errors import ConfigError, ConnectionFailedError
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.parsing import load_json
from airflow_provider_mongocdc.core.events.filters import Filters
from airflow_provider_mongocdc.core.offsets.model import OffsetState, check_status
from airflow_provider_mongocdc.core.snapshot.id_ranges import (
    BOUNDS_JSON,
    bound_codec_options,
    document_codec_options,
    same_type_range,
)

log = logging.getLogger(__name__)

RUNNING, COMPLETED, STOPPED = "running", "completed", "stopped"
STATUSES = (RUNNING, COMPLETED, STOPPED)
SNAPSHOT_MARKER = "incremental"  # source.snapshot of the read events
_FILTER_FIX = 'write a MongoDB query in (extended) JSON, e.g. {"status": "open"}'


def new_request_id(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"incremental-{now.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"


def parse_filter(namespace: str, value: Any) -> dict[str, Any]:
    """A collection's additional condition: a MongoDB query as a document or extended JSON text."""
    if value in (None, "", {}):
        return {}
    if isinstance(value, str):
        value = load_json(value, f"The filter of {namespace} is not a JSON query", _FILTER_FIX, _filter_query)
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"The filter of {namespace} must be a query document",
            cause=f"got {type(value).__name__}",
            fix=_FILTER_FIX,
        )
    return dict(value)


def _filter_query(text: str) -> Any:
    return json_util.loads(text, json_options=BOUNDS_JSON)


def _filter_text(query: Mapping[str, Any]) -> str:
    return json_util.dumps(dict(query), json_options=BOUNDS_JSON)


def _stored_json(record: IncrementalRequest | IncrementalProgress) -> dict[str, Any]:
    """A request's or progress's stored layout: its fields in order, ``request_id`` as ``id``,
    tuples as lists, mappings as dicts and times as ISO text."""
    return {
        "id" if item.name == "request_id" else item.name: _json_value(getattr(record, item.name))
        for item in fields(record)
    }


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return iso_z(value) if isinstance(value, datetime) else value


# -- the request ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IncrementalRequest:
    """What the user asked for: collections (empty: every captured one), filters, or a stop."""

    request_id: str
    collections: tuple[str, ...] = ()
    filters: Mapping[str, str] = field(default_factory=dict)  # namespace -> query (extended JSON)
    reason: str = ""
    requested_at: datetime | None = None
    stop: bool = False

    def to_json(self) -> dict[str, Any]:
        return _stored_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IncrementalRequest:
        return cls(
            request_id=str(data["id"]),
            collections=tuple(data.get("collections") or ()),
            filters=dict(data.get("filters") or {}),
            reason=str(data.get("reason") or ""),
            requested_at=parse_iso(data.get("requested_at")),
            stop=bool(data.get("stop")),
        )

    @classmethod
    def new(
        cls, collections: Sequence[str], filters: Mapping[str, Any] | None = None, reason: str = ""
    ) -> IncrementalRequest:
        """A new request; ``filters`` maps ``<db>.<collection>`` to a query (document or JSON)."""
        names = tuple(sorted(set(collections)))
        texts: dict[str, str] = {}
        for namespace, value in (filters or {}).items():
            if names and namespace not in names:
                raise ConfigError(
                    f"A filter is given for {namespace}, which is not among the collections to copy",
                    cause=f"the collections are {', '.join(names)}",
                    fix=f"add {namespace} to the collections, or remove its filter",
                )
            query = parse_filter(namespace, value)
            if query:
                texts[namespace] = _filter_text(query)
        return cls(new_request_id(), names, texts, reason, datetime.now(timezone.utc))

    def stopped(self) -> IncrementalRequest:
        return replace(self, stop=True)


# -- the progress -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class IncrementalProgress:
    """Where an incremental snapshot stands; committed with each chunk's events."""

    request_id: str
    status: str = RUNNING
    pending: tuple[str, ...] = ()  # collections not started yet, in order
    current: str | None = None  # the collection being copied
    last_key: str | None = None  # the last _id copied of ``current`` (canonical extended JSON)
    max_key: str | None = None  # the largest _id of ``current`` when its copy began
    filters: Mapping[str, str] = field(default_factory=dict)
    done: tuple[str, ...] = ()
    # Documents to read again, by collection: the _ids (canonical extended JSON) whose rows were
    # dropped for a change whose event does not carry the document (see Chunk.apply).
    reread: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    documents: int = 0  # read events emitted
    dropped: int = 0  # chunk rows left out because the stream changed them meanwhile
    chunks: int = 0
    started_at: datetime | None = None
    completed_at: datetime | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        check_status(self.status, STATUSES, "incremental snapshot")

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    def to_json(self) -> dict[str, Any]:
        return _stored_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> IncrementalProgress | None:
        if not data:
            return None
        return cls(
            request_id=str(data["id"]),
            status=str(data.get("status") or RUNNING),
            pending=tuple(data.get("pending") or ()),
            current=data.get("current"),
            last_key=data.get("last_key"),
            max_key=data.get("max_key"),
            filters=dict(data.get("filters") or {}),
            done=tuple(data.get("done") or ()),
            reread={str(name): tuple(keys) for name, keys in (data.get("reread") or {}).items()},
            documents=int(data.get("documents") or 0),
            dropped=int(data.get("dropped") or 0),
            chunks=int(data.get("chunks") or 0),
            started_at=parse_iso(data.get("started_at")),
            completed_at=parse_iso(data.get("completed_at")),
            message=data.get("message"),
        )

    def finish(self, status: str, message: str | None = None) -> IncrementalProgress:
        return replace(self, status=status, completed_at=datetime.now(timezone.utc), message=message)

    @property
    def rereads(self) -> int:
        """How many documents wait to be read again."""
        return sum(len(keys) for keys in self.reread.values())

    @property
    def collections_left(self) -> tuple[str, ...]:
        """The collections with work left: the current one, the pending ones, and those with
        documents to read again."""
        left = ([self.current] if self.current else []) + list(self.pending)
        return tuple(left + [name for name in self.reread if name not in left])

    def describe(self) -> str:
        if self.status != RUNNING:
            return f"incremental snapshot {self.request_id} {self.status}: {self.documents} documents"
        remaining = self.collections_left
        again = f", {self.rereads} document(s) to read again" if self.reread else ""
        return (
            f"incremental snapshot {self.request_id}: {self.documents} documents in {self.chunks} chunks, "
            f"{len(self.done)} collection(s) done, next: {', '.join(remaining) or 'none'}{again}"
        )


def reconcile(
    progress: IncrementalProgress | None,
    request: IncrementalRequest | None,
    resolve: Callable[[Sequence[str]], list[str]],
) -> IncrementalProgress | None:
    """The progress a window works on, given the stored progress and the current request.

    A new request (another id) starts over with its collections (``resolve`` turns an empty list
    into every captured collection and checks named ones); a stop request ends the running one.
    """
    if request is None:
        return progress
    if progress is not None and progress.request_id == request.request_id:
        if request.stop and progress.running:
            return progress.finish(STOPPED, "stopped on request")
        return progress
    if request.stop:
        return progress  # a stop of a request this partition never started
    collections = resolve(list(request.collections))
    log.info(
        "Incremental snapshot %s starts: %s", request.request_id, ", ".join(collections) or "no collections"
    )
    started = IncrementalProgress(
        request.request_id,
        pending=tuple(collections),
        filters=dict(request.filters),
        started_at=datetime.now(timezone.utc),
    )
    if progress is not None and progress.running:
        log.warning(
            "Incremental snapshot %s is replaced by %s before it finished (%s)",
            progress.request_id,
            request.request_id,
            progress.describe(),
        )
    return started if collections else started.finish(COMPLETED, "no collection to copy")


def superseded_incremental(state: OffsetState, snapshot_id: str) -> OffsetState:
    """A blocking snapshot that moved the offset (after an oplog gap) ends a running incremental
    snapshot: it copied the collections again from a new start, so the chunks left are moot."""
    progress = IncrementalProgress.from_json(state.incremental)
    if progress is None or not progress.running:
        return state
    log.warning(
        "The running incremental snapshot %s ends: snapshot %s copied the collections again from a "
        "new position (%s)",
        progress.request_id,
        snapshot_id,
        progress.describe(),
    )
    stopped = progress.finish(STOPPED, f"superseded by the blocking snapshot {snapshot_id}")
    return replace(state, incremental=stopped.to_json())


# -- reading a chunk --------------------------------------------------------------------------------
def _exact(value: Any) -> str:
    return json_util.dumps(value, json_options=BOUNDS_JSON)


def _from_exact(text: str) -> Any:
    return json_util.loads(text, json_options=BOUNDS_JSON)


def after_query(last: Any | None, maximum: Any) -> dict[str, Any]:
    """``_id`` in ``(last, maximum]`` of MongoDB's BSON order, across types (see range_query)."""
    if last is not None and same_type_range(last, maximum):
        return {"_id": {"$gt": last, "$lte": maximum}}
    conditions: list[dict[str, Any]] = [{"$lte": ["$_id", {"$literal": maximum}]}]
    if last is not None:
        conditions.insert(0, {"$gt": ["$_id", {"$literal": last}]})
    return {"$expr": conditions[0] if len(conditions) == 1 else {"$and": conditions}}


def _and(*queries: Mapping[str, Any]) -> dict[str, Any]:
    parts = [dict(query) for query in queries if query]
    if not parts:
        return {}
    return parts[0] if len(parts) == 1 else {"$and": parts}


@dataclass
class Chunk:
    """The rows of one chunk, keyed by their encoded ``_id``, until the stream passes its high
    watermark; rows the stream changes meanwhile are dropped (:meth:`drop`). A range chunk holds
    the next documents by ``_id`` (``last_key``, ``exhausted``); a re-read chunk the documents
    whose ``_id``s ``rereads`` lists (queued by earlier chunks)."""

    namespace: str
    rows: dict[bytes, Mapping[str, Any]]
    last_key: str | None  # a range chunk's last _id (canonical extended JSON)
    exhausted: bool  # no document after this chunk up to the collection's maximum key
    high_watermark: Timestamp
    codec_options: CodecOptions
    bounds_options: CodecOptions | None = None  # decodes _ids exactly as stored (the queue's keys)
    rereads: tuple[str, ...] = ()  # the queued _ids a re-read chunk reads again
    dropped: int = 0
    _dropped_keys: set[bytes] = field(default_factory=set, init=False, repr=False)
    _reread: dict[bytes, None] = field(
        default_factory=dict, init=False, repr=False
    )  # of those, to read again

    def drop(self, document_key: Any, omitted: bool = False) -> None:
        """Drop the row of ``document_key``; ``omitted``: the change that drops it leaves the
        document in place but no event carries it whole, so it is to be read again (unless a
        later change of the window carries it, or deletes it)."""
        encoded = key_bytes(document_key, self.codec_options)
        if self.rows.pop(encoded, None) is not None:
            self.dropped += 1
            self._dropped_keys.add(encoded)
        if encoded in self._dropped_keys:
            if omitted:
                self._reread[encoded] = None
            else:
                self._reread.pop(encoded, None)

    def clear(self) -> None:
        """Drop every row: the collection was dropped or replaced (its documents are gone)."""
        self.dropped += len(self.rows)
        self.rows.clear()
        self._reread.clear()

    def apply(self, change: Mapping[str, Any], omitted: bool = False) -> None:
        """A streamed change of the chunk's collection supersedes its row (DBLog's
        de-duplication); a drop or rename of the collection, or its database's drop, all rows.
        ``omitted``: no event of ``change`` carries the document it leaves (see
        :meth:`~airflow_provider_mongocdc.core.events.builder.EventBuilder.omits_document`), so its dropped row is read again later."""
        namespace = change.get("ns") or {}
        database, _, collection = self.namespace.partition(".")
        target = change.get("to") or {}
        if target.get("db") == database and target.get("coll") == collection:
            self.clear()  # a rename replaced the collection
        elif namespace.get("db") != database:
            return
        elif namespace.get("coll") == collection:
            key = change.get("documentKey")
            if key is not None and "_id" in key:
                self.drop(key["_id"], omitted)
            elif change.get("operationType") in ("drop", "rename"):
                self.clear()
        elif namespace.get("coll") is None and change.get("operationType") == "dropDatabase":
            self.clear()

    def reread_keys(self) -> tuple[str, ...]:
        """The ``_id``s (canonical extended JSON) whose rows were dropped for a change that no
        event carries whole: the documents to read again."""
        options = self.bounds_options or self.codec_options
        return tuple(_exact(bson.decode(encoded, codec_options=options)["_id"]) for encoded in self._reread)


def key_bytes(value: Any, codec_options: CodecOptions) -> bytes:
    return bson.encode({"_id": value}, codec_options=codec_options)


class ChunkReader:
    """Reads the next chunk of an incremental snapshot, between its low and high watermarks."""

    def __init__(self, client: MongoClient, config: ConnectorConfig):
        self.client = client
        self.config = config
        self.filters = Filters(config)
        self.documents_options = document_codec_options(client)
        self.bounds_options = bound_codec_options(client)

    def _collection(self, namespace: str, codec_options: CodecOptions):
        database, _, name = namespace.partition(".")
        return self.client[database].get_collection(
            name, codec_options=codec_options, read_concern=ReadConcern("majority")
        )

    def _query(self, progress: IncrementalProgress, namespace: str) -> dict[str, Any]:
        database, _, name = namespace.partition(".")
        extra = progress.filters.get(namespace)
        return _and(self.filters.snapshot_filter(database, name), _from_exact(extra) if extra else {})

    def next_chunk(
        self, progress: IncrementalProgress, low_watermark: Timestamp, size: int
    ) -> tuple[IncrementalProgress, Chunk | None]:
        """The progress (moved past empty or finished collections) and the next chunk, or None
        when the snapshot has nothing left (the progress is then completed). Documents queued to
        be read again come first, as a re-read chunk of up to ``size`` of them."""
        try:
            if progress.reread:
                namespace, keys = next(iter(progress.reread.items()))
                return progress, self._reread(progress, namespace, keys[:size], low_watermark)
            while True:
                if progress.current is None:
                    if not progress.pending:
                        return progress.finish(COMPLETED), None
                    progress = replace(
                        progress,
                        current=progress.pending[0],
                        pending=progress.pending[1:],
                        last_key=None,
                        max_key=None,
                    )
                namespace = progress.current
                query = self._query(progress, namespace)
                if progress.max_key is None:
                    maximum = self._maximum(namespace, query)
                    if maximum is None:  # empty: nothing to copy
                        progress = replace(progress, current=None, done=(*progress.done, namespace))
                        continue
                    progress = replace(progress, max_key=_exact(maximum))
                chunk = self._read(progress, namespace, query, low_watermark, size)
                if chunk is not None:
                    return progress, chunk
                progress = replace(progress, current=None, done=(*progress.done, namespace))
        except PyMongoError as error:
            raise ConnectionFailedError(
                f"Reading the next incremental snapshot chunk of {progress.current or 'a collection'} failed",
                cause=error_text(error),
                fix="check that MongoDB is reachable and the user may read the collection; the next "
                "window continues the incremental snapshot from its last committed chunk",
            ) from None

    def documents_left(self, progress: IncrementalProgress) -> dict[str, int]:
        """How many documents each collection still to copy holds: the current one after its last
        copied ``_id`` (up to the largest ``_id`` it had when its copy began), the pending ones
        whole, each with the connector's and the request's filters."""
        left: dict[str, int] = {}
        try:
            for namespace in ([progress.current] if progress.current else []) + list(progress.pending):
                query = self._query(progress, namespace)
                if namespace == progress.current and progress.max_key is not None:
                    last = _from_exact(progress.last_key) if progress.last_key else None
                    query = _and(after_query(last, _from_exact(progress.max_key)), query)
                left[namespace] = self._collection(namespace, self.bounds_options).count_documents(query)
        except PyMongoError as error:
            raise ConnectionFailedError(
                "Counting the documents left to the incremental snapshot failed",
                cause=error_text(error),
                fix="check that MongoDB is reachable and the user may read the collections",
            ) from None
        return left

    def _maximum(self, namespace: str, query: Mapping[str, Any]) -> Any:
        found = (
            self._collection(namespace, self.bounds_options)
            .find(query, {"_id": 1}, sort=[("_id", -1)], limit=1)
            .to_list()
        )
        return found[0]["_id"] if found else None

    def _read(
        self,
        progress: IncrementalProgress,
        namespace: str,
        query: Mapping[str, Any],
        low_watermark: Timestamp,
        size: int,
    ) -> Chunk | None:
        last = _from_exact(progress.last_key) if progress.last_key else None
        maximum = _from_exact(progress.max_key)
        rows, more, high = self._find(namespace, _and(after_query(last, maximum), query), low_watermark, size)
        if not rows:
            return None
        exact_last = bson.decode(next(reversed(rows)), codec_options=self.bounds_options)["_id"]
        return Chunk(
            namespace,
            rows,
            _exact(exact_last),
            exhausted=not more,
            high_watermark=high,
            codec_options=self.documents_options,
            bounds_options=self.bounds_options,
        )

    def _reread(
        self, progress: IncrementalProgress, namespace: str, keys: tuple[str, ...], low_watermark: Timestamp
    ) -> Chunk:
        """The documents of the queued ``keys`` (those deleted since are simply not found)."""
        wanted = {"_id": {"$in": [_from_exact(key) for key in keys]}}
        rows, _, high = self._find(
            namespace, _and(wanted, self._query(progress, namespace)), low_watermark, len(keys)
        )
        return Chunk(
            namespace,
            rows,
            None,
            exhausted=False,
            high_watermark=high,
            codec_options=self.documents_options,
            bounds_options=self.bounds_options,
            rereads=keys,
        )

    def _find(
        self, namespace: str, query: Mapping[str, Any], low_watermark: Timestamp, size: int
    ) -> tuple[dict[bytes, Mapping[str, Any]], bool, Timestamp]:
        """Up to ``size`` documents matching ``query`` by ``_id`` (keyed by their encoded
        ``_id``), whether more match, and the high watermark of the read."""
        rows: dict[bytes, Mapping[str, Any]] = {}
        more = False
        # A causally consistent session reading after the low watermark: the chunk reflects at
        # least every change the stream has already delivered.
        with self.client.start_session(causal_consistency=True) as session:
            if low_watermark is not None:
                session.advance_operation_time(low_watermark)
            collection = self._collection(namespace, self.documents_options)
            cursor = collection.find(query, sort=[("_id", 1)], limit=size + 1, session=session)
            if self.config.snapshot_fetch_size:
                cursor = cursor.batch_size(self.config.snapshot_fetch_size)
            for document in cursor:
                if len(rows) == size:
                    more = True
                    break
                rows[key_bytes(document["_id"], self.documents_options)] = document
            cursor.close()
            high = _session_time(session) or low_watermark
        return rows, more, max(time for time in (high, low_watermark) if time is not None)


def _session_time(session) -> Timestamp | None:
    """The cluster time the session has seen (at least every change visible to its reads)."""
    times = []
    cluster = session.cluster_time
    if cluster and isinstance(cluster.get("clusterTime"), Timestamp):
        times.append(cluster["clusterTime"])
    if isinstance(session.operation_time, Timestamp):
        times.append(session.operation_time)
    return max(times) if times else None


def after_chunk(progress: IncrementalProgress, chunk: Chunk, emitted: int) -> IncrementalProgress:
    """The progress once ``chunk`` is committed: a range chunk moves the copy on (its collection
    done when it was the last one); a re-read chunk takes its keys off the queue; the documents
    the chunk dropped for a change no event carries whole join the queue. The snapshot is
    completed when no collection and no queued document is left."""
    queue = dict(progress.reread)
    read_again = set(chunk.rereads)
    # Ordered and without duplicates: the keys still waiting, then the ones this chunk dropped.
    waiting = dict.fromkeys(key for key in queue.pop(chunk.namespace, ()) if key not in read_again)
    waiting.update(dict.fromkeys(chunk.reread_keys()))
    if waiting:
        queue[chunk.namespace] = tuple(waiting)
    progress = replace(
        progress,
        reread=queue,
        documents=progress.documents + emitted,
        dropped=progress.dropped + chunk.dropped,
        chunks=progress.chunks + 1,
    )
    if not chunk.rereads:
        progress = replace(progress, last_key=chunk.last_key)
        if chunk.exhausted:
            progress = replace(progress, current=None, done=(*progress.done, chunk.namespace))
    if progress.current is None and not progress.pending and not progress.reread:
        progress = progress.finish(COMPLETED)
    return progress


def requested_collections(names: Iterable[str]) -> list[tuple[str, str]]:
    return [(name.partition(".")[0], name.partition(".")[2]) for name in names]


def request_value(request: IncrementalRequest) -> bytes:
    return json.dumps(request.to_json(), separators=(",", ":")).encode()
