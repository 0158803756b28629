"""The tables' location, checked before any table changes (both formats)."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_mongocdc.core.base.errors import TableError


def check_writable(location: str) -> None:
    """A local location must exist or be creatable, and be writable (before any table changes)."""
    if "://" in location and not location.startswith("file://"):
        return  # an object store: its first write says (TableError in words)
    path = Path(location.removeprefix("file://"))
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise TableError(
            f"The tables' location {location} cannot be written",
            cause=f"{probe} is not a directory this process (user id {os.getuid()}) may write"
            if probe.exists()
            else f"no part of {location} exists",
            fix="create the directory and give the Airflow worker's user write access, or choose another "
            "'location'",
        )
