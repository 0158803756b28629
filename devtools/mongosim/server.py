"""Replica-set members (or a standalone server) and the deployment that owns every endpoint.

One process runs the whole deployment: every member and mongos listens on its own port of
127.0.0.1, all share one lock, one cluster clock and (per replica set) one copy of the data.
"""

from __future__ import annotations

import os
import threading
import time

from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from devtools.mongosim import auth as scram
from devtools.mongosim import commands as cmds
from devtools.mongosim.endpoint import WRITE_COMMANDS, Endpoint, configure_fail_point
from devtools.mongosim.engine import DataNode, NodeBackend, OpCtx, lsid_text, no_such_transaction
from devtools.mongosim.errors import CloseConnection, CommandError
from devtools.mongosim.failpoints import FAIL_COMMAND, FAIL_GET_MORE, ON_PRIMARY_TRANSACTIONAL_WRITE
from devtools.mongosim.oplog import INITIATING_SET, ClusterClock, wall_now
from devtools.mongosim.router import Router

WIRE_VERSIONS = {21: "7.0.14", 25: "8.0.4"}
TXN_META = ("lsid", "txnNumber", "autocommit", "startTransaction")


class Deployment:
    def __init__(
        self,
        mode: str,
        members: int = 1,
        shards: int = 2,
        auth: tuple[str, str] | None = None,
        oplog_max_entries: int | None = None,
        oplog_max_bytes: int | None = None,
        port: int = 0,
        noop_interval: float = 10.0,
        max_wire_version: int = 21,
    ):
        self.mode = mode
        self.lock = threading.RLock()
        self.cv = threading.Condition(self.lock)
        self.clock = ClusterClock()
        self.credentials = scram.Credentials(*auth) if auth else None
        self.noop_interval = noop_interval
        self.max_wire_version = max_wire_version
        self.version = WIRE_VERSIONS.get(max_wire_version, "7.0.14")
        self.pid = os.getpid()
        self.started = time.time()
        self.replsets: list[ReplicaSet] = []
        self.router = None
        self.members = members
        self.oplog_max_entries = oplog_max_entries
        self.oplog_max_bytes = oplog_max_bytes
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        first_port = port
        if mode == "standalone":
            rs = ReplicaSet(self, None, 1, oplog=False)
            self.replsets.append(rs)
        elif mode == "replset":
            rs = ReplicaSet(
                self, "rs0", members, oplog_max_entries=oplog_max_entries, oplog_max_bytes=oplog_max_bytes
            )
            self.replsets.append(rs)
        elif mode == "sharded":
            for index in range(shards):
                self.replsets.append(
                    ReplicaSet(
                        self,
                        f"shard{index}",
                        members,
                        oplog_max_entries=oplog_max_entries,
                        oplog_max_bytes=oplog_max_bytes,
                    )
                )
            self.router = Router(self, list(self.replsets))
        else:
            raise ValueError(f"unknown mode {mode!r}")
        self._first_port = first_port

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        port = self._first_port
        if self.router is not None:
            self.router.listen(port)
            port = 0
        for rs in self.replsets:
            for member in rs.members:
                member.listen(port)
                port = 0
        with self.lock:
            for rs in self.replsets:
                rs.initiate()
        thread = threading.Thread(target=self._maintenance, name="mongosim-maintenance", daemon=True)
        thread.start()
        self._threads.append(thread)

    def start_replica_set(self, name: str) -> ReplicaSet:
        """Start and initiate one more replica set in this process (its oplog begins with the
        "initiating set" entry, now), as an operator starts the mongod processes of a new shard
        and runs ``rs.initiate()``; ``addShard`` on mongos then adds it to the cluster."""
        with self.lock:
            if any(rs.set_name == name for rs in self.replsets):
                raise CommandError(
                    2, f"a replica set named {name} already runs in this simulator", code_name="BadValue"
                )
            rs = ReplicaSet(
                self,
                name,
                self.members,
                oplog_max_entries=self.oplog_max_entries,
                oplog_max_bytes=self.oplog_max_bytes,
            )
        for member in rs.members:
            member.listen(0)
        with self.lock:
            rs.initiate()
            self.replsets.append(rs)
        return rs

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            self.cv.notify_all()
        endpoints = ([self.router] if self.router else []) + [m for rs in self.replsets for m in rs.members]
        stoppers = [
            threading.Thread(target=e.server.stop, daemon=True) for e in endpoints if e.server is not None
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(timeout=5)

    def notify(self) -> None:
        self.cv.notify_all()

    @property
    def uri(self) -> str:
        if self.router is not None:
            return f"mongodb://{self.router.host}/"
        rs = self.replsets[0]
        return rs.uri

    def describe(self) -> dict:
        return {
            "uri": self.uri,
            "mode": self.mode,
            "shard_uris": [rs.uri for rs in self.router.shards] if self.router else [],
            "members": [m.host for rs in self.replsets for m in rs.members],
            "mongos": self.router.host if self.router else None,
        }

    def _maintenance(self) -> None:
        last_noop = time.monotonic()
        while not self._stop.wait(0.1):
            now = time.monotonic()
            with self.lock:
                for rs in self.replsets:
                    rs.maybe_elect()
                if now - last_noop >= self.noop_interval:
                    last_noop = now
                    for rs in self.replsets:
                        if (
                            rs.oplog is not None
                            and rs.primary is not None
                            and time.time() - _wall_seconds(rs.last_write_wall) >= self.noop_interval * 0.9
                        ):
                            rs.log_noop("periodic noop")
                for rs in self.replsets:
                    rs.reap_transactions()
                    for member in rs.members:
                        member.cursors.reap()
                if self.router is not None:
                    self.router.cursors.reap()


def _wall_seconds(wall) -> float:
    import calendar

    return calendar.timegm(wall.timetuple()) + wall.microsecond / 1e6


class Member(Endpoint):
    """One replica-set member (or the standalone server)."""

    FAIL_POINTS = (FAIL_COMMAND, FAIL_GET_MORE, ON_PRIMARY_TRANSACTIONAL_WRITE)

    def __init__(self, deployment: Deployment, replset: ReplicaSet, index: int):
        super().__init__(deployment)
        self.replset = replset
        self.index = index
        self.backend: NodeBackend | None = None

    def listen(self, port: int = 0) -> None:
        super().listen(port)
        self.backend = NodeBackend(self.replset, self.host)

    @property
    def is_primary(self) -> bool:
        return self.replset.primary is self

    def hello_fields(self, legacy: bool) -> dict:
        rs = self.replset
        reply: dict = {"topologyVersion": self.topology_version()}
        if rs.set_name is None:
            reply["ismaster" if legacy else "isWritablePrimary"] = True
            return reply
        reply["hosts"] = [m.host for m in rs.members]
        reply["setName"] = rs.set_name
        reply["setVersion"] = 1
        reply["ismaster" if legacy else "isWritablePrimary"] = self.is_primary
        reply["secondary"] = not self.is_primary
        if rs.primary is not None:
            reply["primary"] = rs.primary.host
        reply["me"] = self.host
        if self.is_primary:
            reply["electionId"] = rs.election_id
        op_time = {"ts": rs.last_write, "t": Int64(rs.term)}
        reply["lastWrite"] = {
            "opTime": op_time,
            "lastWriteDate": rs.last_write_wall,
            "majorityOpTime": op_time,
            "majorityWriteDate": rs.last_write_wall,
        }
        return reply

    def decorate(self, reply: dict) -> dict:
        reply = dict(reply)
        op_time = reply.pop("_op_time", None) or self.replset.last_write
        if self.replset.set_name is None:
            return reply
        reply.update(self.cluster_time_fields(op_time))
        return reply

    def extra_commands(self) -> dict:
        return MEMBER_COMMANDS

    def execute(self, conn, handler, cmd, db) -> dict:
        rs = self.replset
        lname = handler.name.lower()
        if rs.set_name is not None:
            if handler.kind == "write" and not self.is_primary:
                raise CommandError(10107, "not primary")
            if handler.kind == "read" and not self.is_primary and not _secondary_ok(cmd):
                raise CommandError(13435, "not primary and secondaryOk=false")
        lsid = cmd.get("lsid")
        txn_number = cmd.get("txnNumber")
        autocommit = cmd.get("autocommit")
        if txn_number is not None and rs.set_name is None:
            raise CommandError(20, "Transaction numbers are only allowed on a replica set member or mongos")
        if (txn_number is not None or autocommit is not None) and not isinstance(lsid, dict):
            raise CommandError(
                50768,
                "Transaction number requires a session ID to also be specified",
                code_name="Location50768",
            )
        ctx = OpCtx(rs, db, user=conn.user)
        if isinstance(lsid, dict) and "id" in lsid and rs.set_name is not None:
            ctx.session = rs.session(lsid, conn.user)
        if autocommit is None:
            ctx.read_at = self._snapshot_read(cmd, lname)
        if autocommit is False:
            ctx.txn_number = int(txn_number)
            ctx.txn = self._transaction(ctx, cmd, lname, handler)
            if lname in ("committransaction", "aborttransaction"):
                return handler.func(cmds.Call(self, self.backend, conn, cmd, db, ctx))
        elif txn_number is not None and lname in WRITE_COMMANDS:
            session = ctx.session
            number = int(txn_number)
            if number < session.last_txn_number:
                raise CommandError(
                    225,
                    f"Retryable write with txnNumber {number} is prohibited on session "
                    f"{lsid_text(lsid)} because a newer retryable write with txnNumber "
                    f"{session.last_txn_number} has already started on this session.",
                )
            if number > session.last_txn_number:
                if session.txn is not None and session.txn.state == "in_progress":
                    rs.abort_transaction(session.txn)
                session.last_txn_number = number
                session.statements = {}
                session.last_write_op_time = None
            # A retried write runs again only the statements not yet executed (MongoDB's
            # TransactionParticipant::checkStatementExecuted): the others answer as they did.
            ctx.txn_number = number
            ctx.retryable = True
            ctx.executed = session.statements
            if self.is_primary:
                ctx.write_fail_point = self.failpoints[ON_PRIMARY_TRANSACTIONAL_WRITE]
        call = cmds.Call(self, self.backend, conn, cmd, db, ctx)
        try:
            reply = handler.func(call)
        except CommandError as error:
            if ctx.txn is not None and error.code not in (251,):
                rs.abort_transaction(ctx.txn)
            if ctx.close_connection:
                raise CloseConnection() from None
            raise
        if ctx.txn is not None and reply.get("writeErrors"):
            rs.abort_transaction(ctx.txn)
        if ctx.close_connection:
            # onPrimaryTransactionalWrite: what was written stays, the reply is lost.
            raise CloseConnection()
        if ctx.op_time is not None:
            reply = dict(reply)
            reply["_op_time"] = ctx.op_time
        return reply

    def _snapshot_read(self, cmd: dict, lname: str):
        """The cluster time of a snapshot read outside a transaction (``readConcern: {level:
        "snapshot"}``), or None. MongoDB 5.0+ serves them for find, aggregate and distinct (and
        their getMores), at ``atClusterTime`` or at the latest committed write, within its
        snapshot history window; other commands refuse them with InvalidOptions
        (jstests/replsets/read_concern_snapshot.js)."""
        read_concern = cmd.get("readConcern")
        if not isinstance(read_concern, dict) or read_concern.get("level") != "snapshot":
            return None
        if lname not in ("find", "aggregate", "distinct"):
            raise CommandError(
                72,
                f'Command {next(iter(cmd))} does not support {{ readConcern: {{ level: "snapshot" }} }} '
                ":: caused by :: read concern not supported",
                code_name="InvalidOptions",
            )
        if self.replset.set_name is None:
            raise CommandError(
                20,
                "readConcern level 'snapshot' is only supported on a replica set",
                code_name="IllegalOperation",
            )
        at = read_concern.get("atClusterTime")
        if at is None:
            return self.replset.last_write
        if not isinstance(at, Timestamp):
            raise CommandError(
                14,
                "BSON field 'atClusterTime' is the wrong type, expected type 'timestamp'",
                code_name="TypeMismatch",
            )
        now = self.deployment.clock.now
        if at > now:
            raise CommandError(
                72,
                "readConcern atClusterTime value must not be greater than the current clusterTime. "
                f"Requested clusterTime: {at}; current clusterTime: {now}",
                code_name="InvalidOptions",
            )
        self.replset.check_snapshot(at)
        return at

    def _transaction(self, ctx: OpCtx, cmd: dict, lname: str, handler):
        rs = self.replset
        session = ctx.session
        number = ctx.txn_number
        if lname in ("committransaction", "aborttransaction"):
            return session.txn if session.txn is not None and session.txn.txn_number == number else None
        if cmd.get("startTransaction"):
            if number < session.last_txn_number:
                raise CommandError(
                    225,
                    f"Cannot start transaction {number} on session {lsid_text(cmd['lsid'])} "
                    f"because a newer transaction {session.last_txn_number} has already started.",
                )
            if number == session.last_txn_number:
                raise CommandError(
                    251,
                    f"Given transaction number {number} does not match any in-progress "
                    "transactions. The active transaction number is " + str(session.last_txn_number),
                )
            txn = rs.begin_transaction(session, number)
        else:
            txn = session.txn
            if txn is None or txn.txn_number != number or txn.state == "aborted":
                raise no_such_transaction(number)
            if txn.state == "committed":
                raise CommandError(256, f"Transaction {number} has been committed.")
        if not handler.in_txn:
            raise CommandError(263, f"Cannot run '{handler.name}' in a multi-document transaction.")
        return txn


def _secondary_ok(cmd: dict) -> bool:
    pref = cmd.get("$readPreference")
    return isinstance(pref, dict) and pref.get("mode", "primary") != "primary"


class ReplicaSet(DataNode):
    def __init__(
        self,
        deployment: Deployment,
        set_name: str | None,
        members: int,
        oplog: bool = True,
        oplog_max_entries: int | None = None,
        oplog_max_bytes: int | None = None,
    ):
        super().__init__(
            deployment, set_name, oplog=oplog, max_entries=oplog_max_entries, max_bytes=oplog_max_bytes
        )
        self.set_name = set_name
        self.members = [Member(deployment, self, i) for i in range(members)]
        self.primary: Member | None = None
        self.stepdown_until = 0.0
        self.stepped_down: Member | None = None
        self.election_id = ObjectId("7fffffff0000000000000001")
        self.started = time.monotonic()

    @property
    def uri(self) -> str:
        hosts = ",".join(m.host for m in self.members)
        if self.set_name is None:
            return f"mongodb://{hosts}/"
        return f"mongodb://{hosts}/?replicaSet={self.set_name}"

    def initiate(self) -> None:
        self.primary = self.members[0]
        self.election_id = ObjectId(f"7fffffff{self.term:016x}")
        if self.oplog is not None:
            self.log_noop(INITIATING_SET)

    def elect(self, member: Member) -> None:
        self.term += 1
        self.primary = member
        self.election_id = ObjectId(f"7fffffff{self.term:016x}")
        if self.oplog is not None:
            self.log_noop("new primary")
        for m in self.members:
            m.bump_topology()

    def maybe_elect(self) -> None:
        if self.set_name is None or self.primary is not None:
            return
        if time.monotonic() >= self.stepdown_until:
            self.elect(self.stepped_down or self.members[0])

    def step_down(self, member: Member, seconds: float) -> None:
        if self.primary is not member:
            raise CommandError(10107, "not primary so can't step down")
        self.primary = None
        self.stepped_down = member
        interrupted = CommandError(11602, "operation was interrupted because a node stepped down")
        member.cursors.interrupt_all(interrupted)
        for session in self.sessions.values():
            if session.txn is not None and session.txn.state == "in_progress":
                self.abort_transaction(session.txn)
        if len(self.members) > 1:
            candidates = [m for m in self.members if m is not member]
            self.elect(candidates[0])
        else:
            self.stepdown_until = time.monotonic() + seconds
            for m in self.members:
                m.bump_topology()

    def replset_status(self, me: Member) -> dict:
        now = wall_now()
        op_time = {"ts": self.last_write, "t": Int64(self.term)}
        members = []
        for m in self.members:
            primary = self.primary is m
            entry = {
                "_id": m.index,
                "name": m.host,
                "health": 1.0,
                "state": 1 if primary else 2,
                "stateStr": "PRIMARY" if primary else "SECONDARY",
                "uptime": int(time.monotonic() - self.started),
                "optime": op_time,
                "optimeDate": self.last_write_wall,
                "lastAppliedWallTime": self.last_write_wall,
                "lastDurableWallTime": self.last_write_wall,
                "syncSourceHost": "" if primary else (self.primary.host if self.primary else ""),
                "syncSourceId": -1,
                "configVersion": 1,
                "configTerm": Int64(self.term),
            }
            if primary:
                entry["electionTime"] = self.last_write
                entry["electionDate"] = now
            if m is me:
                entry["self"] = True
            members.append(entry)
        my_state = 1 if self.primary is me else 2
        return {
            "set": self.set_name,
            "date": now,
            "myState": my_state,
            "term": Int64(self.term),
            "syncSourceHost": "",
            "syncSourceId": -1,
            "heartbeatIntervalMillis": Int64(2000),
            "majorityVoteCount": len(self.members) // 2 + 1,
            "writeMajorityCount": len(self.members) // 2 + 1,
            "votingMembersCount": len(self.members),
            "writableVotingMembersCount": len(self.members),
            "optimes": {
                "lastCommittedOpTime": op_time,
                "lastCommittedWallTime": self.last_write_wall,
                "readConcernMajorityOpTime": op_time,
                "appliedOpTime": op_time,
                "durableOpTime": op_time,
                "lastAppliedWallTime": self.last_write_wall,
                "lastDurableWallTime": self.last_write_wall,
            },
            "members": members,
        }


# -- member-only commands ---------------------------------------------------------------------------
MEMBER_COMMANDS: dict = {}


def member_command(*names, kind="none", admin_only=False, in_txn=False):
    def register(func):
        for name in names:
            MEMBER_COMMANDS[name.lower()] = cmds.Command(func, name, kind, admin_only, in_txn, True)
        return func

    return register


@member_command("replSetGetStatus", admin_only=True)
def cmd_replset_get_status(call: cmds.Call) -> dict:
    member: Member = call.endpoint
    if member.replset.set_name is None:
        raise CommandError(76, "not running with --replSet")
    return member.replset.replset_status(member)


@member_command("replSetGetConfig", admin_only=True)
def cmd_replset_get_config(call: cmds.Call) -> dict:
    rs = call.endpoint.replset
    if rs.set_name is None:
        raise CommandError(76, "not running with --replSet")
    return {
        "config": {
            "_id": rs.set_name,
            "version": 1,
            "term": Int64(rs.term),
            "protocolVersion": Int64(1),
            "members": [
                {
                    "_id": m.index,
                    "host": m.host,
                    "arbiterOnly": False,
                    "buildIndexes": True,
                    "hidden": False,
                    "priority": 1.0,
                    "tags": {},
                    "secondaryDelaySecs": Int64(0),
                    "votes": 1,
                }
                for m in rs.members
            ],
            "settings": {
                "chainingAllowed": True,
                "heartbeatIntervalMillis": 2000,
                "electionTimeoutMillis": 10000,
            },
        }
    }


@member_command("replSetStepDown", admin_only=True)
def cmd_replset_step_down(call: cmds.Call) -> dict:
    member: Member = call.endpoint
    rs = member.replset
    if rs.set_name is None:
        raise CommandError(76, "not running with --replSet")
    seconds = call.arg()
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, Int64)):
        raise CommandError(14, "Expected a number for the stepdown period", code_name="TypeMismatch")
    seconds = float(seconds) if seconds else 60.0
    catch_up = call.cmd.get("secondaryCatchUpPeriodSecs")
    catch_up = 10.0 if catch_up is None else float(catch_up)
    if catch_up > seconds:
        raise CommandError(
            2, "stepdown period must be longer than secondaryCatchUpPeriodSecs", code_name="BadValue"
        )
    if not member.is_primary:
        raise CommandError(10107, "not primary so can't step down")
    if len(rs.members) == 1 and not call.cmd.get("force"):
        # No electable secondary can catch up: mongod waits secondaryCatchUpPeriodSecs, then fails.
        deadline = time.monotonic() + catch_up
        while time.monotonic() < deadline:
            call.endpoint.deployment.cv.wait(deadline - time.monotonic())
        raise CommandError(
            262,
            "No electable secondaries caught up as of "
            f"{wall_now().isoformat()}Z. Please use the replSetStepDown command with the argument "
            "{force: true} to force node to step down.",
        )
    rs.step_down(member, seconds)
    return {}


@member_command("replSetFreeze", admin_only=True)
def cmd_replset_freeze(call: cmds.Call) -> dict:
    return {}


@member_command("configureFailPoint", admin_only=True)
def cmd_configure_fail_point(call: cmds.Call) -> dict:
    return configure_fail_point(call)


@member_command("commitTransaction", kind="write", admin_only=True, in_txn=True)
def cmd_commit_transaction(call: cmds.Call) -> dict:
    ctx = call.op
    rs = call.endpoint.replset
    if call.cmd.get("autocommit") is not False or ctx.session is None:
        raise CommandError(
            50768 if ctx.session is None else 50781,
            "commitTransaction must be run within a transaction",
            code_name="Location50768" if ctx.session is None else "Location50781",
        )
    number = ctx.txn_number
    txn = ctx.txn
    if txn is None:
        if ctx.session.outcomes.get(number) == "committed":
            return {}
        raise no_such_transaction(number)
    if txn.state == "aborted":
        raise no_such_transaction(number)
    ts = rs.commit_transaction(txn)
    if ts is not None:
        ctx.op_time = ts
    return {"_op_time": ts} if ts is not None else {}


@member_command("abortTransaction", kind="write", admin_only=True, in_txn=True)
def cmd_abort_transaction(call: cmds.Call) -> dict:
    ctx = call.op
    rs = call.endpoint.replset
    number = ctx.txn_number
    txn = ctx.txn
    if txn is None or txn.state == "aborted":
        raise no_such_transaction(number)
    if txn.state == "committed":
        raise CommandError(256, f"Transaction {number} has been committed.")
    rs.abort_transaction(txn)
    return {}
