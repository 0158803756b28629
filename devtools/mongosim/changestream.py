"""Change streams: ``$changeStream`` on a collection, a database or the whole deployment.

Events are built from the oplog the way MongoDB's ``ChangeStreamDefaultEventTransformation`` does
(field order included): ``_id`` (resume token), ``operationType``, ``clusterTime``,
``collectionUUID`` (showExpandedEvents only), ``wallTime``, ``fullDocument``, ``ns``, ``to``,
``documentKey``, ``updateDescription``; ``txnNumber``/``lsid`` on events of a transaction (which
share the commit's clusterTime and are ordered by ``txnOpIndex``). Through mongos the shards'
streams are merged in resume-token order (cluster time first).

The cursor keeps a resume position; every batch carries a ``postBatchResumeToken`` that is the
token of the last event returned or, once everything up to the latest oplog entry has been
scanned, the high-water mark of that entry's timestamp.
"""

from __future__ import annotations

import collections
import time

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from devtools.mongosim import bsonutil, diff, query, tokens
from devtools.mongosim.catalog import INTERNAL_DBS
from devtools.mongosim.errors import CommandError, fatal_change_stream, history_lost

ALLOWED_STAGES = {
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
}
SPLIT_STAGE = "$changeStreamSplitLargeEvent"
CRUD = {"i": "insert", "u": None, "d": "delete"}
DEFAULT_AWAIT_MS = 1000


class Spec:
    """The parsed ``$changeStream`` stage and the stages after it."""

    def __init__(self, stage: dict, pipeline: list, scope: tuple):
        if not isinstance(stage, dict):
            raise CommandError(
                50808, "$changeStream stage expects a document as argument", code_name="Location50808"
            )
        known = {
            "fullDocument",
            "fullDocumentBeforeChange",
            "resumeAfter",
            "startAfter",
            "startAtOperationTime",
            "allChangesForCluster",
            "showExpandedEvents",
            "showSystemEvents",
            "showRawUpdateDescription",
            "allowToRunOnConfigDB",
            "allowToRunOnSystemNS",
            "$_passthrough",
        }
        for key in stage:
            if key not in known:
                raise CommandError(
                    40415, f"BSON field '$changeStream.{key}' is an unknown field.", code_name="Location40415"
                )
        self.full_document = stage.get("fullDocument", "default")
        if self.full_document not in ("default", "updateLookup", "whenAvailable", "required"):
            raise CommandError(
                2,
                "Enumeration value '" + str(self.full_document) + "' for field "
                "'$changeStream.fullDocument' is not a valid value.",
                code_name="BadValue",
            )
        self.before = stage.get("fullDocumentBeforeChange", "off")
        if self.before not in ("off", "whenAvailable", "required"):
            raise CommandError(
                2,
                "Enumeration value '" + str(self.before) + "' for field "
                "'$changeStream.fullDocumentBeforeChange' is not a valid value.",
                code_name="BadValue",
            )
        options = [k for k in ("resumeAfter", "startAfter", "startAtOperationTime") if k in stage]
        if len(options) > 1:
            raise CommandError(
                40674,
                "Only one type of resume option is allowed, but multiple were found.",
                code_name="Location40674",
            )
        self.resume_after = stage.get("resumeAfter")
        self.start_after = stage.get("startAfter")
        self.start_at = stage.get("startAtOperationTime")
        if self.start_at is not None and not isinstance(self.start_at, Timestamp):
            raise CommandError(
                14,
                "BSON field '$changeStream.startAtOperationTime' is the wrong type, "
                "expected type 'timestamp'",
                code_name="TypeMismatch",
            )
        self.expanded = bool(stage.get("showExpandedEvents", False))
        self.scope = scope
        self.pipeline = []
        self.split = False
        for position, item in enumerate(pipeline):
            if not isinstance(item, dict) or len(item) != 1:
                raise CommandError(
                    40323,
                    "A pipeline stage specification object must contain exactly one field.",
                    code_name="Location40323",
                )
            name = next(iter(item))
            if name == "$changeStream":
                raise CommandError(
                    40602,
                    "$changeStream is only valid as the first stage in a pipeline.",
                    code_name="Location40602",
                )
            if name == SPLIT_STAGE:
                # MongoDB 7.0 / 6.0.9: one stage, the last one, with an empty document.
                if item[name] != {} and not (isinstance(item[name], dict) and not item[name]):
                    raise CommandError(
                        7182800,
                        "$changeStreamSplitLargeEvent stage expects an empty document as argument",
                        code_name="Location7182800",
                    )
                if self.split or position != len(pipeline) - 1:
                    raise CommandError(
                        7182802,
                        "$changeStreamSplitLargeEvent can only appear once, as the last stage of a "
                        "$changeStream pipeline",
                        code_name="Location7182802",
                    )
                self.split = True
                continue
            if name not in query.STAGES:
                raise query.unrecognized_stage(name)
            if name not in ALLOWED_STAGES:
                # Pipeline::validateCommon: a known stage that may not follow $changeStream.
                raise CommandError(20, f"{name} is not permitted in a $changeStream pipeline")
            self.pipeline.append(item)
        self._match_only = all(next(iter(s)) == "$match" for s in self.pipeline)
        self._matchers = (
            [query.compile_filter(s["$match"]) for s in self.pipeline] if self._match_only else []
        )

    def apply_pipeline(self, event: dict) -> dict | None:
        if not self.pipeline:
            return event
        if self._match_only:
            for matcher in self._matchers:
                if not matcher(event):
                    return None
            return event
        result = query.run_pipeline([event], self.pipeline)
        if not result:
            return None
        out = result[0]
        if "_id" not in out or not bsonutil.values_equal(out["_id"], event["_id"]):
            raise fatal_change_stream(
                "Encountered an event whose _id field, which contains the resume token, was modified by "
                "the pipeline. Modifying the _id field of an event makes it impossible to resume the "
                "stream from that point. Only transformations that retain the unmodified _id field are "
                "allowed."
            )
        return out


def _ns_parts(ns: str) -> tuple[str, str]:
    db, _, coll = ns.partition(".")
    return db, coll


def _visible_db(db: str) -> bool:
    return db not in INTERNAL_DBS


class _Raw:
    """An event candidate before lookups and the user pipeline."""

    __slots__ = ("sort_data", "event", "needs", "node", "position", "closes")

    def __init__(self, event: dict, needs: dict, node, position: tuple, closes: bool):
        self.event = event
        self.sort_data = event["_id"]["_data"]
        self.needs = needs
        self.node = node
        self.position = position
        self.closes = closes


def _event_id(op_type: str, document_key=None, description=None) -> dict:
    ident = {"operationType": op_type}
    if document_key is not None:
        ident["documentKey"] = document_key
    elif description is not None:
        ident["operationDescription"] = description
    return ident


class ChangeStreamCursor:
    """Server side of one change stream (a tailable, awaitData cursor)."""

    kind = "changeStream"

    def __init__(self, spec: Spec, nodes: list, deployment, lookup, ns: str, expect_sharded: bool = False):
        self.spec = spec
        self.nodes = nodes
        self.deployment = deployment
        self.lookup = lookup  # (db, coll, uuid, documentKey) -> doc | None
        self.ns = ns
        self.buffer: collections.deque = collections.deque()
        self.closed = False
        self.killed: CommandError | None = None
        self.expect_sharded = expect_sharded
        self.last_returned: str | None = None
        self.fragments: collections.deque = collections.deque()  # (RawBSONDocument, token)
        self.resume_fragment: tuple[str, int] | None = None  # (event token, fragments already read)
        self._start()

    # -- start / resume --------------------------------------------------------------------------
    def _history_lost(self, key: int) -> bool:
        """Whether a node's oplog no longer reaches back to ``key`` (MongoDB checks each shard's
        first oplog entry; one that is the replica set's initiation covers any earlier time, so a
        shard added after ``key`` does not fail the stream)."""
        return any(n.oplog is not None and not n.oplog.covers(key) for n in self.nodes)

    def _start(self) -> None:
        spec = self.spec
        token = spec.resume_after if spec.resume_after is not None else spec.start_after
        if token is not None:
            try:
                data = tokens.decode_token(token)
            except tokens.TokenError as error:
                raise CommandError(260, f"Failed to decode resume token: {error}") from error
            if data.from_invalidate and spec.resume_after is not None:
                raise CommandError(
                    260,
                    "Attempting to resume a change stream using 'resumeAfter' is not "
                    "allowed from an invalidate notification.",
                )
            key = bsonutil.ts_key(data.cluster_time)
            if self._history_lost(key):
                raise history_lost("aggregate")
            self.position = data.position()
            self.position_data = data.data
            self.scan_key = key
            self.pbrt = {"_data": data.data}
            if not data.is_high_water_mark:
                fragment = self._verify_token_present(data)
                if fragment is not None:
                    # A fragment's token: the stream goes on with the event's next fragment (after
                    # the last one, with the next event), so the event itself is read again.
                    event_data, number = fragment
                    self.position = self.position[:3] + (-1,)
                    self.resume_fragment = (event_data, number + 1)
            return
        if spec.start_at is not None:
            key = bsonutil.ts_key(spec.start_at)
            if self._history_lost(key):
                raise history_lost("aggregate")
        else:
            key = bsonutil.ts_key(self.deployment.clock.peek_next())
        start_ts = bsonutil.ts_from_key(key)
        self.position = (key, 0, 0, 0)
        self.position_data = tokens.high_water_mark(start_ts)["_data"]
        self.scan_key = key
        self.pbrt = tokens.high_water_mark(start_ts)

    def _verify_token_present(self, data: tokens.TokenData) -> tuple[str, int] | None:
        """Check that the token names an event; returns (event token, fragment number) when it
        is the token of a ``$changeStreamSplitLargeEvent`` fragment of that event."""
        key = bsonutil.ts_key(data.cluster_time)
        latest = max((n.oplog.latest_key or 0) for n in self.nodes if n.oplog is not None)
        if key > latest:
            return None
        for node in self.nodes:
            if node.oplog is None:
                continue
            for entry in node.oplog.entries_at(key):
                for raw in self._events_of(node, entry):
                    if raw.sort_data == data.data:
                        return None
                    fragment = tokens.fragment_of(data.data, raw.sort_data)
                    if fragment is not None:
                        if not self.spec.split:
                            raise fatal_change_stream(
                                "PlanExecutor error during aggregation :: caused by :: Attempted "
                                "to resume from a split event fragment, but the change stream has "
                                "no $changeStreamSplitLargeEvent stage"
                            )
                        return raw.sort_data, fragment
        raise fatal_change_stream(
            "PlanExecutor error during aggregation :: caused by :: cannot resume stream; the resume "
            f'token was not found. {{_data: "{data.data}"}}'
        )

    # -- scope -----------------------------------------------------------------------------------
    def _in_scope_ns(self, db: str, coll: str) -> bool:
        scope = self.spec.scope
        if scope[0] == "collection":
            return db == scope[1] and coll == scope[2]
        if not _visible_db(db) or coll.startswith("system."):
            return False
        if scope[0] == "database":
            return db == scope[1]
        return True

    # -- oplog entry -> events -------------------------------------------------------------------
    def _events_of(self, node, entry: dict) -> list[_Raw]:
        op = entry["op"]
        if entry.get("fromMigrate"):
            return []
        ts = entry["ts"]
        wall = entry["wall"]
        if op in ("i", "u", "d"):
            return self._crud_events(node, entry, ts, wall, None, None, 0)
        if op != "c":
            return []
        o = entry["o"]
        if "applyOps" in o:
            out = []
            txn = {"txnNumber": entry.get("txnNumber"), "lsid": entry.get("lsid")}
            for index, inner in enumerate(o["applyOps"]):
                if inner["op"] in ("i", "u", "d"):
                    out.extend(self._crud_events(node, inner, ts, wall, txn, index, index))
                elif inner["op"] == "c" and self.spec.expanded:
                    out.extend(self._command_events(node, inner, ts, wall, txn, index))
            return out
        return self._command_events(node, entry, ts, wall, None, 0)

    def _crud_events(self, node, op: dict, ts, wall, txn, txn_op_index, apply_index) -> list[_Raw]:
        db, coll = _ns_parts(op["ns"])
        if not self._in_scope_ns(db, coll):
            return []
        kind = op["op"]
        uuid = op.get("ui")
        full_document = None
        update_description = None
        if kind == "i":
            op_type = "insert"
            full_document = op["o"]
            document_key = op.get("o2") or {"_id": op["o"]["_id"]}
        elif kind == "d":
            op_type = "delete"
            document_key = op["o"]
        else:
            document_key = op["o2"]
            if "_id" in op["o"]:
                op_type = "replace"
                full_document = op["o"]
            else:
                op_type = "update"
                update_description = diff.parse_diff(op["o"]["diff"], disambiguate=self.spec.expanded)
        index = txn_op_index or 0
        token = tokens.encode_token(
            ts, tokens.TOKEN_TYPE_EVENT, index, False, uuid, _event_id(op_type, document_key)
        )
        event: dict = {}
        if txn is not None:
            if txn.get("txnNumber") is not None:
                event["txnNumber"] = txn["txnNumber"]
            if txn.get("lsid") is not None:
                event["lsid"] = txn["lsid"]
        event["_id"] = token
        event["operationType"] = op_type
        event["clusterTime"] = ts
        if self.spec.expanded and uuid is not None:
            event["collectionUUID"] = uuid
        event["wallTime"] = wall
        if full_document is not None:
            event["fullDocument"] = full_document
        event["ns"] = {"db": db, "coll": coll}
        event["documentKey"] = document_key
        if update_description is not None:
            event["updateDescription"] = update_description
        needs = {"uuid": uuid, "ts": ts, "apply_index": apply_index or 0, "db": db, "coll": coll}
        position = (bsonutil.ts_key(ts), tokens.TOKEN_TYPE_EVENT, index, 0)
        return [_Raw(event, needs, node, position, False)]

    def _command_events(self, node, entry: dict, ts, wall, txn, txn_op_index) -> list[_Raw]:
        o = entry["o"]
        db = entry["ns"].split(".", 1)[0]
        uuid = entry.get("ui")
        scope = self.spec.scope
        events = []
        invalidates = False
        extra_first: dict = {}
        description = None
        if "drop" in o:
            coll = o["drop"]
            op_type = "drop"
            ns = {"db": db, "coll": coll}
            if scope[0] == "collection":
                if (db, coll) != (scope[1], scope[2]):
                    return []
                invalidates = True
            elif not self._in_scope_ns(db, coll):
                return []
        elif "renameCollection" in o:
            sdb, scoll = _ns_parts(o["renameCollection"])
            tdb, tcoll = _ns_parts(o["to"])
            op_type = "rename"
            ns = {"db": sdb, "coll": scoll}
            to = {"db": tdb, "coll": tcoll}
            extra_first["to"] = to
            description = {"to": to}
            if "dropTarget" in o:
                description["dropTarget"] = o["dropTarget"]
            if scope[0] == "collection":
                watched = (scope[1], scope[2])
                if watched not in ((sdb, scoll), (tdb, tcoll)):
                    return []
                invalidates = True
            elif not (self._in_scope_ns(sdb, scoll) or self._in_scope_ns(tdb, tcoll)):
                return []
        elif "dropDatabase" in o:
            op_type = "dropDatabase"
            ns = {"db": db}
            uuid = None
            if scope[0] == "collection":
                return []
            if scope[0] == "database":
                if db != scope[1]:
                    return []
                invalidates = True
            elif not _visible_db(db):
                return []
        elif self.spec.expanded and any(
            k in o for k in ("create", "createIndexes", "dropIndexes", "collMod")
        ):
            name_field = next(k for k in ("create", "createIndexes", "dropIndexes", "collMod") if k in o)
            coll = o[name_field]
            if not self._in_scope_ns(db, coll):
                return []
            op_type = {
                "create": "create",
                "createIndexes": "createIndexes",
                "dropIndexes": "dropIndexes",
                "collMod": "modify",
            }[name_field]
            ns = {"db": db, "coll": coll}
            rest = {k: v for k, v in o.items() if k != name_field}
            if name_field == "createIndexes":
                description = {"indexes": [rest]}
            elif name_field == "dropIndexes":
                description = {"indexes": [entry.get("o2", {})]}
            else:
                description = rest
        else:
            return []
        index = txn_op_index or 0
        token = tokens.encode_token(
            ts, tokens.TOKEN_TYPE_EVENT, index, False, uuid, _event_id(op_type, None, description)
        )
        event = dict(extra_first)
        if txn is not None:
            if txn.get("txnNumber") is not None:
                event["txnNumber"] = txn["txnNumber"]
            if txn.get("lsid") is not None:
                event["lsid"] = txn["lsid"]
        event["_id"] = token
        event["operationType"] = op_type
        event["clusterTime"] = ts
        if self.spec.expanded and uuid is not None:
            event["collectionUUID"] = uuid
        event["wallTime"] = wall
        event["ns"] = ns
        if self.spec.expanded and description is not None and op_type != "rename":
            event["operationDescription"] = description
        elif self.spec.expanded and op_type == "rename":
            event["operationDescription"] = description
        position = (bsonutil.ts_key(ts), tokens.TOKEN_TYPE_EVENT, index, 0)
        events.append(_Raw(event, {}, node, position, False))
        if invalidates:
            inv_token = tokens.encode_token(
                ts, tokens.TOKEN_TYPE_EVENT, index, True, uuid, _event_id(op_type, None, description)
            )
            invalidate = {
                "_id": inv_token,
                "operationType": "invalidate",
                "clusterTime": ts,
                "wallTime": wall,
            }
            events.append(_Raw(invalidate, {}, node, (position[0], position[1], position[2], 1), True))
        return events

    # -- reading ---------------------------------------------------------------------------------
    def _scan(self) -> None:
        """Move oplog entries with ts >= scan_key into the buffer (caller holds the lock)."""
        upto = bsonutil.ts_key(self.deployment.clock.now)
        if upto < self.scan_key:
            return
        candidates: list[_Raw] = []
        for node in self.nodes:
            oplog = node.oplog
            if oplog is None:
                continue
            if oplog.dropped_through >= self.scan_key:
                raise history_lost("getMore")
            start = oplog.index_at_or_after(self.scan_key)
            end = oplog.index_after(upto)
            for i in range(start, end):
                entry = oplog.entries[i]
                for raw in self._events_of(node, entry):
                    if raw.position > self.position:
                        candidates.append(raw)
        if len(self.nodes) > 1:
            candidates.sort(key=lambda r: r.sort_data)
        self.buffer.extend(candidates)
        self.scan_key = upto + 1
        self._scanned_hwm = upto

    def _finish(self, raw: _Raw) -> dict | None:
        """Lookups (fullDocument, pre-image) and the user pipeline for one event."""
        event = raw.event
        spec = self.spec
        op_type = event["operationType"]
        needs = raw.needs
        if op_type in ("update", "replace", "delete") and needs:
            pre = None
            post = None
            stored = (
                raw.node.preimage(needs["uuid"], needs["ts"], needs["apply_index"]) if needs["uuid"] else None
            )
            if stored is not None:
                pre = stored
            if op_type == "update" and spec.full_document != "default":
                event = dict(event)
                if spec.full_document == "updateLookup":
                    event["fullDocument"] = self.lookup(
                        needs["db"], needs["coll"], needs["uuid"], event["documentKey"]
                    )
                else:
                    if pre is not None:
                        post = raw.node.postimage(needs["uuid"], needs["ts"], needs["apply_index"])
                    if post is None and spec.full_document == "required":
                        raise CommandError(
                            47,
                            "Change stream was configured to require a post-image for "
                            "all update events, but the post-image was not found for event: "
                            + _describe(event),
                        )
                    event["fullDocument"] = post
            if spec.before != "off":
                if pre is None and spec.before == "required":
                    raise CommandError(
                        47,
                        "Change stream was configured to require a pre-image for all "
                        "update, delete and replace events, but the pre-image was not found "
                        "for event: " + _describe(event),
                    )
                event = dict(event)
                event["fullDocumentBeforeChange"] = pre
        return spec.apply_pipeline(event)

    def next_batch(self, batch_size: int | None, await_ms: float | None, first: bool) -> tuple[list, bool]:
        """(events as RawBSONDocuments, closed). Caller holds the deployment lock."""
        if batch_size == 0:
            return [], self.closed
        limit = batch_size if batch_size is not None else 0
        out: list = []
        total = 0
        deadline = None if first or await_ms is None else time.monotonic() + await_ms / 1000.0
        while True:
            if self.killed is not None:
                raise self.killed
            while self.fragments and (limit <= 0 or len(out) < limit):
                fragment, token = self.fragments[0]
                if out and total + len(fragment.raw) > bsonutil.MAX_BSON_SIZE:
                    break
                self.fragments.popleft()
                total += len(fragment.raw)
                out.append(fragment)
                self.pbrt = token
            if self.fragments:
                return out, self.closed
            if not self.buffer:
                self._scan()
            while self.buffer and (limit <= 0 or len(out) < limit) and not self.closed:
                raw = self.buffer[0]
                event = self._finish(raw)
                self.buffer.popleft()
                self.position = raw.position
                self.position_data = raw.sort_data
                if raw.closes:
                    self.closed = True
                if event is None:
                    continue
                encoded = bsonutil.encode(event)
                resume = self.resume_fragment
                self.resume_fragment = None
                if self.spec.split and len(encoded) > bsonutil.MAX_BSON_SIZE:
                    fragments = split_event(event, first)
                    skip = resume[1] if resume is not None and resume[0] == raw.sort_data else 0
                    self.fragments.extend(fragments[skip:])
                    self.last_returned = raw.sort_data
                    if not self.fragments:  # resumed after the last fragment
                        self.pbrt = fragments[-1][1]
                        continue
                    if out:
                        return out, self.closed
                    return self.next_batch(batch_size, await_ms, first)
                if len(encoded) > bsonutil.MAX_INTERNAL_BSON_SIZE:
                    prefix = (
                        "PlanExecutor error during aggregation :: caused by :: "
                        if first
                        else "Executor error during getMore :: caused by :: "
                    )
                    raise CommandError(
                        10334,
                        f"{prefix}BSONObj size: {len(encoded)} "
                        f"({hex(len(encoded)).upper().replace('0X', '0x')}) is invalid. Size must "
                        'be between 0 and 16793600(16MB) First element: _id: { _data: "'
                        f'{event["_id"]["_data"]}" }}',
                    )
                if out and total + len(encoded) > bsonutil.MAX_BSON_SIZE:
                    # Does not fit: give it back for the next batch.
                    self.buffer.appendleft(raw)
                    self.closed = False
                    break
                total += len(encoded)
                out.append(RawBSONDocument(encoded))
                self.last_returned = raw.sort_data
                self.pbrt = {"_data": raw.sort_data}
                if limit > 0 and len(out) >= limit:
                    break
            if not self.buffer and not self.closed:
                hwm_key = getattr(self, "_scanned_hwm", None)
                if hwm_key is not None:
                    hwm = tokens.high_water_mark(bsonutil.ts_from_key(hwm_key))
                    if hwm["_data"] > self.pbrt["_data"]:
                        self.pbrt = hwm
                        self.position = max(self.position, (hwm_key, 0, 0, 0))
            if out or self.closed or deadline is None:
                return out, self.closed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out, self.closed
            self.deployment.cv.wait(min(remaining, 0.25))

    def kill(self, error: CommandError) -> None:
        self.killed = error
        self.deployment.notify()


def split_event(event: dict, first: bool) -> list[tuple[RawBSONDocument, dict]]:
    """The fragments ``$changeStreamSplitLargeEvent`` makes of an event over 16 MB, with their
    resume tokens.

    As MongoDB documents it: only top-level fields are sized (a field that alone does not fit
    fails with ``BSONObjectTooLarge``); the fields are placed so that the first fragment holds as
    many as possible (smallest first); each fragment is ``{_id: <token>, splitEvent: {fragment:
    n, of: m}, ...fields}`` and has its own token, the event's token with the fragment number
    (0-based) as suffix; resuming from one continues with the next fragment.
    """
    token = event["_id"]
    fields = [(name, value) for name, value in event.items() if name != "_id"]
    sizes = {name: len(bsonutil.encode({name: value})) - 5 for name, value in fields}
    ordered = sorted(fields, key=lambda item: sizes[item[0]])
    overhead = len(bsonutil.encode({"_id": token, "splitEvent": {"fragment": 1, "of": 1}})) + 32
    groups: list[list] = [[]]
    used = overhead
    for name, value in ordered:
        if overhead + sizes[name] > bsonutil.MAX_BSON_SIZE:
            prefix = (
                "PlanExecutor error during aggregation :: caused by :: "
                if first
                else "Executor error during getMore :: caused by :: "
            )
            raise CommandError(
                10334,
                f"{prefix}BSONObj size: {sizes[name] + overhead} is invalid. Size must be between 0 and "
                f'16793600(16MB) First element: _id: {{ _data: "{token["_data"]}" }}',
                code_name="BSONObjectTooLarge",
            )
        if groups[-1] and used + sizes[name] > bsonutil.MAX_BSON_SIZE:
            groups.append([])
            used = overhead
        groups[-1].append((name, value))
        used += sizes[name]
    data = tokens.decode_token(token)
    out = []
    for number, group in enumerate(groups):
        fragment_token = {"_data": token["_data"][:-2] + _fragment_suffix(number)}
        assert data.data == token["_data"]
        doc = {"_id": fragment_token, "splitEvent": {"fragment": number + 1, "of": len(groups)}}
        doc.update(group)
        out.append((RawBSONDocument(bsonutil.encode(doc)), fragment_token))
    return out


def _fragment_suffix(number: int) -> str:
    out = bytearray()
    tokens._encode_number(number, out)  # pylint: disable=protected-access
    out.append(tokens.K_END)
    return out.hex().upper()


def _describe(event: dict) -> str:
    parts = [f'operationType: "{event.get("operationType")}"']
    if "ns" in event:
        parts.append("ns: " + bsonutil.to_relaxed_json(event["ns"]))
    parts.append("clusterTime: " + bsonutil.to_relaxed_json(event.get("clusterTime")))
    parts.append("txnNumber: " + (str(event["txnNumber"]) if "txnNumber" in event else "missing"))
    return "{" + ", ".join(parts) + "}"
