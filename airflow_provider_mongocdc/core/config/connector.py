"""The connector configuration: Debezium MongoDB connector property names, validated.

:meth:`ConnectorConfig.from_properties` turns ``property -> value`` (as written for Debezium)
into a typed, immutable object; :meth:`ConnectorConfig.to_properties` turns it back into plain
JSON-friendly properties so it can travel to Spark applications. Validation reports every bad
value at once in one :class:`ConfigError`; unknown properties get the closest known name as a
suggestion; values of secret-looking properties are never echoed.

The properties are declared in :mod:`airflow_provider_mongocdc.core.config.properties`, their values read by
:mod:`airflow_provider_mongocdc.core.config.parsing`, the foreign ones listed in :mod:`airflow_provider_mongocdc.core.config.compat`. After changing a
property run ``python -m airflow_provider_mongocdc.core.config.connector --write-docs docs/configuration.md``
(and README.md).
"""

from __future__ import annotations

import difflib
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.compat import (
    ALIASES,
    IGNORED,
    IGNORED_PREFIXES,
    UNSUPPORTED,
    UNSUPPORTED_PREFIXES,
)
from airflow_provider_mongocdc.core.config.docs import main
from airflow_provider_mongocdc.core.config.enums import (
    JSON_SERIALIZATION_TO_EXTENDED,
    CaptureMode,
    CaptureScope,
    EventFormat,
    SnapshotMode,
)
from airflow_provider_mongocdc.core.config.parsing import (
    JSON_CONVERTER,
    MONGODB_CONNECTOR_CLASS,
    InvalidValue,
    parse_filter_json,
    shown,
)
from airflow_provider_mongocdc.core.config.properties import (
    FILTER_OVERRIDES,
    OVERRIDE_DOC_NAME,
    PROPERTIES,
    PROPERTIES_BY_NAME,
    Property,
)

log = logging.getLogger(__name__)


def describe_connector(name: str | None, topic_prefix: str) -> str:
    """A connector as log lines name it: ``connector default (topic prefix shop)``, or
    ``connector of topic prefix shop`` when it has no name (its ``name`` property)."""
    if name and name != topic_prefix:
        return f"connector {name} (topic prefix {topic_prefix})"
    return f"connector of topic prefix {topic_prefix}"


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
    extended_headers_enabled: bool = True
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
    name: str | None = None
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
    def in_words(self) -> str:
        """The connector in words, as log lines name it (:func:`describe_connector`)."""
        return describe_connector(self.name, self.topic_prefix)

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
        return "strict" if self.event_format == EventFormat.OPLOG else "relaxed"

    @property
    def update_full(self) -> bool:
        """Whether update events carry the full document in ``after``."""
        return self.capture_mode in (CaptureMode.UPDATE_FULL, CaptureMode.UPDATE_FULL_WITH_PRE_IMAGE)

    @property
    def pre_image(self) -> bool:
        """Whether update and delete events carry the pre-image in ``before``."""
        return self.capture_mode in (CaptureMode.WITH_PRE_IMAGE, CaptureMode.UPDATE_FULL_WITH_PRE_IMAGE)

    @property
    def snapshots_data(self) -> bool:
        """Whether this snapshot mode copies documents at all."""
        return self.snapshot_mode != SnapshotMode.NO_DATA

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
        raw, overrides = _sort_properties(props, problems, warnings_)
        values = _parse_values(raw, problems)
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
            if prop.name == OVERRIDE_DOC_NAME:
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
            f"{name}={shown(name, value)}" for name, value in sorted(self.to_properties().items())
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
                f"'{canonical}' to different values ({shown(canonical, previous)} "
                f"and {shown(canonical, value)}); keep only '{canonical}'"
            )
        return
    raw[canonical] = (written, value)


def _prefix_match(name: str, prefixes: Mapping[str, str]) -> str | None:
    for prefix, reason in prefixes.items():
        if name.startswith(prefix):
            return reason
    return None


def _known_names() -> list[str]:
    names = [p.name for p in PROPERTIES if p.name != OVERRIDE_DOC_NAME]
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


def _problem(name: str, value: Any, invalid: InvalidValue) -> str:
    return f"property '{name}' = {shown(name, value)} {invalid.reason} (allowed: {invalid.allowed})"


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


def _sort_properties(
    props: Mapping[str, Any], problems: list[str], warnings_: list[str]
) -> tuple[dict[str, tuple[str, Any]], dict[str, Any]]:
    """The known properties by canonical name (``name -> (name as written, raw value)``; aliases
    renamed) and the snapshot filter overrides by namespace; ignored, unsupported and unknown
    properties noted in ``warnings_`` and ``problems``."""
    raw: dict[str, tuple[str, Any]] = {}
    overrides: dict[str, Any] = {}
    for given_name, value in props.items():
        name = str(given_name).strip()
        if name in PROPERTIES_BY_NAME and name != OVERRIDE_DOC_NAME:
            _assign(raw, name, name, value, problems)
        elif name in ALIASES:
            _assign_alias(raw, name, value, problems, warnings_)
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
    return raw, overrides


def _assign_alias(
    raw: dict[str, tuple[str, Any]], name: str, value: Any, problems: list[str], warnings_: list[str]
) -> None:
    """A deprecated name: its value (converted when the new property reads it otherwise) under
    the new name."""
    canonical, transform = ALIASES[name]
    warnings_.append(f"Property '{name}' is deprecated; use '{canonical}' instead")
    if transform is not None:
        try:
            value = transform(value)
        except InvalidValue as invalid:
            problems.append(_problem(name, value, invalid))
            return
    _assign(raw, canonical, name, value, problems)


def _parse_values(raw: dict[str, tuple[str, Any]], problems: list[str]) -> dict[str, Any]:
    """Each property's value read (``attribute -> value``); missing required ones noted."""
    values: dict[str, Any] = {}
    for prop in PROPERTIES:
        if prop.name == OVERRIDE_DOC_NAME:
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
        except InvalidValue as invalid:
            problems.append(_problem(written, value, invalid))
    return values


def _cross_check(
    values: dict[str, Any], overrides: dict[str, Any], problems: list[str], warnings_: list[str]
) -> None:
    """Rules that involve several properties. ``values`` is completed in place: the extended JSON
    mode that json.serialization.mode names, snapshot.mode never read as no_data, the snapshot
    filter overrides by namespace."""
    _check_include_exclude(values, problems)
    _check_json_serialization(values, problems)
    if values.get("snapshot_mode") == "never":
        values["snapshot_mode"] = SnapshotMode.NO_DATA.value
        warnings_.append("snapshot.mode 'never' is deprecated; it behaves as 'no_data'")
    _check_capture_target(values, problems, warnings_)
    _check_backoff(values, problems)
    _check_filter_overrides(values, overrides, problems)


def _check_include_exclude(values: dict[str, Any], problems: list[str]) -> None:
    for include, exclude in (
        ("database.include.list", "database.exclude.list"),
        ("collection.include.list", "collection.exclude.list"),
    ):
        if values.get(include.replace(".", "_")) and values.get(exclude.replace(".", "_")):
            problems.append(
                f"properties '{include}' and '{exclude}' are both set (allowed: "
                f"only one of them; keep the include list or the exclude list)"
            )


def _check_json_serialization(values: dict[str, Any], problems: list[str]) -> None:
    """Debezium's json.serialization.mode sets extended.json.mode; both must agree."""
    serialization = values.get("json_serialization_mode")
    if serialization is None:
        return
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


def _check_capture_target(values: dict[str, Any], problems: list[str], warnings_: list[str]) -> None:
    scope = values.get("capture_scope", CaptureScope.DEPLOYMENT)
    target = values.get("capture_target")
    if scope == CaptureScope.DATABASE and (not target or "." in target):
        problems.append(
            f"property 'capture.target' = {shown('capture.target', target)} must "
            "name one database when capture.scope is 'database' (allowed: a "
            "database name)"
        )
    elif scope == CaptureScope.COLLECTION and (not target or "." not in target.strip(".")):
        problems.append(
            f"property 'capture.target' = {shown('capture.target', target)} must "
            "name one collection when capture.scope is 'collection' (allowed: "
            "<db>.<collection>)"
        )
    elif scope == CaptureScope.DEPLOYMENT and target:
        warnings_.append("Property 'capture.target' is ignored because capture.scope is 'deployment'")
        values.pop("capture_target")


def _check_backoff(values: dict[str, Any], problems: list[str]) -> None:
    initial = values.get("connect_backoff_initial_delay_ms", 1000)
    maximum = values.get("connect_backoff_max_delay_ms", 120000)
    if maximum < initial:
        problems.append(
            f"property 'connect.backoff.max.delay.ms' = {maximum} is smaller than "
            f"connect.backoff.initial.delay.ms = {initial} (allowed: a value >= "
            "connect.backoff.initial.delay.ms)"
        )


def _check_filter_overrides(values: dict[str, Any], overrides: dict[str, Any], problems: list[str]) -> None:
    """snapshot.collection.filter.overrides lists <db>.<collection> names, each with its filter
    in snapshot.collection.filter.overrides.<db>.<collection>, and no filter without its name."""
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
            parse_filter_json(text)
        except InvalidValue as invalid:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
