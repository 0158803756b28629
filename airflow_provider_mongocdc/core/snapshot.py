"""Snapshots, one name space: what :mod:`.snapshot_decision`, :mod:`.snapshot_plan`,
:mod:`.snapshot_copy` and :mod:`.id_ranges` define, importable from here as before.

A snapshot records the change stream's position, copies every captured collection as read events
in chunks that run in parallel (Spark tasks of ``spark_apps/snapshot.py``), then hands the
recorded position to streaming. The reasoning (planning, ranges over mixed ``_id`` types, copying
a chunk exactly once, the "last" event, the snapshot modes) is in docs/design.md, "Snapshots".
"""

from __future__ import annotations

from airflow_provider_mongocdc.core.id_ranges import (
    BOUNDS_JSON,
    bound_codec_options,
    document_codec_options,
    id_type,
    range_query,
    same_type_range,
)
from airflow_provider_mongocdc.core.snapshot_copy import (
    ChunkCopier,
    ChunkResult,
    Progress,
    check_complete,
    chunk_transactional_id,
    control_transactional_id,
    fence_chunks,
)
from airflow_provider_mongocdc.core.snapshot_decision import (
    NOTHING,
    RECORD_POSITION,
    RESUME,
    SNAPSHOT,
    Decision,
    decide,
    needs_snapshot,
    resume_point_purged,
)
from airflow_provider_mongocdc.core.snapshot_plan import (
    PLAN_CHUNK_PREFIX,
    PLAN_CHUNKS_PER_RECORD,
    PLAN_FORMAT,
    SAMPLES_PER_CHUNK,
    Chunk,
    SnapshotPlan,
    build_plan,
    data_chunks_finished,
    distribute,
    is_plan_chunk,
    new_snapshot_id,
    parse_namespaces,
    plan_chunk_id,
    plan_collection,
    snapshot_collections,
)

_BOUNDS_JSON = BOUNDS_JSON  # the name core.incremental imports

__all__ = [
    "BOUNDS_JSON",
    "NOTHING",
    "PLAN_CHUNK_PREFIX",
    "PLAN_CHUNKS_PER_RECORD",
    "PLAN_FORMAT",
    "RECORD_POSITION",
    "RESUME",
    "SAMPLES_PER_CHUNK",
    "SNAPSHOT",
    "Chunk",
    "ChunkCopier",
    "ChunkResult",
    "Decision",
    "Progress",
    "SnapshotPlan",
    "bound_codec_options",
    "build_plan",
    "check_complete",
    "chunk_transactional_id",
    "control_transactional_id",
    "data_chunks_finished",
    "decide",
    "distribute",
    "document_codec_options",
    "fence_chunks",
    "id_type",
    "is_plan_chunk",
    "needs_snapshot",
    "new_snapshot_id",
    "parse_namespaces",
    "plan_chunk_id",
    "plan_collection",
    "range_query",
    "resume_point_purged",
    "same_type_range",
    "snapshot_collections",
]
