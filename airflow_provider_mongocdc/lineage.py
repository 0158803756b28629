"""Assets and OpenLineage datasets of the snapshot and window tasks (core stays Airflow-free).

One Asset per connector, ``mongocdc://<topic.prefix>`` (name ``mongocdc.<topic.prefix>``): a
window's outlet when ``topic.prefix`` is known at parse time; otherwise, and for snapshots, the
AssetAlias ``mongocdc``, to which the run attaches the connector's Asset (a snapshot only when it
copied data). The asset event's ``extra`` is the run's summary (events or documents per collection
and per topic, end position per partition, window end), with no key that Airflow's UI and REST API
mask (the resume token is ``resume_point`` there).

OpenLineage (``pip install airflow-provider-mongocdc[openlineage]``): inputs are the collections a
run read (namespace ``mongodb://<first seed host>:<port>``, name ``<db>.<collection>``), outputs the
topics it wrote (namespace ``kafka://<first bootstrap server>``, name the topic).
Why one Asset per connector rather than per topic: docs/design.md, "Assets and lineage".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow.sdk import Asset

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.topics import TopicNamer

ASSET_SCHEME = "mongocdc"
# The resume token's name in an asset event's extra (Airflow masks keys containing "token").
RESUME_POINT = "resume_point"
MONGODB_DEFAULT_PORT = 27017


def connector_asset(topic_prefix: str) -> Asset:
    """The Asset of a connector: what its snapshots and windows write."""
    return Asset(uri=f"{ASSET_SCHEME}://{topic_prefix}", name=f"mongocdc.{topic_prefix}", group="mongocdc")


def literal_topic_prefix(connector_config: Mapping[str, Any] | str) -> str | None:
    """``topic.prefix`` when it is known at parse time (not a template), else None."""
    if isinstance(connector_config, str):
        import json

        try:
            connector_config = json.loads(connector_config)
        except ValueError:
            return None  # a template, or invalid JSON (reported when the task runs)
    if not isinstance(connector_config, Mapping):
        return None
    prefix = connector_config.get("topic.prefix")
    if not isinstance(prefix, str) or not prefix or "{{" in prefix or "{%" in prefix:
        return None
    return prefix


def collections_written(summary: Mapping[str, Any]) -> list[str]:
    """The ``db.collection`` names a run's summary counts (window or snapshot)."""
    counts = summary.get("events_by_collection") or summary.get("collections") or {}
    return sorted(counts)


def topics_by_collection(config: ConnectorConfig, collections: Iterable[str]) -> dict[str, str]:
    namer = TopicNamer(config)
    topics = {}
    for namespace in collections:
        db, _, coll = namespace.partition(".")
        topics[namespace] = namer.data_topic(db, coll)
    return topics


def served_positions(positions: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A summary's positions (``{partition: position}``) as an asset event's extra holds them: one
    entry per partition, ``{"partition", "sec", "ord", "resume_point", "time"}``. Airflow's UI and
    REST API mask every text under a key that looks like a secret (``resume_token``, or a replica
    set named like one), so neither is a key here."""
    served = []
    for partition, position in sorted((positions or {}).items()):
        entry = {"partition": partition}
        for key, value in (position or {}).items():
            entry[RESUME_POINT if key == "resume_token" else key] = value
        served.append(entry)
    return served


def asset_extra(config: ConnectorConfig, application: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The asset event's extra of a run: JSON-friendly, without credentials, and with no key that
    Airflow's UI and REST API would mask (see :func:`served_positions`). ``connector`` is the
    connector's name (its ``name`` property, the topic prefix when it has none), ``topic_prefix``
    its topic prefix."""
    counts = dict(summary.get("events_by_collection") or summary.get("collections") or {})
    topics = topics_by_collection(config, counts)
    window = application == "stream_window"
    count = "events" if window else "documents"
    extra: dict[str, Any] = {
        "connector": config.name or config.topic_prefix,
        "topic_prefix": config.topic_prefix,
        "run": application,
        "status": summary.get("status") or summary.get("action") or "ok",
        "topics": {topics[ns]: n for ns, n in counts.items()},
        count: summary.get(count, 0),
        f"{count}_by_collection": counts,
        "bytes": summary.get("bytes", 0),
    }
    if window:
        extra["window_end"] = summary.get("window_end")
        if summary.get("open_window"):  # an open window: since when, events, committed lag
            extra["open_window"] = dict(summary["open_window"])
    else:
        extra["snapshot_id"] = summary.get("snapshot_id")
    # A snapshot ends where the stream goes on: its start position.
    extra["end_position"] = served_positions(summary.get("end_position" if window else "start_position"))
    return extra


def mongodb_namespace(mongo: Mapping[str, Any]) -> str:
    """``mongodb://host:port`` of the first seed host (credentials and options left out)."""
    text = mongo.get("hosts") or mongo.get("connection_string") or ""
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.split("/", 1)[0].split("?", 1)[0]
    text = text.rsplit("@", 1)[-1]  # user:password@
    if "/" in (mongo.get("hosts") or "") and not mongo.get("connection_string"):
        text = mongo["hosts"].split("/", 1)[1]  # rs0/host1:27017,host2:27017
    host = text.split(",", 1)[0].strip() or "localhost"
    if not host.startswith("[") and ":" not in host or host.endswith("]"):
        host = f"{host}:{MONGODB_DEFAULT_PORT}"
    return f"mongodb://{host}"


def kafka_namespace(kafka: Mapping[str, Any]) -> str:
    """``kafka://host:port`` of the first bootstrap server."""
    servers = str(kafka.get("bootstrap.servers") or kafka.get("metadata.broker.list") or "")
    server = servers.split(",", 1)[0].strip()
    if "://" in server:  # PLAINTEXT://host:port
        server = server.split("://", 1)[1]
    return f"kafka://{server}"


def openlineage_facets(
    config: ConnectorConfig, mongo_ns: str, kafka_ns: str, summary: Mapping[str, Any] | None
):
    """OperatorLineage of a run: collections read, topics written (the OpenLineage provider is
    imported here, so the provider works without it)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    collections = collections_written(summary or {})
    topics = topics_by_collection(config, collections)
    return OperatorLineage(
        inputs=[Dataset(namespace=mongo_ns, name=ns) for ns in collections],
        outputs=[Dataset(namespace=kafka_ns, name=topics[ns]) for ns in collections],
    )
