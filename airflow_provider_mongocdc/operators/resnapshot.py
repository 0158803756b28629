"""The operator that re-snapshots a connector after an oplog gap, or on request.

What reads MongoDB or Kafka (and bson) is imported when the task runs: the DAG files import this
module at every parse, which needs neither pymongo nor confluent_kafka.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.operators.base import json_object, parse_connector_config
from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.resnapshot_form import COLLECTION_FORMAT, COLLECTION_PATTERN, collection_error

if TYPE_CHECKING:
    from airflow_provider_mongocdc.core.offsets.store import OffsetStore
    from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress, IncrementalRequest

GAP, MANUAL, INCREMENTAL, STOP = "gap", "manual", "incremental", "stop"
MODES = (MANUAL, INCREMENTAL, GAP, STOP)


def parse_collections(value: Any) -> list[str]:
    """``collections`` from a trigger form or a DAG run conf: a list, a JSON list, a
    comma-separated string, or empty (every captured collection)."""
    from airflow_provider_mongocdc.core.snapshot.plan import parse_namespaces

    if isinstance(value, (list, tuple)):
        for item in value:
            name = str(item).strip()
            database, _, collection = name.partition(".")
            if name and (not database or not collection):
                raise collection_error(name)
    namespaces = parse_namespaces(value) or []
    return [f"{db}.{coll}" for db, coll in namespaces]


def resnapshot_params() -> dict[str, Any]:
    """The trigger form of a re-snapshot DAG: valid as it opens (every field may stay empty)."""
    from airflow.sdk import Param

    return {
        "mode": Param(
            MANUAL,
            type="string",
            enum=list(MODES),
            title="Mode",
            values_display={
                MANUAL: "manual: chosen collections (or all), the offset stays",
                INCREMENTAL: "incremental: copied in chunks by the next windows, streaming goes on",
                GAP: "gap: every collection, the offset moves to the new snapshot",
                STOP: "stop: end the running incremental snapshot",
            },
            description="manual (default): copy the chosen collections, or all when Collections is "
            "empty, while streaming continues from the stored offset (the windows wait meanwhile). "
            "incremental: record the request and return at once; each following window copies the "
            "next chunks after streaming, so the windows never stop. gap: after an oplog gap, copy "
            "every collection and move the offset to the new snapshot's start (Collections must "
            "stay empty; use manual for a chosen few). stop: end the running incremental snapshot.",
        ),
        "collections": Param(
            None,
            type=["null", "array"],
            # Refused when the run is requested, before it exists: the API server validates the
            # form's conf (its format check answers in words) and the form shows its answer above
            # its fields. The pattern says the same rule to any JSON Schema validator.
            items={
                "description": "<database>.<collection>, e.g. shop.orders, not orders",
                "type": "string",
                "pattern": COLLECTION_PATTERN,
                "format": COLLECTION_FORMAT,
            },
            title="Collections",
            description="One <database>.<collection> per line, e.g. shop.orders. A line without its "
            "database (orders) or its collection (shop.) is refused when you press Trigger, with the "
            "reason at the top of this form. Empty: every captured collection.",
        ),
        "filters": Param(
            None,
            type=["null", "object"],
            title="Filters (incremental)",
            description='Mode incremental only: a MongoDB query per collection, e.g. {"shop.orders": '
            '{"status": "open"}}: only the matching documents are copied. Empty: every document.',
        ),
        "reason": Param(
            None,
            type=["null", "string"],
            title="Reason",
            description="Why the re-snapshot runs, kept in the run's summary and task log. Empty: no "
            "reason recorded.",
        ),
    }


def _filters(value: Any) -> dict[str, Any]:
    """``filters`` from the form or a DAG run conf: an object (or its JSON) of query per collection."""
    from airflow_provider_mongocdc.core.snapshot.incremental import parse_filter

    if value in (None, "", "None", {}):
        return {}
    value = json_object(value, "Filters", 'give an object such as {"shop.orders": {"status": "open"}}')
    parse_collections(list(value))
    return {str(name): parse_filter(str(name), query) for name, query in value.items()}


def active_progress(
    store: OffsetStore, prefix: str, request: IncrementalRequest | None
) -> IncrementalProgress | None:
    """What is left of ``request`` when it still runs (its collections in ``pending``), else None."""
    from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress

    if request is None or request.stop:
        return None
    for partition, state in store.read_all().items():
        progress = IncrementalProgress.from_json(state.incremental) if partition.server_id == prefix else None
        if progress is not None and progress.request_id == request.request_id:
            if not progress.running:
                return None
            return replace(progress, pending=progress.collections_left)
    # not started by a window yet
    return IncrementalProgress(request.request_id, pending=request.collections, filters=dict(request.filters))


def merged_request(
    collections: list[str], filters: Mapping[str, Any], reason: str, active: IncrementalProgress | None
) -> IncrementalRequest:
    """A new request; one still running is folded in (its collections are copied again in full)."""
    from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalRequest

    if active is not None and collections and active.pending:
        merged = {**{name: active.filters.get(name) for name in active.pending}, **filters}
        return IncrementalRequest.new(sorted(set(collections) | set(active.pending)), merged, reason)
    if active is not None and collections and not active.pending:
        collections = []  # the running one copies every captured collection: so does this one
    return IncrementalRequest.new(collections, filters, reason)


def _gap_with_collections(collections: list[str], gap_partitions: list[str]) -> ConfigError:
    """A gap re-snapshot copies every captured collection: chosen ones are refused."""
    if not gap_partitions:
        return ConfigError(
            "Gap mode copies every captured collection",
            cause=f"mode gap was chosen with collections {', '.join(collections)}",
            fix="use mode manual to copy a chosen few (the offset stays), or leave collections "
            "empty for a gap re-snapshot of every collection",
        )
    return ConfigError(
        "A re-snapshot after an oplog gap must copy every captured collection",
        cause=f"the stored resume point of {', '.join(gap_partitions) or 'the connector'} is no "
        "longer in the oplog, so changes of every collection were lost, but collections "
        f"{', '.join(collections)} were chosen",
        fix="trigger the re-snapshot again with collections empty (gap mode copies every collection)",
    )


def _report(value: Any) -> dict[str, Any] | None:
    if value in (None, "", "None"):
        return None
    return json_object(value, "The gap report", "pass the OplogGapSensor's XCom value (a JSON object)")


class MongoResnapshotOperator(MongoSnapshotOperator):
    """Re-snapshot all or chosen collections of a connector, with the snapshot application.

    ``mode="gap"`` (what the watchdog DAG sends with the sensor's gap report): a stored resume
    point is no longer in the oplog, so every captured collection is copied again and the
    streaming offset moves to the new snapshot's start position. Choosing collections is refused
    in this mode: the lost history covered every collection.

    ``mode="manual"``: a new snapshot of the chosen collections (or of all) while streaming goes
    on: the streaming offset stays where it is, so no change event is skipped. Before submitting,
    the operator checks the stored positions itself (as OplogGapSensor does); when one is gone it
    proceeds as in gap mode (or refuses chosen collections, naming the fix).

    Like every snapshot, it holds the connector's lease (see
    :mod:`airflow_provider_mongocdc.core.offsets.lease`) while it runs, so a window of the same connector
    cannot start meanwhile; put the task in the connector's pool (one slot; the example DAGs use
    the pool of their connector list entry) too, so that windows queue instead of failing. The mode is decided (and the oplog checked)
    before the lease is taken.

    Returns the snapshot application's summary plus ``resnapshot``: mode, reason, collections,
    whether the offset was reset, and the gap report's partitions.

    :param collections: ``["<db>.<collection>", ...]``, a JSON list or a comma-separated string;
        empty = every captured collection. (templated)
    :param reason: why the re-snapshot runs (logged and returned). (templated)
    :param mode: ``manual``, ``incremental``, ``gap`` or ``stop``. (templated)
    :param filters: mode ``incremental``: ``{"<db>.<collection>": <query>}`` (a document or
        extended JSON), Debezium's ``additional-conditions``. (templated)
    :param gap_report: the OplogGapSensor's report, when triggered by it. (templated)
    :param spark_conn_id: the Spark connection. (templated)
    Other parameters: see :class:`MongoSnapshotOperator` (``lease_ttl`` ...; without ``force`` /
    ``reset_offset``, which the mode decides).
    """

    # force and reset_offset are decided from the mode when the task runs: they are not templated
    # fields, so Rendered Templates shows the mode instead of values the run may not use.
    template_fields: Sequence[str] = (
        *(name for name in MongoSnapshotOperator.template_fields if name not in ("force", "reset_offset")),
        "reason",
        "mode",
        "filters",
        "gap_report",
    )
    template_fields_renderers = {**MongoSnapshotOperator.template_fields_renderers, "gap_report": "json"}
    ui_color = "#c9e4a6"

    def __init__(
        self,
        *,
        collections: Sequence[str] | str | None = None,
        reason: str = "",
        mode: str = MANUAL,
        filters: Mapping[str, Any] | str | None = None,
        gap_report: Mapping[str, Any] | str | None = None,
        **kwargs: Any,
    ) -> None:
        for fixed in ("force", "reset_offset"):
            if fixed in kwargs:
                raise TypeError(f"MongoResnapshotOperator sets {fixed} from its mode; do not pass it")
        self.spark_conn_id = kwargs.get("spark_conn_id", "spark_default")
        super().__init__(collections=collections, force=True, reset_offset=True, **kwargs)
        self.reason = reason
        self.mode = mode
        self.filters = filters
        self.gap_report = gap_report
        self._decision: dict[str, Any] = {}

    # -- the decision ------------------------------------------------------------------------------
    def decide(self, config: ConnectorConfig) -> dict[str, Any]:
        """Mode, collections and whether the offset resets (checks the oplog in manual mode)."""
        mode, collections, filters = self._request()
        if mode == STOP:
            return {"mode": STOP, "reason": str(self.reason or ""), "collections": [], "reset_offset": False}
        report = _report(self.gap_report)
        gap_partitions = list((report or {}).get("gap_partitions") or [])
        gap = mode == GAP or bool(gap_partitions)
        if not gap:
            found = self.check_gap(config)
            if found.gap:
                self.log.warning(
                    "A stored resume point is no longer in the oplog (%s): the re-snapshot "
                    "copies every collection and resets the offset",
                    found.describe(),
                )
                gap, report = True, found.to_dict()
                gap_partitions = report["gap_partitions"]
        if gap and collections:
            raise _gap_with_collections(collections, gap_partitions)
        return {
            "mode": GAP if gap else mode,
            "reason": str(self.reason or ""),
            "collections": collections,
            "filters": {} if gap else filters,
            "reset_offset": gap,
            "gap_partitions": gap_partitions,
            "gap_report": report,
        }

    def _request(self) -> tuple[str, list[str], dict[str, Any]]:
        """The mode, collections and filters asked for, checked against each other."""
        mode = str(self.mode or MANUAL).strip().lower()
        if mode not in MODES:
            raise ConfigError(f"Unknown re-snapshot mode {self.mode!r}", fix=f"use one of {', '.join(MODES)}")
        collections = parse_collections(self.collections)
        filters = _filters(self.filters)
        if filters and mode != INCREMENTAL:
            raise ConfigError(
                f"Filters apply to mode incremental only, not to mode {mode}",
                cause=f"filters were given for {', '.join(sorted(filters))}",
                fix="choose mode incremental, or leave Filters empty",
            )
        if mode == STOP and collections:
            raise ConfigError(
                "Mode stop ends the whole running incremental snapshot",
                cause=f"collections {', '.join(collections)} were chosen",
                fix="leave collections empty to stop it, then request the collections you still "
                "want with mode incremental",
            )
        return mode, collections, filters

    def check_gap(self, config: ConnectorConfig):
        """The connector's gap report now (as OplogGapSensor computes it)."""
        from airflow_provider_mongocdc.core.gap.checker import GapChecker
        from airflow_provider_mongocdc.core.offsets.store import OffsetStore
        from airflow_provider_mongocdc.hooks.kafka import KafkaConfigHook
        from airflow_provider_mongocdc.hooks.topology import MongoTopologyHook

        details = MongoTopologyHook.from_config(config, self.mongo_conn_id).get_connection_details()
        store = OffsetStore(KafkaConfigHook(self.kafka_conn_id).get_kafka_config(), config.offsets_topic)
        policy = BackoffPolicy(
            config.connect_backoff_initial_delay_ms,
            config.connect_backoff_max_delay_ms,
            min(config.connect_max_attempts, 2),
        )
        return GapChecker(config, details, policy=policy).check(store.read_all(), offsets_topic=store.topic)

    def request_incremental(self, config: ConnectorConfig, decision: Mapping[str, Any]) -> dict[str, Any]:
        """Record an incremental snapshot request (or its stop) in the offsets topic; the windows
        do the copying. Returns at once, without the lease and without spark-submit."""
        from airflow_provider_mongocdc.core.events.filters import Filters
        from airflow_provider_mongocdc.core.offsets.lease import ConnectorLease
        from airflow_provider_mongocdc.core.offsets.store import OffsetStore, check_prefix_owner
        from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalRequest
        from airflow_provider_mongocdc.hooks.kafka import KafkaConfigHook

        kafka_config = KafkaConfigHook(self.kafka_conn_id).get_kafka_config()
        store = OffsetStore(kafka_config, config.offsets_topic)
        store.ensure_topic()
        prefix = config.topic_prefix
        # Another connector's windows would copy what this one asks for: refused as its runs are.
        read = store.read_records()
        lease = ConnectorLease(kafka_config, prefix, store.topic).current(read.records)
        check_prefix_owner(
            store.read_everything(read.records).states,
            lease.connector if lease else None,
            prefix,
            config.name,
            store.topic,
        )
        stored = store.incremental_request(prefix, prefix)
        current = IncrementalRequest.from_json(stored) if stored else None
        active = active_progress(store, prefix, current)
        if decision["mode"] == STOP:
            if current is None or active is None:
                self.log.info("No incremental snapshot of connector %s is running: nothing to stop", prefix)
                return {"status": "nothing_to_stop", "resnapshot": dict(decision)}
            store.write_incremental_request(prefix, prefix, current.stopped().to_json())
            self.log.info(
                "Incremental snapshot %s of connector %s: stop requested (%s)",
                current.request_id,
                prefix,
                active.describe(),
            )
            return {
                "status": "stop_requested",
                "resnapshot": dict(decision),
                "incremental_snapshot": current.request_id,
            }
        for name in decision["collections"]:
            database, _, collection = name.partition(".")
            if not Filters(config).collection_included(database, collection):
                raise ConfigError(
                    f"The collection {name} is not captured by connector {prefix}",
                    cause="the include/exclude lists (or capture.scope) leave it out, so its changes are "
                    "never streamed",
                    fix="choose captured collections, or change the connector's include lists first",
                )
        request = merged_request(decision["collections"], decision["filters"], decision["reason"], active)
        store.write_incremental_request(prefix, prefix, request.to_json())
        self.log.info(
            "Incremental snapshot %s of connector %s requested: %s%s; the next windows copy it in "
            "chunks of %d documents after streaming (at most %d ms per window)",
            request.request_id,
            prefix,
            ", ".join(request.collections) or "every captured collection",
            f" (with the collections left of {active.request_id})" if active is not None else "",
            config.incremental_snapshot_chunk_size,
            config.incremental_snapshot_window_budget_ms,
        )
        return {
            "status": "requested",
            "resnapshot": {key: value for key, value in decision.items() if key != "gap_report"},
            "incremental_snapshot": request.to_json(),
        }

    def job_params(self, context, config: ConnectorConfig) -> dict[str, Any]:
        self.collections = self._decision["collections"] or None
        self.force = True
        self.reset_offset = self._decision["reset_offset"]
        return super().job_params(context, config)

    # -- run ---------------------------------------------------------------------------------------
    def execute(self, context) -> dict[str, Any]:
        config = parse_connector_config(self.connector_config)
        self._use_rendered_spark_connection()
        self._decision = self.decide(config)
        decision = self._decision
        if decision["mode"] in (INCREMENTAL, STOP):
            return self.request_incremental(config, decision)
        self.log.info(
            "Re-snapshot of connector %s (mode %s%s): %s; the streaming offset %s",
            config.topic_prefix,
            decision["mode"],
            f", reason: {decision['reason']}" if decision["reason"] else "",
            ", ".join(decision["collections"]) or "every captured collection",
            "moves to the new snapshot's start" if decision["reset_offset"] else "stays as it is",
        )
        summary = dict(super().execute(context))  # holds the connector's lease while it runs
        summary["resnapshot"] = {key: value for key, value in decision.items() if key != "gap_report"}
        if decision["gap_report"]:
            summary["resnapshot"]["gap_detected_at"] = decision["gap_report"].get("detected_at")
            summary["resnapshot"]["lost_seconds"] = decision["gap_report"].get("lost_seconds")
        return summary
