"""The connector configuration: Debezium MongoDB connector property names, validated.

Users write the configuration as they would for Debezium (a JSON object or an Airflow Variable of
``property -> value``). :meth:`ConnectorConfig.from_properties` turns it into a typed, immutable
object; :meth:`ConnectorConfig.to_properties` turns it back into plain JSON-friendly properties
so it can travel to Spark applications.

Every property is declared once in :data:`PROPERTIES` (name, type, default, allowed values,
description). That registry drives parsing, validation and the reference table in
``docs/configuration.md`` (:func:`render_property_table`, kept in sync by a unit test; run
``python -m airflow_provider_mongocdc.core.config --write-docs docs/configuration.md`` after
changing a property).

Validation reports every bad value at once in a single :class:`ConfigError` naming each property,
its value and what is allowed. Unknown properties are an error with the closest known name as a
suggestion. Properties that belong to Kafka Connect or Debezium but have no meaning here are
either accepted with an "ignored because ..." warning (when ignoring them cannot change the
events, e.g. ``tasks.max``) or refused (when ignoring them would silently change the output or
leak a secret, e.g. ``transforms`` or ``mongodb.password``). Values of secret-looking properties
are never echoed in messages.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mongocdc.core.errors import ConfigError

log = logging.getLogger(__name__)

# -- allowed values --------------------------------------------------------------------------------
CAPTURE_MODES = (
    "change_streams",
    "change_streams_update_full",
    "change_streams_with_pre_image",
    "change_streams_update_full_with_pre_image",
)
CAPTURE_SCOPES = ("deployment", "database", "collection")
SNAPSHOT_MODES = ("initial", "always", "initial_only", "no_data", "when_needed")
FULL_UPDATE_TYPES = ("lookup", "post_image")
CONNECTION_MODES = ("sharded", "replica_set")
MATCH_MODES = ("regex", "literal")
NAME_ADJUSTMENT_MODES = ("none", "avro", "avro_unicode")
OVERSIZE_MODES = ("fail", "skip", "split")
PIPELINE_ORDERS = ("internal_first", "user_first", "user_only")
EVENT_FORMATS = ("change_streams", "oplog")
JSON_MODES = ("strict", "relaxed", "canonical", "legacy")
KEY_JSON_MODES = ("relaxed", "strict")
# Debezium's json.serialization.mode (MongoDbConnectorConfig.JsonSerializationMode, Debezium 3.7+)
# -> the extended.json.mode writing the same documents (JsonSerialization's document settings).
JSON_SERIALIZATION_MODES = ("legacy", "strict", "extended", "relaxed")
JSON_SERIALIZATION_TO_EXTENDED = {
    "legacy": "strict",
    "strict": "strict",
    "extended": "canonical",
    "relaxed": "relaxed",
}
SKIPPABLE_OPERATIONS = ("c", "u", "d", "t")

JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
MONGODB_CONNECTOR_CLASS = "io.debezium.connector.mongodb.MongoDbConnector"
FILTER_OVERRIDES = "snapshot.collection.filter.overrides"

_TOPIC_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_SECRET_WORDS = (
    "password",
    "secret",
    "connection.string",
    "keystore",
    "truststore",
    "jaas",
    "credential",
    "token",
)


class _Invalid(Exception):
    """A single bad value: ``reason`` says what is wrong, ``allowed`` what would be accepted."""

    def __init__(self, reason: str, allowed: str):
        super().__init__(reason)
        self.reason = reason
        self.allowed = allowed


# -- value parsers ---------------------------------------------------------------------------------
def _parse_str(raw: Any) -> str:
    if isinstance(raw, (bool, int, float)) or not isinstance(raw, str):
        raise _Invalid("is not a string", "a string")
    return raw.strip()


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise _Invalid("is not a boolean", "true or false")


def _int_parser(minimum: int) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, float) and raw.is_integer():
            value = int(raw)
        elif isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw):
            value = int(raw)
        if value is None:
            raise _Invalid("is not a whole number", f"a whole number >= {minimum}")
        if value < minimum:
            raise _Invalid(f"is less than {minimum}", f"a whole number >= {minimum}")
        return value

    return parse


def _enum_parser(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if not isinstance(raw, str) or raw.strip().lower() not in allowed:
            raise _Invalid("is not one of the allowed values", "one of " + ", ".join(allowed))
        return raw.strip().lower()

    return parse


def split_list(raw: str) -> list[str]:
    """Split a comma-separated list as Debezium does for regular expressions: a comma inside
    ``{}``, ``[]`` or ``()`` or escaped as ``\\,`` does not separate items; blanks are dropped."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    i = 0
    while i < len(raw):
        char = raw[i]
        if char == "\\" and i + 1 < len(raw):
            nxt = raw[i + 1]
            current.append("," if nxt == "," else char + nxt)
            i += 2
            continue
        if char in "{[(":
            depth += 1
        elif char in "}])" and depth:
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _parse_list(raw: Any) -> tuple[str, ...] | None:
    if isinstance(raw, (list, tuple)):
        values = [str(item).strip() for item in raw if str(item).strip()]
    elif isinstance(raw, str):
        values = split_list(raw)
    else:
        raise _Invalid("is not a comma-separated list", "a comma-separated list of names")
    return tuple(values) or None


def _parse_regex_list(raw: Any) -> tuple[str, ...] | None:
    values = _parse_list(raw)
    for pattern in values or ():
        try:
            re.compile(pattern)
        except re.error as error:
            raise _Invalid(
                f"contains the invalid regular expression {pattern!r} ({error})",
                "a comma-separated list of valid regular expressions",
            ) from None
    return values


def _parse_skipped_operations(raw: Any) -> frozenset[str]:
    values = _parse_list(raw) or ()
    lowered = [value.lower() for value in values]
    if "none" in lowered:
        if len(lowered) > 1:
            raise _Invalid(
                "combines 'none' with operations", "'none' alone, or a comma-separated list of c, u, d, t"
            )
        return frozenset()
    bad = [value for value in lowered if value not in SKIPPABLE_OPERATIONS]
    if bad:
        raise _Invalid(
            f"names unknown operation(s) {', '.join(bad)}",
            "'none' or a comma-separated list of c (create), u (update), d (delete), t (truncate)",
        )
    return frozenset(lowered)


def _parse_field_paths(raw: Any) -> tuple[str, ...] | None:
    values = _parse_list(raw)
    for value in values or ():
        parts = value.split(".")
        if len(parts) < 3 or any(not part for part in parts):
            raise _Invalid(
                f"contains {value!r}, which is not <database>.<collection>.<field>",
                "a comma-separated list of <database>.<collection>.<field>[.<nested>] "
                "(* allowed in database and collection)",
            )
    return values


def _parse_field_renames(raw: Any) -> tuple[tuple[str, str], ...] | None:
    values = _parse_list(raw)
    renames = []
    for value in values or ():
        separator = ":" if ":" in value else "="
        path, _, new_name = value.rpartition(separator)
        parts = path.split(".")
        if (
            not path
            or len(parts) < 3
            or any(not part for part in parts)
            or not new_name.strip()
            or "." in new_name
        ):
            raise _Invalid(
                f"contains {value!r}, which is not <database>.<collection>.<field>:<new name>",
                "a comma-separated list of <database>.<collection>.<field>[.<nested>]"
                ":<new name> (* allowed in database and collection)",
            )
        renames.append((path, new_name.strip()))
    return tuple(renames) or None


def _parse_topic_prefix(raw: Any) -> str:
    value = _parse_str(raw)
    if not value:
        raise _Invalid("is empty", "a non-empty name of letters, digits, '.', '_' and '-'")
    if not _TOPIC_PREFIX_RE.match(value):
        raise _Invalid(
            "contains characters other than letters, digits, '.', '_' and '-'",
            "a non-empty name of letters, digits, '.', '_' and '-' (Kafka topic characters)",
        )
    if len(value) > 200:
        raise _Invalid(
            "is longer than 200 characters",
            "at most 200 characters, so that topic names stay under Kafka's 249",
        )
    return value


def _parse_topic_name(raw: Any) -> str:
    value = _parse_str(raw)
    if not value or not _TOPIC_PREFIX_RE.match(value) or len(value) > 249:
        raise _Invalid("is not a valid Kafka topic name", "1 to 249 letters, digits, '.', '_' or '-'")
    return value


def _parse_optional_topic_name(raw: Any) -> str | None:
    if isinstance(raw, str) and not raw.strip():
        return None
    return _parse_topic_name(raw)


def _parse_capture_target(raw: Any) -> str | None:
    value = _parse_str(raw)
    return value or None


def _parse_converter(raw: Any) -> str:
    value = _parse_str(raw)
    if value != JSON_CONVERTER:
        raise _Invalid(
            "is not the JSON converter",
            f"{JSON_CONVERTER} (this connector writes Kafka Connect JSON; set "
            "key/value.converter.schemas.enable to choose schema+payload or payload "
            "only)",
        )
    return value


def _parse_connector_class(raw: Any) -> str:
    value = _parse_str(raw)
    if value != MONGODB_CONNECTOR_CLASS:
        raise _Invalid("is not the MongoDB connector class", MONGODB_CONNECTOR_CLASS)
    return value


def _parse_capture_mode(raw: Any) -> str:
    if isinstance(raw, str) and raw.strip().lower() == "oplog":
        raise _Invalid(
            "names the oplog capture mode, removed in Debezium 2.0",
            "one of " + ", ".join(CAPTURE_MODES) + " (for Debezium 1.x event shapes set event.format=oplog)",
        )
    return _enum_parser(CAPTURE_MODES)(raw)


def _parse_snapshot_mode(raw: Any) -> str:
    if isinstance(raw, str) and raw.strip().lower() == "never":
        return "never"  # deprecated spelling of no_data; normalised (with a warning) later
    if isinstance(raw, str) and raw.strip().lower() in ("configuration_based", "custom"):
        raise _Invalid(
            "needs Debezium's Java snapshotter SPI, which does not exist here",
            "one of " + ", ".join(SNAPSHOT_MODES),
        )
    return _enum_parser(SNAPSHOT_MODES)(raw)


# -- the registry ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Property:
    """One connector property. ``origin`` is ``debezium`` (a Debezium MongoDB connector or Kafka
    Connect JsonConverter property, same meaning) or ``product`` (this connector's own)."""

    name: str
    attribute: str
    type: str
    default: Any
    description: str
    parse: Callable[[Any], Any] = field(repr=False, compare=False)
    allowed: tuple[str, ...] = ()
    origin: str = "debezium"  # "debezium", "kafka-connect" or "product"
    required: bool = False
    default_text: str | None = None  # how the default reads in docs, when not the value itself

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


def _p(
    name: str,
    type_: str,
    default: Any,
    description: str,
    parse: Callable[[Any], Any],
    *,
    allowed: tuple[str, ...] = (),
    origin: str = "debezium",
    required: bool = False,
    default_text: str | None = None,
    attribute: str | None = None,
) -> Property:
    return Property(
        name=name,
        attribute=attribute or name.replace(".", "_"),
        type=type_,
        default=default,
        description=description,
        parse=parse,
        allowed=allowed,
        origin=origin,
        required=required,
        default_text=default_text,
    )


_nonneg = _int_parser(0)
_positive = _int_parser(1)

PROPERTIES: tuple[Property, ...] = (
    # naming
    _p(
        "topic.prefix",
        "string",
        None,
        "Logical name of the MongoDB replica set or sharded cluster: prefix of every topic "
        "(`<topic.prefix>.<db>.<collection>`), `source.name` in events, and part of the offsets. "
        "Letters, digits, `.`, `_`, `-`; start with a letter or `_` to keep schema names "
        "Avro-compatible. Do not change it once events were written. Deprecated alias: "
        "`mongodb.name`.",
        _parse_topic_prefix,
        required=True,
    ),
    _p("topic.delimiter", "string", ".", "Delimiter between the parts of topic names.", _parse_str),
    _p(
        "topic.transaction",
        "string",
        "transaction",
        "Suffix of the transaction metadata topic `<topic.prefix><delimiter><topic.transaction>`.",
        _parse_topic_name,
    ),
    _p(
        "topic.heartbeat.prefix",
        "string",
        "__debezium-heartbeat",
        "Prefix of the heartbeat topic `<topic.heartbeat.prefix><delimiter><topic.prefix>`. "
        "Deprecated alias: `heartbeat.topics.prefix`.",
        _parse_topic_name,
    ),
    _p(
        "topic.heartbeat.name",
        "string",
        None,
        "Full name of the heartbeat topic; when set it replaces the prefix-based name.",
        _parse_optional_topic_name,
    ),
    # filters
    _p(
        "filters.match.mode",
        "enum",
        "regex",
        "How the include/exclude lists match names: `regex` (anchored, case-insensitive regular "
        "expressions) or `literal` (exact names).",
        _enum_parser(MATCH_MODES),
        allowed=MATCH_MODES,
    ),
    _p(
        "database.include.list",
        "list",
        None,
        "Comma-separated regular expressions (or literals) matched against whole database "
        "names; only matching databases are captured. Not with `database.exclude.list`.",
        _parse_regex_list,
        default_text="all databases",
    ),
    _p(
        "database.exclude.list",
        "list",
        None,
        "Comma-separated regular expressions (or literals) of databases not to capture. Not with "
        "`database.include.list`.",
        _parse_regex_list,
    ),
    _p(
        "collection.include.list",
        "list",
        None,
        "Comma-separated regular expressions (or literals) matched against whole namespaces "
        "`<db>.<collection>`; only matching collections are captured. Not with "
        "`collection.exclude.list`. `admin`, `config`, `local` and `system.*` collections are "
        "never captured.",
        _parse_regex_list,
        default_text="all collections",
    ),
    _p(
        "collection.exclude.list",
        "list",
        None,
        "Comma-separated regular expressions (or literals) of namespaces `<db>.<collection>` not "
        "to capture. Not with `collection.include.list`.",
        _parse_regex_list,
    ),
    # capture
    _p(
        "capture.mode",
        "enum",
        "change_streams_update_full",
        "What update events carry: `change_streams` (updateDescription only), "
        "`change_streams_update_full` (plus the full document in `after`), "
        "`change_streams_with_pre_image` (plus the pre-image in `before`, MongoDB 6.0+ with "
        "changeStreamPreAndPostImages), `change_streams_update_full_with_pre_image` (both).",
        _parse_capture_mode,
        allowed=CAPTURE_MODES,
    ),
    _p(
        "capture.mode.full.update.type",
        "enum",
        "lookup",
        "How the full document of an update is obtained in the `*_update_full*` modes: `lookup` "
        "(change stream `updateLookup`; `after` is the document as read at lookup time, null if "
        "it was deleted meanwhile) or `post_image` (MongoDB 6.0+ post-images).",
        _enum_parser(FULL_UPDATE_TYPES),
        allowed=FULL_UPDATE_TYPES,
    ),
    _p(
        "capture.scope",
        "enum",
        "deployment",
        "Scope of the change stream: `deployment` (all databases), `database` or `collection` "
        "(named by `capture.target`).",
        _enum_parser(CAPTURE_SCOPES),
        allowed=CAPTURE_SCOPES,
    ),
    _p(
        "capture.target",
        "string",
        None,
        "The database (`capture.scope=database`) or `<db>.<collection>` "
        "(`capture.scope=collection`) to watch.",
        _parse_capture_target,
    ),
    _p(
        "skipped.operations",
        "list",
        frozenset({"t"}),
        "Comma-separated operations not to emit while streaming: `c` (insert), `u` (update and "
        "replace), `d` (delete), `t` (truncate; MongoDB has none), or `none`.",
        _parse_skipped_operations,
        allowed=SKIPPABLE_OPERATIONS + ("none",),
        default_text="t",
    ),
    _p(
        "cursor.max.await.time.ms",
        "int",
        0,
        "Longest time (ms) the change stream cursor waits on the server for new events per "
        "batch; 0 uses the driver default.",
        _nonneg,
    ),
    # snapshot
    _p(
        "snapshot.mode",
        "enum",
        "initial",
        "When a snapshot runs: `initial` (when there is no offset), `always` (every start), "
        "`initial_only` (snapshot, then stop), `no_data` (never copy data; `never` is a "
        "deprecated spelling), `when_needed` (no offset, or the offset is no longer in the "
        "oplog).",
        _parse_snapshot_mode,
        allowed=SNAPSHOT_MODES + ("never",),
    ),
    _p(
        "snapshot.max.threads",
        "int",
        1,
        "Most collections copied in parallel during a snapshot (Spark tasks).",
        _positive,
    ),
    _p(
        "snapshot.fetch.size",
        "int",
        0,
        "Documents per cursor batch while copying; 0 lets the server choose.",
        _nonneg,
    ),
    _p(
        "snapshot.include.collection.list",
        "list",
        None,
        "Comma-separated regular expressions of namespaces `<db>.<collection>` to snapshot; "
        "they must also be captured.",
        _parse_regex_list,
        default_text="all captured collections",
    ),
    _p(
        FILTER_OVERRIDES,
        "list",
        None,
        "Comma-separated namespaces `<db>.<collection>` whose snapshot copies only the "
        "documents matching a filter, given for each in "
        "`snapshot.collection.filter.overrides.<db>.<collection>`.",
        _parse_list,
    ),
    _p(
        FILTER_OVERRIDES + ".<db>.<collection>",
        "json",
        None,
        'MongoDB query filter (extended JSON, e.g. `{"status": "active"}`) applied when '
        "snapshotting that collection. Affects snapshots only.",
        _parse_str,
        attribute="snapshot_collection_filter_overrides_by_namespace",
    ),
    _p(
        "snapshot.chunk.size",
        "int",
        10000,
        "Documents per snapshot chunk. Each chunk is copied by one Spark task and committed with "
        "its events; a restarted snapshot skips committed chunks.",
        _positive,
        origin="product",
    ),
    _p(
        "incremental.snapshot.chunk.size",
        "int",
        1024,
        "Documents per chunk of an incremental snapshot (re-snapshot mode `incremental`): each "
        "chunk is read between two watermarks at the end of a window and committed with its "
        "progress.",
        _positive,
    ),
    _p(
        "incremental.snapshot.window.budget.ms",
        "int",
        300000,
        "Longest time (ms) a window spends on incremental snapshot chunks after streaming to its "
        "end; the next chunk starts only within the budget. 0: no chunk is read.",
        _nonneg,
        origin="product",
    ),
    _p(
        "incremental.snapshot.window.max.documents",
        "int",
        0,
        "Most incremental snapshot documents read per window (whole chunks; the last chunk is "
        "cut to fit); 0: no limit besides the time budget.",
        _nonneg,
        origin="product",
    ),
    # event content
    _p(
        "field.exclude.list",
        "list",
        None,
        "Comma-separated fields `<db>.<collection>.<field>[.<nested>]` removed from event values "
        "(`before`, `after`, `updateDescription`, `patch`); `*` matches any database or "
        "collection name.",
        _parse_field_paths,
    ),
    _p(
        "field.renames",
        "list",
        None,
        "Comma-separated renames `<db>.<collection>.<field>[.<nested>]:<new name>` applied to "
        "event values in order; `*` matches any database or collection name.",
        _parse_field_renames,
    ),
    _p(
        "field.name.adjustment.mode",
        "enum",
        "none",
        "Adjustment of document field names in event values: `none`, `avro` (invalid characters "
        "become `_`) or `avro_unicode` (`_uXXXX`). Deprecated alias: `sanitize.field.names` "
        "(true = avro).",
        _enum_parser(NAME_ADJUSTMENT_MODES),
        allowed=NAME_ADJUSTMENT_MODES,
    ),
    _p(
        "schema.name.adjustment.mode",
        "enum",
        "none",
        "Adjustment of Kafka Connect schema names (`<prefix>.<db>.<coll>.Key`/`.Envelope`): "
        "`none` (Debezium 2.x/3.x default, CommonConnectorConfig), `avro` (invalid characters "
        "become `_`, the Debezium 1.x default) or `avro_unicode`.",
        _enum_parser(NAME_ADJUSTMENT_MODES),
        allowed=NAME_ADJUSTMENT_MODES,
    ),
    _p(
        "tombstones.on.delete",
        "bool",
        True,
        "Whether a delete event is followed by a tombstone (same key, null value) so log "
        "compaction can drop the document's events.",
        _parse_bool,
    ),
    _p(
        "provide.transaction.metadata",
        "bool",
        False,
        "Whether BEGIN/END events go to the transaction topic and data events carry a `transaction` block.",
        _parse_bool,
    ),
    _p(
        "heartbeat.interval.ms",
        "int",
        0,
        "Interval (ms) between heartbeat events on the heartbeat topic; 0 disables them.",
        _nonneg,
    ),
    _p("max.batch.size", "int", 2048, "Most change events read and sent per batch.", _positive),
    _p(
        "event.format",
        "enum",
        "change_streams",
        "Event envelope: `change_streams` (Debezium 2.x: `before`, `after`, `updateDescription`) "
        "or `oplog` (Debezium 1.x oplog shape: `after`, `patch`, `filter`; source with boolean "
        "`snapshot` and `h`).",
        _enum_parser(EVENT_FORMATS),
        allowed=EVENT_FORMATS,
        origin="product",
    ),
    _p(
        "extended.json.mode",
        "enum",
        "strict",
        "MongoDB extended JSON used for `before`, `after`, `updateDescription`, `patch` and "
        "`filter`, written as the MongoDB Java driver writes it for Debezium: `strict` (Debezium "
        "3.x default: documents in JsonMode.STRICT, `$numberLong`, `$date` as epoch ms, "
        "`$binary`+`$type`; `updatedFields` with BsonDocument.toJson(), relaxed), `relaxed` and "
        "`canonical` (Extended JSON v2, Debezium's json.serialization.mode relaxed/extended), "
        "`legacy` (bson.json_util strict without `$numberLong`).",
        _enum_parser(JSON_MODES),
        allowed=JSON_MODES,
        origin="product",
    ),
    _p(
        "json.serialization.mode",
        "enum",
        None,
        "Debezium's name (3.7+) for the same choice, mapped onto `extended.json.mode`: `legacy` "
        "(Debezium's default) is `strict`, `relaxed` is `relaxed`, `extended` is `canonical`, and "
        "`strict` is `strict` with `updatedFields` in compact JsonMode.STRICT as well (Debezium's "
        "COMPACT_JSON_SETTINGS). Set with `extended.json.mode`, the two must agree or the "
        "configuration is refused.",
        _enum_parser(JSON_SERIALIZATION_MODES),
        allowed=JSON_SERIALIZATION_MODES,
        default_text="unset (`extended.json.mode` applies)",
    ),
    _p(
        "key.json.mode",
        "enum",
        None,
        "Extended JSON of the key's `id`: `relaxed` (Debezium 2.x/3.x: `123` for 64-bit "
        'integers, `{"$binary": {"base64": ..., "subType": "04"}}`, ISO `$date`) or `strict` '
        '(Debezium 1.x: `{"$numberLong": "123"}`, `{"$binary": ..., "$type": "04"}`, '
        "`$date` as epoch ms). Default: `strict` with `event.format=oplog`, else `relaxed`.",
        _enum_parser(KEY_JSON_MODES),
        allowed=KEY_JSON_MODES,
        origin="product",
        default_text="relaxed (strict with event.format=oplog)",
    ),
    _p(
        "key.converter.schemas.enable",
        "bool",
        True,
        'Whether keys are written as Kafka Connect JSON `{"schema", "payload"}` (true) or '
        "the payload only (false).",
        _parse_bool,
        origin="kafka-connect",
    ),
    _p(
        "value.converter.schemas.enable",
        "bool",
        True,
        'Whether values are written as Kafka Connect JSON `{"schema", "payload"}` (true) or '
        "the payload only (false).",
        _parse_bool,
        origin="kafka-connect",
    ),
    _p(
        "key.converter",
        "string",
        JSON_CONVERTER,
        "Accepted for compatibility; only the JSON converter is available.",
        _parse_converter,
        origin="kafka-connect",
    ),
    _p(
        "value.converter",
        "string",
        JSON_CONVERTER,
        "Accepted for compatibility; only the JSON converter is available.",
        _parse_converter,
        origin="kafka-connect",
    ),
    _p(
        "event.max.bytes",
        "int",
        1_000_000,
        "Largest event (key + value bytes) sent to Kafka. Keep it within the topic's "
        "`max.message.bytes` and the producer's `message.max.bytes`.",
        _int_parser(1024),
        origin="product",
    ),
    _p(
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
        _enum_parser(OVERSIZE_MODES),
        allowed=OVERSIZE_MODES,
        origin="debezium",
        attribute="event_oversize_handling_mode",
    ),
    _p(
        "cursor.oversize.skip.threshold",
        "int",
        0,
        "With `cursor.oversize.handling.mode=skip`: the largest `fullDocument` and "
        "`fullDocumentBeforeChange` (BSON bytes) whose changes are streamed; larger ones are "
        "dropped by a `$match` on `$bsonSize` ahead of the other stages. `0` adds no such stage "
        "(Debezium refuses `skip` with `0`; here `skip` then only drops events over "
        "`event.max.bytes`).",
        _int_parser(0),
        origin="debezium",
    ),
    _p(
        "cursor.pipeline",
        "string",
        None,
        "Aggregation stages (a JSON array in MongoDB extended JSON) added to the change stream "
        'pipeline, e.g. `[{"$match": {"fullDocument.region": "EU"}}]`; placed per '
        "`cursor.pipeline.order`. Only stages MongoDB allows in a change stream.",
        lambda raw: _parse_pipeline(raw),
        origin="debezium",
    ),
    _p(
        "cursor.pipeline.order",
        "enum",
        "internal_first",
        "Where `cursor.pipeline` goes: `internal_first` (after the connector's filter stage), "
        "`user_first` (before it) or `user_only` (replaces it: the include/exclude lists and "
        "`skipped.operations` no longer filter on the server).",
        _enum_parser(PIPELINE_ORDERS),
        allowed=PIPELINE_ORDERS,
        origin="debezium",
    ),
    _p(
        "capture.start.op.time",
        "int",
        -1,
        "Where streaming starts when no offset is stored and no data is copied "
        "(`snapshot.mode=no_data`): a MongoDB timestamp as one 64-bit number, seconds << 32 | "
        "increment (Debezium's `BsonTimestamp(long)`); `-1` starts at the current position. "
        "Ignored once an offset is stored.",
        _int_parser(-1),
        origin="debezium",
    ),
    # offsets
    _p(
        "offset.storage.topic",
        "string",
        None,
        "Compacted topic holding this connector's offsets, written in the same Kafka transaction "
        "as the events they cover.",
        _parse_topic_name,
        origin="product",
        default_text="`<topic.prefix>.offsets`",
    ),
    # connection behaviour (no addresses or credentials: those come from the Airflow connection)
    _p(
        "mongodb.connection.mode",
        "enum",
        "sharded",
        "`sharded`: one change stream through mongos (or the replica set itself); "
        "`replica_set`: one change stream per shard replica set, each with its own offset. "
        "Debezium 2.5 and earlier had this property; Debezium 2.6+ (3.x included) always streams "
        "as `sharded`, ignores `sharded` and refuses `replica_set` as a removed value.",
        _enum_parser(CONNECTION_MODES),
        allowed=CONNECTION_MODES,
        origin="product",
    ),
    _p(
        "mongodb.members.auto.discover",
        "bool",
        True,
        "Whether the seed addresses are used to discover all members (true), or used as given "
        "(false, e.g. behind a proxy).",
        _parse_bool,
    ),
    _p(
        "connect.backoff.initial.delay.ms",
        "int",
        1000,
        "Delay (ms) before the first reconnection attempt; each next delay doubles.",
        _nonneg,
    ),
    _p(
        "connect.backoff.max.delay.ms",
        "int",
        120000,
        "Longest delay (ms) between reconnection attempts.",
        _nonneg,
    ),
    _p(
        "connect.max.attempts",
        "int",
        16,
        "Reconnection attempts before the run fails with an error.",
        _nonneg,
    ),
    _p("mongodb.connect.timeout.ms", "int", 10000, "Driver connect timeout (ms).", _nonneg),
    _p("mongodb.socket.timeout.ms", "int", 0, "Driver socket timeout (ms); 0 disables it.", _nonneg),
    _p("mongodb.server.selection.timeout.ms", "int", 30000, "Driver server selection timeout (ms).", _nonneg),
    _p(
        "mongodb.heartbeat.frequency.ms",
        "int",
        10000,
        "How often (ms) the driver checks each server.",
        _int_parser(500),
    ),
    _p(
        "mongodb.poll.interval.ms",
        "int",
        30000,
        "How often (ms) the topology (shards, replica set members) is checked for changes.",
        _positive,
    ),
    _p(
        "connector.class",
        "string",
        MONGODB_CONNECTOR_CLASS,
        "Accepted so Debezium configurations can be reused unchanged.",
        _parse_connector_class,
    ),
)

PROPERTIES_BY_NAME: dict[str, Property] = {p.name: p for p in PROPERTIES}
_OVERRIDE_DOC_NAME = FILTER_OVERRIDES + ".<db>.<collection>"

# Older names accepted with a deprecation warning: alias -> (canonical name, value transform).
ALIASES: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "mongodb.name": ("topic.prefix", None),
    "heartbeat.topics.prefix": ("topic.heartbeat.prefix", None),
    "database.whitelist": ("database.include.list", None),
    "database.blacklist": ("database.exclude.list", None),
    "collection.whitelist": ("collection.include.list", None),
    "collection.blacklist": ("collection.exclude.list", None),
    "field.blacklist": ("field.exclude.list", None),
    "event.oversize.handling.mode": ("cursor.oversize.handling.mode", None),
    "sanitize.field.names": (
        "field.name.adjustment.mode",
        lambda raw: "avro" if _parse_bool(raw) else "none",
    ),
}

# Kafka Connect / Debezium properties that cannot change the events here: accepted, ignored.
IGNORED: dict[str, str] = {
    "name": "the connector is named by its Airflow DAG and topic.prefix",
    "tasks.max": "parallelism comes from Spark (snapshot.max.threads) and one stream per replica set",
    "max.queue.size": "events go straight from the change stream to the Kafka transaction; "
    "max.batch.size bounds a batch",
    "max.queue.size.in.bytes": "events go straight from the change stream to the Kafka "
    "transaction; max.batch.size bounds a batch",
    "poll.interval.ms": "windows are scheduled by Airflow",
    "retriable.restart.connector.wait.ms": "retries are Airflow task retries",
    "snapshot.delay.ms": "snapshots are scheduled by Airflow",
    "streaming.delay.ms": "windows are scheduled by Airflow",
    "offset.flush.interval.ms": "offsets are committed with every Kafka transaction",
    "offset.flush.timeout.ms": "offsets are committed with every Kafka transaction",
    "source.struct.version": "the source block is always Debezium's v2 layout",
    "topic.naming.strategy": "topic names follow Debezium's default naming strategy",
    "topic.cache.size": "topic names are cached without a size limit per run",
    "custom.metric.tags": "there are no JMX metrics",
    "notification.enabled.channels": "progress is reported in Airflow task logs",
    "incremental.snapshot.watermarking.strategy": "the watermarks of incremental snapshots are "
    "cluster times read around each chunk: nothing is written to MongoDB",
    "internal.mongodb.allow.offset.invalidation": "offsets are stored by this connector, not "
    "by Kafka Connect",
    "errors.log.enable": "errors are reported in Airflow task logs",
    "errors.log.include.messages": "errors are reported in Airflow task logs",
    "errors.max.retries": "retries are Airflow task retries",
    "errors.retry.delay.max.ms": "retries are Airflow task retries",
    "errors.retry.timeout": "retries are Airflow task retries",
    "errors.tolerance": "failed events always stop the run without moving the offset",
}
IGNORED_PREFIXES: dict[str, str] = {
    "producer.override.": "Kafka producer settings come from the Airflow Kafka connection",
    "consumer.override.": "Kafka consumer settings come from the Airflow Kafka connection",
    "key.converter.": "only key.converter.schemas.enable applies to the JSON output",
    "value.converter.": "only value.converter.schemas.enable applies to the JSON output",
}

_CONNECTION = (
    "set it in the Airflow MongoDB connection (mongo_conn_id) instead, so it never "
    "travels in the connector properties"
)
# Properties whose meaning cannot be honoured: refused, with the reason and what to do.
UNSUPPORTED: dict[str, str] = {
    "mongodb.connection.string": "addresses and credentials are not connector properties; " + _CONNECTION,
    "mongodb.hosts": "addresses are not connector properties; " + _CONNECTION,
    "mongodb.user": "credentials are not connector properties; " + _CONNECTION,
    "mongodb.password": "credentials are not connector properties; " + _CONNECTION,
    "mongodb.authsource": "credentials are not connector properties; " + _CONNECTION,
    "mongodb.authentication.class": "authentication is configured in the Airflow MongoDB connection",
    "transforms": "single message transforms are not available; transform downstream of Kafka",
    "predicates": "single message transforms are not available; transform downstream of Kafka",
    "signal.data.collection": "signals are not available; trigger a re-snapshot (incremental or "
    "blocking) from Airflow",
    "signal.enabled.channels": "signals are not available; trigger a re-snapshot from Airflow",
    "snapshot.mode.custom.name": "custom snapshotters are not available",
    "schema.history.internal": "MongoDB has no schema history",
}
UNSUPPORTED_PREFIXES: dict[str, str] = {
    "mongodb.ssl.": "TLS is configured in the Airflow MongoDB connection",
    "transforms.": "single message transforms are not available; transform downstream of Kafka",
    "predicates.": "single message transforms are not available",
    "signal.": "signals are not available; trigger a re-snapshot from Airflow",
    "snapshot.mode.configuration.based.": "configuration-based snapshots are not available",
    "schema.history.internal.": "MongoDB has no schema history",
}


def is_secret_property(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _shown(name: str, value: Any) -> str:
    """A value as it may appear in messages: secrets are never echoed."""
    if is_secret_property(name):
        return "<hidden>"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text if len(text) <= 200 else text[:200] + "...")


# -- the configuration object ----------------------------------------------------------------------
@dataclass(frozen=True)
class ConnectorConfig:
    """A validated connector configuration. Build it with :meth:`from_properties`."""

    topic_prefix: str
    topic_delimiter: str = "."
    topic_transaction: str = "transaction"
    topic_heartbeat_prefix: str = "__debezium-heartbeat"
    topic_heartbeat_name: str | None = None
    filters_match_mode: str = "regex"
    database_include_list: tuple[str, ...] | None = None
    database_exclude_list: tuple[str, ...] | None = None
    collection_include_list: tuple[str, ...] | None = None
    collection_exclude_list: tuple[str, ...] | None = None
    capture_mode: str = "change_streams_update_full"
    capture_mode_full_update_type: str = "lookup"
    capture_scope: str = "deployment"
    capture_target: str | None = None
    skipped_operations: frozenset[str] = frozenset({"t"})
    cursor_max_await_time_ms: int = 0
    snapshot_mode: str = "initial"
    snapshot_max_threads: int = 1
    snapshot_fetch_size: int = 0
    snapshot_include_collection_list: tuple[str, ...] | None = None
    snapshot_collection_filter_overrides: tuple[str, ...] | None = None
    snapshot_collection_filter_overrides_by_namespace: tuple[tuple[str, str], ...] = ()
    snapshot_chunk_size: int = 10000
    incremental_snapshot_chunk_size: int = 1024
    incremental_snapshot_window_budget_ms: int = 300000
    incremental_snapshot_window_max_documents: int = 0
    field_exclude_list: tuple[str, ...] | None = None
    field_renames: tuple[tuple[str, str], ...] | None = None
    field_name_adjustment_mode: str = "none"
    schema_name_adjustment_mode: str = "none"
    tombstones_on_delete: bool = True
    provide_transaction_metadata: bool = False
    heartbeat_interval_ms: int = 0
    max_batch_size: int = 2048
    event_format: str = "change_streams"
    extended_json_mode: str = "strict"
    json_serialization_mode: str | None = None
    key_json_mode: str | None = None
    key_converter_schemas_enable: bool = True
    value_converter_schemas_enable: bool = True
    key_converter: str = JSON_CONVERTER
    value_converter: str = JSON_CONVERTER
    event_max_bytes: int = 1_000_000
    event_oversize_handling_mode: str = "fail"
    cursor_oversize_skip_threshold: int = 0
    cursor_pipeline: str | None = None
    cursor_pipeline_order: str = "internal_first"
    capture_start_op_time: int = -1
    offset_storage_topic: str | None = None
    mongodb_connection_mode: str = "sharded"
    mongodb_members_auto_discover: bool = True
    connect_backoff_initial_delay_ms: int = 1000
    connect_backoff_max_delay_ms: int = 120000
    connect_max_attempts: int = 16
    mongodb_connect_timeout_ms: int = 10000
    mongodb_socket_timeout_ms: int = 0
    mongodb_server_selection_timeout_ms: int = 30000
    mongodb_heartbeat_frequency_ms: int = 10000
    mongodb_poll_interval_ms: int = 30000
    connector_class: str = MONGODB_CONNECTOR_CLASS
    warnings: tuple[str, ...] = field(default=(), compare=False)

    # -- derived values ----------------------------------------------------------------------------
    @property
    def offsets_topic(self) -> str:
        """The offsets topic: ``offset.storage.topic`` or ``<topic.prefix>.offsets``."""
        return self.offset_storage_topic or f"{self.topic_prefix}.offsets"

    @property
    def filter_overrides(self) -> dict[str, str]:
        """``<db>.<collection>`` -> snapshot filter (extended JSON text)."""
        return dict(self.snapshot_collection_filter_overrides_by_namespace)

    @property
    def resolved_key_json_mode(self) -> str:
        """``key.json.mode``, or its default for the event format."""
        if self.key_json_mode:
            return self.key_json_mode
        return "strict" if self.event_format == "oplog" else "relaxed"

    @property
    def update_full(self) -> bool:
        """Whether update events carry the full document in ``after``."""
        return self.capture_mode in (
            "change_streams_update_full",
            "change_streams_update_full_with_pre_image",
        )

    @property
    def pre_image(self) -> bool:
        """Whether update and delete events carry the pre-image in ``before``."""
        return self.capture_mode.endswith("_with_pre_image")

    @property
    def snapshots_data(self) -> bool:
        """Whether this snapshot mode copies documents at all."""
        return self.snapshot_mode != "no_data"

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> ConnectorConfig:
        """Validate Debezium-style properties. Raises one :class:`ConfigError` listing every
        problem; warnings (deprecated or ignored properties) are logged and kept in
        :attr:`warnings`."""
        if not isinstance(props, Mapping):
            raise ConfigError(
                "The connector configuration is not a mapping of property names to values",
                cause=f"got {type(props).__name__}",
                fix='give a JSON object such as {"topic.prefix": "fulfillment"}',
            )
        problems: list[str] = []
        warnings_: list[str] = []
        raw: dict[str, tuple[str, Any]] = {}  # canonical name -> (name as written, raw value)
        overrides: dict[str, Any] = {}

        for given_name, value in props.items():
            name = str(given_name).strip()
            if name in PROPERTIES_BY_NAME and name != _OVERRIDE_DOC_NAME:
                _assign(raw, name, name, value, problems)
            elif name in ALIASES:
                canonical, transform = ALIASES[name]
                warnings_.append(f"Property '{name}' is deprecated; use '{canonical}' instead")
                if transform is not None:
                    try:
                        value = transform(value)
                    except _Invalid as invalid:
                        problems.append(_problem(name, value, invalid))
                        continue
                _assign(raw, canonical, name, value, problems)
            elif name.startswith(FILTER_OVERRIDES + "."):
                overrides[name[len(FILTER_OVERRIDES) + 1 :]] = value
            elif name in IGNORED or _prefix_match(name, IGNORED_PREFIXES):
                reason = IGNORED.get(name) or _prefix_match(name, IGNORED_PREFIXES)
                warnings_.append(f"Property '{name}' is ignored because {reason}")
            elif name in UNSUPPORTED or _prefix_match(name, UNSUPPORTED_PREFIXES):
                reason = UNSUPPORTED.get(name) or _prefix_match(name, UNSUPPORTED_PREFIXES)
                problems.append(f"property '{name}' is not supported: {reason}")
            else:
                problems.append(_unknown(name))

        values: dict[str, Any] = {}
        for prop in PROPERTIES:
            if prop.name == _OVERRIDE_DOC_NAME:
                continue
            if prop.name not in raw:
                if prop.required:
                    problems.append(
                        f"property '{prop.name}' is required and missing (allowed: {_allowed_text(prop)})"
                    )
                continue
            written, value = raw[prop.name]
            try:
                values[prop.attribute] = prop.parse(value)
            except _Invalid as invalid:
                problems.append(_problem(written, value, invalid))

        _cross_check(values, overrides, problems, warnings_)
        if problems:
            raise _config_error(problems)
        for message in warnings_:
            log.warning("%s", message)
        return cls(**values, warnings=tuple(warnings_))

    def to_properties(self) -> dict[str, Any]:
        """Canonical properties that rebuild an equal configuration (JSON-friendly values).
        Only required properties and values that differ from the defaults are listed."""
        out: dict[str, Any] = {}
        for prop in PROPERTIES:
            if prop.name == _OVERRIDE_DOC_NAME:
                continue
            value = getattr(self, prop.attribute)
            if not prop.required and value == prop.default:
                continue
            out[prop.name] = _to_property_value(prop, value)
        for namespace, filter_json in self.snapshot_collection_filter_overrides_by_namespace:
            out[f"{FILTER_OVERRIDES}.{namespace}"] = filter_json
        return out

    def replace(self, **changes: Any) -> ConnectorConfig:
        """A copy with some properties changed, validated again. Keys are property names."""
        props = self.to_properties()
        props.update(changes)
        return ConnectorConfig.from_properties(props)

    def describe(self) -> str:
        """One line per non-default property, safe to log."""
        return ", ".join(
            f"{name}={_shown(name, value)}" for name, value in sorted(self.to_properties().items())
        )


def _to_property_value(prop: Property, value: Any) -> Any:
    if value is None:
        return ""
    if prop.name == "skipped.operations":
        return ",".join(sorted(value)) or "none"
    if prop.name == "field.renames":
        return ",".join(f"{path}:{new}" for path, new in value)
    if isinstance(value, tuple):
        return ",".join(item.replace(",", "\\,") for item in value)
    return value


def _assign(
    raw: dict[str, tuple[str, Any]], canonical: str, written: str, value: Any, problems: list[str]
) -> None:
    if canonical in raw and raw[canonical][0] != written:
        previous_name, previous = raw[canonical]
        if previous != value:
            problems.append(
                f"properties '{previous_name}' and '{written}' both set "
                f"'{canonical}' to different values ({_shown(canonical, previous)} "
                f"and {_shown(canonical, value)}); keep only '{canonical}'"
            )
        return
    raw[canonical] = (written, value)


def _prefix_match(name: str, prefixes: Mapping[str, str]) -> str | None:
    for prefix, reason in prefixes.items():
        if name.startswith(prefix):
            return reason
    return None


def _known_names() -> list[str]:
    names = [p.name for p in PROPERTIES if p.name != _OVERRIDE_DOC_NAME]
    return names + list(ALIASES) + list(IGNORED) + list(UNSUPPORTED)


def _unknown(name: str) -> str:
    matches = difflib.get_close_matches(name, _known_names(), n=1, cutoff=0.6)
    hint = (
        f"; did you mean '{matches[0]}'?"
        if matches
        else "; see docs/configuration.md for the properties this connector accepts"
    )
    return f"property '{name}' is unknown{hint}"


def _allowed_text(prop: Property) -> str:
    if prop.name == "topic.prefix":
        return "a non-empty name of letters, digits, '.', '_' and '-'"
    return "one of " + ", ".join(prop.allowed) if prop.allowed else prop.type


def _problem(name: str, value: Any, invalid: _Invalid) -> str:
    return f"property '{name}' = {_shown(name, value)} {invalid.reason} (allowed: {invalid.allowed})"


def _config_error(problems: list[str]) -> ConfigError:
    if len(problems) == 1:
        error = ConfigError(
            "Invalid connector configuration: " + problems[0],
            fix="correct the property as described and run again",
        )
    else:
        listed = "; ".join(f"{i}) {problem}" for i, problem in enumerate(problems, 1))
        error = ConfigError(
            f"Invalid connector configuration: {len(problems)} problems: {listed}",
            fix="correct each property listed and run again",
        )
    error.problems = tuple(problems)  # type: ignore[attr-defined]
    return error


def _cross_check(
    values: dict[str, Any], overrides: dict[str, Any], problems: list[str], warnings_: list[str]
) -> None:
    """Rules that involve several properties."""
    for include, exclude in (
        ("database.include.list", "database.exclude.list"),
        ("collection.include.list", "collection.exclude.list"),
    ):
        if values.get(include.replace(".", "_")) and values.get(exclude.replace(".", "_")):
            problems.append(
                f"properties '{include}' and '{exclude}' are both set (allowed: "
                f"only one of them; keep the include list or the exclude list)"
            )

    serialization = values.get("json_serialization_mode")
    if serialization is not None:
        mapped = JSON_SERIALIZATION_TO_EXTENDED[serialization]
        given = values.get("extended_json_mode")
        if given is not None and given != mapped:
            problems.append(
                f"properties 'json.serialization.mode' = '{serialization}' and 'extended.json.mode' = "
                f"'{given}' disagree: Debezium's json.serialization.mode '{serialization}' is "
                f"extended.json.mode '{mapped}' (allowed: set only one of them, or values that agree)"
            )
        else:
            values["extended_json_mode"] = mapped

    if values.get("snapshot_mode") == "never":
        values["snapshot_mode"] = "no_data"
        warnings_.append("snapshot.mode 'never' is deprecated; it behaves as 'no_data'")

    scope = values.get("capture_scope", "deployment")
    target = values.get("capture_target")
    if scope == "database" and (not target or "." in target):
        problems.append(
            f"property 'capture.target' = {_shown('capture.target', target)} must "
            "name one database when capture.scope is 'database' (allowed: a "
            "database name)"
        )
    elif scope == "collection" and (not target or "." not in target.strip(".")):
        problems.append(
            f"property 'capture.target' = {_shown('capture.target', target)} must "
            "name one collection when capture.scope is 'collection' (allowed: "
            "<db>.<collection>)"
        )
    elif scope == "deployment" and target:
        warnings_.append("Property 'capture.target' is ignored because capture.scope is 'deployment'")
        values.pop("capture_target")

    initial = values.get("connect_backoff_initial_delay_ms", 1000)
    maximum = values.get("connect_backoff_max_delay_ms", 120000)
    if maximum < initial:
        problems.append(
            f"property 'connect.backoff.max.delay.ms' = {maximum} is smaller than "
            f"connect.backoff.initial.delay.ms = {initial} (allowed: a value >= "
            "connect.backoff.initial.delay.ms)"
        )

    listed = values.get("snapshot_collection_filter_overrides") or ()
    for namespace in listed:
        if "." not in namespace.strip("."):
            problems.append(
                f"property '{FILTER_OVERRIDES}' lists {namespace!r}, which is not "
                "<db>.<collection> (allowed: comma-separated <db>.<collection>)"
            )
    by_namespace: list[tuple[str, str]] = []
    for namespace, text in overrides.items():
        name = f"{FILTER_OVERRIDES}.{namespace}"
        if namespace not in listed:
            problems.append(
                f"property '{name}' is set but {namespace!r} is not listed in "
                f"'{FILTER_OVERRIDES}' (allowed: add {namespace} to "
                f"{FILTER_OVERRIDES}, or remove {name})"
            )
            continue
        try:
            _parse_filter_json(text)
        except _Invalid as invalid:
            problems.append(_problem(name, text, invalid))
            continue
        by_namespace.append((namespace, text.strip()))
    for namespace in listed:
        if namespace not in overrides:
            problems.append(
                f"property '{FILTER_OVERRIDES}' lists {namespace!r} but "
                f"'{FILTER_OVERRIDES}.{namespace}' is missing (allowed: set it to a "
                "MongoDB query filter in JSON)"
            )
    if by_namespace:
        values["snapshot_collection_filter_overrides_by_namespace"] = tuple(sorted(by_namespace))


def _parse_pipeline(raw: Any) -> str | None:
    """``cursor.pipeline``: the text, checked to be a JSON array of one-key stage documents."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if not isinstance(raw, str):
        raise _Invalid("is not a JSON text", "a JSON array of aggregation stages")
    parse_pipeline(raw)
    return raw.strip()


def parse_pipeline(text: str | None) -> list[dict[str, Any]]:
    """The stages of a ``cursor.pipeline`` text (MongoDB extended JSON), as Debezium's
    ``ChangeStreamPipeline(String)`` reads it: an array of stages, or one stage document."""
    from bson import json_util

    if not text:
        return []
    try:
        parsed = json_util.loads(text)
    except (ValueError, TypeError) as error:
        raise _Invalid(f"is not valid JSON ({error})", "a JSON array of aggregation stages") from None
    stages = [parsed] if isinstance(parsed, dict) else parsed
    if not isinstance(stages, list) or not all(
        isinstance(stage, dict) and len(stage) == 1 and str(next(iter(stage))).startswith("$")
        for stage in stages
    ):
        raise _Invalid(
            "is not an array of aggregation stages",
            'a JSON array of one-key stage documents such as [{"$match": {...}}]',
        )
    return stages


def _parse_filter_json(text: Any) -> dict[str, Any]:
    from bson import json_util  # pymongo's bson; imported lazily to keep config light

    if not isinstance(text, str):
        raise _Invalid("is not a JSON text", "a MongoDB query filter as a JSON object")
    try:
        parsed = json_util.loads(text)
    except (ValueError, TypeError) as error:
        raise _Invalid(f"is not valid JSON ({error})", "a MongoDB query filter as a JSON object") from None
    if not isinstance(parsed, dict):
        raise _Invalid("is not a JSON object", "a MongoDB query filter as a JSON object")
    return parsed


# -- documentation ---------------------------------------------------------------------------------
DOCS_BEGIN = "<!-- BEGIN GENERATED PROPERTY TABLE (python -m airflow_provider_mongocdc.core.config) -->"
DOCS_END = "<!-- END GENERATED PROPERTY TABLE -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_property_table() -> str:
    """The Markdown reference table of every property (the generated part of the docs)."""
    lines = [DOCS_BEGIN, "", "| Property | Default | Origin | Meaning |", "|---|---|---|---|"]
    for prop in PROPERTIES:
        default = prop.default_for_docs()
        if prop.default_text is None and default:
            default = f"`{default}`"
        if prop.required:
            default = "(required)"
        allowed = " Allowed: " + ", ".join(f"`{a}`" for a in prop.allowed) + "." if prop.allowed else ""
        origin = {"debezium": "Debezium", "kafka-connect": "Kafka Connect"}.get(prop.origin, "this connector")
        lines.append(f"| `{prop.name}` | {_cell(default)} | {origin} | {_cell(prop.description + allowed)} |")
    lines += ["", "Deprecated names accepted with a warning:", ""]
    for alias, (canonical, _) in ALIASES.items():
        lines.append(f"- `{alias}` → `{canonical}`")
    lines += ["", "Accepted and ignored, with a warning saying why:", ""]
    for name, reason in IGNORED.items():
        lines.append(f"- `{name}`: {reason}")
    for prefix, reason in IGNORED_PREFIXES.items():
        lines.append(f"- `{prefix}*`: {reason}")
    lines += ["", "Refused with an error (they would change the output or carry secrets):", ""]
    for name, reason in UNSUPPORTED.items():
        lines.append(f"- `{name}`: {reason}")
    for prefix, reason in UNSUPPORTED_PREFIXES.items():
        lines.append(f"- `{prefix}*`: {reason}")
    lines += ["", DOCS_END]
    return "\n".join(lines)


def sync_docs(path: str) -> bool:
    """Rewrite the generated table in ``path``; returns whether the file changed."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    start, end = text.index(DOCS_BEGIN), text.index(DOCS_END) + len(DOCS_END)
    updated = text[:start] + render_property_table() + text[end:]
    if updated != text:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(updated)
    return updated != text


def _main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write-docs":
        changed = sync_docs(argv[1])
        print(f"{argv[1]}: {'updated' if changed else 'already in sync'}")
        return 0
    print(render_property_table())
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

__all__ = [
    "ConnectorConfig",
    "Property",
    "PROPERTIES",
    "ALIASES",
    "IGNORED",
    "UNSUPPORTED",
    "render_property_table",
    "sync_docs",
    "split_list",
    "is_secret_property",
]
