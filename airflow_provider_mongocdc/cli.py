"""``mongocdc``: the operator commands (offsets show, reset, set, import-debezium, export-debezium,
adopt; tables reset-positions).

Entry point :func:`main`; its help text (:data:`HELP`) says what each command does. A command
prints JSON on stdout and its log lines on stderr; a refusal goes to stderr with its cause and fix
(exit status 1, usage 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from bson import json_util
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import ConfigError, MongoCdcError
from airflow_provider_mongocdc.core.base.timefmt import parse_iso
from airflow_provider_mongocdc.core.config.parsing import load_json

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# What `mongocdc --help` prints before its usage lines.
HELP = """``mongocdc``: operator commands.

    mongocdc offsets show  --topic-prefix P [--partition RS]            (JSON on stdout)
    mongocdc offsets reset --topic-prefix P --partition RS --yes
    mongocdc offsets set   --topic-prefix P --partition RS --yes
                           (--resume-token JSON | --cluster-time SEC:INC | --cluster-time ISO-TIME)
    mongocdc offsets import-debezium --topic-prefix P --partition RS --connect-offsets-topic T
                           [--debezium-connector NAME] --yes
    mongocdc offsets export-debezium --topic-prefix P --partition RS --connect-offsets-topic T
                           --debezium-connector NAME --yes
    mongocdc offsets adopt --topic-prefix P --name NAME --yes

``import-debezium`` moves the partition to the position of a Debezium MongoDB connector stored in
a Kafka Connect offsets topic (the worker's offset.storage.topic; key ``["<connector>",
{"server_id": "<topic prefix>"}]``, resume token as Debezium 2.7+ base64 BSON or the older hex
``_data``): the next window resumes right after the last change Debezium processed.
``export-debezium`` writes the partition's position there as Debezium 3.x writes its offset, so a
Debezium connector with that name and topic.prefix resumes right after the last change delivered
here. Stop the Debezium connector first (Kafka Connect reads offsets when a task starts).

``adopt`` hands a topic prefix's offsets to the connector named NAME (its entry in the connector
list): a topic prefix belongs to one connector, and runs refuse offsets written under another
connector's name. Use it when a connector was renamed.

Kafka: ``--kafka-config FILE`` (a librdkafka JSON configuration, secrets included: keep them out of
the command line), ``--kafka-conn-id ID`` (an Airflow connection whose extra is that
configuration, read from Airflow's secrets backends, then its metadata database: run the command
where Airflow is configured) or ``--bootstrap-servers HOSTS`` (clusters without authentication).
The offsets topic is ``--offsets-topic`` or ``<topic prefix>.offsets``.

``reset``, ``set``, ``import-debezium``, ``export-debezium`` and ``adopt`` hold the connector's lease (kind
``offsets``) while they change the offset: a running window or snapshot would overwrite the
change when it commits, so they are refused while one holds the lease (the error names it, since
when and until when it holds it), and no window or snapshot starts meanwhile. Pause the connector's DAGs first so that none is due. ``show``
only reads; it says when a transaction is open on the offsets topic (offsets committed after it
are not shown until it ends). A change waits for the transactions open on the offsets topic to end
and ends those of the connector's own writers that were killed; another writer's is an error.
"""
TABLES_HELP = """``mongocdc tables``: a collection's table.

    mongocdc tables reset-positions --table URI --topic T [--storage-conn-id ID] (Kafka options) --yes

``reset-positions`` is for a table whose topic was deleted and created again (the apply stops such
a table with an error that says so): it records, in one commit that changes no row, the topic's
identity and the first offset of each of its partitions as the table's positions. The next apply
applies the new topic from its beginning: records of documents the table holds change their rows
again (to the same state or a newer one), and a re-snapshot sweeps the rows of documents MongoDB no
longer has. Pause the connector's DAGs first. The table's storage options come from the Airflow
connection ``--storage-conn-id`` (run the command where Airflow is configured). Kafka: as for
``mongocdc offsets``.
"""
# The ways to reach Kafka (one of them): option, metavar, help.
_KAFKA_OPTIONS = (
    (
        "--kafka-config",
        "FILE",
        "librdkafka configuration as a JSON file (bootstrap.servers, security.*, sasl.* ...)",
    ),
    ("--kafka-conn-id", "ID", "Airflow connection (type mongocdc_kafka or kafka) holding that configuration"),
    ("--bootstrap-servers", "HOSTS", "host1:9092,host2:9092 (no authentication)"),
)
_KAFKA_OBJECT_FIX = 'write a JSON object such as {"bootstrap.servers": "host:9092"}'


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mongocdc", description="MongoDB CDC for Apache Airflow: operator commands."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    offsets = commands.add_parser(
        "offsets",
        help="show, reset or move a connector's offsets",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = offsets.add_subparsers(dest="action", required=True)

    def common(sub: argparse.ArgumentParser, partition_required: bool) -> None:
        kafka = sub.add_mutually_exclusive_group(required=True)
        for option, metavar, help_text in _KAFKA_OPTIONS:
            kafka.add_argument(option, metavar=metavar, help=help_text)
        sub.add_argument("--topic-prefix", required=True, help="the connector's topic.prefix")
        sub.add_argument(
            "--offsets-topic", help="the connector's offset.storage.topic (default <topic prefix>.offsets)"
        )
        sub.add_argument("--connector", help="connector name in the offset keys (default: the topic prefix)")
        sub.add_argument(
            "--partition",
            required=partition_required,
            metavar="RS",
            help="replica set name, or 'cluster' for a whole-cluster stream",
        )
        sub.add_argument(
            "--timeout", type=float, default=60.0, help="seconds to read the offsets topic (default 60)"
        )

    show = actions.add_parser("show", help="print the committed offsets as JSON")
    common(show, partition_required=False)
    reset = actions.add_parser("reset", help="delete a partition's offset (the next run starts over)")
    common(reset, partition_required=True)
    reset.add_argument("--yes", action="store_true", help="confirm the change")
    move = actions.add_parser("set", help="move a partition to a resume token or cluster time")
    common(move, partition_required=True)
    target = move.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--resume-token",
        metavar="JSON",
        help='resume token as JSON ({"_data": "8263..."}) or its _data string',
    )
    target.add_argument(
        "--cluster-time",
        metavar="SEC:INC|ISO",
        help="cluster time as seconds:increment (1714557600:1) or an ISO time "
        "(2024-05-01T10:00:00Z); streaming starts at that operation time",
    )
    move.add_argument("--yes", action="store_true", help="confirm the change")
    for action, help_text in (
        ("import-debezium", "move a partition to a Debezium MongoDB connector's stored position"),
        ("export-debezium", "write a partition's position as a Debezium MongoDB connector's offset"),
    ):
        switch = actions.add_parser(action, help=help_text)
        common(switch, partition_required=True)
        switch.add_argument(
            "--connect-offsets-topic",
            required=True,
            metavar="TOPIC",
            help="the Kafka Connect worker's offset.storage.topic",
        )
        switch.add_argument(
            "--debezium-connector",
            required=action == "export-debezium",
            metavar="NAME",
            help="the Debezium connector's name in Kafka Connect"
            + (
                " (default: the only one whose server_id is the topic prefix)"
                if action == "import-debezium"
                else ""
            ),
        )
        switch.add_argument("--yes", action="store_true", help="confirm the change")
    adopt = actions.add_parser("adopt", help="hand a topic prefix's offsets to a (renamed) connector")
    common(adopt, partition_required=False)
    adopt.add_argument("--name", required=True, help="the connector's name (its entry in the connector list)")
    adopt.add_argument("--yes", action="store_true", help="confirm the change")

    tables = commands.add_parser(
        "tables",
        help="act on a collection's table",
        description=TABLES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    table_actions = tables.add_subparsers(dest="action", required=True)
    reset_positions = table_actions.add_parser(
        "reset-positions", help="apply a table's topic again from its first record (a topic created again)"
    )
    kafka = reset_positions.add_mutually_exclusive_group(required=True)
    for option, metavar, help_text in _KAFKA_OPTIONS:
        kafka.add_argument(option, metavar=metavar, help=help_text)
    reset_positions.add_argument(
        "--table",
        required=True,
        metavar="URI",
        help="the table: <location>/<database>/<collection> (Delta; Iceberg in the SQL catalog under the "
        "location), or iceberg://<iceberg connection>/<namespace>/<table>",
    )
    reset_positions.add_argument(
        "--format", choices=("delta", "iceberg"), default="delta", help="the table's format (default delta)"
    )
    reset_positions.add_argument(
        "--topic", required=True, help="the table's topic: <topic prefix>.<db>.<coll>"
    )
    reset_positions.add_argument(
        "--storage-conn-id",
        metavar="ID",
        help="the Airflow connection of the table's storage options (the connector's 'conn_id')",
    )
    reset_positions.add_argument("--yes", action="store_true", help="confirm the change")
    return parser


def _kafka_config(args: argparse.Namespace) -> dict[str, Any]:
    if args.kafka_config:
        return _kafka_config_file(Path(args.kafka_config))
    if args.kafka_conn_id:
        from airflow_provider_mongocdc.hooks.kafka import kafka_config_from_connection

        return kafka_config_from_connection(stored_connection(args.kafka_conn_id))
    return {"bootstrap.servers": args.bootstrap_servers}


def stored_connection(conn_id: str):
    """The Airflow connection ``conn_id`` wherever the Airflow configured here keeps it, as
    ``airflow connections get`` finds it: its secrets backends (a configured backend,
    ``AIRFLOW_CONN_<ID>``), then its metadata database. Outside a task the Task SDK reads only the
    secrets backends, so the database is read here (``airflow.secrets.metastore``)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException
    from airflow.secrets.metastore import MetastoreBackend
    from airflow.settings import engine
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        pass
    database = engine.url.render_as_string(hide_password=True) if engine is not None else "not configured"
    try:
        conn = MetastoreBackend().get_connection(conn_id)
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", None) or error).splitlines()[0]
        where = (
            f"Airflow's metadata database ({database}) could not be read: {reason} (an Airflow home "
            "whose database was never created needs `airflow db migrate`)"
        )
    else:
        if conn is not None:
            return conn
        where = f"Airflow's metadata database ({database}) has no connection of that id"
    variable = f"AIRFLOW_CONN_{conn_id.upper()}"
    raise ConfigError(
        f"Kafka connection {conn_id!r} was not found",
        cause=f"it is in no secrets backend ({variable} is not set) and {where}",
        fix="run the command where Airflow is configured (the AIRFLOW_HOME or "
        f"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN of the scheduler), or set {variable}, or give the "
        "Kafka settings with --bootstrap-servers HOST:PORT or --kafka-config FILE instead of "
        "--kafka-conn-id",
    )


def _kafka_config_file(path: Path) -> dict[str, Any]:
    name = repr(str(path))
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(
            f"Cannot read the Kafka configuration file {name}",
            cause=str(error),
            fix="give the path of a readable JSON file",
        ) from None
    config = load_json(text, f"The Kafka configuration file {name} is not JSON", _KAFKA_OBJECT_FIX)
    if not isinstance(config, dict):
        raise ConfigError(
            f"The Kafka configuration file {name} does not hold a JSON object", fix=_KAFKA_OBJECT_FIX
        )
    return config


def parse_cluster_time(text: str) -> Timestamp:
    """``"1714557600:3"`` -> Timestamp(1714557600, 3); an ISO time -> Timestamp(its seconds, 0)."""
    value = text.strip()
    if ":" in value and value.replace(":", "").isdigit():
        seconds, increment = value.split(":", 1)
        return Timestamp(int(seconds), int(increment))
    if value.isdigit():
        return Timestamp(int(value), 0)
    try:
        moment = parse_iso(value)
    except ValueError:
        moment = None
    if moment is None:
        raise ConfigError(
            f"Cannot read cluster time {text!r}",
            fix="give seconds:increment (1714557600:1) or an ISO time (2024-05-01T10:00:00Z)",
        )
    return Timestamp(int(moment.timestamp()), 0)


def parse_resume_token(text: str) -> dict[str, Any]:
    value = text.strip()
    if not value.startswith("{"):
        if not value or any(c not in "0123456789abcdefABCDEF" for c in value):
            raise ConfigError(
                f"Cannot read resume token {text!r}",
                fix='give the token as JSON ({"_data": "8263..."}) or its hexadecimal _data string',
            )
        return {"_data": value}
    token = load_json(
        value,
        "The resume token is not valid JSON",
        fix='give the token as JSON, e.g. {"_data": "8263..."}',
        loads=json_util.loads,
    )
    if not isinstance(token, dict) or "_data" not in token:
        raise ConfigError(
            "The resume token has no _data field",
            cause=f"got {text!r}",
            fix='give the token as the change stream returned it, e.g. {"_data": "8263..."}',
        )
    return token


def _state(state) -> dict[str, Any] | None:
    return None if state is None else state.to_dict()


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = sys.stdout
    # stdout carries the command's JSON only: log lines (the provider's, and Airflow's, whose
    # logging writes to stdout once a connection lookup imports it) go to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        result = _execute(args)
    if result is None:
        return EXIT_USAGE
    print(json.dumps(result, indent=2, sort_keys=False, default=str), file=out)
    return EXIT_OK


def _tables(args: argparse.Namespace) -> dict[str, Any] | None:
    """``mongocdc tables reset-positions`` (None: refused without --yes)."""
    if not args.yes:
        print(
            f"mongocdc: refusing to reset the positions of the table {args.table} without --yes. Pause the "
            "connector's DAGs first, then repeat the command with --yes.",
            file=sys.stderr,
        )
        return None
    from airflow_provider_mongocdc.core.apply.run import reset_positions
    from airflow_provider_mongocdc.core.apply.settings import DeltaSettings

    if args.format == "iceberg" or args.table.startswith("iceberg://"):
        return reset_positions(_iceberg_store(args.table), _kafka_config(args), args.topic)
    from airflow_provider_mongocdc.tables.delta import DeltaTableStore

    storage_options: dict[str, str] = {}
    if args.storage_conn_id:
        from airflow_provider_mongocdc.hooks.delta import DeltaStorageHook

        scheme = DeltaSettings.from_mapping({"location": args.table}).scheme
        storage_options = DeltaStorageHook(args.storage_conn_id).storage_options(scheme)
    store = DeltaTableStore(args.table, storage_options, conn_id=args.storage_conn_id)
    return reset_positions(store, _kafka_config(args), args.topic)


def _iceberg_store(table: str):
    """The Iceberg table of ``--table``: ``iceberg://<connection>/<namespace>/<table>`` (its catalog from
    that Airflow connection), or ``<location>/<database>/<collection>`` (the SQL catalog under the
    location)."""
    from airflow_provider_mongocdc.core.apply.settings import TableSettings
    from airflow_provider_mongocdc.tables.iceberg import IcebergTableStore

    if table.startswith("iceberg://"):
        parts = table.removeprefix("iceberg://").split("/")
        if len(parts) != 3 or not all(parts):
            raise ConfigError(
                f"--table {table!r} is not iceberg://<connection>/<namespace>/<table>",
                fix="give the table as the MongoDB CDC page and its asset name it",
            )
        conn_id, namespace, name = parts
        from airflow_provider_mongocdc.hooks.iceberg import IcebergCatalogHook

        properties = IcebergCatalogHook(conn_id).catalog_properties()
        return IcebergTableStore(properties, (namespace, name), conn_id=conn_id, uri=table)
    path = Path(table)
    settings = TableSettings.from_mapping({"format": "iceberg", "location": str(path.parent.parent)})
    return IcebergTableStore(settings.default_catalog(), (path.parent.name, path.name))


def _execute(args: argparse.Namespace) -> dict[str, Any] | None:
    """The command's result (None: refused without --yes)."""
    if args.command == "tables":
        return _tables(args)
    from airflow_provider_mongocdc.core.offsets.model import Position
    from airflow_provider_mongocdc.core.offsets.store import OffsetStore
    from airflow_provider_mongocdc.core.offsets.writers import TakeOver

    if args.action != "show" and not args.yes:
        what = {"reset": "delete", "export-debezium": "export", "adopt": "hand over"}.get(args.action, "move")
        whose = "the offsets" if args.action == "adopt" else f"the offset of partition {args.partition!r}"
        print(
            f"mongocdc: refusing to {what} {whose} of "
            f"{args.topic_prefix!r} without --yes. Stop the connector's DAGs first, check the "
            f"current offset with 'mongocdc offsets show', then repeat the command with --yes.",
            file=sys.stderr,
        )
        return None
    target = None
    if args.action == "set":
        target = (
            Position(resume_token=parse_resume_token(args.resume_token))
            if args.resume_token
            else Position(cluster_time=parse_cluster_time(args.cluster_time))
        )

    kafka_config = _kafka_config(args)
    topic = args.offsets_topic or f"{args.topic_prefix}.offsets"
    if args.action == "show":
        store = OffsetStore(kafka_config, topic, read_timeout_s=args.timeout)
    else:  # a change acts on the offsets as they stand
        settling = TakeOver(kafka_config, args.topic_prefix, topic)
        store = OffsetStore(kafka_config, topic, read_timeout_s=args.timeout, settling=settling)
    if args.action == "show":
        shown = store.show(args.topic_prefix, args.partition, args.connector)
        shown["topic_prefix"] = args.topic_prefix
        return with_incremental_standing(shown)
    from airflow_provider_mongocdc.core.offsets.lease import (
        OFFSETS,
        OFFSETS_TTL,
        ConnectorLease,
        offsets_owner,
    )

    lease = ConnectorLease(kafka_config, args.topic_prefix, store.topic, read_timeout_s=args.timeout)
    with lease.hold(offsets_owner(args.action), OFFSETS, OFFSETS_TTL):
        return _change(args, store, target)


def _change(args: argparse.Namespace, store, target) -> dict[str, Any]:
    """``reset``, ``set``, ``import-debezium``, ``export-debezium`` or ``adopt`` (under the connector's lease)."""
    from airflow_provider_mongocdc.core.offsets.model import OffsetPartition

    if args.action == "adopt":
        adopted = store.adopt(args.topic_prefix, args.name)
        return {
            "action": "adopt",
            "topic": store.topic,
            "connector_name": args.name,
            "partitions": [{"partition": p.to_dict(), "offset": _state(s)} for p, s in adopted],
            "changed": bool(adopted),
        }
    partition = OffsetPartition(args.topic_prefix, args.partition, args.connector)
    change: dict[str, Any] = {"action": args.action, "topic": store.topic, "partition": partition.to_dict()}
    if args.action == "export-debezium":
        state, key, value = store.export_debezium(
            partition, args.connect_offsets_topic, args.debezium_connector
        )
        change["topic"] = args.connect_offsets_topic  # the topic written to
        change.update(offset=_state(state), key=json.loads(key), value=json.loads(value), changed=True)
    elif args.action == "reset":
        before = store.reset(partition)
        change.update(before=_state(before), after=None, changed=before is not None)
    elif args.action == "import-debezium":
        entry, before, after = store.import_debezium(
            partition, args.connect_offsets_topic, args.debezium_connector
        )
        change["debezium"] = {
            "topic": args.connect_offsets_topic,
            "connector": entry.connector,
            "partition": dict(entry.source_partition),
            "offset": dict(entry.value),
            "resume_token_format": entry.token_format,
        }
        change.update(before=_state(before), after=_state(after), changed=True)
    else:
        before, after = store.set_position(partition, target)
        change.update(before=_state(before), after=_state(after), changed=True)
    return change


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except MongoCdcError as error:
        print(f"mongocdc: {error}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())


def with_incremental_standing(shown: dict) -> dict:
    """``offsets show``'s JSON with each connector's incremental snapshot where it stands: a request
    stays under ``incremental_snapshot_requests`` (with its ``status``, requested or running) until
    a window took it up and finished it; then ``incremental_snapshots`` tells the last one's outcome,
    time and counts."""
    from airflow_provider_mongocdc.core.snapshot.incremental import incremental_standing

    progresses: dict[tuple[str, str], list] = {}
    for entry in shown["partitions"]:
        partition = entry["partition"]
        owner = (partition.get("connector") or partition["server_id"], partition["server_id"])
        progresses.setdefault(owner, []).append(entry["offset"].get("incremental_snapshot"))
    requests, standings = [], []
    owners = {(item["connector"], item["server_id"]): item for item in shown["incremental_snapshot_requests"]}
    for owner in sorted(set(progresses) | set(owners)):
        request = owners.get(owner)
        standing = incremental_standing(request["request"] if request else None, progresses.get(owner, []))
        if standing is None:
            continue
        if request is not None and standing.open and standing.request_id == request["request"].get("id"):
            requests.append({**request, "status": standing.status})
        standings.append({"connector": owner[0], "server_id": owner[1], **standing.to_json()})
    shown["incremental_snapshot_requests"] = requests
    shown["incremental_snapshots"] = standings
    return shown
