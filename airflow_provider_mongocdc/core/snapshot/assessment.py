"""What a snapshot run knows before copying anything: topology, stored offsets and the decision.

Shared by the snapshot run (``core/snapshot/run.py``, which then copies) and
``MongoSnapshotOperator`` (which asks :func:`nothing_to_do` first, so that a run with nothing to do
never starts spark-submit). The decision itself is :func:`~airflow_provider_mongocdc.core.snapshot.decision.decide`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.booleans import parse_bool
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.mongo.connection import connect, connection_details
from airflow_provider_mongocdc.core.mongo.topology import (
    CLUSTER_PARTITION,
    REPLICA_SET,
    ShardAddress,
    discover,
)
from airflow_provider_mongocdc.core.offsets.lease import ConnectorLease
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore, check_prefix_owner
from airflow_provider_mongocdc.core.offsets.writers import take_over, window_transactional_id
from airflow_provider_mongocdc.core.snapshot.decision import NOTHING, decide, resume_point_purged
from airflow_provider_mongocdc.core.snapshot.plan import parse_namespaces

log = logging.getLogger("airflow_provider_mongocdc")


def bool_param(params: dict[str, Any], name: str, default: bool) -> bool:
    """A boolean job parameter (a bool, or a word such as "true"/"false"); ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    return parse_bool(
        value,
        name,
        problem=f"The snapshot parameter {name}={value!r} is not a boolean",
        cause=None,
        fix=f"pass {name} as true or false",
    )


class Assessment:
    """Topology, offsets and the snapshot decision: everything known before any copying.

    ``before_read`` runs after the offsets topic is ensured and before it is read: the job takes
    over the control transactional.id there, which finishes any offsets transaction a killed run
    left open, so that the read sees everything that was committed. The deployment and the
    decision are logged at ``log_level``.
    """

    def __init__(self, spec: JobSpec, before_read=None, *, log_level: int = logging.INFO):
        self.started = time.monotonic()
        self.spec = spec
        self.config = config = ConnectorConfig.from_properties(spec.connector)
        params = dict(spec.params or {})
        self.collections = parse_namespaces(params.get("collections"))
        self.force = bool_param(params, "force", False)
        self.reset_offset = bool_param(params, "reset_offset", True)
        self.details = connection_details(spec.mongo, config)
        self.policy = BackoffPolicy.from_config(config)

        topology = discover(self.details, policy=self.policy)  # refuses a standalone server (TopologyError)
        partition_names = topology.partitions(config.mongodb_connection_mode)
        self.partitions = [OffsetPartition(config.topic_prefix, name) for name in partition_names]
        self.replica_set = (
            topology.replica_sets[0].name if topology.kind == REPLICA_SET else CLUSTER_PARTITION
        )
        self._shards = {
            shard.replica_set.name: ShardAddress(shard.name, shard.host) for shard in topology.shards
        }
        log.log(
            log_level,
            "Snapshot of %s (%s): partitions %s, snapshot.mode=%s",
            self.details.describe(),
            topology.kind,
            ", ".join(partition_names),
            config.snapshot_mode,
        )

        self.store = OffsetStore.for_connector(spec.kafka, config)
        self.store.ensure_topic()
        self._clients: dict[Any, Any] = {}
        self.extra = before_read() if before_read else None
        # The streams' window writers too: none of a killed window's transactions stays open.
        take_over(spec.kafka, [window_transactional_id(config.topic_prefix, p.rs) for p in self.partitions])
        try:
            read = self.store.read_records()
            self.everything = self.store.read_everything(read.records)
            self.everything.open_transactions = read.open_transactions
            self.states = {partition: self.everything.states.get(partition) for partition in self.partitions}
            # Another connector's offsets (of any partition of the prefix) or lease: refused.
            lease = ConnectorLease(spec.kafka, config.topic_prefix, self.store.topic).current(read.records)
            check_prefix_owner(
                self.everything.states,
                lease.connector if lease else None,
                config.topic_prefix,
                config.name,
                self.store.topic,
            )
            self.decision = decide(self.states, config.snapshot_mode, force=self.force, purged=self._purged)
        except BaseException:
            self.close()
            if self.extra is not None:
                self.extra.close()
            raise
        log.log(log_level, "Snapshot decision: %s (%s)", self.decision.action, self.decision.reason)

    def client_for(self, partition_name: str | None):
        """The deployment's client, or a shard's for a per-shard partition."""
        key = partition_name if partition_name in self._shards else None
        if key not in self._clients:
            self._clients[key] = connect(
                self.details if key is None else self.details.for_replica_set(key, self._shards[key].hosts),
                self.policy,
            )
        return self._clients[key]

    def _purged(self, partition, position) -> bool:
        return resume_point_purged(self.client_for(partition.rs), self.config, position)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


# -- summaries (the run's result file and the operator's XCom) ----------------------------------------
def base_summary(config: ConnectorConfig, decision, partitions) -> dict[str, Any]:
    return {
        "connector": config.topic_prefix,
        "mode": config.snapshot_mode,
        "action": decision.action,
        "reason": decision.reason,
        "partitions": [partition.rs for partition in partitions],
    }


def offsets_summary(states) -> dict[str, Any]:
    return {
        partition.rs: (state.to_dict() if state is not None else None) for partition, state in states.items()
    }


def nothing_summary(config: ConnectorConfig, decision, partitions, states) -> dict[str, Any]:
    return base_summary(config, decision, partitions) | {"offsets": offsets_summary(states)}


def nothing_to_do(spec: JobSpec) -> dict[str, Any] | None:
    """The run's summary when ``snapshot.mode`` finds nothing to do now, else None.

    Read without Spark and without taking over any transaction: the operator asks this first and
    skips spark-submit when there is nothing to do. Offsets are read up to the last stable offset,
    so an interrupted snapshot whose transaction is still open can look unfinished here; then the
    run itself decides, after taking over. Its lines are DEBUG: the application logs the same ones
    when it runs, and the operator says why nothing was to be done.
    """
    assessment = Assessment(spec, log_level=logging.DEBUG)
    assessment.close()
    if assessment.decision.action != NOTHING:
        return None
    return nothing_summary(assessment.config, assessment.decision, assessment.partitions, assessment.states)
