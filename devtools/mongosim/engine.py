"""The data of one replica set (or standalone server): collections, writes, the oplog, sessions,
retryable writes and multi-document transactions.

Every method runs with the deployment lock held (``Deployment.lock``). Writes outside a
transaction are applied at once and logged one oplog entry each (``op`` i/u/d/c, ``ui``, ``o``,
``o2``, ``ts``, ``t``, ``v``, ``wall`` and, for retryable writes, ``lsid``/``txnNumber``/``stmtId``/
``prevOpTime``). A transaction works on a snapshot of the data taken at its first operation; its
writes become visible, and reach the oplog as one ``applyOps`` entry, only when it commits.
"""

from __future__ import annotations

import collections
import hashlib
import time
import uuid

from bson.binary import Binary
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from devtools.mongosim import bsonutil, diff, query
from devtools.mongosim.catalog import ID_INDEX, Catalog, Collection, valid_collection_name, valid_db_name
from devtools.mongosim.errors import CommandError
from devtools.mongosim.oplog import Oplog, wall_now

TRANSACTION_LIFETIME_S = 60.0
# minSnapshotHistoryWindowInSeconds: how far back snapshot reads (readConcern snapshot with
# atClusterTime) can look (MongoDB's documentation of the server parameter: 300 s by default).
SNAPSHOT_HISTORY_S = 300.0
LOCK_WAIT_S = 60.0
EMPTY_UID = Binary(hashlib.sha256(b"").digest(), 0)


def write_conflict() -> CommandError:
    return CommandError(
        112,
        "Caused by :: Write conflict during plan execution and yielding is "
        "disabled. :: Please retry your operation or multi-document transaction.",
    )


def no_such_transaction(txn_number) -> CommandError:
    return CommandError(
        251,
        f"Transaction with {{ txnNumber: {txn_number} }} has been aborted.",
    )


class Session:
    def __init__(self, lsid: dict, uid: Binary):
        self.lsid = {"id": lsid["id"], "uid": uid}
        self.last_txn_number = -1
        self.txn: Txn | None = None
        self.outcomes: dict[int, str] = {}  # txnNumber -> committed / aborted
        self.commit_replies: dict[int, Timestamp] = {}
        # statement (index in its command) -> its result, for the retryable write last_txn_number
        self.statements: dict[int, dict] = {}
        self.last_write_op_time: Timestamp | None = None
        self.last_used = time.monotonic()
        self.last_use = wall_now()


class Txn:
    def __init__(self, node: DataNode, session: Session, txn_number: int):
        self.node = node
        self.session = session
        self.txn_number = txn_number
        self.colls: dict[str, Collection] = {}
        self.snapshot: dict[str, dict] = {}
        for coll in node.catalog.all_collections():
            self.colls[coll.ns] = coll
            self.snapshot[coll.ns] = dict(coll.docs)
        self.created: dict[str, Collection] = {}
        self.ops: list[dict] = []
        self.op_colls: list[Collection] = []
        self.preimages: list[tuple | None] = []
        self.base: dict = {}
        self.state = "in_progress"
        self.started = time.monotonic()
        self.commit_ts: Timestamp | None = None


class OpCtx:
    """What a command runs with: the node, the session/transaction, the caller."""

    def __init__(
        self,
        node: DataNode,
        db: str = "admin",
        session: Session | None = None,
        txn: Txn | None = None,
        txn_number: int | None = None,
        retryable: bool = False,
        user: str | None = None,
    ):
        self.node = node
        self.db = db
        self.session = session
        self.txn = txn
        self.txn_number = txn_number
        self.retryable = retryable
        self.user = user
        self.stmt_id = 0
        self.op_time: Timestamp | None = None
        self.from_migrate = False
        self.read_at: Timestamp | None = None  # a snapshot read outside a transaction: its atClusterTime
        self.executed: dict | None = None  # a retryable write's executed statements (Session.statements)
        self.write_fail_point = None  # the primary's onPrimaryTransactionalWrite fail point
        self.write_check_pending = False  # the fail point fires at the next write
        self.close_connection = False  # that fail point fired: no reply

    def before_write(self) -> None:
        """The primary's ``onPrimaryTransactionalWrite`` fail point, evaluated when a retryable
        write is about to be written (once per statement, or per insert batch), as MongoDB's
        TransactionParticipant does after each write: ``closeConnection`` (default true) drops
        the reply, ``failBeforeCommitExceptionCode`` fails the statement before it is written."""
        if not self.write_check_pending or self.write_fail_point is None:
            return
        self.write_check_pending = False
        data = self.write_fail_point.fire()
        if data is None:
            return
        if data.get("closeConnection", True):
            self.close_connection = True
        code = data.get("failBeforeCommitExceptionCode")
        if code is not None:
            error = CommandError(
                int(code),
                f"Failing write for {lsid_text(self.session.lsid)}:{self.txn_number} due to failpoint. "
                "The write must not be reflected.",
            )
            error.write_fail_point = True
            raise error


class DataNode:
    def __init__(
        self,
        deployment,
        name: str | None,
        oplog: bool = True,
        max_entries: int | None = None,
        max_bytes: int | None = None,
    ):
        self.deployment = deployment
        self.name = name
        self.catalog = Catalog()
        self.oplog: Oplog | None = Oplog(max_entries, max_bytes) if oplog else None
        self.preimages: collections.OrderedDict[tuple, dict] = collections.OrderedDict()
        if self.oplog is not None:
            self.oplog.on_truncate = self._truncate_preimages
        self.sessions: dict[bytes, Session] = {}
        self.locks: dict[tuple, Txn] = {}
        self.term = 1
        self.oplog_uuid = Binary(__import__("uuid").uuid4().bytes, 4)
        self.last_write: Timestamp = deployment.clock.now
        self.last_write_wall = wall_now()
        # Recent document versions for snapshot reads: (ts key, ns, id key, document before the
        # write or None, when), oldest first, kept for SNAPSHOT_HISTORY_S.
        self.history: collections.deque = collections.deque()
        self.history_floor = bsonutil.ts_key(self.last_write)  # no snapshot read before this

    # -- clock / oplog ---------------------------------------------------------------------------
    @property
    def clock(self):
        return self.deployment.clock

    def _entry(self, ctx: OpCtx | None, op: str, ns: str, o: dict, ui=None, o2=None, ts=None) -> dict:
        entry: dict = {}
        session_fields = ctx is not None and ctx.retryable and ctx.session is not None
        if session_fields:
            entry["lsid"] = ctx.session.lsid
            entry["txnNumber"] = Int64(ctx.txn_number)
        entry["op"] = op
        entry["ns"] = ns
        if ui is not None:
            entry["ui"] = ui
        entry["o"] = o
        if o2 is not None:
            entry["o2"] = o2
        if session_fields:
            entry["stmtId"] = ctx.stmt_id
            ctx.stmt_id += 1
        if ctx is not None and ctx.from_migrate:
            entry["fromMigrate"] = True
        entry["ts"] = ts or self.clock.tick()
        entry["t"] = Int64(self.term)
        entry["v"] = Int64(2)
        entry["wall"] = wall_now()
        if session_fields:
            previous = ctx.session.last_write_op_time
            entry["prevOpTime"] = {
                "ts": previous or Timestamp(0, 0),
                "t": Int64(self.term if previous else -1),
            }
        return entry

    def log(self, entry: dict, ctx: OpCtx | None = None) -> Timestamp:
        ts = entry["ts"]
        if self.oplog is not None:
            self.oplog.append(entry)
        self.last_write = ts
        self.last_write_wall = entry["wall"]
        if ctx is not None:
            ctx.op_time = ts
            if ctx.retryable and ctx.session is not None:
                ctx.session.last_write_op_time = ts
        self.deployment.notify()
        return ts

    def log_noop(self, message: str) -> None:
        if self.oplog is None:
            return
        self.log(self._entry(None, "n", "", {"msg": message}))

    def kill_sessions(self, keys: set | None) -> None:
        """Abort the open transactions of these sessions (keys: ``session_key``s; None: all)."""
        for key, session in self.sessions.items():
            if (keys is None or key in keys) and session.txn is not None:
                self.abort_transaction(session.txn)

    def _truncate_preimages(self, oldest_key: int) -> None:
        while self.preimages:
            key = next(iter(self.preimages))
            if key[1] >= oldest_key:
                break
            self.preimages.popitem(last=False)

    def preimage(self, uuid: Binary, ts: Timestamp, index: int):
        images = self.preimages.get((bytes(uuid), bsonutil.ts_key(ts), index))
        return images[0] if images else None

    def postimage(self, uuid: Binary, ts: Timestamp, index: int):
        images = self.preimages.get((bytes(uuid), bsonutil.ts_key(ts), index))
        return images[1] if images else None

    # -- sessions --------------------------------------------------------------------------------
    def session(self, lsid: dict, user: str | None) -> Session:
        key = session_key(lsid)
        session = self.sessions.get(key)
        if session is None:
            uid = Binary(hashlib.sha256((user or "").encode()).digest(), 0) if user else EMPTY_UID
            session = self.sessions[key] = Session(lsid, uid)
        session.last_used = time.monotonic()
        session.last_use = wall_now()
        return session

    # -- reading ---------------------------------------------------------------------------------
    def view(self, ctx: OpCtx, db: str, name: str) -> tuple[Collection | None, dict]:
        ns = f"{db}.{name}"
        if ctx.txn is not None:
            coll = ctx.txn.colls.get(ns)
            if coll is None:
                return None, {}
            return coll, ctx.txn.snapshot[ns]
        coll = self.catalog.get(db, name)
        if coll is None:
            return None, {}
        if ctx.read_at is not None:
            return coll, self.docs_at(coll, ctx.read_at)
        return coll, coll.docs

    # -- snapshot history ------------------------------------------------------------------------
    def remember(self, ns: str, key, before: dict | None, ts: Timestamp) -> None:
        """Keep the version a write replaced, for snapshot reads at an earlier cluster time."""
        now = time.monotonic()
        self.history.append((bsonutil.ts_key(ts), ns, key, before, now))
        while self.history and now - self.history[0][4] > SNAPSHOT_HISTORY_S:
            self.history_floor = self.history.popleft()[0]

    def check_snapshot(self, at: Timestamp) -> None:
        """MongoDB refuses a snapshot read older than its history window (SnapshotTooOld)."""
        if bsonutil.ts_key(at) < self.history_floor:
            raise CommandError(
                239,
                f"Read timestamp {at} is older than the oldest available timestamp.",
                code_name="SnapshotTooOld",
            )

    def docs_at(self, coll: Collection, at: Timestamp) -> dict:
        """A collection's documents as they were at cluster time ``at`` (the versions written
        after it replaced by the ones before)."""
        limit = bsonutil.ts_key(at)
        older: dict = {}
        for ts_key, ns, key, before, _when in reversed(self.history):
            if ts_key <= limit:
                break
            if ns == coll.ns:
                older[key] = before
        if not older:
            return coll.docs
        docs = dict(coll.docs)
        for key, before in older.items():
            if before is None:
                docs.pop(key, None)
            else:
                docs[key] = before
        return docs

    def candidates(self, docs: dict, spec) -> list:
        """Documents matching a filter, in natural order."""
        is_id, value = query.id_equality(spec)
        if is_id:
            doc = docs.get(bsonutil.id_key(value))
            return [doc] if doc is not None else []
        pred = query.compile_filter(spec)
        return [d for d in list(docs.values()) if pred(d)]

    def document_key(self, coll: Collection, doc: dict) -> dict:
        if coll.shard_key:
            key = {}
            for field in coll.shard_key:
                if field == "_id":
                    continue
                value = query.get_path(doc, field, None)
                key[field] = value
            key["_id"] = doc["_id"]
            return key
        return {"_id": doc["_id"]}

    # -- catalog writes --------------------------------------------------------------------------
    def ensure_collection(self, ctx: OpCtx, db: str, name: str, options: dict | None = None) -> Collection:
        if ctx.txn is None:
            existing = self.catalog.get(db, name)
            if existing is not None:
                return existing
        check_namespace(db, name)
        ns = f"{db}.{name}"
        if ctx.txn is not None:
            coll = ctx.txn.colls.get(ns)
            if coll is not None:
                return coll
            live = self.catalog.get(db, name)
            if live is not None:
                ctx.txn.colls[ns] = live
                ctx.txn.snapshot[ns] = dict(live.docs)
                return live
            coll = Collection(db, name, options)
            ctx.txn.colls[ns] = coll
            ctx.txn.snapshot[ns] = {}
            ctx.txn.created[ns] = coll
            self._txn_append(ctx, coll, self._create_op(coll), None)
            return coll
        coll = self.catalog.get(db, name)
        if coll is None:
            coll = Collection(db, name, options)
            self.catalog.add(coll)
            ctx.op_time = self.log(
                self._entry(_ddl(ctx), "c", f"{db}.$cmd", self._create_o(coll), ui=coll.uuid)
            )
        return coll

    @staticmethod
    def _create_o(coll: Collection) -> dict:
        o = {"create": coll.name}
        o.update(coll.options)
        o["idIndex"] = dict(ID_INDEX)
        return o

    def _create_op(self, coll: Collection) -> dict:
        return {"op": "c", "ns": f"{coll.db}.$cmd", "ui": coll.uuid, "o": self._create_o(coll)}

    def create_collection(self, ctx: OpCtx, db: str, name: str, options: dict) -> None:
        check_namespace(db, name)
        existing = self.view(ctx, db, name)[0]
        if existing is not None:
            # Outside a transaction, creating an existing collection with the same options is a
            # no-op; inside one it fails (MongoDB's create command).
            if ctx.txn is None and _options_equal(existing.options, options):
                return
            raise CommandError(48, f"Collection {db}.{name} already exists.")
        self.ensure_collection(ctx, db, name, options)

    def drop_collection(self, ctx: OpCtx, db: str, name: str) -> bool:
        coll = self.catalog.get(db, name)
        if coll is None:
            return False
        self._check_not_locked(coll)
        self.catalog.remove(db, name)
        count = len(coll.docs)
        self.log(
            self._entry(
                _ddl(ctx), "c", f"{db}.$cmd", {"drop": name}, ui=coll.uuid, o2={"numRecords": Int64(count)}
            ),
            ctx,
        )
        return True

    def drop_database(self, ctx: OpCtx, db: str) -> None:
        for coll in self.catalog.collections(db):
            self.drop_collection(ctx, db, coll.name)
        self.log(self._entry(_ddl(ctx), "c", f"{db}.$cmd", {"dropDatabase": 1}), ctx)

    def rename_collection(self, ctx: OpCtx, source: str, target: str, drop_target: bool) -> None:
        sdb, _, sname = source.partition(".")
        tdb, _, tname = target.partition(".")
        check_namespace(tdb, tname)
        coll = self.catalog.get(sdb, sname)
        if coll is None:
            raise CommandError(26, "Source collection " + source + " does not exist")
        if source == target:
            raise CommandError(20, "Can't rename a collection to itself")
        existing = self.catalog.get(tdb, tname)
        o = {"renameCollection": source, "to": target, "stayTemp": False}
        if existing is not None:
            if not drop_target:
                raise CommandError(48, "target namespace exists")
            self._check_not_locked(existing)
            self.catalog.remove(tdb, tname)
            o["dropTarget"] = existing.uuid
        self._check_not_locked(coll)
        self.catalog.remove(sdb, sname)
        renamed = coll.clone_empty(tdb, tname)
        renamed.docs = coll.docs
        renamed.sizes = coll.sizes
        renamed.total_size = coll.total_size
        self.catalog.add(renamed)
        self.log(self._entry(_ddl(ctx), "c", f"{sdb}.$cmd", o, ui=coll.uuid), ctx)

    def coll_mod(self, ctx: OpCtx, db: str, name: str, changes: dict) -> dict:
        coll = self.catalog.get(db, name)
        if coll is None:
            raise CommandError(26, f"ns does not exist: {db}.{name}")
        old_options = dict(coll.options)
        for key, value in changes.items():
            if key == "changeStreamPreAndPostImages":
                if not isinstance(value, dict) or "enabled" not in value:
                    raise CommandError(
                        40414,
                        "BSON field 'changeStreamPreAndPostImages.enabled' is missing but a required field",
                        code_name="Location40414",
                    )
                if value.get("enabled"):
                    coll.options[key] = {"enabled": True}
                else:
                    coll.options.pop(key, None)
            elif key in (
                "validator",
                "validationLevel",
                "validationAction",
                "expireAfterSeconds",
                "comment",
                "index",
            ):
                if key != "comment" and key != "index":
                    coll.options[key] = value
            else:
                raise CommandError(
                    40415, f"BSON field 'collMod.{key}' is an unknown field.", code_name="Location40415"
                )
        o = {"collMod": name}
        o.update({k: v for k, v in changes.items() if k != "comment"})
        self.log(
            self._entry(
                _ddl(ctx), "c", f"{db}.$cmd", o, ui=coll.uuid, o2={"collectionOptions_old": old_options}
            ),
            ctx,
        )
        return old_options

    def create_indexes(self, ctx: OpCtx, db: str, name: str, indexes: list) -> tuple[int, int, bool]:
        created = self.view(ctx, db, name)[0] is None
        coll = self.ensure_collection(ctx, db, name)
        before = len(coll.indexes)
        for spec in indexes:
            if not isinstance(spec, dict) or not isinstance(spec.get("key"), dict) or not spec["key"]:
                raise CommandError(
                    9, "Error in specification: the 'key' field is required", code_name="FailedToParse"
                )
            if "name" not in spec:
                raise CommandError(
                    9, "Error in specification: the 'name' field is required", code_name="FailedToParse"
                )
            same_name = next((i for i in coll.indexes if i["name"] == spec["name"]), None)
            if same_name is not None:
                if dict(same_name["key"]) != dict(spec["key"]):
                    raise CommandError(
                        86,
                        "An existing index has the same name as the requested index. "
                        f"When index names are not specified, they are auto generated and "
                        f"can cause conflicts. Please refer to our documentation. Requested "
                        f"index: {spec}, existing index: {same_name}",
                    )
                continue
            if any(dict(i["key"]) == dict(spec["key"]) for i in coll.indexes):
                continue
            if ctx.txn is not None and coll.ns not in ctx.txn.created:
                # An index build takes an exclusive lock: inside a transaction only a collection
                # the transaction created gets new indexes (create_indexes.cpp).
                raise CommandError(
                    263,
                    f"Cannot create new indexes on existing collection {coll.ns} in a multi-document "
                    "transaction.",
                )
            index = {"v": 2, "key": dict(spec["key"]), "name": spec["name"]}
            index.update({k: v for k, v in spec.items() if k not in ("v", "key", "name")})
            coll.indexes.append(index)
            if ctx.txn is None:
                o = {"createIndexes": name}
                o.update(index)
                self.log(self._entry(_ddl(ctx), "c", f"{db}.$cmd", o, ui=coll.uuid), ctx)
        return before, len(coll.indexes), created

    def drop_indexes(self, ctx: OpCtx, db: str, name: str, index) -> int:
        coll = self.catalog.get(db, name)
        if coll is None:
            raise CommandError(26, f"ns not found {db}.{name}")
        before = len(coll.indexes)
        if index == "*":
            dropped = [i for i in coll.indexes if i["name"] != "_id_"]
        else:
            names = index if isinstance(index, list) else [index]
            dropped = []
            for item in names:
                match = next(
                    (
                        i
                        for i in coll.indexes
                        if i["name"] == item or (isinstance(item, dict) and dict(i["key"]) == dict(item))
                    ),
                    None,
                )
                if match is None:
                    raise CommandError(27, f"index not found with name [{item}]")
                if match["name"] == "_id_":
                    raise CommandError(72, "cannot drop _id index")
                dropped.append(match)
        coll.indexes = [i for i in coll.indexes if i not in dropped]
        for index_spec in dropped:
            self.log(
                self._entry(
                    _ddl(ctx),
                    "c",
                    f"{db}.$cmd",
                    {"dropIndexes": name, "index": index_spec["name"]},
                    ui=coll.uuid,
                    o2=dict(index_spec),
                ),
                ctx,
            )
        return before

    def _check_not_locked(self, coll: Collection) -> None:
        prefix = coll.ns
        if any(key[0] == prefix for key in self.locks):
            raise CommandError(
                117,
                f"Unable to acquire an exclusive lock on collection {coll.ns}: a transaction holds "
                "locks on it",
            )

    # -- document writes -------------------------------------------------------------------------
    def _wait_unlocked(self, ctx: OpCtx, ns: str, key) -> None:
        """Outside transactions a write on a document held by an open transaction waits for it."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            holder = self.locks.get((ns, key))
            if holder is None or holder is ctx.txn or holder.state != "in_progress":
                return
            if ctx.txn is not None:
                self.abort_transaction(ctx.txn)
                raise write_conflict()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandError(50, "operation exceeded time limit")
            self.deployment.cv.wait(min(remaining, 0.5))

    def _apply(
        self,
        ctx: OpCtx,
        coll: Collection,
        key,
        new_doc: dict | None,
        old_doc: dict | None,
        entry: dict,
        size: int | None = None,
    ) -> None:
        """Apply one document write (new_doc None = delete) and log it."""
        self._wait_unlocked(ctx, coll.ns, key)
        if ctx.txn is not None:
            txn = ctx.txn
            docs = txn.snapshot[coll.ns]
            lock_key = (coll.ns, key)
            if lock_key not in txn.base:
                snapshot_doc = docs.get(key)
                live = self.catalog.get(coll.db, coll.name)
                live_doc = live.docs.get(key) if live is not None else None
                if live_doc is not snapshot_doc:
                    self.abort_transaction(txn)
                    raise write_conflict()
                txn.base[lock_key] = snapshot_doc
                self.locks[lock_key] = txn
            if new_doc is None:
                docs.pop(key, None)
            else:
                docs[key] = new_doc
            self._txn_append(
                ctx,
                coll,
                entry,
                (old_doc, new_doc) if coll.pre_and_post_images and old_doc is not None else None,
            )
            return
        ctx.before_write()
        if new_doc is None:
            coll.remove(key)
        else:
            coll.put(key, new_doc, size)
        entry_full = self._entry(
            ctx, entry["op"], entry["ns"], entry["o"], ui=entry.get("ui"), o2=entry.get("o2")
        )
        if coll.pre_and_post_images and old_doc is not None and entry["op"] in ("u", "d"):
            self.preimages[(bytes(coll.uuid), bsonutil.ts_key(entry_full["ts"]), 0)] = (old_doc, new_doc)
        self.remember(coll.ns, key, old_doc, entry_full["ts"])
        self.log(entry_full, ctx)

    def _txn_append(self, ctx: OpCtx, coll: Collection, op: dict, preimage: tuple | None) -> None:
        ctx.txn.ops.append(op)
        ctx.txn.op_colls.append(coll)
        ctx.txn.preimages.append(preimage)

    def insert(self, ctx: OpCtx, db: str, name: str, doc: dict) -> None:
        if not isinstance(doc, dict):
            raise CommandError(14, "Wrong type for 'documents[0]'. Expected an object")
        if "_id" not in doc:
            doc = {"_id": ObjectId(), **doc}
        elif next(iter(doc)) != "_id":
            doc = {"_id": doc["_id"], **{k: v for k, v in doc.items() if k != "_id"}}
        _validate_id(doc["_id"])
        for field in doc:
            if field.startswith("$"):
                raise CommandError(2, f"Document can't have $ prefixed field names: {field}")
        coll = self.ensure_collection(ctx, db, name)
        docs = self.view(ctx, db, name)[1]
        key = bsonutil.id_key(doc["_id"])
        if key in docs:
            raise duplicate_key(coll, doc["_id"])
        size = bsonutil.bson_size(doc)
        if size > bsonutil.MAX_BSON_SIZE:
            raise CommandError(
                10334,
                f"object to insert too large. size in bytes: {size}, max size: {bsonutil.MAX_BSON_SIZE}",
            )
        entry = {"op": "i", "ns": coll.ns, "ui": coll.uuid, "o": doc, "o2": self.document_key(coll, doc)}
        self._apply(ctx, coll, key, doc, None, entry, size)

    def update(
        self,
        ctx: OpCtx,
        db: str,
        name: str,
        spec: dict,
        update,
        upsert: bool = False,
        multi: bool = False,
        array_filters=None,
        sort=None,
        return_docs: bool = False,
    ) -> dict:
        """Returns {n, nModified, upserted (id or None), before, after}."""
        query.validate_update(update)
        if multi and isinstance(update, dict) and not query.is_operator_update(update):
            raise CommandError(
                9, "multi update is not supported for replacement-style update", code_name="FailedToParse"
            )
        coll, docs = self.view(ctx, db, name)
        matched = self.candidates(docs, spec) if coll is not None else []
        if sort:
            matched = query.sort_docs(matched, sort)
        if not multi:
            matched = matched[:1]
        n = modified = 0
        before = after = None
        for doc in matched:
            n += 1
            new = query.apply_update(doc, spec, update, False, array_filters)
            if return_docs:
                before, after = doc, new
            if diff.is_noop(doc, new):
                continue
            size = bsonutil.bson_size(new)
            if size > bsonutil.MAX_BSON_SIZE:
                raise CommandError(
                    17419,
                    f"Resulting document after update is larger than {bsonutil.MAX_BSON_SIZE}",
                    code_name="Location17419",
                )
            key = bsonutil.id_key(doc["_id"])
            if isinstance(update, dict) and not query.is_operator_update(update):
                o = new
            else:
                o = {"$v": 2, "diff": diff.compute_diff(doc, new, update)}
            entry = {"op": "u", "ns": coll.ns, "ui": coll.uuid, "o": o, "o2": self.document_key(coll, doc)}
            self._apply(ctx, coll, key, new, doc, entry, size)
            modified += 1
        upserted = None
        if not matched and upsert:
            seed = query.upsert_seed(spec, update)
            if isinstance(update, dict) and not query.is_operator_update(update):
                new = dict(update)
                if "_id" not in new:
                    seed = query.upsert_seed(spec, {"$set": {}})
                    new = {"_id": seed["_id"] if "_id" in seed else ObjectId(), **new}
            else:
                new = query.apply_update(seed, spec, update, True, array_filters)
                if "_id" not in new:
                    new = {"_id": ObjectId(), **new}
            self.insert(ctx, db, name, new)
            upserted = new["_id"]
            n = 1
            if return_docs:
                before, after = None, new
        return {"n": n, "nModified": modified, "upserted": upserted, "before": before, "after": after}

    def delete(
        self, ctx: OpCtx, db: str, name: str, spec: dict, limit: int, sort=None
    ) -> tuple[int, dict | None]:
        coll, docs = self.view(ctx, db, name)
        if coll is None:
            return 0, None
        matched = self.candidates(docs, spec)
        if sort:
            matched = query.sort_docs(matched, sort)
        if limit:
            matched = matched[:1]
        for doc in matched:
            key = bsonutil.id_key(doc["_id"])
            entry = {"op": "d", "ns": coll.ns, "ui": coll.uuid, "o": self.document_key(coll, doc)}
            self._apply(ctx, coll, key, None, doc, entry)
        return len(matched), (matched[0] if matched else None)

    # -- transactions ----------------------------------------------------------------------------
    def begin_transaction(self, session: Session, txn_number: int) -> Txn:
        if session.txn is not None and session.txn.state == "in_progress":
            self.abort_transaction(session.txn)
        txn = Txn(self, session, txn_number)
        session.txn = txn
        session.last_txn_number = txn_number
        return txn

    def commit_transaction(self, txn: Txn, ts: Timestamp | None = None) -> Timestamp | None:
        if txn.state == "committed":
            return txn.commit_ts
        if txn.state != "in_progress":
            raise no_such_transaction(txn.txn_number)
        applied_keys: set = set()
        replaced: list = []  # (ns, key, version before the commit)
        for coll in txn.created.values():
            if self.catalog.get(coll.db, coll.name) is None:
                self.catalog.add(coll)
        for op, coll in zip(txn.ops, txn.op_colls):
            if op["op"] not in ("i", "u", "d"):
                continue
            live = self.catalog.get(coll.db, coll.name)
            if live is None:
                live = coll
                self.catalog.add(coll)
            key = bsonutil.id_key(
                op["o"]["_id"] if op["op"] == "i" else op["o2"]["_id"] if op["op"] == "u" else op["o"]["_id"]
            )
            if (coll.ns, key) in applied_keys:
                continue
            applied_keys.add((coll.ns, key))
            replaced.append((coll.ns, key, live.docs.get(key)))
            final = txn.snapshot[coll.ns].get(key)
            if final is None:
                live.remove(key)
            else:
                live.put(key, final)
        commit_ts = None
        if txn.ops:
            entry = {
                "lsid": txn.session.lsid,
                "txnNumber": Int64(txn.txn_number),
                "op": "c",
                "ns": "admin.$cmd",
                "o": {"applyOps": list(txn.ops)},
            }
            entry["ts"] = ts or self.clock.tick()
            entry["t"] = Int64(self.term)
            entry["v"] = Int64(2)
            entry["wall"] = wall_now()
            entry["prevOpTime"] = {"ts": Timestamp(0, 0), "t": Int64(-1)}
            for index, (coll, pre) in enumerate(zip(txn.op_colls, txn.preimages)):
                if pre is not None:
                    self.preimages[(bytes(coll.uuid), bsonutil.ts_key(entry["ts"]), index)] = pre
            for ns, key, before in replaced:
                self.remember(ns, key, before, entry["ts"])
            self.log(entry)
            commit_ts = entry["ts"]
        txn.state = "committed"
        txn.commit_ts = commit_ts or self.clock.now
        txn.session.outcomes[txn.txn_number] = "committed"
        self._release(txn)
        return txn.commit_ts

    def abort_transaction(self, txn: Txn) -> None:
        if txn.state != "in_progress":
            return
        txn.state = "aborted"
        txn.session.outcomes[txn.txn_number] = "aborted"
        self._release(txn)

    def _release(self, txn: Txn) -> None:
        for key in [k for k, holder in self.locks.items() if holder is txn]:
            del self.locks[key]
        self.deployment.notify()

    def reap_transactions(self) -> None:
        now = time.monotonic()
        for session in list(self.sessions.values()):
            txn = session.txn
            if txn is not None and txn.state == "in_progress" and now - txn.started > TRANSACTION_LIFETIME_S:
                self.abort_transaction(txn)


def session_key(lsid: dict) -> bytes:
    """The key of a session (its id's bytes)."""
    value = lsid.get("id")
    return bytes(value) if isinstance(value, (bytes, bytearray)) else repr(value).encode()


def lsid_text(lsid: dict) -> str:
    """A session id as MongoDB writes it in messages (its UUID)."""
    try:
        return str(uuid.UUID(bytes=bytes(lsid["id"])))
    except (KeyError, TypeError, ValueError):
        return str(lsid)


def _ddl(ctx: OpCtx | None) -> OpCtx | None:
    """DDL oplog entries carry no session fields; only fromMigrate is taken from the context."""
    return ctx if ctx is not None and ctx.from_migrate and not ctx.retryable else None


def _options_equal(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items()} == {k: v for k, v in (b or {}).items()}


def _validate_id(value) -> None:
    if isinstance(value, list):
        raise CommandError(53, "The '_id' value cannot be of type array", code_name="InvalidIdField")
    if bsonutil.type_order(value) == 50:
        raise CommandError(53, "The '_id' value cannot be of type regex", code_name="InvalidIdField")


def duplicate_key(coll: Collection, id_value) -> CommandError:
    return CommandError(
        11000,
        f"E11000 duplicate key error collection: {coll.ns} index: _id_ dup key: "
        f"{{ _id: {bsonutil.to_relaxed_json(id_value)} }}",
        keyPattern={"_id": 1},
        keyValue={"_id": id_value},
    )


def check_namespace(db: str, name: str) -> None:
    if not valid_db_name(db):
        raise CommandError(73, f"Invalid database name: '{db}'")
    if not valid_collection_name(name):
        raise CommandError(73, f"Invalid collection name: {name}")
    if db == "local" and name == "oplog.rs":
        raise CommandError(20, "cannot write to 'local.oplog.rs'")


class NodeBackend:
    """The backend interface of the command layer, over one DataNode."""

    def __init__(self, node: DataNode, host: str):
        self.node = node
        self.host = host

    def read_docs(self, ctx: OpCtx, db: str, name: str, spec) -> list:
        coll, docs = self.node.view(ctx, db, name)
        if coll is None:
            return []
        return self.node.candidates(docs, spec)

    def count_all(self, ctx: OpCtx, db: str, name: str) -> int:
        return len(self.node.view(ctx, db, name)[1])

    def collection_meta(self, ctx: OpCtx, db: str, name: str) -> Collection | None:
        return self.node.view(ctx, db, name)[0]

    def insert(self, ctx, db, name, doc):
        self.node.insert(ctx, db, name, doc)

    def update(self, ctx, db, name, spec, update, **kwargs):
        return self.node.update(ctx, db, name, spec, update, **kwargs)

    def delete(self, ctx, db, name, spec, limit, sort=None):
        return self.node.delete(ctx, db, name, spec, limit, sort)

    def create_collection(self, ctx, db, name, options):
        self.node.create_collection(ctx, db, name, options)

    def drop_collection(self, ctx, db, name):
        self.node.drop_collection(ctx, db, name)

    def drop_database(self, ctx, db):
        self.node.drop_database(ctx, db)

    def rename_collection(self, ctx, source, target, drop_target):
        self.node.rename_collection(ctx, source, target, drop_target)

    def coll_mod(self, ctx, db, name, changes):
        self.node.coll_mod(ctx, db, name, changes)

    def create_indexes(self, ctx, db, name, indexes):
        return self.node.create_indexes(ctx, db, name, indexes)

    def drop_indexes(self, ctx, db, name, index):
        return self.node.drop_indexes(ctx, db, name, index)

    def list_collections(self, ctx: OpCtx, db: str) -> list[dict]:
        if db == "local" and self.node.oplog is not None:
            return [
                {
                    "name": "oplog.rs",
                    "type": "collection",
                    "options": {
                        "capped": True,
                        "size": self.node.oplog.stats()["maxSize"],
                        "autoIndexId": False,
                    },
                    "info": {"readOnly": False, "uuid": self.node.oplog_uuid},
                }
            ]
        if ctx.txn is not None:
            colls = [c for ns, c in ctx.txn.colls.items() if c.db == db]
        else:
            colls = self.node.catalog.collections(db)
        return [c.info() for c in colls]

    def list_databases(self, ctx: OpCtx) -> list[tuple[str, int, bool]]:
        out = []
        names = set(self.node.catalog.database_names())
        for internal in ("admin", "config", "local"):
            if internal == "local" and self.node.oplog is not None:
                out.append(("local", max(4096, self.node.oplog.total_bytes), False))
            else:
                out.append((internal, 8192 if internal != "local" else 4096, False))
            names.discard(internal)
        for name in sorted(names):
            size = sum(
                c.stats()["storageSize"] + c.stats()["totalIndexSize"]
                for c in self.node.catalog.collections(name)
            )
            out.append((name, size, False))
        return out

    def coll_stats(self, ctx: OpCtx, db: str, name: str) -> list[tuple]:
        if db == "local" and name == "oplog.rs" and self.node.oplog is not None:
            return [(self.host, None, self.node.oplog.stats())]
        coll = self.node.view(ctx, db, name)[0]
        if coll is None:
            return [(self.host, None, None)]
        stats = coll.stats()
        stats["capped"] = bool(coll.options.get("capped"))
        return [(self.host, None, stats)]

    def change_stream_nodes(self):
        return [self.node] if self.node.oplog is not None else None

    def lookup_document(self, db: str, name: str, uuid, document_key: dict):
        coll = self.node.catalog.get(db, name)
        if coll is None or (uuid is not None and coll.uuid != uuid):
            return None
        return coll.docs.get(bsonutil.id_key(document_key.get("_id")))

    def oplog_view(self):
        return self.node.oplog

    def kill_sessions(self, ctx: OpCtx, keys: set | None) -> None:
        self.node.kill_sessions(keys)

    def local_sessions(self) -> list[dict]:
        """The sessions in the server's cache, as ``$listLocalSessions`` lists them."""
        return [{"_id": dict(s.lsid), "lastUse": s.last_use} for s in self.node.sessions.values()]

    def oplogs(self) -> list:
        return [self.node.oplog] if self.node.oplog is not None else []
