"""Run the MongoDB simulator in the foreground; the first stdout line is its URI.

    python -m devtools.mongosim --mode replset|standalone|sharded [--members 1|3] [--shards 2]
        [--port 0] [--auth USER:PASSWORD] [--oplog-max-entries N] [--oplog-max-bytes N]
        [--noop-interval SECONDS] [--max-wire-version 21|25] [--max-seconds 3600] [--describe]

``--auth`` may be replaced by the MONGOSIM_AUTH environment variable (USER:PASSWORD), which keeps
the password out of the process list. ``--describe`` prints a second line with a JSON description
(shard URIs, member addresses). The simulator stops on SIGTERM/SIGINT or after --max-seconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from devtools.mongosim.server import WIRE_VERSIONS, Deployment


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.mongosim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mode", choices=("replset", "standalone", "sharded"), default="replset")
    parser.add_argument("--members", type=int, choices=(1, 3), default=1)
    parser.add_argument("--shards", type=_positive, default=2)
    parser.add_argument("--port", type=int, default=0, help="port of the first member or of mongos (0: any)")
    parser.add_argument("--auth", default=None, metavar="USER:PASSWORD")
    parser.add_argument("--oplog-max-entries", type=_positive, default=None)
    parser.add_argument("--oplog-max-bytes", type=_positive, default=None)
    parser.add_argument(
        "--noop-interval",
        type=float,
        default=10.0,
        help="seconds between periodic no-op oplog writes on an idle server (MongoDB: 10)",
    )
    parser.add_argument("--max-wire-version", type=int, choices=sorted(WIRE_VERSIONS), default=21)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument("--describe", action="store_true", help="print a JSON description on the second line")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    auth_text = args.auth or os.environ.get("MONGOSIM_AUTH")
    auth = None
    if auth_text:
        user, sep, password = auth_text.partition(":")
        if not sep or not user:
            parser.error("--auth must be USER:PASSWORD")
        auth = (user, password)
    if args.mode == "standalone" and (args.oplog_max_entries or args.oplog_max_bytes):
        parser.error("a standalone server has no oplog")

    deployment = Deployment(
        args.mode,
        members=args.members,
        shards=args.shards,
        auth=auth,
        oplog_max_entries=args.oplog_max_entries,
        oplog_max_bytes=args.oplog_max_bytes,
        port=args.port,
        noop_interval=args.noop_interval,
        max_wire_version=args.max_wire_version,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    deployment.start()
    print(deployment.uri, flush=True)
    if args.describe:
        print(json.dumps(deployment.describe()), flush=True)
    try:
        stop.wait(args.max_seconds)
    finally:
        deployment.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
