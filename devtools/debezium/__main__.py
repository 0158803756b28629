"""python -m devtools.debezium fetch: fetch Kafka Connect's runtime and Debezium's MongoDB connector with Maven."""

from __future__ import annotations

import argparse
import sys

from devtools.debezium import ConnectError, ensure_jars


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.debezium", description=__doc__)
    parser.add_argument("command", choices=["fetch"])
    parser.parse_args(argv)
    try:
        print(ensure_jars(quiet=False))
    except ConnectError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
