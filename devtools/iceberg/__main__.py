"""Command line for the local Iceberg REST catalog server.

python -m devtools.iceberg fetch                         # fetch the jars with Maven, compile the server
python -m devtools.iceberg run [--warehouse DIR] [--seconds N]   # run in the foreground until Ctrl-C

``run`` takes a credential (client_id:client_secret) from the environment variable
MONGOCDC_ICEBERG_CREDENTIAL, never from the command line.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from devtools.iceberg import CREDENTIAL_ENV, IcebergLaunchError, IcebergRestCatalog, ensure_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.iceberg",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="fetch the jars from Maven Central and compile the server")
    run = sub.add_parser("run", help="run a server in the foreground")
    run.add_argument("--warehouse", default=None, help="directory of the tables (temporary when not given)")
    run.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    args = parser.parse_args(argv)

    try:
        if args.command == "fetch":
            print(ensure_server(quiet=False))
            return 0
        if args.command == "run":
            credential = os.environ.get(CREDENTIAL_ENV) or None
            with IcebergRestCatalog(args.warehouse, credential) as catalog:
                print(
                    f"Iceberg REST catalog ready at {catalog.uri}, warehouse {catalog.warehouse} "
                    f"(pid {catalog.pid}, log {catalog.log_path}); Ctrl-C stops it.",
                    flush=True,
                )
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
                deadline = time.monotonic() + args.seconds if args.seconds else None
                try:
                    while deadline is None or time.monotonic() < deadline:
                        time.sleep(0.5)
                except KeyboardInterrupt:
                    pass
            return 0
    except IcebergLaunchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
