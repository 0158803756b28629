"""Database commands, written once against a backend: a replica set's data (``engine.DataNode``)
or mongos (``router.Router``), which both offer the same read/write/catalog methods.

Each handler receives a ``Call`` (endpoint, backend, connection, command, database, operation
context) and returns the reply document without ``ok``/``$clusterTime`` (the endpoint adds
those). Errors are ``CommandError``s with MongoDB's codes and messages.
"""

from __future__ import annotations

import random
import time

from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from devtools.mongosim import bsonutil, query
from devtools.mongosim.catalog import INTERNAL_DBS
from devtools.mongosim.changestream import ChangeStreamCursor, Spec
from devtools.mongosim.engine import session_key
from devtools.mongosim.errors import CommandError
from devtools.mongosim.failpoints import FAIL_GET_MORE, command_filter, get_more_error

HANDLERS: dict = {}
DEFAULT_BATCH = 101
# write_ops_exec.cpp: internalInsertMaxBatchSize (64 documents) and write_ops::insertVectorMaxBytes.
INSERT_BATCH_DOCS = 64
INSERT_BATCH_BYTES = 256 * 1024
CURSOR_IDLE_TIMEOUT_S = 600.0


class Command:
    def __init__(self, func, name: str, kind: str, admin_only: bool, in_txn: bool, auth: bool):
        self.func = func
        self.name = name
        self.kind = kind  # "read", "write" or "none" (no replica-set state check)
        self.admin_only = admin_only
        self.in_txn = in_txn
        self.auth = auth


def command(*names, kind: str = "none", admin_only: bool = False, in_txn: bool = False, auth: bool = True):
    def register(func):
        for name in names:
            HANDLERS[name.lower()] = Command(func, name, kind, admin_only, in_txn, auth)
        return func

    return register


class Call:
    def __init__(self, endpoint, backend, conn, cmd: dict, db: str, op):
        self.endpoint = endpoint
        self.backend = backend
        self.conn = conn
        self.cmd = cmd
        self.name = next(iter(cmd))
        self.db = db
        self.op = op
        self.cursors = endpoint.cursors

    def arg(self):
        return self.cmd[self.name]

    def collection_name(self) -> str:
        name = self.arg()
        if not isinstance(name, str) or not name:
            raise CommandError(73, f"collection name has invalid type {bsonutil.type_name(name)}")
        return name


# -- cursors ---------------------------------------------------------------------------------------
class FindCursor:
    kind = "find"

    def __init__(self, ns: str, docs: list, limit: int = 0):
        self.ns = ns
        self.docs = docs
        self.position = 0
        self.limit = limit  # 0: no limit
        self.returned = 0
        self.killed: CommandError | None = None
        self.at_cluster_time = None  # the snapshot of a snapshot read outside a transaction

    def next_batch(self, batch_size: int | None) -> tuple[list, bool]:
        out = []
        total = 0
        while self.position < len(self.docs):
            if batch_size and len(out) >= batch_size:
                break
            if self.limit and self.returned >= self.limit:
                break
            encoded = bsonutil.encode(self.docs[self.position])
            if out and total + len(encoded) > bsonutil.MAX_BSON_SIZE:
                break
            total += len(encoded)
            out.append(RawBSONDocument(encoded))
            self.position += 1
            self.returned += 1
        exhausted = self.position >= len(self.docs) or bool(self.limit and self.returned >= self.limit)
        return out, exhausted


class OplogTailCursor:
    """A tailable (optionally awaitData) cursor on local.oplog.rs."""

    kind = "tail"

    def __init__(self, ns: str, oplog, pred, deployment, await_data: bool, projection):
        self.ns = ns
        self.oplog = oplog
        self.pred = pred
        self.deployment = deployment
        self.await_data = await_data
        self.projection = projection
        self.last_key = -1
        self.killed: CommandError | None = None

    def next_batch(self, batch_size: int | None, await_ms: float | None) -> list:
        deadline = time.monotonic() + (await_ms or 0) / 1000.0 if self.await_data and await_ms else None
        while True:
            if self.killed is not None:
                raise self.killed
            if (
                self.last_key >= 0
                and self.oplog.dropped_through > self.last_key
                and (not self.oplog.keys or self.oplog.keys[0] > self.last_key)
            ):
                raise CommandError(
                    136,
                    "Executor error during getMore :: caused by :: CollectionScan died due "
                    "to position in capped collection being deleted.",
                )
            out = []
            total = 0
            index = self.oplog.index_after(self.last_key)
            while index < len(self.oplog.entries):
                entry = self.oplog.entries[index]
                key = self.oplog.keys[index]
                index += 1
                self.last_key = key
                if not self.pred(entry):
                    continue
                doc = query.project(entry, self.projection) if self.projection else entry
                encoded = bsonutil.encode(doc)
                total += len(encoded)
                out.append(RawBSONDocument(encoded))
                if (batch_size and len(out) >= batch_size) or total > bsonutil.MAX_BSON_SIZE - 1024 * 1024:
                    break
            if out or deadline is None:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out
            self.deployment.cv.wait(min(remaining, 0.25))

    def kill(self, error: CommandError) -> None:
        self.killed = error


class Cursors:
    """Open cursors of one endpoint (a cursor id is only valid on the server that created it)."""

    def __init__(self):
        self.cursors: dict[int, dict] = {}

    def add(self, cursor, lsid, txn) -> int:
        while True:
            cursor_id = random.randint(1, 2**62)
            if cursor_id not in self.cursors:
                break
        self.cursors[cursor_id] = {"cursor": cursor, "lsid": lsid, "txn": txn, "used": time.monotonic()}
        return cursor_id

    def get(self, cursor_id: int) -> dict | None:
        entry = self.cursors.get(cursor_id)
        if entry is not None:
            entry["used"] = time.monotonic()
        return entry

    def remove(self, cursor_id: int) -> bool:
        return self.cursors.pop(cursor_id, None) is not None

    def kill_sessions(self, ids: set | None) -> None:
        """Close the cursors opened in these sessions (ids: session id bytes; None: all)."""
        for cursor_id, entry in list(self.cursors.items()):
            lsid = entry["lsid"]
            if not isinstance(lsid, dict) or "id" not in lsid:
                continue
            if ids is None or session_key(lsid) in ids:
                self.cursors.pop(cursor_id, None)

    def interrupt_all(self, error: CommandError) -> None:
        for entry in self.cursors.values():
            entry["cursor"].killed = error
            kill = getattr(entry["cursor"], "kill", None)
            if kill is not None:
                kill(error)

    def reap(self) -> None:
        now = time.monotonic()
        for cursor_id in [cid for cid, e in self.cursors.items() if now - e["used"] > CURSOR_IDLE_TIMEOUT_S]:
            self.cursors.pop(cursor_id, None)


def _cursor_reply(cursor_id: int, ns: str, batch: list, first: bool, pbrt=None, at_cluster_time=None) -> dict:
    cursor = {"firstBatch" if first else "nextBatch": batch}
    if pbrt is not None:
        cursor["postBatchResumeToken"] = pbrt
    cursor["id"] = Int64(cursor_id)
    cursor["ns"] = ns
    if at_cluster_time is not None:
        # A snapshot read outside a transaction names its snapshot (CursorResponseBuilder).
        cursor["atClusterTime"] = at_cluster_time
    return {"cursor": cursor}


def _positive_int(value, name: str, allow_zero: bool = True) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float, Int64)):
        raise CommandError(
            14,
            f"BSON field '{name}' is the wrong type '{bsonutil.type_name(value)}', "
            "expected types '[long, int, decimal, double]'",
            code_name="TypeMismatch",
        )
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        raise CommandError(
            51024,
            f"BSON field '{name}' value must be >= {0 if allow_zero else 1}, actual value '{value}'",
            code_name="Location51024",
        )
    return value


def open_cursor(
    call: Call, ns: str, docs: list, batch_size: int | None, limit: int = 0, single_batch: bool = False
) -> dict:
    cursor = FindCursor(ns, docs, limit)
    cursor.at_cluster_time = getattr(call.op, "read_at", None)
    first_size = DEFAULT_BATCH if batch_size is None else batch_size
    if first_size == 0 and not single_batch:
        batch, exhausted = [], not docs
        if exhausted:
            return _cursor_reply(0, ns, batch, True, at_cluster_time=cursor.at_cluster_time)
    else:
        batch, exhausted = cursor.next_batch(first_size if first_size else None)
    if exhausted or single_batch:
        return _cursor_reply(0, ns, batch, True, at_cluster_time=cursor.at_cluster_time)
    lsid = call.cmd.get("lsid")
    cursor_id = call.cursors.add(cursor, lsid, getattr(call.op, "txn", None))
    return _cursor_reply(cursor_id, ns, batch, True, at_cluster_time=cursor.at_cluster_time)


# -- handshake and diagnostics ---------------------------------------------------------------------
@command("ping", auth=False)
def cmd_ping(call: Call) -> dict:
    return {}


@command("buildInfo", auth=False)
def cmd_build_info(call: Call) -> dict:
    version = call.endpoint.deployment.version
    return {
        "version": version,
        "gitVersion": "mongosim",
        "versionArray": [int(x) for x in version.split(".")] + [0],
        "bits": 64,
        "debug": False,
        "maxBsonObjectSize": bsonutil.MAX_BSON_SIZE,
        "storageEngines": ["wiredTiger"],
        "modules": [],
        "openssl": {"running": "disabled"},
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "allocator": "system",
        "buildEnvironment": {"target_os": "linux"},
    }


@command("hostInfo")
def cmd_host_info(call: Call) -> dict:
    return {
        "system": {
            "currentTime": _now(),
            "hostname": "127.0.0.1",
            "cpuAddrSize": 64,
            "numCores": 2,
            "cpuArch": "x86_64",
        },
        "os": {"type": "Linux"},
        "extra": {},
    }


@command("getCmdLineOpts")
def cmd_get_cmd_line_opts(call: Call) -> dict:
    parsed = {"net": {"bindIp": "127.0.0.1"}}
    rs = getattr(call.endpoint, "replset", None)
    if rs is not None and rs.set_name:
        parsed["replication"] = {"replSet": rs.set_name}
    return {"argv": ["mongod"], "parsed": parsed}


@command("getParameter")
def cmd_get_parameter(call: Call) -> dict:
    version = call.endpoint.deployment.version
    fcv = ".".join(version.split(".")[:2])
    out = {}
    cmd = call.cmd
    if cmd.get("featureCompatibilityVersion") or cmd.get("getParameter") == "*":
        out["featureCompatibilityVersion"] = {"version": fcv}
    if cmd.get("transactionLifetimeLimitSeconds") or cmd.get("getParameter") == "*":
        out["transactionLifetimeLimitSeconds"] = 60
    if cmd.get("enableTestCommands") or cmd.get("getParameter") == "*":
        out["enableTestCommands"] = True
    if not out:
        raise CommandError(72, "no option found to get", code_name="InvalidOptions")
    return out


@command("whatsmyuri")
def cmd_whatsmyuri(call: Call) -> dict:
    return {"you": call.conn.peer_address}


@command("connectionStatus", auth=False)
def cmd_connection_status(call: Call) -> dict:
    users = [{"user": call.conn.user, "db": "admin"}] if call.conn.user else []
    roles = [{"role": "root", "db": "admin"}] if call.conn.user else []
    return {"authInfo": {"authenticatedUsers": users, "authenticatedUserRoles": roles}}


@command("serverStatus")
def cmd_server_status(call: Call) -> dict:
    endpoint = call.endpoint
    deployment = endpoint.deployment
    out = {
        "host": endpoint.host,
        "version": deployment.version,
        "process": "mongos" if endpoint.is_mongos else "mongod",
        "pid": Int64(deployment.pid),
        "uptime": float(int(time.time() - deployment.started)),
        "uptimeMillis": Int64(int((time.time() - deployment.started) * 1000)),
        "localTime": _now(),
        "connections": {
            "current": endpoint.server.connection_count() if endpoint.server else 0,
            "available": 10000,
        },
    }
    rs = getattr(endpoint, "replset", None)
    if rs is not None and rs.set_name:
        out["repl"] = endpoint.hello_fields(legacy=False)
    return out


@command("listCommands")
def cmd_list_commands(call: Call) -> dict:
    return {"commands": {c.name: {"help": "", "adminOnly": c.admin_only} for c in HANDLERS.values()}}


@command("refreshSessions", auth=False)
def cmd_refresh_sessions(call: Call) -> dict:
    return {}


@command("endSessions", "killSessions", "killAllSessions", "killAllSessionsByPattern", auth=False)
def cmd_kill_sessions(call: Call) -> dict:
    """Ending or killing sessions aborts their open transactions and closes their cursors
    (MongoDB's documentation of endSessions, killSessions and killAllSessions: "kills all
    in-progress operations ... closes all open cursors"). ``killAllSessions``/
    ``killAllSessionsByPattern`` take user patterns: the simulator has one user, so any pattern
    selects every session."""
    if call.name.lower() in ("endsessions", "killsessions"):
        lsids = call.arg()
        if not isinstance(lsids, list):
            raise CommandError(
                14,
                f"BSON field '{call.name}' is the wrong type, expected type 'array'",
                code_name="TypeMismatch",
            )
        ids = {session_key(lsid) for lsid in lsids if isinstance(lsid, dict) and "id" in lsid}
    else:
        ids = None
    call.backend.kill_sessions(call.op, ids)
    call.cursors.kill_sessions(ids)
    return {}


@command("startSession")
def cmd_start_session(call: Call) -> dict:
    import uuid as uuidlib

    from bson.binary import Binary

    return {"id": {"id": Binary(uuidlib.uuid4().bytes, 4)}, "timeoutMinutes": 30}


@command("logout", auth=False)
def cmd_logout(call: Call) -> dict:
    call.conn.user = None
    return {}


@command("getLastError")
def cmd_get_last_error(call: Call) -> dict:
    return {"err": None, "n": 0}


# -- CRUD ------------------------------------------------------------------------------------------
def _check_write_target(call: Call, db: str, name: str) -> None:
    if db == "local" and name == "oplog.rs":
        raise CommandError(20, "cannot write to 'local.oplog.rs'")
    if name.startswith("system.") and name not in ("system.js",):
        raise CommandError(
            13,
            f"cannot write to '{db}.{name}'"
            if db not in ("admin", "config")
            else f"not authorized on {db} to execute command",
        )


def _statement(call: Call, index: int, run, check_fail_point: bool = True):
    """One statement of a write command. In a retryable write a statement already executed
    answers its recorded result without running again (MongoDB's
    TransactionParticipant::checkStatementExecuted); a new one is checked against the primary's
    onPrimaryTransactionalWrite fail point when it writes (``OpCtx.before_write``)."""
    ctx = call.op
    executed = getattr(ctx, "executed", None)
    if executed is not None and index in executed:
        return executed[index]
    if check_fail_point and getattr(ctx, "write_fail_point", None) is not None:
        ctx.write_check_pending = True
    ctx.stmt_id = index
    result = run()
    if executed is not None:
        executed[index] = result
    return result


def _result(update: dict) -> dict:
    """What an update statement reports (the part a retried statement answers again)."""
    return {"n": update["n"], "nModified": update["nModified"], "upserted": update["upserted"]}


def _write_error(index: int, error: CommandError) -> dict:
    out = {"index": index, "code": error.code, "errmsg": error.errmsg}
    out.update(error.extra)
    return out


@command("insert", kind="write", in_txn=True)
def cmd_insert(call: Call) -> dict:
    name = call.collection_name()
    docs = call.cmd.get("documents")
    if not isinstance(docs, list) or not docs:
        raise CommandError(
            2, "Write batch sizes must be between 1 and 100000. Got 0 operations.", code_name="InvalidLength"
        )
    _check_write_target(call, call.db, name)
    ordered = call.cmd.get("ordered", True)
    out = {"n": 0, "errors": []}
    # MongoDB inserts a command's documents in batches of at most 64 documents or 256 KB, each in
    # one storage commit (write_ops_exec.cpp, performInserts): onPrimaryTransactionalWrite fires
    # once per batch; when a batch fails, its documents are inserted one at a time, each checked
    # again. Documents a retried write already inserted end the batch before them.
    batch: list = []
    size = 0
    executed = getattr(call.op, "executed", None) or {}
    for index, doc in enumerate(docs):
        if index in executed:
            if not _insert_batch(call, name, batch, ordered, out):
                break
            batch, size = [], 0
            out["n"] += 1
            continue
        batch.append((index, doc))
        size += bsonutil.bson_size(doc) if isinstance(doc, dict) else 0
        if index < len(docs) - 1 and len(batch) < INSERT_BATCH_DOCS and size < INSERT_BATCH_BYTES:
            continue
        if not _insert_batch(call, name, batch, ordered, out):
            break
        batch, size = [], 0
    reply = {"n": out["n"]}
    if out["errors"]:
        reply["writeErrors"] = out["errors"]
    return reply


def _insert_batch(call: Call, name: str, batch: list, ordered: bool, out: dict) -> bool:
    """Insert one batch; False when an error stops an ordered insert."""
    fail_point = getattr(call.op, "write_fail_point", None) is not None
    if fail_point and len(batch) > 1:
        call.op.write_check_pending = True  # one check for the batch's commit
    one_at_a_time = len(batch) <= 1
    position = 0
    while position < len(batch):
        index, doc = batch[position]
        try:
            _statement(
                call,
                index,
                lambda doc=doc: call.backend.insert(call.op, call.db, name, doc) or {"n": 1},
                check_fail_point=one_at_a_time,
            )
            out["n"] += 1
        except CommandError as error:
            if getattr(error, "write_fail_point", False) and not one_at_a_time:
                one_at_a_time = True  # the batch failed before anything was written
                continue
            if error.code in (112, 251) or getattr(call.op, "txn", None) is not None:
                raise
            out["errors"].append(_write_error(index, error))
            if ordered:
                return False
        position += 1
    return True


@command("update", kind="write", in_txn=True)
def cmd_update(call: Call) -> dict:
    name = call.collection_name()
    updates = call.cmd.get("updates")
    if not isinstance(updates, list) or not updates:
        raise CommandError(
            2, "Write batch sizes must be between 1 and 100000. Got 0 operations.", code_name="InvalidLength"
        )
    _check_write_target(call, call.db, name)
    ordered = call.cmd.get("ordered", True)
    n = modified = 0
    upserted = []
    errors = []
    for index, spec in enumerate(updates):
        try:
            if not isinstance(spec, dict) or "q" not in spec or "u" not in spec:
                raise CommandError(
                    40414,
                    "BSON field 'update.updates.q' is missing but a required field",
                    code_name="Location40414",
                )
            result = _statement(
                call,
                index,
                lambda spec=spec: _result(
                    call.backend.update(
                        call.op,
                        call.db,
                        name,
                        spec["q"] or {},
                        spec["u"],
                        upsert=bool(spec.get("upsert")),
                        multi=bool(spec.get("multi")),
                        array_filters=spec.get("arrayFilters"),
                        sort=spec.get("sort"),
                    )
                ),
            )
            n += result["n"]
            modified += result["nModified"]
            if result["upserted"] is not None:
                upserted.append({"index": index, "_id": result["upserted"]})
        except CommandError as error:
            if error.code in (112, 251) or getattr(call.op, "txn", None) is not None:
                raise
            errors.append(_write_error(index, error))
            if ordered:
                break
    reply = {"n": n, "nModified": modified}
    if upserted:
        reply["upserted"] = upserted
    if errors:
        reply["writeErrors"] = errors
    return reply


@command("delete", kind="write", in_txn=True)
def cmd_delete(call: Call) -> dict:
    name = call.collection_name()
    deletes = call.cmd.get("deletes")
    if not isinstance(deletes, list) or not deletes:
        raise CommandError(
            2, "Write batch sizes must be between 1 and 100000. Got 0 operations.", code_name="InvalidLength"
        )
    _check_write_target(call, call.db, name)
    ordered = call.cmd.get("ordered", True)
    n = 0
    errors = []
    for index, spec in enumerate(deletes):
        try:
            if not isinstance(spec, dict) or "q" not in spec or "limit" not in spec:
                raise CommandError(
                    40414,
                    "BSON field 'delete.deletes.limit' is missing but a required field",
                    code_name="Location40414",
                )
            limit = spec["limit"]
            if limit not in (0, 1):
                raise CommandError(
                    9,
                    "The limit field in delete objects must be 0 or 1. Got " + str(limit),
                    code_name="FailedToParse",
                )
            count = _statement(
                call,
                index,
                lambda spec=spec, limit=limit: {
                    "n": call.backend.delete(call.op, call.db, name, spec["q"] or {}, int(limit))[0]
                },
            )["n"]
            n += count
        except CommandError as error:
            if error.code in (112, 251) or getattr(call.op, "txn", None) is not None:
                raise
            errors.append(_write_error(index, error))
            if ordered:
                break
    reply = {"n": n}
    if errors:
        reply["writeErrors"] = errors
    return reply


@command("findAndModify", kind="write", in_txn=True)
def cmd_find_and_modify(call: Call) -> dict:
    name = call.collection_name()
    _check_write_target(call, call.db, name)
    cmd = call.cmd
    spec = cmd.get("query") or {}
    sort = cmd.get("sort")
    fields = cmd.get("fields")
    remove = bool(cmd.get("remove"))
    update = cmd.get("update")
    if remove and update is not None:
        raise CommandError(9, "Cannot specify both an update and remove=true", code_name="FailedToParse")
    if not remove and update is None:
        raise CommandError(9, "Either an update or remove=true must be specified", code_name="FailedToParse")
    if remove and cmd.get("upsert"):
        raise CommandError(9, "Cannot specify both upsert=true and remove=true", code_name="FailedToParse")
    return _statement(call, 0, lambda: _find_and_modify(call, name, spec, sort, fields, remove, update))


def _find_and_modify(call: Call, name: str, spec, sort, fields, remove: bool, update) -> dict:
    cmd = call.cmd
    if remove:
        count, doc = call.backend.delete(call.op, call.db, name, spec, 1, sort=sort)
        value = query.project(doc, fields) if doc is not None and fields else doc
        return {"lastErrorObject": {"n": count}, "value": value}
    result = call.backend.update(
        call.op,
        call.db,
        name,
        spec,
        update,
        upsert=bool(cmd.get("upsert")),
        multi=False,
        array_filters=cmd.get("arrayFilters"),
        sort=sort,
        return_docs=True,
    )
    doc = result["after"] if cmd.get("new") else result["before"]
    if doc is not None and fields:
        doc = query.project(doc, fields)
    last_error = {"n": result["n"], "updatedExisting": bool(result["n"]) and result["upserted"] is None}
    if result["upserted"] is not None:
        last_error["upserted"] = result["upserted"]
    return {"lastErrorObject": last_error, "value": doc}


def _read_docs(call: Call, db: str, name: str, spec) -> list:
    if db == "local" and name == "oplog.rs":
        oplog = call.backend.oplog_view()
        if oplog is None:
            return []
        pred = query.compile_filter(spec)
        return [e for e in list(oplog.entries) if pred(e)]
    return call.backend.read_docs(call.op, db, name, spec)


def _check_hint(call: Call, db: str, name: str, hint) -> None:
    if hint is None or hint == {} or hint == "":
        return
    meta = call.backend.collection_meta(call.op, db, name)
    indexes = meta.indexes if meta is not None else []
    if isinstance(hint, str):
        if any(i["name"] == hint for i in indexes) or hint == "_id_":
            return
    elif isinstance(hint, dict):
        if (
            "$natural" in hint
            or any(dict(i["key"]) == dict(hint) for i in indexes)
            or dict(hint) == {"_id": 1}
        ):
            return
    if meta is None:
        return
    raise CommandError(
        2,
        "error processing query: ns=" + f"{db}.{name} ... planner returned error :: caused "
        "by :: hint provided does not correspond to an existing index",
        code_name="BadValue",
    )


@command("find", kind="read", in_txn=True)
def cmd_find(call: Call) -> dict:
    name = call.collection_name()
    cmd = call.cmd
    spec = cmd.get("filter") or {}
    if not isinstance(spec, dict):
        raise CommandError(
            14,
            "BSON field 'FindCommandRequest.filter' is the wrong type, expected type 'object'",
            code_name="TypeMismatch",
        )
    _check_hint(call, call.db, name, cmd.get("hint"))
    if cmd.get("tailable"):
        return _tailable_find(call, name, spec)
    docs = _read_docs(call, call.db, name, spec)
    sort = cmd.get("sort")
    if sort:
        docs = query.sort_docs(docs, sort)
    skip = _positive_int(cmd.get("skip"), "skip")
    limit_value = cmd.get("limit")
    single_batch = bool(cmd.get("singleBatch"))
    limit = 0
    if limit_value is not None:
        if (
            isinstance(limit_value, (int, float, Int64))
            and not isinstance(limit_value, bool)
            and limit_value < 0
        ):
            limit = -int(limit_value)
            single_batch = True
        else:
            limit = _positive_int(limit_value, "limit")
    if skip:
        docs = docs[skip:]
    if limit:
        docs = docs[:limit]
    projection = cmd.get("projection")
    if projection:
        docs = [query.project(d, projection) for d in docs]
    batch_size = cmd.get("batchSize")
    batch_size = None if batch_size is None else _positive_int(batch_size, "batchSize")
    if limit and (batch_size is None or batch_size > limit):
        batch_size = limit if batch_size is not None or limit < DEFAULT_BATCH else batch_size
    return open_cursor(call, f"{call.db}.{name}", docs, batch_size, limit, single_batch)


def _tailable_find(call: Call, name: str, spec: dict) -> dict:
    oplog = call.backend.oplog_view() if (call.db, name) == ("local", "oplog.rs") else None
    if oplog is None:
        raise CommandError(
            2,
            f"error processing query: ns={call.db}.{name} :: caused by :: tailable cursor "
            "requested on non capped collection",
            code_name="BadValue",
        )
    cursor = OplogTailCursor(
        f"{call.db}.{name}",
        oplog,
        query.compile_filter(spec),
        call.endpoint.deployment,
        bool(call.cmd.get("awaitData")),
        call.cmd.get("projection"),
    )
    batch_size = call.cmd.get("batchSize")
    batch = (
        cursor.next_batch(DEFAULT_BATCH if batch_size is None else int(batch_size), None)
        if batch_size != 0
        else []
    )
    cursor_id = call.cursors.add(cursor, call.cmd.get("lsid"), None)
    return _cursor_reply(cursor_id, cursor.ns, batch, True)


@command("getMore", kind="none", in_txn=True)
def cmd_get_more(call: Call) -> dict:
    cursor_id = call.arg()
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, (int, Int64)):
        raise CommandError(
            14,
            "BSON field 'getMore.getMore' is the wrong type, expected type 'long'",
            code_name="TypeMismatch",
        )
    collection = call.cmd.get("collection")
    entry = call.cursors.get(int(cursor_id))
    if entry is None:
        raise CommandError(43, f"cursor id {int(cursor_id)} not found")
    cursor = entry["cursor"]
    ns = f"{call.db}.{collection}"
    if cursor.ns != ns:
        raise CommandError(
            13,
            f"Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {cursor.ns}",
        )
    batch_size = call.cmd.get("batchSize")
    batch_size = None if batch_size is None else _positive_int(batch_size, "batchSize")
    # The cursor is checked out: MongoDB's failGetMoreAfterCursorCheckout fires here, and its error
    # (like any error from here on) deletes the cursor (getmore_cmd.cpp).
    failure = call.endpoint.failpoints[FAIL_GET_MORE].fire(
        command_filter("getMore", call.conn.app_name, ns, listed=False)
    )
    try:
        if failure is not None:
            raise get_more_error(failure)
        if cursor.kind == "changeStream":
            max_time = call.cmd.get("maxTimeMS")
            await_ms = float(max_time) if max_time is not None else 1000.0
            batch, closed = cursor.next_batch(batch_size, await_ms, first=False)
    except CommandError as error:
        call.cursors.remove(int(cursor_id))
        # The getMore's originating command is a $changeStream: its errors get the change-stream
        # labels (ErrorLabelBuilder::isResumableChangeStreamError). A copy: an interruption error
        # is shared by every cursor of the member.
        raised = error.copy()
        raised.change_stream = cursor.kind == "changeStream"
        raise raised from None
    if cursor.kind == "changeStream":
        if closed:
            call.cursors.remove(int(cursor_id))
        return _cursor_reply(0 if closed else int(cursor_id), ns, batch, False, cursor.pbrt)
    if cursor.kind == "tail":
        max_time = call.cmd.get("maxTimeMS")
        try:
            batch = cursor.next_batch(batch_size, float(max_time) if max_time is not None else 1000.0)
        except CommandError:
            call.cursors.remove(int(cursor_id))
            raise
        return _cursor_reply(int(cursor_id), ns, batch, False)
    if cursor.killed is not None:
        call.cursors.remove(int(cursor_id))
        raise cursor.killed
    batch, exhausted = cursor.next_batch(batch_size)
    if exhausted:
        call.cursors.remove(int(cursor_id))
    return _cursor_reply(
        0 if exhausted else int(cursor_id), ns, batch, False, at_cluster_time=cursor.at_cluster_time
    )


@command("killCursors", kind="none", in_txn=True)
def cmd_kill_cursors(call: Call) -> dict:
    ids = call.cmd.get("cursors") or []
    killed, not_found = [], []
    for cursor_id in ids:
        (killed if call.cursors.remove(int(cursor_id)) else not_found).append(Int64(cursor_id))
    return {"cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": [], "cursorsUnknown": []}


@command("count", kind="read")
def cmd_count(call: Call) -> dict:
    name = call.collection_name()
    spec = call.cmd.get("query") or {}
    if not spec and not call.cmd.get("skip") and not call.cmd.get("limit"):
        meta = call.backend.collection_meta(call.op, call.db, name)
        if call.db == "local" and name == "oplog.rs":
            oplog = call.backend.oplog_view()
            return {"n": len(oplog.entries) if oplog else 0}
        if meta is None:
            return {"n": 0}
        return {"n": call.backend.count_all(call.op, call.db, name)}
    docs = _read_docs(call, call.db, name, spec)
    skip = _positive_int(call.cmd.get("skip"), "skip")
    limit = abs(int(call.cmd.get("limit") or 0))
    docs = docs[skip:]
    if limit:
        docs = docs[:limit]
    return {"n": len(docs)}


@command("distinct", kind="read", in_txn=True)
def cmd_distinct(call: Call) -> dict:
    name = call.collection_name()
    key = call.cmd.get("key")
    if not isinstance(key, str):
        raise CommandError(
            14,
            "BSON field 'distinct.key' is the wrong type, expected type 'string'",
            code_name="TypeMismatch",
        )
    docs = _read_docs(call, call.db, name, call.cmd.get("query") or {})
    seen = set()
    values = []
    for doc in docs:
        value = query.get_path(doc, key, None)
        if value is None and query.get_path(doc, key) is query._MISSING:  # pylint: disable=protected-access
            continue
        items = value if isinstance(value, list) else [value]
        for item in items:
            k = bsonutil.sort_key(item)
            if k not in seen:
                seen.add(k)
                values.append(item)
    reply = {"values": values}
    if getattr(call.op, "read_at", None) is not None:
        reply["atClusterTime"] = call.op.read_at
    return reply


# -- aggregate -------------------------------------------------------------------------------------
def _change_stream_scope(call: Call, stage: dict) -> tuple:
    target = call.arg()
    db = call.db
    if target == 1 or target == 1.0:
        if db == "admin":
            if not stage.get("allChangesForCluster"):
                raise CommandError(73, "$changeStream may not be opened on the internal admin database")
            return ("cluster",), "admin.$cmd.aggregate"
        if db in ("config", "local"):
            raise CommandError(73, f"$changeStream may not be opened on the internal {db} database")
        return ("database", db), f"{db}.$cmd.aggregate"
    if stage.get("allChangesForCluster"):
        raise CommandError(
            73,
            "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' database, and with no collection name; found "
            f"{db}.{target}",
        )
    if db in INTERNAL_DBS:
        raise CommandError(73, f"$changeStream may not be opened on the internal {db} database")
    if isinstance(target, str) and target.startswith("system."):
        raise CommandError(73, f"cannot open $changeStream for internal {db}.{target} collection")
    return ("collection", db, target), f"{db}.{target}"


def _aggregate_change_stream(call: Call, pipeline: list, batch_size) -> dict:
    if getattr(call.op, "txn", None) is not None:
        raise CommandError(
            263,
            "Operation not permitted in transaction :: caused by :: $changeStream is not "
            "supported in a transaction",
        )
    read_concern = call.cmd.get("readConcern")
    level = read_concern.get("level") if isinstance(read_concern, dict) else None
    if level is not None and level != "majority":
        # Change streams read majority-committed data only (DocumentSourceChangeStream's
        # supportsReadConcern: onlySingleReadConcernSupported(kMajorityReadConcern)).
        raise CommandError(
            72,
            "Aggregation stage $changeStream cannot run with a readConcern other than 'majority'. "
            f"Current readConcern: {level}",
            code_name="InvalidOptions",
        )
    nodes = call.backend.change_stream_nodes()
    if nodes is None:
        raise CommandError(
            40573, "The $changeStream stage is only supported on replica sets", code_name="Location40573"
        )
    stage = pipeline[0]["$changeStream"]
    scope, ns = _change_stream_scope(call, stage if isinstance(stage, dict) else {})
    spec = Spec(stage, pipeline[1:], scope)
    cursor = ChangeStreamCursor(spec, nodes, call.endpoint.deployment, call.backend.lookup_document, ns)
    batch, closed = cursor.next_batch(batch_size, None, first=True)
    if closed:
        return _cursor_reply(0, ns, batch, True, cursor.pbrt)
    cursor_id = call.cursors.add(cursor, call.cmd.get("lsid"), None)
    return _cursor_reply(cursor_id, ns, batch, True, cursor.pbrt)


def _coll_stats_stage(call: Call, db: str, name: str, options: dict) -> list:
    if not isinstance(options, dict):
        raise CommandError(
            5447000,
            "$collStats must take a nested object but found: " + str(options),
            code_name="Location5447000",
        )
    out = []
    for host, shard, stats in call.backend.coll_stats(call.op, db, name):
        doc = {"ns": f"{db}.{name}"}
        if shard is not None:
            doc["shard"] = shard
        doc["host"] = host
        doc["localTime"] = _now()
        if "latencyStats" in options:
            doc["latencyStats"] = {
                "reads": {"latency": Int64(0), "ops": Int64(0)},
                "writes": {"latency": Int64(0), "ops": Int64(0)},
                "commands": {"latency": Int64(0), "ops": Int64(0)},
                "transactions": {"latency": Int64(0), "ops": Int64(0)},
            }
        if "storageStats" in options:
            if stats is None:
                raise CommandError(
                    26,
                    "Unable to retrieve storageStats in $collStats stage :: caused by :: "
                    f"Collection [{db}.{name}] not found.",
                )
            storage = dict(stats)
            storage.pop("ns", None)
            doc["storageStats"] = storage
        if "count" in options:
            if stats is None:
                raise CommandError(
                    26,
                    "Unable to retrieve count in $collStats stage :: caused by :: "
                    f"Collection [{db}.{name}] not found.",
                )
            doc["count"] = stats["count"]
        out.append(doc)
    return out


@command("aggregate", kind="read", in_txn=True)
def cmd_aggregate(call: Call) -> dict:
    pipeline = call.cmd.get("pipeline")
    if not isinstance(pipeline, list):
        raise CommandError(
            40414,
            "BSON field 'aggregate.pipeline' is missing but a required field",
            code_name="Location40414",
        )
    cursor_spec = call.cmd.get("cursor")
    if cursor_spec is None and not call.cmd.get("explain"):
        raise CommandError(
            9,
            "The 'cursor' option is required, except for aggregate with the explain argument",
            code_name="FailedToParse",
        )
    batch_size = (cursor_spec or {}).get("batchSize")
    batch_size = None if batch_size is None else _positive_int(batch_size, "cursor.batchSize")
    if pipeline and isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]:
        return _aggregate_change_stream(call, pipeline, batch_size)
    for stage in pipeline:
        if isinstance(stage, dict) and stage and next(iter(stage)) in ("$out", "$merge"):
            raise query.unrecognized_stage(next(iter(stage)))
        if isinstance(stage, dict) and "$changeStream" in stage:
            raise CommandError(
                40602,
                "$changeStream is only valid as the first stage in a pipeline.",
                code_name="Location40602",
            )
    target = call.arg()
    if (
        target in (1, 1.0)
        and pipeline
        and isinstance(pipeline[0], dict)
        and "$listLocalSessions" in pipeline[0]
    ):
        # $listLocalSessions (MongoDB's documentation): the sessions in this server's cache.
        result = query.run_pipeline(call.backend.local_sessions(), pipeline[1:])
        return open_cursor(call, f"{call.db}.$cmd.aggregate", result, batch_size)
    if not isinstance(target, str):
        raise CommandError(
            73,
            "{aggregate: 1} is not valid for '"
            + (pipeline and next(iter(pipeline[0])) or "")
            + "'; a collection is required.",
        )
    name = target
    ns = f"{call.db}.{name}"
    rest = pipeline
    if pipeline and isinstance(pipeline[0], dict) and "$collStats" in pipeline[0]:
        docs = _coll_stats_stage(call, call.db, name, pipeline[0]["$collStats"])
        rest = pipeline[1:]
    elif pipeline and isinstance(pipeline[0], dict) and "$match" in pipeline[0]:
        docs = _read_docs(call, call.db, name, pipeline[0]["$match"])
        rest = pipeline[1:]
    else:
        docs = _read_docs(call, call.db, name, {})
    if any(isinstance(s, dict) and "$collStats" in s for s in rest):
        raise CommandError(
            40602, "$collStats is only valid as the first stage in a pipeline.", code_name="Location40602"
        )
    db = call.db

    def resolver(other: str) -> list:
        return _read_docs(call, db, other, {})

    result = query.run_pipeline(docs, rest, resolver) if rest else docs
    if call.cmd.get("explain"):
        return {
            "stages": [{"$cursor": {"queryPlanner": {"namespace": ns, "winningPlan": {"stage": "COLLSCAN"}}}}]
        }
    return open_cursor(call, ns, result, batch_size)


# -- explain and validate (stubs) -----------------------------------------------------------------
EXPLAINABLE = {"find", "aggregate", "count", "distinct", "update", "delete", "findandmodify"}


@command("explain", kind="read")
def cmd_explain(call: Call) -> dict:
    """``explain`` of find, aggregate, count, distinct, update, delete and findAndModify: MongoDB's
    reply layout (explainVersion, queryPlanner, executionStats, command, serverInfo) with a
    collection scan as the plan, since the simulator plans nothing; writes are not run."""
    inner = call.arg()
    if not isinstance(inner, dict) or not inner:
        raise CommandError(
            14,
            "BSON field 'explain.explain' is the wrong type, expected type 'object'",
            code_name="TypeMismatch",
        )
    name = next(iter(inner))
    if name.lower() not in EXPLAINABLE:
        raise CommandError(59, f"Explain failed due to unknown command: {name}", code_name="CommandNotFound")
    target = inner[name]
    ns = f"{call.db}.{target}"
    verbosity = call.cmd.get("verbosity", "allPlansExecution")
    if verbosity not in ("queryPlanner", "executionStats", "allPlansExecution"):
        raise CommandError(
            2,
            f"Enumeration value '{verbosity}' for field 'explain.verbosity' is not a valid value.",
            code_name="BadValue",
        )
    spec = inner.get("filter", inner.get("query")) or {}
    reply: dict = {
        "explainVersion": "1",
        "queryPlanner": {
            "namespace": ns,
            "indexFilterSet": False,
            "parsedQuery": spec,
            "winningPlan": {"stage": "COLLSCAN", "filter": spec, "direction": "forward"},
            "rejectedPlans": [],
        },
    }
    if (
        verbosity != "queryPlanner"
        and name.lower() in ("find", "count", "distinct")
        and isinstance(target, str)
    ):
        docs = _read_docs(call, call.db, target, spec if isinstance(spec, dict) else {})
        total = len(call.backend.read_docs(call.op, call.db, target, {}))
        reply["executionStats"] = {
            "executionSuccess": True,
            "nReturned": len(docs),
            "executionTimeMillis": 0,
            "totalKeysExamined": 0,
            "totalDocsExamined": total,
        }
    reply["command"] = {**inner, "$db": call.db}
    host, _, port = call.endpoint.host.rpartition(":")
    version = call.endpoint.deployment.version
    reply["serverInfo"] = {"host": host, "port": int(port), "version": version, "gitVersion": "mongosim"}
    return reply


@command("validate", kind="read")
def cmd_validate(call: Call) -> dict:
    """``validate``: the simulator's collections are always consistent (MongoDB's reply fields,
    nothing invalid)."""
    name = call.collection_name()
    meta = call.backend.collection_meta(call.op, call.db, name)
    if meta is None:
        raise CommandError(26, f"Collection '{call.db}.{name}' does not exist to validate.")
    count = call.backend.count_all(call.op, call.db, name)
    return {
        "ns": f"{call.db}.{name}",
        "uuid": meta.uuid,
        "nInvalidDocuments": 0,
        "nNonCompliantDocuments": 0,
        "nrecords": count,
        "nIndexes": len(meta.indexes),
        "keysPerIndex": {index["name"]: count for index in meta.indexes},
        "indexDetails": {index["name"]: {"valid": True} for index in meta.indexes},
        "valid": True,
        "repaired": False,
        "warnings": [],
        "errors": [],
        "extraIndexEntries": [],
        "missingIndexEntries": [],
        "corruptRecords": [],
    }


# -- catalog ---------------------------------------------------------------------------------------
@command("listDatabases", kind="read", admin_only=True)
def cmd_list_databases(call: Call) -> dict:
    entries = call.backend.list_databases(call.op)
    spec = call.cmd.get("filter")
    name_only = bool(call.cmd.get("nameOnly"))
    databases = []
    total = 0
    for name, size, empty in entries:
        doc = {"name": name} if name_only else {"name": name, "sizeOnDisk": Int64(size), "empty": empty}
        if spec and not query.compile_filter(spec)(doc if name_only else {**doc, "name": name}):
            continue
        databases.append(doc)
        total += size
    if name_only:
        return {"databases": databases}
    return {"databases": databases, "totalSize": Int64(total), "totalSizeMb": Int64(total // (1024 * 1024))}


@command("listCollections", kind="read", in_txn=True)
def cmd_list_collections(call: Call) -> dict:
    infos = call.backend.list_collections(call.op, call.db)
    spec = call.cmd.get("filter") or {}
    name_only = bool(call.cmd.get("nameOnly"))
    pred = query.compile_filter(spec)
    docs = []
    for info in infos:
        if not pred(info):
            continue
        docs.append({"name": info["name"], "type": info["type"]} if name_only else info)
    cursor_spec = call.cmd.get("cursor") or {}
    return open_cursor(call, f"{call.db}.$cmd.listCollections", docs, cursor_spec.get("batchSize"))


@command("create", kind="write", in_txn=True)
def cmd_create(call: Call) -> dict:
    name = call.collection_name()
    options = {
        k: v
        for k, v in call.cmd.items()
        if k
        not in (
            "create",
            "$db",
            "lsid",
            "txnNumber",
            "autocommit",
            "startTransaction",
            "$clusterTime",
            "writeConcern",
            "$readPreference",
            "comment",
            "apiVersion",
            "apiStrict",
            "apiDeprecationErrors",
            "readConcern",
        )
    }
    # Views (viewOn, pipeline) and time-series collections are left out on purpose (README): their
    # options are answered as fields MongoDB does not know.
    for key in options:
        if key not in (
            "capped",
            "size",
            "max",
            "changeStreamPreAndPostImages",
            "validator",
            "validationLevel",
            "validationAction",
            "collation",
            "storageEngine",
            "indexOptionDefaults",
            "expireAfterSeconds",
            "clusteredIndex",
            "encryptedFields",
            "idIndex",
            "flags",
            "autoIndexId",
        ):
            raise CommandError(
                40415, f"BSON field 'create.{key}' is an unknown field.", code_name="Location40415"
            )
    if "changeStreamPreAndPostImages" in options:
        value = options["changeStreamPreAndPostImages"]
        if not isinstance(value, dict) or "enabled" not in value:
            raise CommandError(
                40414,
                "BSON field 'changeStreamPreAndPostImages.enabled' is missing but a required field",
                code_name="Location40414",
            )
        if not value["enabled"]:
            options.pop("changeStreamPreAndPostImages")
        else:
            options["changeStreamPreAndPostImages"] = {"enabled": True}
    call.backend.create_collection(call.op, call.db, name, options)
    return {}


@command("drop", kind="write")
def cmd_drop(call: Call) -> dict:
    name = call.collection_name()
    meta = call.backend.collection_meta(call.op, call.db, name)
    if call.db == "local" and name == "oplog.rs":
        raise CommandError(20, "can't drop live oplog while replicating")
    if meta is None:
        return {}
    indexes = len(meta.indexes)
    call.backend.drop_collection(call.op, call.db, name)
    return {"nIndexesWas": indexes, "ns": f"{call.db}.{name}"}


@command("dropDatabase", kind="write")
def cmd_drop_database(call: Call) -> dict:
    if call.db in ("local", "admin"):
        raise CommandError(20, f"Cannot drop '{call.db}' database while replication is active")
    call.backend.drop_database(call.op, call.db)
    return {"dropped": call.db}


@command("renameCollection", kind="write", admin_only=True)
def cmd_rename_collection(call: Call) -> dict:
    source = call.arg()
    target = call.cmd.get("to")
    if not isinstance(source, str) or "." not in source or not isinstance(target, str) or "." not in target:
        raise CommandError(73, "Invalid namespace specified")
    call.backend.rename_collection(call.op, source, target, bool(call.cmd.get("dropTarget")))
    return {}


@command("collMod", kind="write")
def cmd_coll_mod(call: Call) -> dict:
    name = call.collection_name()
    changes = {
        k: v
        for k, v in call.cmd.items()
        if k
        not in (
            "collMod",
            "$db",
            "lsid",
            "txnNumber",
            "$clusterTime",
            "writeConcern",
            "$readPreference",
            "comment",
            "apiVersion",
            "apiStrict",
            "apiDeprecationErrors",
        )
    }
    call.backend.coll_mod(call.op, call.db, name, changes)
    return {}


@command("createIndexes", kind="write", in_txn=True)
def cmd_create_indexes(call: Call) -> dict:
    name = call.collection_name()
    indexes = call.cmd.get("indexes")
    if not isinstance(indexes, list) or not indexes:
        raise CommandError(2, "Must specify at least one index to create", code_name="BadValue")
    before, after, created = call.backend.create_indexes(call.op, call.db, name, indexes)
    reply = {"numIndexesBefore": before, "numIndexesAfter": after, "createdCollectionAutomatically": created}
    if before == after:
        reply["note"] = "all indexes already exist"
    return reply


@command("listIndexes", kind="read", in_txn=True)
def cmd_list_indexes(call: Call) -> dict:
    name = call.collection_name()
    meta = call.backend.collection_meta(call.op, call.db, name)
    if meta is None:
        raise CommandError(26, f"ns does not exist: {call.db}.{name}")
    cursor_spec = call.cmd.get("cursor") or {}
    return open_cursor(
        call, f"{call.db}.{name}", [dict(i) for i in meta.indexes], cursor_spec.get("batchSize")
    )


@command("dropIndexes", "deleteIndexes", kind="write")
def cmd_drop_indexes(call: Call) -> dict:
    name = call.collection_name()
    before = call.backend.drop_indexes(call.op, call.db, name, call.cmd.get("index"))
    return {"nIndexesWas": before}


# -- sizes and chunk planning ---------------------------------------------------------------------
@command("dbStats", kind="read")
def cmd_db_stats(call: Call) -> dict:
    infos = call.backend.list_collections(call.op, call.db)
    objects = size = storage = indexes = index_size = 0
    for info in infos:
        for _host, _shard, stats in call.backend.coll_stats(call.op, call.db, info["name"]):
            if stats is None:
                continue
            objects += stats["count"]
            size += stats["size"]
            storage += stats["storageSize"]
            indexes += stats.get("nindexes", 0)
            index_size += stats.get("totalIndexSize", 0)
    return {
        "db": call.db,
        "collections": len(infos),
        "views": 0,
        "objects": objects,
        "avgObjSize": (size / objects) if objects else 0,
        "dataSize": float(size),
        "storageSize": float(storage),
        "indexes": indexes,
        "indexSize": float(index_size),
        "totalSize": float(storage + index_size),
        "scaleFactor": 1,
        "fsUsedSize": 0.0,
        "fsTotalSize": 0.0,
    }


@command("collStats", kind="read")
def cmd_coll_stats(call: Call) -> dict:
    name = call.collection_name()
    scale = int(call.cmd.get("scale") or 1)
    results = call.backend.coll_stats(call.op, call.db, name)
    count = size = storage = total_index = nindexes = 0
    capped = False
    extra = {}
    found = False
    for _host, _shard, stats in results:
        if stats is None:
            continue
        found = True
        count += stats["count"]
        size += stats["size"]
        storage += stats["storageSize"]
        total_index += stats.get("totalIndexSize", 0)
        nindexes = max(nindexes, stats.get("nindexes", 0))
        capped = stats.get("capped", False)
        if "maxSize" in stats:
            extra["maxSize"] = Int64(stats["maxSize"] // scale)
            extra["max"] = stats.get("max", Int64(0))
    if not found:
        raise CommandError(26, f"Collection [{call.db}.{name}] not found.")
    reply = {
        "ns": f"{call.db}.{name}",
        "size": size // scale,
        "count": count,
        "avgObjSize": (size // count) if count else 0,
        "storageSize": storage // scale,
        "nindexes": nindexes,
        "totalIndexSize": total_index // scale,
        "indexSizes": {},
        "capped": capped,
        "scaleFactor": scale,
    }
    meta = call.backend.collection_meta(call.op, call.db, name)
    if meta is not None:
        reply["indexSizes"] = {i["name"]: max(4096, count * 24) // scale for i in meta.indexes}
    reply.update(extra)
    if call.endpoint.is_mongos:
        reply["sharded"] = bool(meta is not None and meta.shard_key)
    return reply


def _key_values(doc: dict, pattern: dict) -> dict:
    return {field: query.get_path(doc, field, None) for field in pattern}


def _key_sort(key: dict) -> tuple:
    return tuple(bsonutil.sort_key(v) for v in key.values())


def _range_docs(call: Call, ns: str, pattern: dict, min_key, max_key) -> tuple[list, object]:
    db, _, name = ns.partition(".")
    meta = call.backend.collection_meta(call.op, db, name)
    if meta is None:
        raise CommandError(26, "ns not found")
    docs = call.backend.read_docs(call.op, db, name, {})
    keyed = [(_key_sort(_key_values(d, pattern)), d) for d in docs]
    if min_key:
        low = _key_sort({f: min_key.get(f) for f in pattern})
        keyed = [kd for kd in keyed if kd[0] >= low]
    if max_key:
        high = _key_sort({f: max_key.get(f) for f in pattern})
        keyed = [kd for kd in keyed if kd[0] < high]
    keyed.sort(key=lambda kd: kd[0])
    return keyed, meta


@command("dataSize", kind="read")
def cmd_data_size(call: Call) -> dict:
    started = time.monotonic()
    ns = call.arg()
    if not isinstance(ns, str) or "." not in ns:
        raise CommandError(73, "Invalid namespace specified")
    pattern = call.cmd.get("keyPattern") or {"_id": 1}
    db, _, name = ns.partition(".")
    if call.backend.collection_meta(call.op, db, name) is None:
        return {"size": 0, "numObjects": 0, "millis": 0, "estimate": bool(call.cmd.get("estimate"))}
    keyed, meta = _range_docs(call, ns, pattern, call.cmd.get("min"), call.cmd.get("max"))
    size = sum(bsonutil.bson_size(d) for _, d in keyed)
    return {
        "estimate": bool(call.cmd.get("estimate")),
        "size": size,
        "numObjects": len(keyed),
        "millis": int((time.monotonic() - started) * 1000),
    }


@command("splitVector", kind="read")
def cmd_split_vector(call: Call) -> dict:
    started = time.monotonic()
    ns = call.arg()
    if not isinstance(ns, str) or "." not in ns:
        raise CommandError(73, "Invalid namespace specified")
    pattern = call.cmd.get("keyPattern")
    if not isinstance(pattern, dict) or not pattern:
        raise CommandError(
            40414,
            "BSON field 'splitVector.keyPattern' is missing but a required field",
            code_name="Location40414",
        )
    db, _, name = ns.partition(".")
    meta = call.backend.collection_meta(call.op, db, name)
    if meta is None:
        raise CommandError(26, "ns not found")
    fields = list(pattern)
    if not any(list(i["key"])[: len(fields)] == fields for i in meta.indexes):
        raise CommandError(
            27, f"couldn't find index over splitting key {bsonutil.to_relaxed_json(dict(pattern))}"
        )
    force = bool(call.cmd.get("force"))
    max_bytes = call.cmd.get("maxChunkSizeBytes")
    if max_bytes is None and call.cmd.get("maxChunkSize") is not None:
        max_bytes = int(call.cmd["maxChunkSize"]) * 1024 * 1024
    max_objects = int(call.cmd.get("maxChunkObjects") or 250000)
    max_split_points = int(call.cmd.get("maxSplitPoints") or 0)
    keyed, meta = _range_docs(call, ns, pattern, call.cmd.get("min"), call.cmd.get("max"))
    all_docs = call.backend.read_docs(call.op, db, name, {})
    record_count = len(all_docs)
    data_size = sum(bsonutil.bson_size(d) for d in all_docs)
    if force:
        max_bytes = data_size
    if not max_bytes or int(max_bytes) <= 0:
        raise CommandError(72, "need to specify the desired max chunk size", code_name="InvalidOptions")
    max_bytes = int(max_bytes)
    millis = lambda: int((time.monotonic() - started) * 1000)  # noqa: E731
    if data_size < max_bytes or record_count == 0:
        return {"timeMillis": millis(), "splitKeys": []}
    if not keyed:
        raise CommandError(96, "can't open a cursor to scan the range (desired range is possibly empty)")
    avg = data_size // record_count
    key_count = max_bytes // (2 * max(avg, 1))
    if max_objects and max_objects < key_count:
        key_count = max_objects
    keys = [_key_values(d, pattern) for _, d in keyed]
    if _key_sort(keys[0]) == _key_sort(keys[-1]):
        return {"timeMillis": millis(), "splitKeys": []}
    # MongoDB's splitVector: every keyCount-th key becomes a split point (equal keys are skipped);
    # with force, the split is at the middle key.
    if force:
        key_count = len(keys) // 2
    split_keys = [keys[0]]
    current = 0
    for key in keys:
        current += 1
        if current > key_count:
            if _key_sort(key) != _key_sort(split_keys[-1]):
                split_keys.append(key)
                current = 0
        if max_split_points and len(split_keys) - 1 >= max_split_points:
            break
    return {"timeMillis": millis(), "splitKeys": split_keys[1:]}


# -- oplog retention (simulator test command) -----------------------------------------------------
@command("mongosimSetOplogRetention", admin_only=True)
def cmd_set_oplog_retention(call: Call) -> dict:
    def limit(name):
        value = call.cmd.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float, Int64)) or int(value) < 1:
            raise CommandError(2, f"{name} must be a positive number or null", code_name="BadValue")
        return int(value)

    max_entries, max_bytes = limit("maxEntries"), limit("maxBytes")
    oplogs = call.backend.oplogs()
    if not oplogs:
        raise CommandError(76, "not running with --replSet", code_name="NoReplicationEnabled")
    for oplog in oplogs:
        oplog.set_retention(max_entries, max_bytes)
    return {
        "maxEntries": max_entries,
        "maxBytes": max_bytes,
        "count": sum(len(o.entries) for o in oplogs),
        "size": sum(o.total_bytes for o in oplogs),
        "firstTs": max(
            (o.entries[0]["ts"] for o in oplogs if o.entries), default=Timestamp(0, 0), key=bsonutil.ts_key
        ),
    }


def _now():
    from devtools.mongosim.oplog import wall_now

    return wall_now()
