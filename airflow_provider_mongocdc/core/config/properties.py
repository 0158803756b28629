"""The property registry: every connector property declared once (name, type, default, allowed
values, description, parser). It drives parsing, validation and the reference table in the docs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mongocdc.core.config.enums import (
    CAPTURE_MODES,
    CAPTURE_SCOPES,
    CONNECTION_MODES,
    EVENT_FORMATS,
    FULL_UPDATE_TYPES,
    JSON_MODES,
    JSON_SERIALIZATION_MODES,
    KEY_JSON_MODES,
    MATCH_MODES,
    NAME_ADJUSTMENT_MODES,
    OVERSIZE_MODES,
    PIPELINE_ORDERS,
    SNAPSHOT_MODES,
)
from airflow_provider_mongocdc.core.config.parsing import (
    JSON_CONVERTER,
    MONGODB_CONNECTOR_CLASS,
    SKIPPABLE_OPERATIONS,
    enum_parser,
    int_parser,
    parse_boolean,
    parse_capture_mode,
    parse_capture_target,
    parse_connector_class,
    parse_converter,
    parse_field_paths,
    parse_field_renames,
    parse_list,
    parse_optional_topic_name,
    parse_pipeline_property,
    parse_regex_list,
    parse_skipped_operations,
    parse_snapshot_mode,
    parse_str,
    parse_topic_name,
    parse_topic_prefix,
)

FILTER_OVERRIDES = "snapshot.collection.filter.overrides"


@dataclass(frozen=True)
class Property:
    """One connector property. ``origin`` is ``debezium`` (a Debezium MongoDB connector or Kafka
    Connect JsonConverter property, same meaning) or ``product`` (this connector's own).
    ``attribute`` is the :class:`ConnectorConfig` field holding its value: by default the name with
    ``_`` for ``.``."""

    name: str
    type: str
    default: Any
    description: str
    parse: Callable[[Any], Any] = field(repr=False, compare=False)
    allowed: tuple[str, ...] = ()
    origin: str = "debezium"  # "debezium", "kafka-connect" or "product"
    required: bool = False
    default_text: str | None = None  # how the default reads in docs, when not the value itself
    attribute: str = ""

    def __post_init__(self) -> None:
        if not self.attribute:
            object.__setattr__(self, "attribute", self.name.replace(".", "_"))

    def default_for_docs(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.default is None:
            return ""
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        if isinstance(self.default, frozenset):
            return ",".join(sorted(self.default)) or "none"
        return str(self.default)


_nonneg = int_parser(0)
_positive = int_parser(1)

PROPERTIES: tuple[Property, ...] = (
    # naming
    Property(
        "topic.prefix",
        "string",
        None,
        "Logical name of the MongoDB replica set or sharded cluster: prefix of every topic "
        "(`<topic.prefix>.<db>.<collection>`), `source.name` in events, and part of the offsets. "
        "Letters, digits, `.`, `_`, `-`; start with a letter or `_` to keep schema names "
        "Avro-compatible. Do not change it once events were written. Deprecated alias: "
        "`mongodb.name`.",
        parse_topic_prefix,
        required=True,
    ),
    Property(
        "name",
        "string",
        None,
        "The connector's name (Kafka Connect's `name`); the connector list sets it to the entry's "
        "name. A topic prefix and its offsets belong to one connector: a run refuses to commit over "
        "offsets, or to take a lease, last written under another name (`mongocdc offsets adopt` "
        "hands them to a renamed connector).",
        parse_str,
    ),
    Property("topic.delimiter", "string", ".", "Delimiter between the parts of topic names.", parse_str),
    Property(
        "topic.transaction",
        "string",
        "transaction",
        "Suffix of the transaction metadata topic `<topic.prefix><delimiter><topic.transaction>`.",
        parse_topic_name,
    ),
    Property(
        "topic.heartbeat.prefix",
        "string",
        "__debezium-heartbeat",
        "Prefix of the heartbeat topic `<topic.heartbeat.prefix><delimiter><topic.prefix>`. "
        "Deprecated alias: `heartbeat.topics.prefix`.",
        parse_topic_name,
    ),
    Property(
        "topic.heartbeat.name",
        "string",
        None,
        "Full name of the heartbeat topic; when set it replaces the prefix-based name.",
        parse_optional_topic_name,
    ),
    # filters
    Property(
        "filters.match.mode",
        "enum",
        "regex",
        "How the include/exclude lists match names: `regex` (anchored, case-insensitive regular "
        "expressions) or `literal` (exact names).",
        enum_parser(MATCH_MODES),
        allowed=MATCH_MODES,
    ),
    Property(
        "database.include.list",
        "list",
        None,
        "Comma-separated regular expressions (or literals) matched against whole database "
        "names; only matching databases are captured. Not with `database.exclude.list`.",
        parse_regex_list,
        default_text="all databases",
    ),
    Property(
        "database.exclude.list",
        "list",
        None,
        "Comma-separated regular expressions (or literals) of databases not to capture. Not with "
        "`database.include.list`.",
        parse_regex_list,
    ),
    Property(
        "collection.include.list",
        "list",
        None,
        "Comma-separated regular expressions (or literals) matched against whole namespaces "
        "`<db>.<collection>`; only matching collections are captured. Not with "
        "`collection.exclude.list`. `admin`, `config`, `local` and `system.*` collections are "
        "never captured.",
        parse_regex_list,
        default_text="all collections",
    ),
    Property(
        "collection.exclude.list",
        "list",
        None,
        "Comma-separated regular expressions (or literals) of namespaces `<db>.<collection>` not "
        "to capture. Not with `collection.include.list`.",
        parse_regex_list,
    ),
    # capture
    Property(
        "capture.mode",
        "enum",
        "change_streams_update_full",
        "What update events carry: `change_streams` (updateDescription only), "
        "`change_streams_update_full` (plus the full document in `after`), "
        "`change_streams_with_pre_image` (plus the pre-image in `before`, MongoDB 6.0+ with "
        "changeStreamPreAndPostImages), `change_streams_update_full_with_pre_image` (both).",
        parse_capture_mode,
        allowed=CAPTURE_MODES,
    ),
    Property(
        "capture.mode.full.update.type",
        "enum",
        "lookup",
        "How the full document of an update is obtained in the `*_update_full*` modes: `lookup` "
        "(change stream `updateLookup`; `after` is the document as read at lookup time, null if "
        "it was deleted meanwhile) or `post_image` (MongoDB 6.0+ post-images).",
        enum_parser(FULL_UPDATE_TYPES),
        allowed=FULL_UPDATE_TYPES,
    ),
    Property(
        "capture.scope",
        "enum",
        "deployment",
        "Scope of the change stream: `deployment` (all databases), `database` or `collection` "
        "(named by `capture.target`).",
        enum_parser(CAPTURE_SCOPES),
        allowed=CAPTURE_SCOPES,
    ),
    Property(
        "capture.target",
        "string",
        None,
        "The database (`capture.scope=database`) or `<db>.<collection>` "
        "(`capture.scope=collection`) to watch.",
        parse_capture_target,
    ),
    Property(
        "skipped.operations",
        "list",
        frozenset({"t"}),
        "Comma-separated operations not to emit while streaming: `c` (insert), `u` (update and "
        "replace), `d` (delete), `t` (truncate; MongoDB has none), or `none`.",
        parse_skipped_operations,
        allowed=SKIPPABLE_OPERATIONS + ("none",),
        default_text="t",
    ),
    Property(
        "cursor.max.await.time.ms",
        "int",
        0,
        "Longest time (ms) the change stream cursor waits on the server for new events per "
        "batch; 0 uses the driver default.",
        _nonneg,
    ),
    # snapshot
    Property(
        "snapshot.mode",
        "enum",
        "initial",
        "When a snapshot runs: `initial` (when there is no offset), `always` (every start), "
        "`initial_only` (snapshot, then stop), `no_data` (never copy data; `never` is a "
        "deprecated spelling), `when_needed` (no offset, or the offset is no longer in the "
        "oplog).",
        parse_snapshot_mode,
        allowed=SNAPSHOT_MODES + ("never",),
    ),
    Property(
        "snapshot.max.threads",
        "int",
        1,
        "Most collections copied in parallel during a snapshot (Spark tasks).",
        _positive,
    ),
    Property(
        "snapshot.fetch.size",
        "int",
        0,
        "Documents per cursor batch while copying; 0 lets the server choose.",
        _nonneg,
    ),
    Property(
        "snapshot.include.collection.list",
        "list",
        None,
        "Comma-separated regular expressions of namespaces `<db>.<collection>` to snapshot; "
        "they must also be captured.",
        parse_regex_list,
        default_text="all captured collections",
    ),
    Property(
        FILTER_OVERRIDES,
        "list",
        None,
        "Comma-separated namespaces `<db>.<collection>` whose snapshot copies only the "
        "documents matching a filter, given for each in "
        "`snapshot.collection.filter.overrides.<db>.<collection>`.",
        parse_list,
    ),
    Property(
        FILTER_OVERRIDES + ".<db>.<collection>",
        "json",
        None,
        'MongoDB query filter (extended JSON, e.g. `{"status": "active"}`) applied when '
        "snapshotting that collection. Affects snapshots only.",
        parse_str,
        attribute="snapshot_collection_filter_overrides_by_namespace",
    ),
    Property(
        "snapshot.chunk.size",
        "int",
        10000,
        "Documents per snapshot chunk. Each chunk is copied by one Spark task and committed with "
        "its events; a restarted snapshot skips committed chunks.",
        _positive,
        origin="product",
    ),
    Property(
        "incremental.snapshot.chunk.size",
        "int",
        1024,
        "Documents per chunk of an incremental snapshot (re-snapshot mode `incremental`): each "
        "chunk is read between two watermarks at the end of a window and committed with its "
        "progress.",
        _positive,
    ),
    Property(
        "incremental.snapshot.window.budget.ms",
        "int",
        300000,
        "Longest time (ms) a window spends on incremental snapshot chunks after streaming to its "
        "end; the next chunk starts only within the budget. 0: no chunk is read.",
        _nonneg,
        origin="product",
    ),
    Property(
        "incremental.snapshot.window.max.documents",
        "int",
        0,
        "Most incremental snapshot documents read per window (whole chunks; the last chunk is "
        "cut to fit); 0: no limit besides the time budget.",
        _nonneg,
        origin="product",
    ),
    # event content
    Property(
        "field.exclude.list",
        "list",
        None,
        "Comma-separated fields `<db>.<collection>.<field>[.<nested>]` removed from event values "
        "(`before`, `after`, `updateDescription`, `patch`); `*` matches any database or "
        "collection name.",
        parse_field_paths,
    ),
    Property(
        "field.renames",
        "list",
        None,
        "Comma-separated renames `<db>.<collection>.<field>[.<nested>]:<new name>` applied to "
        "event values in order; `*` matches any database or collection name.",
        parse_field_renames,
    ),
    Property(
        "field.name.adjustment.mode",
        "enum",
        "none",
        "Adjustment of document field names in event values: `none`, `avro` (invalid characters "
        "become `_`) or `avro_unicode` (`_uXXXX`). Deprecated alias: `sanitize.field.names` "
        "(true = avro).",
        enum_parser(NAME_ADJUSTMENT_MODES),
        allowed=NAME_ADJUSTMENT_MODES,
    ),
    Property(
        "schema.name.adjustment.mode",
        "enum",
        "none",
        "Adjustment of Kafka Connect schema names (`<prefix>.<db>.<coll>.Key`/`.Envelope`): "
        "`none` (Debezium 2.x/3.x default, CommonConnectorConfig), `avro` (invalid characters "
        "become `_`, the Debezium 1.x default) or `avro_unicode`.",
        enum_parser(NAME_ADJUSTMENT_MODES),
        allowed=NAME_ADJUSTMENT_MODES,
    ),
    Property(
        "tombstones.on.delete",
        "bool",
        True,
        "Whether a delete event is followed by a tombstone (same key, null value) so log "
        "compaction can drop the document's events.",
        parse_boolean,
    ),
    Property(
        "extended.headers.enabled",
        "bool",
        True,
        "Whether every data record and tombstone carries Debezium's four context headers "
        "(`__debezium.context.connectorLogicalName`, `taskId`, `connectorName`, `runId`; see "
        "[Headers](#headers)).",
        parse_boolean,
    ),
    Property(
        "provide.transaction.metadata",
        "bool",
        False,
        "Whether BEGIN/END events go to the transaction topic and data events carry a `transaction` block.",
        parse_boolean,
    ),
    Property(
        "heartbeat.interval.ms",
        "int",
        0,
        "Interval (ms) between heartbeat events on the heartbeat topic; 0 disables them.",
        _nonneg,
    ),
    Property("max.batch.size", "int", 2048, "Most change events read and sent per batch.", _positive),
    Property(
        "event.format",
        "enum",
        "change_streams",
        "Event envelope: `change_streams` (Debezium 2.x: `before`, `after`, `updateDescription`) "
        "or `oplog` (Debezium 1.x oplog shape: `after`, `patch`, `filter`; source with boolean "
        "`snapshot` and `h`).",
        enum_parser(EVENT_FORMATS),
        allowed=EVENT_FORMATS,
        origin="product",
    ),
    Property(
        "extended.json.mode",
        "enum",
        "strict",
        "MongoDB extended JSON used for `before`, `after`, `updateDescription`, `patch` and "
        "`filter`, written as the MongoDB Java driver writes it for Debezium: `strict` (Debezium "
        "3.x default: documents in JsonMode.STRICT, `$numberLong`, `$date` as epoch ms, "
        "`$binary`+`$type`; `updatedFields` with BsonDocument.toJson(), relaxed), `relaxed` and "
        "`canonical` (Extended JSON v2, Debezium's json.serialization.mode relaxed/extended), "
        "`legacy` (bson.json_util strict without `$numberLong`).",
        enum_parser(JSON_MODES),
        allowed=JSON_MODES,
        origin="product",
    ),
    Property(
        "json.serialization.mode",
        "enum",
        None,
        "Debezium's name (3.7+) for the same choice, mapped onto `extended.json.mode`: `legacy` "
        "(Debezium's default) is `strict`, `relaxed` is `relaxed`, `extended` is `canonical`, and "
        "`strict` is `strict` with `updatedFields` in compact JsonMode.STRICT as well (Debezium's "
        "COMPACT_JSON_SETTINGS). Set with `extended.json.mode`, the two must agree or the "
        "configuration is refused.",
        enum_parser(JSON_SERIALIZATION_MODES),
        allowed=JSON_SERIALIZATION_MODES,
        default_text="unset (`extended.json.mode` applies)",
    ),
    Property(
        "key.json.mode",
        "enum",
        None,
        "Extended JSON of the key's `id`: `relaxed` (Debezium 2.x/3.x: `123` for 64-bit "
        'integers, `{"$binary": {"base64": ..., "subType": "04"}}`, ISO `$date`) or `strict` '
        '(Debezium 1.x: `{"$numberLong": "123"}`, `{"$binary": ..., "$type": "04"}`, '
        "`$date` as epoch ms). Default: `strict` with `event.format=oplog`, else `relaxed`.",
        enum_parser(KEY_JSON_MODES),
        allowed=KEY_JSON_MODES,
        origin="product",
        default_text="relaxed (strict with event.format=oplog)",
    ),
    Property(
        "key.converter.schemas.enable",
        "bool",
        True,
        'Whether keys are written as Kafka Connect JSON `{"schema", "payload"}` (true) or '
        "the payload only (false).",
        parse_boolean,
        origin="kafka-connect",
    ),
    Property(
        "value.converter.schemas.enable",
        "bool",
        True,
        'Whether values are written as Kafka Connect JSON `{"schema", "payload"}` (true) or '
        "the payload only (false).",
        parse_boolean,
        origin="kafka-connect",
    ),
    *(
        Property(
            name,
            "string",
            JSON_CONVERTER,
            "Accepted for compatibility; only the JSON converter is available.",
            parse_converter,
            origin="kafka-connect",
        )
        for name in ("key.converter", "value.converter")
    ),
    Property(
        "event.max.bytes",
        "int",
        1_000_000,
        "Largest event (key + value bytes) sent to Kafka. Keep it within the topic's "
        "`max.message.bytes` and the producer's `message.max.bytes`.",
        int_parser(1024),
        origin="product",
    ),
    Property(
        "cursor.oversize.handling.mode",
        "enum",
        "fail",
        "What happens to an oversize change: `fail` (the run stops with an error; no offset moves "
        "past it), `skip` (changes whose `fullDocument` or `fullDocumentBeforeChange` is larger "
        "than `cursor.oversize.skip.threshold` bytes are dropped by the server, and events larger "
        "than `event.max.bytes` are dropped and logged with their key) or `split` (a change "
        "larger than MongoDB's 16 MB limit is read as `$changeStreamSplitLargeEvent` fragments, "
        "MongoDB 6.0.9+/7.0, and reassembled into one event; an event larger than "
        "`event.max.bytes` still fails). Alias: `event.oversize.handling.mode`.",
        enum_parser(OVERSIZE_MODES),
        allowed=OVERSIZE_MODES,
        origin="debezium",
        attribute="event_oversize_handling_mode",
    ),
    Property(
        "cursor.oversize.skip.threshold",
        "int",
        0,
        "With `cursor.oversize.handling.mode=skip`: the largest `fullDocument` and "
        "`fullDocumentBeforeChange` (BSON bytes) whose changes are streamed; larger ones are "
        "dropped by a `$match` on `$bsonSize` ahead of the other stages. `0` adds no such stage "
        "(Debezium refuses `skip` with `0`; here `skip` then only drops events over "
        "`event.max.bytes`).",
        int_parser(0),
        origin="debezium",
    ),
    Property(
        "cursor.pipeline",
        "string",
        None,
        "Aggregation stages (a JSON array in MongoDB extended JSON) added to the change stream "
        'pipeline, e.g. `[{"$match": {"fullDocument.region": "EU"}}]`; placed per '
        "`cursor.pipeline.order`. Only stages MongoDB allows in a change stream.",
        lambda raw: parse_pipeline_property(raw),
        origin="debezium",
    ),
    Property(
        "cursor.pipeline.order",
        "enum",
        "internal_first",
        "Where `cursor.pipeline` goes: `internal_first` (after the connector's filter stage), "
        "`user_first` (before it) or `user_only` (replaces it: the include/exclude lists and "
        "`skipped.operations` no longer filter on the server).",
        enum_parser(PIPELINE_ORDERS),
        allowed=PIPELINE_ORDERS,
        origin="debezium",
    ),
    Property(
        "capture.start.op.time",
        "int",
        -1,
        "Where streaming starts when no offset is stored and no data is copied "
        "(`snapshot.mode=no_data`): a MongoDB timestamp as one 64-bit number, seconds << 32 | "
        "increment (Debezium's `BsonTimestamp(long)`); `-1` starts at the current position. "
        "Ignored once an offset is stored.",
        int_parser(-1),
        origin="debezium",
    ),
    # offsets
    Property(
        "offset.storage.topic",
        "string",
        None,
        "Compacted topic holding this connector's offsets, written in the same Kafka transaction "
        "as the events they cover.",
        parse_topic_name,
        origin="product",
        default_text="`<topic.prefix>.offsets`",
    ),
    # connection behaviour (no addresses or credentials: those come from the Airflow connection)
    Property(
        "mongodb.connection.mode",
        "enum",
        "sharded",
        "`sharded`: one change stream through mongos (or the replica set itself); "
        "`replica_set`: one change stream per shard replica set, each with its own offset. "
        "Debezium 2.5 and earlier had this property; Debezium 2.6+ (3.x included) always streams "
        "as `sharded`, ignores `sharded` and refuses `replica_set` as a removed value.",
        enum_parser(CONNECTION_MODES),
        allowed=CONNECTION_MODES,
        origin="product",
    ),
    Property(
        "mongodb.members.auto.discover",
        "bool",
        True,
        "Whether the seed addresses are used to discover all members (true), or used as given "
        "(false, e.g. behind a proxy).",
        parse_boolean,
    ),
    Property(
        "connect.backoff.initial.delay.ms",
        "int",
        1000,
        "Delay (ms) before the first reconnection attempt; each next delay doubles.",
        _nonneg,
    ),
    Property(
        "connect.backoff.max.delay.ms",
        "int",
        120000,
        "Longest delay (ms) between reconnection attempts.",
        _nonneg,
    ),
    Property(
        "connect.max.attempts",
        "int",
        16,
        "Reconnection attempts before the run fails with an error.",
        _nonneg,
    ),
    Property("mongodb.connect.timeout.ms", "int", 10000, "Driver connect timeout (ms).", _nonneg),
    Property("mongodb.socket.timeout.ms", "int", 0, "Driver socket timeout (ms); 0 disables it.", _nonneg),
    Property(
        "mongodb.server.selection.timeout.ms", "int", 30000, "Driver server selection timeout (ms).", _nonneg
    ),
    Property(
        "mongodb.heartbeat.frequency.ms",
        "int",
        10000,
        "How often (ms) the driver checks each server.",
        int_parser(500),
    ),
    Property(
        "mongodb.poll.interval.ms",
        "int",
        30000,
        "How often (ms) the topology (shards, replica set members) is checked for changes.",
        _positive,
    ),
    Property(
        "connector.class",
        "string",
        MONGODB_CONNECTOR_CLASS,
        "Accepted so Debezium configurations can be reused unchanged.",
        parse_connector_class,
    ),
)

PROPERTIES_BY_NAME: dict[str, Property] = {p.name: p for p in PROPERTIES}
OVERRIDE_DOC_NAME = FILTER_OVERRIDES + ".<db>.<collection>"
