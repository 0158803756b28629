"""The keys of an offsets topic's records, and which record a key belongs to.

Every key is ``["<connector>", {fields}]``: ``{"server_id", "rs"}`` an offset; plus ``"snapshot"``
and ``"chunk"`` a snapshot chunk marker; ``{"server_id", "lease": "connector"}`` the connector's
lease (:mod:`airflow_provider_mongocdc.core.offsets.lease`; :func:`parse_key` reads it as neither an offset nor a chunk marker, a
tombstone frees it); ``{"server_id", "incremental_snapshot": "request"}`` its incremental snapshot
request (:mod:`airflow_provider_mongocdc.core.window.incremental`); ``{"server_id", "watcher": "status"}``
what its change watcher last counted (written by the watcher outside any transaction; no offset).
Layout and reasons: docs/design.md, "Offsets".
"""

from __future__ import annotations

import json
from typing import Any

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, compact

LEASE_NAME = "connector"
REQUEST_NAME = "request"
WATCH_NAME = "status"


def _split(key: bytes | None) -> tuple[Any, dict[str, Any]] | None:
    """``(connector, fields)`` of a key ``["<connector>", {fields}]``, else None."""
    if not key:
        return None
    try:
        data = json.loads(key)
    except ValueError:
        return None
    if isinstance(data, list) and len(data) == 2 and isinstance(data[1], dict):
        return data[0], data[1]
    return None


def parse_key(key: bytes | None) -> tuple[OffsetPartition, tuple[str, str] | None] | None:
    """The partition (and ``(snapshot id, chunk id)`` for a chunk marker) of a record key, or None
    for a key that is not an offset key."""
    split = _split(key)
    if split is None or not isinstance(split[0], str):
        return None
    connector, fields = split
    server_id, rs = fields.get("server_id"), fields.get("rs")
    if not isinstance(server_id, str) or not isinstance(rs, str) or not server_id or not rs:
        return None
    partition = OffsetPartition(server_id, rs, connector)
    if "snapshot" in fields or "chunk" in fields:
        return partition, (str(fields.get("snapshot")), str(fields.get("chunk")))
    return partition, None


def lease_key(server_id: str, connector: str | None = None) -> bytes:
    """The key of the lease of connector ``server_id`` (its topic.prefix)."""
    return compact([connector or server_id, {"server_id": server_id, "lease": LEASE_NAME}])


def is_lease_key(key: bytes | None) -> bool:
    """Whether a record key of the offsets topic is a connector lease's (see :func:`lease_key`)."""
    split = _split(key)
    return split is not None and split[1].get("lease") == LEASE_NAME and "rs" not in split[1]


def request_key(server_id: str, connector: str | None = None) -> bytes:
    """The key of a connector's incremental snapshot request (see core/window/incremental.py)."""
    return compact([connector or server_id, {"server_id": server_id, "incremental_snapshot": REQUEST_NAME}])


def request_owner(key: bytes | None) -> tuple[str, str] | None:
    """``(connector, server_id)`` of an incremental snapshot request key, else None."""
    if not key or b"incremental_snapshot" not in key:
        return None
    split = _split(key)
    if split is None:
        return None
    connector, fields = split
    if fields.get("incremental_snapshot") == REQUEST_NAME and isinstance(fields.get("server_id"), str):
        return str(connector), fields["server_id"]
    return None


def watch_key(server_id: str, connector: str | None = None) -> bytes:
    """The key of what connector ``server_id``'s change watcher last counted."""
    return compact([connector or server_id, {"server_id": server_id, "watcher": WATCH_NAME}])


def watch_owner(key: bytes | None) -> tuple[str, str] | None:
    """``(connector, server_id)`` of a change watcher's status key, else None."""
    if not key or b"watcher" not in key:
        return None
    split = _split(key)
    if split is None:
        return None
    connector, fields = split
    if (
        fields.get("watcher") == WATCH_NAME
        and isinstance(fields.get("server_id"), str)
        and "rs" not in fields
    ):
        return str(connector), fields["server_id"]
    return None
