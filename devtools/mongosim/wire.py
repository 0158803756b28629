"""MongoDB wire protocol, server side: OP_MSG (with document sequences) and the legacy OP_QUERY
handshake, one thread per connection.

Why not mockupdb: it is built around scripted replies (a request queue that a test thread
answers); the simulator needs a stateful server that shares one data set between several ports,
keeps per-connection state (authentication, appName), blocks in awaitData getMores, and closes
or stalls connections on a fail point. A small threaded server over pymongo's ``bson`` does that
directly.
"""

from __future__ import annotations

import itertools
import logging
import socket
import socketserver
import struct
import threading

from devtools.mongosim import bsonutil
from devtools.mongosim.errors import CloseConnection

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

MSG_CHECKSUM_PRESENT = 1 << 0
MSG_MORE_TO_COME = 1 << 1
MSG_EXHAUST_ALLOWED = 1 << 16

_HEADER = struct.Struct("<iiii")
_request_ids = itertools.count(1)
_connection_ids = itertools.count(1)

log = logging.getLogger("mongosim.wire")


class Connection:
    """Per-connection state visible to command handlers."""

    def __init__(self, sock: socket.socket, peer):
        self.sock = sock
        self.peer = peer
        self.id = next(_connection_ids)
        self.user: str | None = None  # authenticated user name
        self.app_name: str | None = None
        self.sasl: dict = {}  # conversations in progress
        self.closed = False

    @property
    def peer_address(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]}"


class Request:
    """A decoded client message: the command document (document sequences merged in)."""

    def __init__(self, opcode: int, request_id: int, command: dict, db: str, flags: int = 0):
        self.opcode = opcode
        self.request_id = request_id
        self.command = command
        self.db = db
        self.flags = flags

    @property
    def more_to_come(self) -> bool:
        return self.opcode == OP_MSG and bool(self.flags & MSG_MORE_TO_COME)


def _recv_exact(sock: socket.socket, length: int) -> bytes:
    chunks = []
    remaining = length
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("client closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(b"\x00", pos)
    return data[pos:end].decode("utf-8"), end + 1


def parse_message(opcode: int, request_id: int, body: bytes) -> Request:
    if opcode == OP_MSG:
        flags = struct.unpack_from("<I", body, 0)[0]
        end = len(body) - (4 if flags & MSG_CHECKSUM_PRESENT else 0)
        pos = 4
        command = None
        sequences: dict[str, list] = {}
        while pos < end:
            kind = body[pos]
            pos += 1
            if kind == 0:
                size = struct.unpack_from("<i", body, pos)[0]
                command = bsonutil.decode(body[pos : pos + size])
                pos += size
            elif kind == 1:
                size = struct.unpack_from("<i", body, pos)[0]
                section_end = pos + size
                identifier, docs_pos = _cstring(body, pos + 4)
                sequences[identifier] = bsonutil.decode_all(body[docs_pos:section_end])
                pos = section_end
            else:
                raise ValueError(f"unknown OP_MSG section kind {kind}")
        if command is None:
            raise ValueError("OP_MSG without a body section")
        for identifier, docs in sequences.items():
            command[identifier] = docs
        db = command.get("$db", "admin")
        return Request(opcode, request_id, command, db, flags)
    if opcode == OP_QUERY:
        pos = 4
        collection, pos = _cstring(body, pos)
        pos += 8  # numberToSkip, numberToReturn
        size = struct.unpack_from("<i", body, pos)[0]
        query = bsonutil.decode(body[pos : pos + size])
        if "$query" in query:
            query = query["$query"]
        db = collection.split(".", 1)[0]
        return Request(opcode, request_id, query, db)
    raise ValueError(f"unsupported opcode {opcode}")


def build_reply(request: Request, reply: dict, more_to_come: bool = False) -> bytes:
    payload = bsonutil.encode(reply)
    if request.opcode == OP_QUERY:
        body = struct.pack("<iqii", 8, 0, 0, 1) + payload  # AwaitCapable, cursor 0, from 0, 1 doc
        opcode = OP_REPLY
    else:
        flags = MSG_MORE_TO_COME if more_to_come else 0
        body = struct.pack("<I", flags) + b"\x00" + payload
        opcode = OP_MSG
    header = _HEADER.pack(16 + len(body), next(_request_ids), request.request_id, opcode)
    return header + body


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):  # noqa: C901 - the connection loop
        server: WireServer = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(sock, self.client_address)
        server.register(conn)
        try:
            while not server.stopping:
                try:
                    header = _recv_exact(sock, 16)
                except (ConnectionError, OSError):
                    return
                length, request_id, _response_to, opcode = _HEADER.unpack(header)
                if length < 16 or length > bsonutil.MAX_MESSAGE_SIZE + 16 * 1024:
                    return
                body = _recv_exact(sock, length - 16)
                try:
                    request = parse_message(opcode, request_id, body)
                except Exception:  # noqa: BLE001 - malformed message: drop the connection
                    log.exception("cannot parse a message with opcode %s", opcode)
                    return
                try:
                    reply = server.endpoint.handle(conn, request)
                except CloseConnection:
                    return
                if request.more_to_come or reply is None:
                    continue
                sock.sendall(build_reply(request, reply))
        except (ConnectionError, OSError):
            return
        finally:
            conn.closed = True
            server.unregister(conn)
            try:
                sock.close()
            except OSError:
                pass


class WireServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """A listening socket on 127.0.0.1 whose connections are served by ``endpoint.handle``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, endpoint, port: int = 0, host: str = "127.0.0.1"):
        self.endpoint = endpoint
        self.stopping = False
        self._connections: set[Connection] = set()
        self._conn_lock = threading.Lock()
        super().__init__((host, port), _Handler)
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    def register(self, conn: Connection) -> None:
        with self._conn_lock:
            self._connections.add(conn)

    def unregister(self, conn: Connection) -> None:
        with self._conn_lock:
            self._connections.discard(conn)

    def connection_count(self) -> int:
        with self._conn_lock:
            return len(self._connections)

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"mongosim-listener-{self.port}",
            daemon=True,
        )
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        self.shutdown()
        self.server_close()
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
