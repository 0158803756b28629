"""Whether a snapshot runs: :func:`decide` applies ``snapshot.mode`` (and a forced re-snapshot)
to the stored offsets of the connector's partitions; a snapshot found in progress is always
resumed. See docs/design.md, "Snapshots".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pymongo import MongoClient
from pymongo.errors import OperationFailure

from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError, OffsetError
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import SnapshotMode
from airflow_provider_mongocdc.core.mongo.change_stream import open_stream
from airflow_provider_mongocdc.core.mongo.stream_errors import (
    is_history_lost,
    is_unusable_position,
    unusable_position_error,
)
from airflow_provider_mongocdc.core.offsets.model import (
    SNAPSHOT_COMPLETED,
    SNAPSHOT_IN_PROGRESS,
    OffsetPartition,
    OffsetState,
    Position,
)

log = logging.getLogger(__name__)


# Snapshot decisions
RESUME, SNAPSHOT, RECORD_POSITION, NOTHING = "resume", "snapshot", "record_position", "nothing"


def resume_point_purged(client: MongoClient, config: ConnectorConfig, position: Position) -> bool:
    """Whether the change stream can no longer resume from ``position`` (oplog rules: MongoDB
    refuses to open it with ChangeStreamHistoryLost and friends, see
    :func:`~airflow_provider_mongocdc.core.mongo.change_stream.is_history_lost`)."""
    try:
        with open_stream(client, config, position, max_await_time_ms=100) as stream:
            stream.try_next()
        return False
    except OperationFailure as error:
        if is_history_lost(error):
            log.info(
                "The stored resume point (%s) is no longer in the oplog: %s",
                position.describe(),
                error_text(error, brief=True),
            )
            return True
        if is_unusable_position(error):  # a wrong offset, not a purged oplog
            raise unusable_position_error(config, None, position, error) from None
        raise ConnectionFailedError(
            "MongoDB refused to open the change stream at the stored position",
            cause=f"{error.code}: {error_text(error, brief=True)}",
            fix="check the user's roles (changeStream, find on the captured "
            "collections) and the server's state",
        ) from None


def needs_snapshot(state: OffsetState | None, mode: str, *, purged: Callable[[], bool]) -> str | None:
    """Why ``snapshot.mode`` asks for a new snapshot for a partition in ``state``, or None.

    ``purged()`` is called only for ``when_needed`` with a stored position (it opens a change
    stream, see :func:`resume_point_purged`). A snapshot in progress is not covered here: it is
    resumed whatever the mode.
    """
    has_offset = state is not None and (
        state.position is not None or state.snapshot.status == SNAPSHOT_COMPLETED
    )
    if mode == SnapshotMode.NO_DATA:
        return None
    if not has_offset:
        return "no offset is stored"
    if mode == SnapshotMode.ALWAYS:
        return "snapshot.mode=always snapshots on every run"
    if mode == SnapshotMode.WHEN_NEEDED and state.position is not None and purged():
        return "the stored resume point is no longer in the oplog"
    return None


@dataclass(frozen=True)
class Decision:
    """What a snapshot run does: ``resume``, ``snapshot``, ``record_position`` or ``nothing``.

    ``reset_offset`` (new snapshots): whether completion moves the stored offsets to the
    snapshot's start; None leaves it to the run's ``reset_offset`` parameter.
    """

    action: str
    reason: str
    snapshot_id: str | None = None
    reset_offset: bool | None = None


def decide(
    states: Mapping[OffsetPartition, OffsetState | None],
    mode: str,
    *,
    force: bool = False,
    purged: Callable[[OffsetPartition, Position], bool] | None = None,
) -> Decision:
    """Apply ``snapshot.mode`` (and ``force``) to the stored states of the connector's partitions."""
    running = _running_snapshot(states)
    if running is not None:
        return Decision(RESUME, f"snapshot {running} was interrupted; it resumes", running)
    if force:
        return Decision(SNAPSHOT, "a re-snapshot was requested")
    reasons = _snapshot_reasons(states, mode, purged)
    if reasons:
        return _new_snapshot(states, mode, purged, reasons)
    missing = [p for p, state in states.items() if state is None or state.position is None]
    if mode == SnapshotMode.NO_DATA and missing:
        return Decision(
            RECORD_POSITION, "snapshot.mode=no_data: the position is recorded without copying data"
        )
    completed = [
        state
        for state in states.values()
        if state is not None and state.snapshot.status == SNAPSHOT_COMPLETED
    ]
    if completed:
        ids = ", ".join(sorted({state.snapshot.snapshot_id for state in completed}))
        return Decision(NOTHING, f"snapshot {ids} is already completed (snapshot.mode={mode})")
    return Decision(NOTHING, f"an offset is stored (snapshot.mode={mode})")


def _running_snapshot(states: Mapping[OffsetPartition, OffsetState | None]) -> str | None:
    """The id of the snapshot in progress, if any; more than one is an error."""
    running = {
        state.snapshot.snapshot_id
        for state in states.values()
        if state is not None and state.snapshot.status == SNAPSHOT_IN_PROGRESS
    }
    if len(running) > 1:
        raise OffsetError(
            "The offsets hold more than one snapshot in progress",
            cause=f"snapshots {', '.join(sorted(running))}",
            fix="reset the connector's offsets (mongocdc offsets reset) and snapshot again",
        )
    return running.pop() if running else None


def _snapshot_reasons(
    states: Mapping[OffsetPartition, OffsetState | None],
    mode: str,
    purged: Callable[[OffsetPartition, Position], bool] | None,
) -> list[str]:
    """Why ``snapshot.mode`` asks for a new snapshot, per partition (named when there are several)."""
    reasons = []
    for partition, state in states.items():

        def check(partition=partition, state=state) -> bool:
            return bool(purged and state and state.position and purged(partition, state.position))

        reason = needs_snapshot(state, mode, purged=check)
        if reason:
            reasons.append(reason if len(states) == 1 else f"{partition.rs}: {reason}")
    return reasons


def _new_snapshot(
    states: Mapping[OffsetPartition, OffsetState | None],
    mode: str,
    purged: Callable[[OffsetPartition, Position], bool] | None,
    reasons: list[str],
) -> Decision:
    """A new snapshot; with ``snapshot.mode=always`` and stored offsets, whether it resets them."""
    reset_offset = None
    stored = {p: s.position for p, s in states.items() if s is not None and s.position is not None}
    if mode == SnapshotMode.ALWAYS and stored:
        # Streaming stays continuous: the stored offsets stay, unless one was purged.
        lost = [p.rs for p, position in stored.items() if purged and purged(p, position)]
        reset_offset = bool(lost)
        reasons.append(
            f"the stored resume point of {', '.join(lost)} is no longer in the oplog: streaming "
            "restarts from this snapshot's start"
            if lost
            else "streaming continues from the stored offset"
        )
    return Decision(SNAPSHOT, "; ".join(reasons), reset_offset=reset_offset)
