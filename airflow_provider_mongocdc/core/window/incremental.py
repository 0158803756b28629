"""Incremental snapshots in a window: the next chunk read by ``_id`` between its watermarks.

After streaming to its end (:mod:`airflow_provider_mongocdc.core.window.incremental_phase`), a
window reads the next chunks of the incremental snapshot that
:mod:`airflow_provider_mongocdc.core.snapshot.incremental` describes, with the watermark
de-duplication of DBLog (:class:`ChunkReader`, :meth:`IncrementalChunk.apply`; docs/design.md,
"Incremental snapshots"), and commits each chunk's read events (``source.snapshot``
``"incremental"``) together with its progress (:func:`after_chunk`) in one Kafka transaction. A
row dropped for a change whose event does not carry the document (an update delta) is read again
later (``IncrementalProgress.reread``), so that every document reaches the topic whole: in
re-read chunks of up to a chunk's size (once a collection's queue fills one, or after the copy),
each document at most once per window (:meth:`ChunkReader.next_chunk`).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field, replace
from typing import Any

import bson
from bson import json_util
from bson.codec_options import CodecOptions
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern

from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.filters import Filters
from airflow_provider_mongocdc.core.snapshot.id_ranges import (
    BOUNDS_JSON,
    bound_codec_options,
    document_codec_options,
    same_type_range,
)
from airflow_provider_mongocdc.core.snapshot.incremental import COMPLETED, IncrementalProgress


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
class IncrementalChunk:
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
        self,
        progress: IncrementalProgress,
        low_watermark: Timestamp,
        size: int,
        tried: Set[tuple[str, str]] = frozenset(),
    ) -> tuple[IncrementalProgress, IncrementalChunk | None]:
        """The progress (moved past empty or finished collections) and the next chunk, or None
        when this window has nothing left to read: the progress is then completed, or still
        running with documents queued that this window read again already.

        Documents queued to be read again are read in batches, as re-read chunks of up to
        ``size`` of one collection: while collections are left to copy, only once a collection's
        queue fills a chunk; after the copy, whatever is queued. ``tried``: the (collection,
        ``_id``) pairs this window read again already; a document changed again meanwhile (a
        hot document) waits for the next window instead of taking this window's budget."""
        try:
            chunk = self._queued_chunk(progress, low_watermark, size, tried, full=True)
            if chunk is not None:
                return progress, chunk
            while True:
                if progress.current is None:
                    if not progress.pending:
                        break
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
            # Every collection is copied: what is queued to be read again.
            chunk = self._queued_chunk(progress, low_watermark, size, tried, full=False)
            if chunk is not None:
                return progress, chunk
            return (progress if progress.reread else progress.finish(COMPLETED)), None
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
    ) -> IncrementalChunk | None:
        last = _from_exact(progress.last_key) if progress.last_key else None
        maximum = _from_exact(progress.max_key)
        rows, more, high = self._find(namespace, _and(after_query(last, maximum), query), low_watermark, size)
        if not rows:
            return None
        exact_last = bson.decode(next(reversed(rows)), codec_options=self.bounds_options)["_id"]
        return IncrementalChunk(
            namespace,
            rows,
            _exact(exact_last),
            exhausted=not more,
            high_watermark=high,
            codec_options=self.documents_options,
            bounds_options=self.bounds_options,
        )

    def _queued_chunk(
        self,
        progress: IncrementalProgress,
        low_watermark: Timestamp,
        size: int,
        tried: Set[tuple[str, str]],
        *,
        full: bool,
    ) -> IncrementalChunk | None:
        """A re-read chunk of the first collection whose queued documents not ``tried`` yet fill
        a chunk (``full``), or of the first with any; None when there is none."""
        for namespace, keys in progress.reread.items():
            waiting = tuple(key for key in keys if (namespace, key) not in tried)
            if waiting and (len(waiting) >= size or not full):
                return self._reread(progress, namespace, waiting[:size], low_watermark)
        return None

    def _reread(
        self, progress: IncrementalProgress, namespace: str, keys: tuple[str, ...], low_watermark: Timestamp
    ) -> IncrementalChunk:
        """The documents of the queued ``keys`` (those deleted since are simply not found)."""
        wanted = {"_id": {"$in": [_from_exact(key) for key in keys]}}
        rows, _, high = self._find(
            namespace, _and(wanted, self._query(progress, namespace)), low_watermark, len(keys)
        )
        return IncrementalChunk(
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


def after_chunk(progress: IncrementalProgress, chunk: IncrementalChunk, emitted: int) -> IncrementalProgress:
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
