"""A listening server of the simulator: the request handling, handshake and authentication that
replica-set members (``server.Member``) and mongos (``router.Router``) share."""

from __future__ import annotations

import time

from bson.binary import Binary
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from devtools.mongosim import auth as scram
from devtools.mongosim import commands as cmds
from devtools.mongosim.errors import NOT_PRIMARY_ERRORS, CloseConnection, CommandError, error_labels
from devtools.mongosim.failpoints import (
    FAIL_COMMAND,
    FAIL_GET_MORE,
    FAILCOMMAND_MESSAGE,
    FailPoint,
    command_filter,
)
from devtools.mongosim.oplog import wall_now
from devtools.mongosim.wire import WireServer

AUTH_EXEMPT = {
    "hello",
    "ismaster",
    "saslstart",
    "saslcontinue",
    "authenticate",
    "ping",
    "buildinfo",
    "getnonce",
    "logout",
    "endsessions",
    "connectionstatus",
}
WRITE_COMMANDS = {"insert", "update", "delete", "findandmodify"}


class Endpoint:
    """A listening server: the shared part of members and mongos."""

    is_mongos = False
    FAIL_POINTS = (FAIL_COMMAND, FAIL_GET_MORE)

    def __init__(self, deployment):
        # the server.Deployment that runs this endpoint (its lock, clock, credentials)
        self.deployment = deployment
        self.server: WireServer | None = None
        self.failpoints = {name: FailPoint() for name in self.FAIL_POINTS}  # per process, as on MongoDB
        self.cursors = cmds.Cursors()
        self.process_id = ObjectId()
        self.topology_counter = 0

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.port}" if self.server else "127.0.0.1:0"

    def listen(self, port: int = 0) -> None:
        self.server = WireServer(self, port)
        self.server.start()

    def bump_topology(self) -> None:
        self.topology_counter += 1
        self.deployment.notify()

    def topology_version(self) -> dict:
        return {"processId": self.process_id, "counter": Int64(self.topology_counter)}

    # -- request handling ------------------------------------------------------------------------
    def handle(self, conn, request) -> dict | None:
        cmd = request.command
        if not cmd:
            return {"ok": 0.0, "errmsg": "no command", "code": 59, "codeName": "CommandNotFound"}
        name = next(iter(cmd))
        lname = name.lower()
        failure = None
        if lname != "configurefailpoint":
            ns = f"{request.db}.{cmd[name]}" if isinstance(cmd.get(name), str) else None
            failure = self.failpoints[FAIL_COMMAND].fire(command_filter(name, conn.app_name, ns))
        try:
            if failure is not None:
                if failure.get("blockConnection"):
                    time.sleep(max(0, int(failure.get("blockTimeMS") or 0)) / 1000.0)
                if failure.get("closeConnection"):
                    raise CloseConnection()
                if failure.get("errorCode") is not None:
                    error = CommandError(int(failure["errorCode"]), FAILCOMMAND_MESSAGE)
                    if "errorLabels" in failure:
                        error.labels = list(failure["errorLabels"])
                        error.fixed_labels = True
                    raise error
            if lname in ("hello", "ismaster"):
                reply = self.hello(conn, cmd, legacy=lname == "ismaster")
            elif lname in ("saslstart", "saslcontinue", "authenticate"):
                with self.deployment.lock:
                    reply = self.sasl(conn, lname, cmd, request.db)
            else:
                reply = self.run(conn, name, lname, cmd, request.db)
            if failure is not None and failure.get("writeConcernError"):
                # failCommand's writeConcernError: the command ran, its reply carries the error
                # (and the labels MongoDB adds for it, unless the fail point names them).
                reply = dict(reply)
                reply["writeConcernError"] = failure["writeConcernError"]
                if "errorLabels" in failure:
                    labels = list(failure["errorLabels"])
                else:
                    labels = _labels(cmd, lname, None, failure["writeConcernError"].get("code"), False)
                if labels:
                    reply["errorLabels"] = labels
                if failure["writeConcernError"].get("code") in NOT_PRIMARY_ERRORS:
                    reply["topologyVersion"] = self.topology_version()
        except CommandError as error:
            reply = self.error_reply(error, cmd, lname)
        except CloseConnection:
            raise
        with self.deployment.lock:
            return self.decorate(reply)

    def run(self, conn, name: str, lname: str, cmd: dict, db: str) -> dict:
        handler = cmds.HANDLERS.get(lname) or self.extra_commands().get(lname)
        if handler is None:
            raise CommandError(59, f"no such command: '{name}'")
        if (
            self.deployment.credentials is not None
            and conn.user is None
            and lname not in AUTH_EXEMPT
            and handler.auth
        ):
            raise CommandError(13, f"Command {name} requires authentication")
        if handler.admin_only and db != "admin":
            raise CommandError(13, f"{name} may only be run against the admin database.")
        with self.deployment.lock:
            _check_after_cluster_time(cmd, self.deployment.clock.now)
            reply = self.execute(conn, handler, cmd, db)
        reply = dict(reply)
        reply.setdefault("ok", 1.0)
        return reply

    def extra_commands(self) -> dict:
        return {}

    def execute(self, conn, handler, cmd, db) -> dict:
        raise NotImplementedError

    def error_reply(self, error: CommandError, cmd: dict, lname: str) -> dict:
        if not error.fixed_labels:
            change_stream = error.change_stream or (lname == "aggregate" and _opens_change_stream(cmd))
            error.labels = _labels(cmd, lname, error.code, None, change_stream)
        reply = error.to_reply()
        if error.code in NOT_PRIMARY_ERRORS:
            reply["topologyVersion"] = self.topology_version()
        return reply

    def decorate(self, reply: dict) -> dict:
        return reply

    def cluster_time_fields(self, operation_time: Timestamp) -> dict:
        return {
            "$clusterTime": {
                "clusterTime": self.deployment.clock.now,
                "signature": {"hash": Binary(b"\x00" * 20, 0), "keyId": Int64(0)},
            },
            "operationTime": operation_time,
        }

    # -- handshake -------------------------------------------------------------------------------
    def hello(self, conn, cmd: dict, legacy: bool) -> dict:
        client = cmd.get("client")
        if isinstance(client, dict):
            application = client.get("application")
            if isinstance(application, dict) and application.get("name"):
                conn.app_name = application["name"]
        topology = cmd.get("topologyVersion")
        max_await = cmd.get("maxAwaitTimeMS")
        with self.deployment.lock:
            if (
                isinstance(topology, dict)
                and max_await is not None
                and topology.get("processId") == self.process_id
                and int(topology.get("counter", -1)) == self.topology_counter
            ):
                deadline = time.monotonic() + int(max_await) / 1000.0
                start_counter = self.topology_counter
                while self.topology_counter == start_counter and not self.deployment._stop.is_set():  # pylint: disable=protected-access
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self.deployment.cv.wait(min(remaining, 1.0))
            reply = self.hello_fields(legacy)
            if cmd.get("helloOk"):
                reply["helloOk"] = True
            reply.update(self._hello_limits(conn))
            self._hello_auth(conn, cmd, reply)
            reply["ok"] = 1.0
            return reply

    def _hello_limits(self, conn) -> dict:
        return {
            "maxBsonObjectSize": 16 * 1024 * 1024,
            "maxMessageSizeBytes": 48000000,
            "maxWriteBatchSize": 100000,
            "localTime": wall_now(),
            "logicalSessionTimeoutMinutes": 30,
            "connectionId": conn.id,
            "minWireVersion": 0,
            "maxWireVersion": self.deployment.max_wire_version,
            "readOnly": False,
        }

    def hello_fields(self, legacy: bool) -> dict:
        raise NotImplementedError

    def _hello_auth(self, conn, cmd: dict, reply: dict) -> None:
        credentials = self.deployment.credentials
        if credentials is None:
            return
        mechs = cmd.get("saslSupportedMechs")
        if isinstance(mechs, str) and mechs == f"admin.{credentials.user}":
            reply["saslSupportedMechs"] = ["SCRAM-SHA-1", "SCRAM-SHA-256"]
        speculative = cmd.get("speculativeAuthenticate")
        if isinstance(speculative, dict) and "saslStart" in speculative:
            try:
                result = self._sasl_start(conn, speculative, speculative.get("db", "admin"))
            except CommandError:
                return
            reply["speculativeAuthenticate"] = result

    # -- authentication --------------------------------------------------------------------------
    def sasl(self, conn, lname: str, cmd: dict, db: str) -> dict:
        if lname == "authenticate":
            raise CommandError(2, "Unsupported mechanism " + str(cmd.get("mechanism")), code_name="BadValue")
        if self.deployment.credentials is None:
            raise CommandError(
                334,
                "Authentication mechanisms are not enabled on this server; the server was "
                "started without --auth",
                code_name="MechanismUnavailable",
            )
        if lname == "saslstart":
            reply = self._sasl_start(conn, cmd, db)
        else:
            conversation = conn.sasl.get(cmd.get("conversationId"))
            if conversation is None:
                raise CommandError(17, "No SASL session state found", code_name="ProtocolError")
            if conversation.done:
                conn.sasl.pop(cmd.get("conversationId"), None)
                return {"conversationId": cmd.get("conversationId"), "done": True, "payload": b"", "ok": 1.0}
            try:
                final = conversation.finish(bytes(cmd.get("payload") or b""))
            except CommandError:
                conn.sasl.pop(cmd.get("conversationId"), None)
                raise
            conn.user = conversation.user
            skip_empty = getattr(conversation, "skip_empty", False)
            if skip_empty:
                conn.sasl.pop(cmd.get("conversationId"), None)
            reply = {"conversationId": cmd.get("conversationId"), "done": skip_empty, "payload": final}
        reply["ok"] = 1.0
        return reply

    def _sasl_start(self, conn, cmd: dict, db: str) -> dict:
        if db != "admin" and db != "$external":
            # The only user lives in admin: any other database has no such user.
            conversation = scram.Conversation(
                self.deployment.credentials, cmd.get("mechanism", ""), bytes(cmd.get("payload") or b"")
            )
            conversation.keys = None
        else:
            conversation = scram.Conversation(
                self.deployment.credentials, cmd.get("mechanism", ""), bytes(cmd.get("payload") or b"")
            )
        options = cmd.get("options") or {}
        conversation.skip_empty = bool(options.get("skipEmptyExchange"))
        conversation_id = len(conn.sasl) + 1
        conn.sasl[conversation_id] = conversation
        return {"conversationId": conversation_id, "done": False, "payload": conversation.first_reply()}


def configure_fail_point(call: cmds.Call) -> dict:
    """``configureFailPoint``, as members and mongos both run it (each with its own fail points)."""
    name = call.arg()
    failpoint = call.endpoint.failpoints.get(name) if isinstance(name, str) else None
    if failpoint is None:
        raise CommandError(
            2,
            f"Cannot find failpoint: {name}" if isinstance(name, str) else "bad failpoint name",
            code_name="BadValue",
        )
    mode = call.cmd.get("mode")
    if mode is None:
        raise CommandError(2, "'mode' must be specified", code_name="BadValue")
    data = call.cmd.get("data")
    if (
        name == FAIL_COMMAND
        and mode != "off"
        and not (isinstance(data, dict) and isinstance(data.get("failCommands"), list))
    ):
        raise CommandError(
            2,
            "failCommand fail point requires 'failCommands' to be specified in 'data'",
            code_name="BadValue",
        )
    count = failpoint.configure(mode, data)
    return {"count": count}


def _labels(cmd: dict, lname: str, code: int | None, wc_code: int | None, change_stream: bool) -> list:
    return error_labels(lname, code, wc_code, "txnNumber" in cmd, "autocommit" in cmd, change_stream)


def _opens_change_stream(cmd: dict) -> bool:
    """Whether an aggregate is a ``$changeStream`` pipeline (ErrorLabelBuilder parses the command
    for the ResumableChangeStreamError label)."""
    pipeline = cmd.get("pipeline")
    return (
        isinstance(pipeline, list)
        and bool(pipeline)
        and isinstance(pipeline[0], dict)
        and "$changeStream" in pipeline[0]
    )


def _check_after_cluster_time(cmd: dict, current) -> None:
    """mongod refuses a read whose ``readConcern.afterClusterTime`` lies past its cluster time."""
    read_concern = cmd.get("readConcern")
    requested = read_concern.get("afterClusterTime") if isinstance(read_concern, dict) else None
    if isinstance(requested, Timestamp) and requested > current:
        raise CommandError(
            72,
            "readConcern afterClusterTime value must not be greater than the current clusterTime. "
            f"Requested clusterTime: {requested}; current clusterTime: {current}",
            code_name="InvalidOptions",
        )
