"""Start the simulator as a child process and talk to it with its own test commands."""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A bound only: starting Python and importing pymongo takes longer on a loaded machine.
START_TIMEOUT_S = 120.0


class MongoSimError(RuntimeError):
    """The simulator could not be started or did not answer."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the simulator dies with its parent
    except OSError:
        pass


class MongoSim:
    """A simulator in a child process. Use as a context manager, or call start() and stop().

    ``uri`` never carries credentials, also in auth mode: pass ``username``/``password`` to
    pymongo (or build a URI with them) yourself.
    """

    def __init__(
        self,
        mode: str = "replset",
        members: int = 1,
        shards: int = 2,
        auth: tuple[str, str] | None = None,
        oplog_max_entries: int | None = None,
        oplog_max_bytes: int | None = None,
        port: int = 0,
        max_seconds: float = 3600,
        noop_interval: float | None = None,
        max_wire_version: int | None = None,
        extra_args: list[str] | None = None,
    ):
        if mode not in ("replset", "standalone", "sharded"):
            raise ValueError(f"mode must be replset, standalone or sharded, not {mode!r}")
        self.mode = mode
        self.members = members
        self.shards = shards
        self.auth = tuple(auth) if auth else None
        self.oplog_max_entries = oplog_max_entries
        self.oplog_max_bytes = oplog_max_bytes
        self.port = port
        self.max_seconds = max_seconds
        self.noop_interval = noop_interval
        self.max_wire_version = max_wire_version
        self.extra_args = list(extra_args or [])
        self.uri: str | None = None
        self.shard_uris: list[str] = []
        self.member_addresses: list[str] = []
        self.process: subprocess.Popen | None = None
        self.pid: int | None = None
        self.start_seconds: float | None = None
        self._pending = b""

    # -- process ---------------------------------------------------------------------------------
    def command_line(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "devtools.mongosim",
            "--mode",
            self.mode,
            "--members",
            str(self.members),
            "--shards",
            str(self.shards),
            "--port",
            str(self.port),
            "--max-seconds",
            str(self.max_seconds),
            "--describe",
        ]
        if self.oplog_max_entries is not None:
            cmd += ["--oplog-max-entries", str(self.oplog_max_entries)]
        if self.oplog_max_bytes is not None:
            cmd += ["--oplog-max-bytes", str(self.oplog_max_bytes)]
        if self.noop_interval is not None:
            cmd += ["--noop-interval", str(self.noop_interval)]
        if self.max_wire_version is not None:
            cmd += ["--max-wire-version", str(self.max_wire_version)]
        return cmd + self.extra_args

    def start(self) -> MongoSim:
        began = time.monotonic()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        if self.auth:
            # Credentials go through the environment, never argv.
            env["MONGOSIM_AUTH"] = f"{self.auth[0]}:{self.auth[1]}"
        self.process = subprocess.Popen(
            self.command_line(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=str(REPO),
            preexec_fn=_die_with_parent,
        )
        self.pid = self.process.pid
        try:
            self.uri = self._read_line(began, "URI")
            description = json.loads(self._read_line(began, "description"))
        except BaseException:
            self.kill()
            raise
        self.shard_uris = description.get("shard_uris", [])
        self.member_addresses = description.get("members", [])
        self.start_seconds = time.monotonic() - began
        # Drain the pipes in the background so that the child never blocks on a full pipe.
        import threading

        for stream in (self.process.stdout, self.process.stderr):
            threading.Thread(target=_drain, args=(stream,), daemon=True).start()
        return self

    def _read_line(self, began: float, what: str) -> str:
        """Read one line from the child's stdout (unbuffered, so that select() stays truthful)."""
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._pending:
            if time.monotonic() - began > START_TIMEOUT_S:
                raise MongoSimError(
                    f"The MongoDB simulator did not print its {what} within {START_TIMEOUT_S:.0f}s"
                )
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                chunk = os.read(fd, 65536)
                if chunk:
                    self._pending += chunk
                    continue
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                raise MongoSimError(
                    f"The MongoDB simulator exited with code {self.process.returncode} before printing its "
                    f"{what}: {err[-2000:]}"
                )
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode().strip()

    def stop(self) -> None:
        """Stop the simulator (SIGTERM, then SIGKILL when it does not go within 5 s)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(timeout=5)
        self.process = None

    def kill(self) -> None:
        """SIGKILL the simulator (all in-memory data is lost)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal(signal.SIGKILL)
            self.process.wait(timeout=5)
        self.process = None

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def __enter__(self) -> MongoSim:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- test commands -----------------------------------------------------------------------------
    def client(self, uri: str | None = None, **kwargs):
        """A pymongo client for this simulator (with the configured credentials in auth mode)."""
        from pymongo import MongoClient

        options = {"serverSelectionTimeoutMS": 10000}
        if self.auth:
            options.update(username=self.auth[0], password=self.auth[1])
        options.update(kwargs)
        return MongoClient(uri or self.uri, **options)

    def set_oplog_retention(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        """Limit the oplog (on every shard in sharded mode); the oldest entries go at once."""
        for uri in self.shard_uris or [self.uri]:
            with self.client(uri) as client:
                client.admin.command(
                    {"mongosimSetOplogRetention": 1, "maxEntries": max_entries, "maxBytes": max_bytes}
                )

    def add_shard(self, name: str | None = None) -> str:
        """Sharded mode: start and initiate a new replica set (``mongosimStartReplicaSet``) and add
        it to the cluster (``addShard``), as an operator adds a shard; returns its URI (also
        appended to ``shard_uris``)."""
        with self.client() as client:
            started = client.admin.command({"mongosimStartReplicaSet": name or 1})
            client.admin.command({"addShard": started["host"]})
        self.shard_uris.append(started["uri"])
        return started["uri"]

    def step_down(self, seconds: int = 10) -> None:
        """replSetStepDown on the primary (of every shard in sharded mode)."""
        from pymongo.errors import AutoReconnect

        for uri in self.shard_uris or [self.uri]:
            with self.client(uri) as client:
                try:
                    client.admin.command(
                        {"replSetStepDown": seconds, "secondaryCatchUpPeriodSecs": 0, "force": True}
                    )
                except AutoReconnect:
                    pass  # a real primary closes connections while stepping down


def _drain(stream) -> None:
    try:
        for _ in iter(lambda: stream.read(65536), b""):
            pass
    except (OSError, ValueError):
        pass
