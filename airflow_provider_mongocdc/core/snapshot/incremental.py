"""Incremental snapshots: what is asked for and how far the copy has come.

A request (:class:`IncrementalRequest`, one record per connector in the offsets topic, written by
``MongoResnapshotOperator``) names the collections and their filters, or stops the running
snapshot; its progress (:class:`IncrementalProgress`) is kept in the partition's offset and
committed with each chunk, with the documents to read again (``reread``). :func:`reconcile` turns
the stored progress and the current request into the progress a window works on;
:func:`superseded_incremental` ends it when a blocking snapshot copied the collections again. The
windows read and commit the chunks (:mod:`airflow_provider_mongocdc.core.window.incremental`);
docs/design.md, "Incremental snapshots".
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from typing import Any

from bson import json_util

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.config.parsing import load_json
from airflow_provider_mongocdc.core.offsets.model import OffsetState, check_status
from airflow_provider_mongocdc.core.snapshot.id_ranges import BOUNDS_JSON

log = logging.getLogger(__name__)

RUNNING, COMPLETED, STOPPED = "running", "completed", "stopped"
STATUSES = (RUNNING, COMPLETED, STOPPED)
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
    # Where each collection's topic ended when the snapshot started (topic -> partition -> next
    # offset, as the window saw it before any chunk): every event of the snapshot, and every change
    # after it started, lies at or past it. A table's re-snapshot sweep begins its generation there
    # (core/apply/snapshots.py). None: not recorded.
    topic_offsets: Mapping[str, Mapping[str, int]] | None = None

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
            topic_offsets=_topic_offsets(data.get("topic_offsets")),
        )

    def started_at_offsets(self, offsets: Mapping[str, Mapping[int, int]]) -> IncrementalProgress:
        """The progress with where its collections' topics ended when it started."""
        return replace(
            self,
            topic_offsets={
                topic: {str(partition): int(offset) for partition, offset in sorted(ends.items())}
                for topic, ends in sorted(offsets.items())
            },
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


def _topic_offsets(value: Any) -> dict[str, dict[str, int]] | None:
    if not isinstance(value, Mapping):
        return None
    return {
        str(topic): {str(partition): int(offset) for partition, offset in (ends or {}).items()}
        for topic, ends in value.items()
    }


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


# -- where the connector stands ---------------------------------------------------------------------
REQUESTED = "requested"


@dataclass(frozen=True)
class IncrementalStanding:
    """The connector's incremental snapshot as its readers show it: ``requested`` (a request no
    window has taken up yet), ``running`` (``progress``), or the last one's outcome
    (``completed``/``stopped``, ``progress`` its counts and time); ``open`` says whether windows
    still have work to do for it."""

    status: str
    request: IncrementalRequest | None = None
    progress: IncrementalProgress | None = None

    @property
    def open(self) -> bool:
        return self.status in (REQUESTED, RUNNING)

    @property
    def request_id(self) -> str | None:
        if self.progress is not None:
            return self.progress.request_id
        return self.request.request_id if self.request is not None else None

    def marker(self) -> str:
        """Changes whenever a window moved it on (a chunk committed, a request taken up)."""
        progress = self.progress
        if progress is None:
            return f"{self.status}:{self.request_id}"
        return f"{progress.status}:{progress.request_id}:{progress.chunks}:{progress.documents}:{progress.rereads}"

    def to_json(self) -> dict[str, Any]:
        """What ``mongocdc offsets show`` says of it."""
        shown: dict[str, Any] = {"status": self.status, "id": self.request_id}
        if self.progress is not None:
            progress = self.progress
            shown.update(
                documents=progress.documents,
                chunks=progress.chunks,
                started_at=iso_z(progress.started_at),
                completed_at=iso_z(progress.completed_at),
                message=progress.message,
            )
        elif self.request is not None:
            shown.update(
                collections=list(self.request.collections), requested_at=iso_z(self.request.requested_at)
            )
        return shown


def incremental_standing(
    request: Mapping[str, Any] | None, progresses: Sequence[Mapping[str, Any] | None]
) -> IncrementalStanding | None:
    """Where the connector's incremental snapshot stands, from its stored request and the progress
    stored in each partition's offset (None: none was ever asked for). A request counts as
    requested only until a window takes it up (a progress of the same id): once that one completed
    or was stopped, the last outcome is shown, not the request."""
    found = [progress for progress in map(IncrementalProgress.from_json, progresses) if progress is not None]
    for progress in found:
        if progress.running:
            return IncrementalStanding(RUNNING, progress=progress)
    asked = IncrementalRequest.from_json(request) if request else None
    if asked is not None and not asked.stop and all(p.request_id != asked.request_id for p in found):
        return IncrementalStanding(REQUESTED, request=asked)
    if not found:
        return None
    earliest = datetime.min.replace(tzinfo=timezone.utc)
    last = max(found, key=lambda p: p.completed_at or p.started_at or earliest)
    return IncrementalStanding(last.status, request=asked, progress=last)
