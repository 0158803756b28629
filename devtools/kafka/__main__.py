"""Command line for the local Kafka broker.

python -m devtools.kafka fetch                 # fetch the broker jars with Maven
python -m devtools.kafka start --state DIR     # start detached; prints the bootstrap servers
python -m devtools.kafka stop --state DIR      # stop it by its PID and remove its data
python -m devtools.kafka run [--seconds N]     # run in the foreground until Ctrl-C (or N seconds)
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path

from devtools.kafka.broker import KafkaBroker, KafkaLaunchError, ensure_jars, stop_pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.kafka",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="fetch the broker jars from Maven Central")
    start = sub.add_parser("start", help="start a detached broker")
    start.add_argument("--state", required=True, help="directory for the broker's state and data")
    stop = sub.add_parser("stop", help="stop a detached broker")
    stop.add_argument("--state", required=True)
    run = sub.add_parser("run", help="run a broker in the foreground")
    run.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    args = parser.parse_args(argv)

    try:
        if args.command == "fetch":
            print(ensure_jars(quiet=False))
            return 0
        if args.command == "start":
            state = Path(args.state)
            state_file = state / "kafka.json"
            if state_file.exists():
                print(f"A broker is already recorded in {state_file}; stop it first.", file=sys.stderr)
                return 1
            broker = KafkaBroker(state / "kafka-data", tie_to_parent=False).start()
            state_file.write_text(
                json.dumps(
                    {
                        "pid": broker.pid,
                        "bootstrap": broker.bootstrap_servers,
                        "data_dir": str(broker.data_dir),
                    }
                )
            )
            print(broker.bootstrap_servers)
            return 0
        if args.command == "stop":
            state_file = Path(args.state) / "kafka.json"
            if not state_file.exists():
                print(f"No broker recorded in {state_file}.", file=sys.stderr)
                return 0
            info = json.loads(state_file.read_text())
            stop_pid(int(info["pid"]))
            shutil.rmtree(info["data_dir"], ignore_errors=True)
            state_file.unlink()
            print(f"stopped broker pid {info['pid']}")
            return 0
        if args.command == "run":
            with KafkaBroker() as broker:
                print(
                    f"Kafka broker ready at {broker.bootstrap_servers} (pid {broker.pid}); Ctrl-C stops it.",
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
    except KafkaLaunchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
