"""The change watcher: an event trigger (``AssetWatcher``) that asks for a connector's window when
changes pile up, wait too long, or a stored position nears the end of the oplog.

It runs in Airflow's triggerer, on pymongo's asyncio API. From each stream's committed position (as
a window would start) it reads the same change stream a window reads, projected down to each
change's position, time, namespace and operation, and counts the changes in whole batches
(:mod:`~airflow_provider_mongocdc.core.watch.stream`); every minute (twelve polls) it checks the
stored positions against the oplog (:class:`~airflow_provider_mongocdc.core.gap.checker.AsyncGapChecker`).
The decisions are :class:`~airflow_provider_mongocdc.core.watch.watcher.ChangeWatch`'s. Its event
(the asset event's ``extra["payload"]``) says why, how many changes are pending and since when:
``{"connector", "reason", "reasons", "message", "pending", "pending_since", "newest_change",
"headroom_seconds", "partitions", "at"}``.

While a window is open (its marker in the offsets topic, and the connector's lease held by a
window: :mod:`~airflow_provider_mongocdc.core.offsets.open_window`) the watcher reads the offsets
when the window's next commit is due (it may have closed by then) and at every check, not at every
poll, keeps no MongoDB client and checks no oplog (with one kept reader that fetches only what was
committed since its last read:
:meth:`~airflow_provider_mongocdc.core.offsets.store.OffsetStore.follower`), sends no event and
reads no change stream (the open window reads every change as it comes); when the window closes it opens the streams again from the window's last commit. The status
it writes for the MongoDB CDC page shows the open window.

The watcher is a scheduling hint: it never commits an offset and never takes the connector's lease;
the window it starts reads from the committed offset as every window does. Its serialized arguments
hold no secret (they are stored in Airflow's metadata database): the connector's name, its inline
configuration (a property that names a credential is refused, even one the connector ignores) or
the name of the Variable holding it,
two connection ids and the thresholds; connections and Variables are resolved in the triggerer.

This module holds what a DAG file builds (the trigger, its Asset) and what Airflow stores of it
(:meth:`MongoChangeWatcher.serialize`); the reads and writes above are
:class:`~airflow_provider_mongocdc.triggers.change_watch_session.WatchSession`'s, imported when the
triggerer runs the watcher, so a parse of the DAG file imports neither pymongo nor confluent_kafka.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.base.redaction import credential_properties
from airflow_provider_mongocdc.core.watch.settings import WatchSettings

ASSET_SCHEME = "mongocdc-changes"


def changes_asset(watcher: MongoChangeWatcher) -> Asset:
    """The Asset ``mongocdc-changes://<connector>`` watched by ``watcher``: a DAG scheduled on it
    runs when the watcher asks for a window of its connector."""
    name = watcher.connector
    return Asset(
        uri=f"{ASSET_SCHEME}://{name}",
        name=f"mongocdc.{name}.changes",
        group="mongocdc",
        watchers=[AssetWatcher(name=f"mongocdc_{name}_changes", trigger=watcher)],
    )


class MongoChangeWatcher(BaseEventTrigger):
    """Fire when a connector's pending changes reach ``min_changes``, its oldest pending change is
    ``max_delay_s`` old, or a stored position leaves the oplog within ``min_headroom_s``.

    :param connector: the connector's name (of the connector list; its messages name it).
    :param connector_config: the connector properties (Debezium names), or None to read them from
        the Variable ``config_variable`` in the triggerer, as the connector's tasks do.
    :param mongo_conn_id: the MongoDB connection of the captured deployment.
    :param kafka_conn_id: the Kafka connection holding the offsets topic.
    :param min_changes, max_delay_s, min_headroom_s, poll_interval_s, refire_after_s: see
        :class:`~airflow_provider_mongocdc.core.watch.settings.WatchSettings` (durations in seconds).
    :param watchdog_dag_id: the connector's oplog gap watchdog, named when a position is purged.
    """

    def __init__(
        self,
        connector: str,
        connector_config: Mapping[str, Any] | None = None,
        config_variable: str | None = None,
        mongo_conn_id: str = "mongocdc_default",
        kafka_conn_id: str = "kafka_default",
        min_changes: int = WatchSettings.min_changes,
        max_delay_s: float = WatchSettings.max_delay_s,
        min_headroom_s: float = WatchSettings.min_headroom_s,
        poll_interval_s: float = WatchSettings.poll_interval_s,
        refire_after_s: float = WatchSettings.refire_after_s,
        watchdog_dag_id: str | None = None,
    ):
        super().__init__()
        if (connector_config is None) == (config_variable is None):
            raise ConfigError(
                f"The change watcher of connector {connector!r} needs the connector configuration",
                fix="give connector_config (the properties) or config_variable (the Variable holding them)",
            )
        secret = credential_properties(connector_config or {})
        if secret:
            # Its arguments are stored in Airflow's serialized DAG, in clear.
            raise ConfigError(
                f"The change watcher of connector {connector!r} was given credential properties "
                f"({', '.join(secret)})",
                cause="a trigger's arguments are stored in clear in Airflow's metadata database",
                fix="remove them from the inline configuration (credentials belong in the MongoDB and "
                "Kafka connections), or pass config_variable instead",
            )
        self.connector = connector
        self.connector_config = dict(connector_config) if connector_config is not None else None
        self.config_variable = config_variable
        self.mongo_conn_id = mongo_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.settings = WatchSettings(
            min_changes, max_delay_s, min_headroom_s, poll_interval_s, refire_after_s
        )
        self.watchdog_dag_id = watchdog_dag_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        names = ("connector", "connector_config", "config_variable", "mongo_conn_id", "kafka_conn_id")
        arguments = {name: getattr(self, name) for name in names}
        arguments.update(self.settings.to_kwargs(), watchdog_dag_id=self.watchdog_dag_id)
        return f"{type(self).__module__}.{type(self).__qualname__}", arguments

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # The MongoDB and Kafka clients are imported here, in the triggerer, not when a DAG file
        # that builds the watcher is parsed.
        from airflow_provider_mongocdc.triggers.change_watch_session import WatchSession

        session = WatchSession(self)
        try:
            while True:
                payload = await session.step()
                if payload is not None:
                    yield TriggerEvent(payload)
        finally:
            await session.close()
