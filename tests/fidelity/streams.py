"""Reading change streams in the fidelity tests: the next event, waited for within a bound."""

from __future__ import annotations

import time


def next_event(stream, timeout: float = 120):
    """The next change event, waiting for it at most ``timeout`` seconds (a bound only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = stream.try_next()
        if event is not None:
            return event
    raise AssertionError(f"no change event arrived within {timeout:.0f} s")
