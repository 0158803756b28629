"""python -m devtools.interop fetch: fetch the interop jars with Maven and compile the harness."""

from __future__ import annotations

import argparse
import sys

from devtools.interop import InteropError, ensure_harness


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.interop", description=__doc__)
    parser.add_argument("command", choices=["fetch"])
    parser.parse_args(argv)
    try:
        print(ensure_harness(quiet=False))
    except InteropError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
