"""Processes that die with their parent (Linux ``prctl(PR_SET_PDEATHSIG)``).

The operators start spark-submit with it (hooks/spark_submit.py), and a stream window that runs
its one stream in the application's Python driver (spark_apps/stream_window.py) gives it to
itself: that driver no longer talks to the JVM while it streams, so it would not notice the
JVM's death through the Py4J gateway. Either way a window does not go on streaming and committing
after Airflow killed its task.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int | None = None) -> Callable[[], None] | None:
    """A function giving the process that calls it the parent-death signal SIGKILL, or None where
    the kernel has no ``prctl`` (not Linux). ``parent``: the pid the caller's parent must have
    (default: this process, for a ``preexec_fn`` that the child calls between fork and exec); when
    it is already gone, the function kills the caller at once (no signal would come). The C
    function is looked up here: the returned function only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    expected = os.getpid() if parent is None else parent

    def tie() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != expected:  # the parent died before prctl: no signal would come
            os.kill(os.getpid(), signal.SIGKILL)

    return tie
