"""mongos: routes commands to the shard replica sets of the same process.

Sharded collections (``shardCollection``) keep their documents on the shard chosen by a hash of
the shard key values (both ``{field: 1}`` and ``{field: "hashed"}`` keys are routed by hash; there
are no chunk ranges, splits, migrations or balancer). Unsharded collections live on the database's
primary shard (``shard0``). Reads scatter to the shards and merge on mongos; writes go to the
shard(s) the shard key targets. Change streams merge the shards' oplogs in resume-token order.
DDL that has to touch every shard is logged with ``fromMigrate: true`` on the non-primary shards,
so a sharded drop is seen once, as on MongoDB.

Shards can be added while running: ``mongosimStartReplicaSet`` (simulator command) starts and
initiates a new replica set in the process, ``addShard`` adds it. As on MongoDB without a
balancer, a new shard holds no data of the collections sharded before it came (they keep routing
to the shards they were sharded over); collections sharded afterwards spread over it too. Open
change streams through mongos read the new shard from then on.
"""

from __future__ import annotations

import hashlib

from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from devtools.mongosim import bsonutil, query
from devtools.mongosim import commands as cmds
from devtools.mongosim.catalog import Collection
from devtools.mongosim.endpoint import WRITE_COMMANDS, Endpoint, configure_fail_point
from devtools.mongosim.engine import OpCtx, no_such_transaction
from devtools.mongosim.errors import CommandError
from devtools.mongosim.oplog import wall_now

NOT_ON_MONGOS = {"splitvector", "replsetgetstatus", "replsetstepdown", "replsetgetconfig", "datasize"}


class RouterSession:
    def __init__(self):
        self.last_txn_number = -1
        self.txn_number: int | None = None
        self.state = "none"
        self.participants: list = []
        self.retry_replies: dict = {}
        self.outcomes: dict[int, str] = {}


class RouterCtx:
    def __init__(
        self,
        router: Router,
        db: str,
        user: str | None,
        lsid=None,
        txn_number=None,
        in_txn: bool = False,
        retryable: bool = False,
        session: RouterSession | None = None,
    ):
        self.router = router
        self.db = db
        self.user = user
        self.lsid = lsid
        self.txn_number = txn_number
        self.in_txn = in_txn
        self.retryable = retryable
        self.session = session
        self.txn = session if in_txn else None  # commands check "txn is not None"
        self.op_time: Timestamp | None = None
        self._ctxs: dict[int, OpCtx] = {}

    def shard_ctx(self, shard, from_migrate: bool = False) -> OpCtx:
        key = (id(shard), from_migrate)
        ctx = self._ctxs.get(key)
        if ctx is not None:
            return ctx
        ctx = OpCtx(shard, self.db, user=self.user)
        ctx.from_migrate = from_migrate
        if self.lsid is not None:
            ctx.session = shard.session(self.lsid, self.user)
        if self.in_txn:
            shard_session = ctx.session
            txn = shard_session.txn
            if txn is None or txn.txn_number != self.txn_number or txn.state != "in_progress":
                txn = shard.begin_transaction(shard_session, self.txn_number)
            ctx.txn = txn
            ctx.txn_number = self.txn_number
            if shard not in self.session.participants:
                self.session.participants.append(shard)
        elif self.retryable and not from_migrate:
            ctx.txn_number = self.txn_number
            ctx.retryable = True
            if ctx.session.last_txn_number != self.txn_number:
                ctx.session.last_txn_number = self.txn_number
                ctx.session.last_write_op_time = None
        self._ctxs[key] = ctx
        return ctx

    def note(self, ctx: OpCtx) -> None:
        if ctx.op_time is not None and (
            self.op_time is None or bsonutil.ts_key(ctx.op_time) > bsonutil.ts_key(self.op_time)
        ):
            self.op_time = ctx.op_time


class Router(Endpoint):
    is_mongos = True

    def __init__(self, deployment, shards: list):
        super().__init__(deployment)
        self.shards = shards
        self.added: dict[str, Timestamp] = {}  # shards added while running -> when
        self.sharded: dict[str, dict] = {}
        self.sessions: dict[bytes, RouterSession] = {}
        self.backend = RouterBackend(self)

    # -- handshake -------------------------------------------------------------------------------
    def hello_fields(self, legacy: bool) -> dict:
        return {
            "ismaster" if legacy else "isWritablePrimary": True,
            "msg": "isdbgrid",
            "topologyVersion": self.topology_version(),
        }

    def decorate(self, reply: dict) -> dict:
        reply = dict(reply)
        op_time = reply.pop("_op_time", None) or self.deployment.clock.now
        reply.update(self.cluster_time_fields(op_time))
        return reply

    def extra_commands(self) -> dict:
        return ROUTER_COMMANDS

    # -- routing ---------------------------------------------------------------------------------
    def primary_shard(self, db: str):
        return self.shards[0]

    def shard_of(self, ns: str, doc: dict):
        meta = self.sharded.get(ns)
        if meta is None:
            return self.primary_shard(ns.split(".", 1)[0])
        values = [query.get_path(doc, field, None) for field in meta["key"]]
        owners = meta["shards"]  # the shards the collection was sharded over (no balancer)
        return owners[_hash_index(values, len(owners))]

    def targets(self, ns: str, spec) -> list:
        meta = self.sharded.get(ns)
        if meta is None:
            return [self.primary_shard(ns.split(".", 1)[0])]
        values = query.shard_key_values(spec, meta["key"])
        owners = meta["shards"]
        if values is not None:
            return [owners[_hash_index([values[f] for f in meta["key"]], len(owners))]]
        return list(owners)

    def add_shard(self, rs) -> None:
        """Add a replica set as a shard (it holds no data yet)."""
        self.shards.append(rs)
        self.added[rs.set_name] = self.deployment.clock.now

    def session_for(self, lsid) -> RouterSession:
        key = bytes(lsid["id"]) if isinstance(lsid, dict) and "id" in lsid else b""
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = RouterSession()
        return session

    # -- execution -------------------------------------------------------------------------------
    def run(self, conn, name: str, lname: str, cmd: dict, db: str) -> dict:
        if lname in NOT_ON_MONGOS:
            raise CommandError(59, f"no such cmd: {name}")
        if db == "local":
            raise CommandError(20, "can't use 'local' database through mongos")
        return super().run(conn, name, lname, cmd, db)

    def execute(self, conn, handler, cmd, db) -> dict:
        lname = handler.name.lower()
        lsid = cmd.get("lsid")
        txn_number = cmd.get("txnNumber")
        autocommit = cmd.get("autocommit")
        session = self.session_for(lsid) if isinstance(lsid, dict) else None
        ctx = RouterCtx(self, db, conn.user, lsid=lsid if isinstance(lsid, dict) else None, session=session)
        if autocommit is False:
            if session is None:
                raise CommandError(
                    50768,
                    "Transaction number requires a session ID to also be specified",
                    code_name="Location50768",
                )
            number = int(txn_number)
            ctx.txn_number = number
            if lname in ("committransaction", "aborttransaction"):
                ctx.in_txn = True
                ctx.txn = session
                return handler.func(cmds.Call(self, self.backend, conn, cmd, db, ctx))
            if cmd.get("startTransaction"):
                if number <= session.last_txn_number:
                    raise CommandError(
                        225,
                        f"Cannot start transaction {number} on session because a newer "
                        f"transaction {session.last_txn_number} has already started.",
                    )
                session.last_txn_number = number
                session.txn_number = number
                session.state = "in_progress"
                session.participants = []
            elif session.txn_number != number or session.state != "in_progress":
                raise no_such_transaction(number)
            if not handler.in_txn:
                raise CommandError(263, f"Cannot run '{handler.name}' in a multi-document transaction.")
            ctx.in_txn = True
            ctx.txn = session
        elif txn_number is not None and lname in WRITE_COMMANDS and session is not None:
            number = int(txn_number)
            if number < session.last_txn_number:
                raise CommandError(
                    225,
                    f"Retryable write with txnNumber {number} is prohibited on session "
                    f"because a newer retryable write with txnNumber {session.last_txn_number} "
                    "has already started on this session.",
                )
            if number == session.last_txn_number and number in session.retry_replies:
                return dict(session.retry_replies[number])
            session.last_txn_number = number
            session.retry_replies = {}
            ctx.txn_number = number
            ctx.retryable = True
        call = cmds.Call(self, self.backend, conn, cmd, db, ctx)
        try:
            reply = handler.func(call)
        except CommandError:
            if ctx.in_txn:
                self.abort(session)
            raise
        if ctx.in_txn and reply.get("writeErrors"):
            self.abort(session)
        if ctx.retryable and not reply.get("writeErrors"):
            session.retry_replies[ctx.txn_number] = dict(reply)
        if ctx.op_time is not None:
            reply = dict(reply)
            reply["_op_time"] = ctx.op_time
        return reply

    def abort(self, session: RouterSession) -> None:
        if session is None or session.state != "in_progress":
            return
        for shard in session.participants:
            for shard_session in shard.sessions.values():
                txn = shard_session.txn
                if (
                    txn is not None
                    and txn.txn_number == session.txn_number
                    and txn.state == "in_progress"
                    and shard_session.last_txn_number == session.txn_number
                ):
                    shard.abort_transaction(txn)
        session.state = "aborted"
        session.outcomes[session.txn_number] = "aborted"

    def commit(self, ctx: RouterCtx) -> Timestamp | None:
        session = ctx.session
        number = ctx.txn_number
        if session.txn_number != number or session.state == "none":
            if session.outcomes.get(number) == "committed":
                return None
            raise no_such_transaction(number)
        if session.state == "committed":
            return None
        if session.state == "aborted":
            raise no_such_transaction(number)
        txns = []
        for shard in session.participants:
            shard_session = shard.session(ctx.lsid, ctx.user)
            txn = shard_session.txn
            if txn is not None and txn.txn_number == number:
                txns.append((shard, txn))
        ts = self.deployment.clock.tick() if any(t.ops for _, t in txns) else None
        for shard, txn in txns:
            shard.commit_transaction(txn, ts)
        session.state = "committed"
        session.outcomes[number] = "committed"
        return ts


def _hash_index(values: list, count: int) -> int:
    digest = hashlib.md5(bsonutil.encode({"k": values})).digest()
    return int.from_bytes(digest[:8], "big") % count


class _MergedMeta:
    """collection_meta() through mongos: the primary shard's collection plus the shard key."""

    def __init__(self, coll: Collection, shard_key):
        self.name = coll.name
        self.uuid = coll.uuid
        self.options = coll.options
        self.indexes = coll.indexes
        self.shard_key = shard_key


class RouterBackend:
    def __init__(self, router: Router):
        self.router = router

    # -- config database -------------------------------------------------------------------------
    def _config_docs(self, name: str) -> list | None:
        router = self.router
        if name == "shards":
            return [
                {
                    "_id": shard.set_name,
                    "host": f"{shard.set_name}/" + ",".join(m.host for m in shard.members),
                    "state": 1,
                    "topologyTime": router.added.get(
                        shard.set_name, Timestamp(int(router.deployment.started), 1)
                    ),
                }
                for shard in router.shards
            ]
        if name == "databases":
            names = sorted(
                {
                    db
                    for shard in router.shards
                    for db in shard.catalog.database_names()
                    if db not in ("admin", "config", "local")
                }
            )
            return [
                {
                    "_id": db,
                    "primary": router.primary_shard(db).set_name,
                    "partitioned": True,
                    "version": {
                        "uuid": router.primary_shard(db).oplog_uuid,
                        "timestamp": Timestamp(int(router.deployment.started), 1),
                        "lastMod": 1,
                    },
                }
                for db in names
            ]
        if name == "collections":
            return [
                {
                    "_id": ns,
                    "lastmodEpoch": meta["epoch"],
                    "lastmod": meta["created"],
                    "timestamp": meta["timestamp"],
                    "uuid": meta["uuid"],
                    "key": dict(meta["key"]),
                    "unique": meta["unique"],
                    "noBalance": False,
                }
                for ns, meta in router.sharded.items()
            ]
        return None

    # -- reads -----------------------------------------------------------------------------------
    def read_docs(self, ctx: RouterCtx, db: str, name: str, spec) -> list:
        if db == "config":
            docs = self._config_docs(name)
            if docs is not None:
                pred = query.compile_filter(spec)
                return [d for d in docs if pred(d)]
        out = []
        for shard in self.router.targets(f"{db}.{name}", spec):
            sctx = ctx.shard_ctx(shard)
            coll, docs = shard.view(sctx, db, name)
            if coll is not None:
                out.extend(shard.candidates(docs, spec))
        return out

    def count_all(self, ctx: RouterCtx, db: str, name: str) -> int:
        return sum(len(shard.view(ctx.shard_ctx(shard), db, name)[1]) for shard in self._holders(db, name))

    def _holders(self, db: str, name: str) -> list:
        if f"{db}.{name}" in self.router.sharded:
            return list(self.router.shards)
        return [self.router.primary_shard(db)]

    def collection_meta(self, ctx: RouterCtx, db: str, name: str):
        primary = self.router.primary_shard(db)
        coll = primary.view(ctx.shard_ctx(primary), db, name)[0]
        if coll is None:
            return None
        meta = self.router.sharded.get(f"{db}.{name}")
        return _MergedMeta(coll, dict(meta["key"]) if meta else None)

    # -- writes ----------------------------------------------------------------------------------
    def insert(self, ctx: RouterCtx, db: str, name: str, doc: dict) -> None:
        if not isinstance(doc, dict):
            raise CommandError(14, "Wrong type for 'documents[0]'. Expected an object")
        if "_id" not in doc:
            doc = {"_id": ObjectId(), **doc}
        ns = f"{db}.{name}"
        meta = self.router.sharded.get(ns)
        if meta is not None:
            for field in meta["key"]:
                if query.get_path(doc, field) is query._MISSING and field != "_id":  # pylint: disable=protected-access
                    pass  # MongoDB 4.4+ treats a missing shard key field as null
        shard = self.router.shard_of(ns, doc)
        sctx = ctx.shard_ctx(shard)
        shard.insert(sctx, db, name, doc)
        ctx.note(sctx)

    def update(
        self,
        ctx: RouterCtx,
        db: str,
        name: str,
        spec,
        update,
        upsert=False,
        multi=False,
        array_filters=None,
        sort=None,
        return_docs=False,
    ) -> dict:
        ns = f"{db}.{name}"
        targets = self.router.targets(ns, spec)
        total = {"n": 0, "nModified": 0, "upserted": None, "before": None, "after": None}
        if not multi and len(targets) > 1:
            targets = self._best_target(ctx, db, name, spec, sort, targets)
        for shard in targets:
            sctx = ctx.shard_ctx(shard)
            result = shard.update(
                sctx,
                db,
                name,
                spec,
                update,
                upsert=False,
                multi=multi,
                array_filters=array_filters,
                sort=sort,
                return_docs=return_docs,
            )
            ctx.note(sctx)
            total["n"] += result["n"]
            total["nModified"] += result["nModified"]
            if result["n"] and total["before"] is None and total["after"] is None:
                total["before"], total["after"] = result["before"], result["after"]
            if result["n"] and not multi:
                break
        if total["n"] == 0 and upsert:
            query.validate_update(update)
            if isinstance(update, dict) and not query.is_operator_update(update):
                new = dict(update)
                if "_id" not in new:
                    seed = query.upsert_seed(spec, {"$set": {}})
                    new = {"_id": seed.get("_id", ObjectId()), **new}
            else:
                new = query.apply_update(query.upsert_seed(spec, update), spec, update, True, array_filters)
                if "_id" not in new:
                    new = {"_id": ObjectId(), **new}
            self.insert(ctx, db, name, new)
            total.update(n=1, upserted=new["_id"], before=None, after=new)
        return total

    def _best_target(self, ctx: RouterCtx, db: str, name: str, spec, sort, targets: list) -> list:
        """For a single-document write without the shard key: the shard holding the first match."""
        best = None
        for shard in targets:
            sctx = ctx.shard_ctx(shard)
            coll, docs = shard.view(sctx, db, name)
            if coll is None:
                continue
            matches = shard.candidates(docs, spec)
            if sort:
                matches = query.sort_docs(matches, sort)
            if matches:
                if not sort:
                    return [shard]
                key = query.sort_docs([matches[0]] + ([best[1]] if best else []), sort)[0]
                if best is None or key is matches[0]:
                    best = (shard, matches[0])
        return [best[0]] if best else targets[:1]

    def delete(self, ctx: RouterCtx, db: str, name: str, spec, limit: int, sort=None):
        targets = self.router.targets(f"{db}.{name}", spec)
        if limit and len(targets) > 1:
            targets = self._best_target(ctx, db, name, spec, sort, targets)
        count = 0
        first = None
        for shard in targets:
            sctx = ctx.shard_ctx(shard)
            n, doc = shard.delete(sctx, db, name, spec, limit, sort)
            ctx.note(sctx)
            count += n
            first = first or doc
            if limit and n:
                break
        return count, first

    # -- catalog ---------------------------------------------------------------------------------
    def _fan_out(self, ctx: RouterCtx, db: str, action, all_shards: bool) -> None:
        primary = self.router.primary_shard(db)
        action(primary, ctx.shard_ctx(primary))
        if all_shards:
            for shard in self.router.shards:
                if shard is not primary:
                    action(shard, ctx.shard_ctx(shard, from_migrate=True))

    def create_collection(self, ctx, db, name, options):
        primary = self.router.primary_shard(db)
        sctx = ctx.shard_ctx(primary)
        primary.create_collection(sctx, db, name, options)
        ctx.note(sctx)

    def drop_collection(self, ctx, db, name):
        ns = f"{db}.{name}"
        sharded = ns in self.router.sharded

        def drop(shard, sctx):
            shard.drop_collection(sctx, db, name)

        self._fan_out(ctx, db, drop, sharded)
        self.router.sharded.pop(ns, None)

    def drop_database(self, ctx, db):
        self._fan_out(ctx, db, lambda shard, sctx: shard.drop_database(sctx, db), True)
        for ns in [ns for ns in self.router.sharded if ns.split(".", 1)[0] == db]:
            self.router.sharded.pop(ns, None)

    def rename_collection(self, ctx, source, target, drop_target):
        if source in self.router.sharded:
            raise CommandError(20, "cannot rename a sharded collection")
        primary = self.router.primary_shard(source.split(".", 1)[0])
        primary.rename_collection(ctx.shard_ctx(primary), source, target, drop_target)

    def coll_mod(self, ctx, db, name, changes):
        sharded = f"{db}.{name}" in self.router.sharded
        self._fan_out(ctx, db, lambda shard, sctx: shard.coll_mod(sctx, db, name, changes), sharded)

    def create_indexes(self, ctx, db, name, indexes):
        sharded = f"{db}.{name}" in self.router.sharded
        results = []
        self._fan_out(
            ctx,
            db,
            lambda shard, sctx: results.append(shard.create_indexes(sctx, db, name, indexes)),
            sharded,
        )
        return results[0]

    def drop_indexes(self, ctx, db, name, index):
        sharded = f"{db}.{name}" in self.router.sharded
        results = []
        self._fan_out(
            ctx, db, lambda shard, sctx: results.append(shard.drop_indexes(sctx, db, name, index)), sharded
        )
        return results[0]

    def list_collections(self, ctx, db) -> list:
        if db == "config":
            return [
                {"name": n, "type": "collection", "options": {}, "info": {"readOnly": False}}
                for n in ("shards", "databases", "collections")
            ]
        seen = {}
        for shard in self.router.shards:
            sctx = ctx.shard_ctx(shard)
            colls = (
                [c for c in sctx.txn.colls.values() if c.db == db]
                if sctx.txn is not None
                else shard.catalog.collections(db)
            )
            for coll in colls:
                seen.setdefault(coll.name, coll.info())
        return list(seen.values())

    def list_databases(self, ctx) -> list:
        sizes: dict[str, int] = {}
        for shard in self.router.shards:
            for name in shard.catalog.database_names():
                size = sum(
                    c.stats()["storageSize"] + c.stats()["totalIndexSize"]
                    for c in shard.catalog.collections(name)
                )
                sizes[name] = sizes.get(name, 0) + size
        out = [("admin", 8192, False), ("config", 8192, False)]
        out.extend(
            (name, size, False) for name, size in sorted(sizes.items()) if name not in ("admin", "config")
        )
        return out

    def coll_stats(self, ctx, db, name) -> list:
        out = []
        for shard in self._holders(db, name):
            coll = shard.view(ctx.shard_ctx(shard), db, name)[0]
            stats = None
            if coll is not None:
                stats = coll.stats()
                stats["capped"] = bool(coll.options.get("capped"))
            out.append(
                (shard.primary.host if shard.primary else shard.members[0].host, shard.set_name, stats)
            )
        return out

    def change_stream_nodes(self):
        # The live list: an open stream reads a shard added later from then on, as on MongoDB.
        return self.router.shards

    def lookup_document(self, db, name, uuid, document_key):
        ns = f"{db}.{name}"
        spec = dict(document_key)
        for shard in self.router.targets(ns, spec):
            coll = shard.catalog.get(db, name)
            if coll is None or (uuid is not None and coll.uuid != uuid):
                continue
            doc = coll.docs.get(bsonutil.id_key(document_key.get("_id")))
            if doc is not None:
                return doc
        return None

    def oplog_view(self):
        return None

    def local_sessions(self) -> list[dict]:
        return [
            {"_id": dict(s.lsid), "lastUse": s.last_use}
            for shard in self.router.shards
            for s in shard.sessions.values()
        ]

    def kill_sessions(self, ctx: RouterCtx, keys: set | None) -> None:
        """End or kill sessions on every shard, and mongos's own transactions of them."""
        for shard in self.router.shards:
            shard.kill_sessions(keys)
        for key, session in self.router.sessions.items():
            if keys is None or key in keys:
                self.router.abort(session)

    def oplogs(self) -> list:
        return [shard.oplog for shard in self.router.shards if shard.oplog is not None]


# -- mongos-only commands ---------------------------------------------------------------------------
ROUTER_COMMANDS: dict = {}


def router_command(*names, kind="none", admin_only=False, in_txn=False):
    def register(func):
        for name in names:
            ROUTER_COMMANDS[name.lower()] = cmds.Command(func, name, kind, admin_only, in_txn, True)
        return func

    return register


@router_command("isdbgrid")
def cmd_isdbgrid(call: cmds.Call) -> dict:
    return {"isdbgrid": 1, "hostname": "127.0.0.1"}


@router_command("listShards", admin_only=True)
def cmd_list_shards(call: cmds.Call) -> dict:
    return {"shards": call.backend._config_docs("shards")}  # pylint: disable=protected-access


@router_command("addShard", "addshard", admin_only=True)
def cmd_add_shard(call: cmds.Call) -> dict:
    """``addShard: "<set name>/<host>[,<host>...]"`` (``name`` optional, default the set name)."""
    router: Router = call.endpoint
    seed = call.arg()
    if not isinstance(seed, str) or not seed:
        raise CommandError(2, "addShard needs a connection string", code_name="BadValue")
    set_name, sep, hosts = seed.partition("/")
    if not sep or not set_name or not hosts:
        raise CommandError(
            96,
            f"can't add shard {seed}: give the replica set as <set name>/<host:port>",
            code_name="OperationFailed",
        )
    name = call.cmd.get("name") or set_name
    hosts = {h.strip() for h in hosts.split(",") if h.strip()}
    rs = next(
        (
            rs
            for rs in router.deployment.replsets
            if rs.set_name is not None and hosts & {m.host for m in rs.members}
        ),
        None,
    )
    if rs is None:
        raise CommandError(
            96,
            f"failed to connect to new shard {seed} :: caused by :: no replica set member listens at "
            + ", ".join(sorted(hosts)),
            code_name="OperationFailed",
        )
    if rs.set_name != set_name:
        raise CommandError(
            96,
            f"in seed list {seed}, host {sorted(hosts)[0]} does not belong to replica set {set_name}; "
            f"found {{ setName: {rs.set_name!r} }}",
            code_name="OperationFailed",
        )
    if name != rs.set_name:
        raise CommandError(2, "the simulator names a shard after its replica set", code_name="BadValue")
    if rs in router.shards:
        return {"shardAdded": rs.set_name}  # idempotent, as on MongoDB
    router.add_shard(rs)
    return {"shardAdded": rs.set_name}


@router_command("mongosimStartReplicaSet", admin_only=True)
def cmd_start_replica_set(call: cmds.Call) -> dict:
    """Simulator command: start and initiate a new replica set (for ``addShard``)."""
    router: Router = call.endpoint
    name = call.arg()
    if name in (1, 1.0, True):
        used = {rs.set_name for rs in router.deployment.replsets}
        name = next(f"shard{n}" for n in range(len(used) + 1) if f"shard{n}" not in used)
    if not isinstance(name, str) or not name or "/" in name:
        raise CommandError(2, "mongosimStartReplicaSet takes a replica set name or 1", code_name="BadValue")
    rs = router.deployment.start_replica_set(name)
    return {
        "setName": rs.set_name,
        "host": f"{rs.set_name}/" + ",".join(m.host for m in rs.members),
        "uri": rs.uri,
    }


@router_command("enableSharding", "enablesharding", admin_only=True)
def cmd_enable_sharding(call: cmds.Call) -> dict:
    return {}


@router_command("balancerStatus", admin_only=True)
def cmd_balancer_status(call: cmds.Call) -> dict:
    return {"mode": "off", "inBalancerRound": False, "numBalancerRounds": Int64(0)}


@router_command("configureFailPoint", admin_only=True)
def cmd_configure_fail_point(call: cmds.Call) -> dict:
    return configure_fail_point(call)


@router_command("shardCollection", "shardcollection", admin_only=True)
def cmd_shard_collection(call: cmds.Call) -> dict:
    router: Router = call.endpoint
    ns = call.arg()
    key = call.cmd.get("key")
    if not isinstance(ns, str) or "." not in ns:
        raise CommandError(73, "Invalid namespace specified")
    if not isinstance(key, dict) or not key:
        raise CommandError(2, "The shard key pattern must be a non-empty object", code_name="BadValue")
    for _field, kind in key.items():
        if kind not in (1, 1.0, "hashed"):
            raise CommandError(
                2,
                f"Unsupported shard key pattern {key}. Pattern must either be a single hashed "
                "field, or a list of ascending fields",
                code_name="BadValue",
            )
    db, _, name = ns.partition(".")
    if ns in router.sharded:
        if dict(router.sharded[ns]["key"]) == dict(key):
            return {"collectionsharded": ns, "collectionUUID": router.sharded[ns]["uuid"]}
        raise CommandError(20, f"sharding already enabled for collection {ns}")
    ctx: RouterCtx = call.op
    primary = router.primary_shard(db)
    pctx = ctx.shard_ctx(primary)
    coll = primary.ensure_collection(pctx, db, name)
    index_name = "_".join(f"{f}_{v}" for f, v in key.items())
    if not any(dict(i["key"]) == dict(key) for i in coll.indexes) and dict(key) != {"_id": 1}:
        primary.create_indexes(pctx, db, name, [{"key": dict(key), "name": index_name}])
    coll.shard_key = dict(key)
    for shard in router.shards:
        if shard is primary:
            continue
        other = shard.catalog.get(db, name)
        if other is None:
            other = coll.clone_empty(db, name)
            shard.catalog.add(other)
        other.shard_key = dict(key)
        other.uuid = coll.uuid
        other.indexes = [dict(i) for i in coll.indexes]
    router.sharded[ns] = {
        "shards": list(router.shards),
        "key": dict(key),
        "unique": bool(call.cmd.get("unique")),
        "uuid": coll.uuid,
        "epoch": ObjectId(),
        "created": _now(),
        "timestamp": router.deployment.clock.now,
    }
    # Move existing documents to the shard their key hashes to (migrations are not change events).
    for _key_id, doc in list(coll.docs.items()):
        target = router.shard_of(ns, doc)
        if target is primary:
            continue
        mctx = OpCtx(primary, db)
        mctx.from_migrate = True
        tctx = OpCtx(target, db)
        tctx.from_migrate = True
        target.insert(tctx, db, name, doc)
        primary.delete(mctx, db, name, {"_id": doc["_id"]}, 1)
    return {"collectionsharded": ns, "collectionUUID": coll.uuid}


@router_command("commitTransaction", kind="write", admin_only=True, in_txn=True)
def cmd_commit_transaction(call: cmds.Call) -> dict:
    ctx: RouterCtx = call.op
    if ctx.session is None:
        raise CommandError(
            50768, "commitTransaction must be run within a transaction", code_name="Location50768"
        )
    ts = call.endpoint.commit(ctx)
    return {"_op_time": ts} if ts is not None else {}


@router_command("abortTransaction", kind="write", admin_only=True, in_txn=True)
def cmd_abort_transaction(call: cmds.Call) -> dict:
    ctx: RouterCtx = call.op
    session = ctx.session
    if session is None or session.txn_number != ctx.txn_number or session.state == "aborted":
        raise no_such_transaction(ctx.txn_number)
    if session.state == "committed":
        raise CommandError(256, f"Transaction {ctx.txn_number} has been committed.")
    call.endpoint.abort(session)
    return {}


def _now():
    return wall_now()
