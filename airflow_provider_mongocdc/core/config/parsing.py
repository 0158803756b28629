"""How one property value is read: a parser per kind of value, each raising :class:`InvalidValue`
with what is wrong and what would be accepted; JSON text read with a :class:`ConfigError` that says
what the text was (:func:`load_json`); and how a value may appear in a message (secrets never do)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.enums import CAPTURE_MODES, SNAPSHOT_MODES

SKIPPABLE_OPERATIONS = ("c", "u", "d", "t")

JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
MONGODB_CONNECTOR_CLASS = "io.debezium.connector.mongodb.MongoDbConnector"

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


class InvalidValue(Exception):
    """A single bad value: ``reason`` says what is wrong, ``allowed`` what would be accepted."""

    def __init__(self, reason: str, allowed: str):
        super().__init__(reason)
        self.reason = reason
        self.allowed = allowed


# -- value parsers ---------------------------------------------------------------------------------
def parse_str(raw: Any) -> str:
    if isinstance(raw, (bool, int, float)) or not isinstance(raw, str):
        raise InvalidValue("is not a string", "a string")
    return raw.strip()


def parse_boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise InvalidValue("is not a boolean", "true or false")


def int_parser(minimum: int) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, float) and raw.is_integer():
            value = int(raw)
        elif isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw):
            value = int(raw)
        if value is None:
            raise InvalidValue("is not a whole number", f"a whole number >= {minimum}")
        if value < minimum:
            raise InvalidValue(f"is less than {minimum}", f"a whole number >= {minimum}")
        return value

    return parse


def enum_parser(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if not isinstance(raw, str) or raw.strip().lower() not in allowed:
            raise InvalidValue("is not one of the allowed values", "one of " + ", ".join(allowed))
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


def parse_list(raw: Any) -> tuple[str, ...] | None:
    if isinstance(raw, (list, tuple)):
        values = [str(item).strip() for item in raw if str(item).strip()]
    elif isinstance(raw, str):
        values = split_list(raw)
    else:
        raise InvalidValue("is not a comma-separated list", "a comma-separated list of names")
    return tuple(values) or None


def parse_regex_list(raw: Any) -> tuple[str, ...] | None:
    values = parse_list(raw)
    for pattern in values or ():
        try:
            re.compile(pattern)
        except re.error as error:
            raise InvalidValue(
                f"contains the invalid regular expression {pattern!r} ({error})",
                "a comma-separated list of valid regular expressions",
            ) from None
    return values


def parse_skipped_operations(raw: Any) -> frozenset[str]:
    values = parse_list(raw) or ()
    lowered = [value.lower() for value in values]
    if "none" in lowered:
        if len(lowered) > 1:
            raise InvalidValue(
                "combines 'none' with operations", "'none' alone, or a comma-separated list of c, u, d, t"
            )
        return frozenset()
    bad = [value for value in lowered if value not in SKIPPABLE_OPERATIONS]
    if bad:
        raise InvalidValue(
            f"names unknown operation(s) {', '.join(bad)}",
            "'none' or a comma-separated list of c (create), u (update), d (delete), t (truncate)",
        )
    return frozenset(lowered)


def parse_field_paths(raw: Any) -> tuple[str, ...] | None:
    values = parse_list(raw)
    for value in values or ():
        parts = value.split(".")
        if len(parts) < 3 or any(not part for part in parts):
            raise InvalidValue(
                f"contains {value!r}, which is not <database>.<collection>.<field>",
                "a comma-separated list of <database>.<collection>.<field>[.<nested>] "
                "(* allowed in database and collection)",
            )
    return values


def parse_field_renames(raw: Any) -> tuple[tuple[str, str], ...] | None:
    values = parse_list(raw)
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
            raise InvalidValue(
                f"contains {value!r}, which is not <database>.<collection>.<field>:<new name>",
                "a comma-separated list of <database>.<collection>.<field>[.<nested>]"
                ":<new name> (* allowed in database and collection)",
            )
        renames.append((path, new_name.strip()))
    return tuple(renames) or None


def parse_topic_prefix(raw: Any) -> str:
    value = parse_str(raw)
    if not value:
        raise InvalidValue("is empty", "a non-empty name of letters, digits, '.', '_' and '-'")
    if not _TOPIC_PREFIX_RE.match(value):
        raise InvalidValue(
            "contains characters other than letters, digits, '.', '_' and '-'",
            "a non-empty name of letters, digits, '.', '_' and '-' (Kafka topic characters)",
        )
    if len(value) > 200:
        raise InvalidValue(
            "is longer than 200 characters",
            "at most 200 characters, so that topic names stay under Kafka's 249",
        )
    return value


def parse_topic_name(raw: Any) -> str:
    value = parse_str(raw)
    if not value or not _TOPIC_PREFIX_RE.match(value) or len(value) > 249:
        raise InvalidValue("is not a valid Kafka topic name", "1 to 249 letters, digits, '.', '_' or '-'")
    return value


def parse_optional_topic_name(raw: Any) -> str | None:
    if isinstance(raw, str) and not raw.strip():
        return None
    return parse_topic_name(raw)


def parse_capture_target(raw: Any) -> str | None:
    value = parse_str(raw)
    return value or None


def parse_converter(raw: Any) -> str:
    value = parse_str(raw)
    if value != JSON_CONVERTER:
        raise InvalidValue(
            "is not the JSON converter",
            f"{JSON_CONVERTER} (this connector writes Kafka Connect JSON; set "
            "key/value.converter.schemas.enable to choose schema+payload or payload "
            "only)",
        )
    return value


def parse_connector_class(raw: Any) -> str:
    value = parse_str(raw)
    if value != MONGODB_CONNECTOR_CLASS:
        raise InvalidValue("is not the MongoDB connector class", MONGODB_CONNECTOR_CLASS)
    return value


def parse_capture_mode(raw: Any) -> str:
    if isinstance(raw, str) and raw.strip().lower() == "oplog":
        raise InvalidValue(
            "names the oplog capture mode, removed in Debezium 2.0",
            "one of " + ", ".join(CAPTURE_MODES) + " (for Debezium 1.x event shapes set event.format=oplog)",
        )
    return enum_parser(CAPTURE_MODES)(raw)


def parse_snapshot_mode(raw: Any) -> str:
    if isinstance(raw, str) and raw.strip().lower() == "never":
        return "never"  # deprecated spelling of no_data; normalised (with a warning) later
    if isinstance(raw, str) and raw.strip().lower() in ("configuration_based", "custom"):
        raise InvalidValue(
            "needs Debezium's Java snapshotter SPI, which does not exist here",
            "one of " + ", ".join(SNAPSHOT_MODES),
        )
    return enum_parser(SNAPSHOT_MODES)(raw)


def parse_pipeline_property(raw: Any) -> str | None:
    """``cursor.pipeline``: the text, checked to be a JSON array of one-key stage documents."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if not isinstance(raw, str):
        raise InvalidValue("is not a JSON text", "a JSON array of aggregation stages")
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
        raise InvalidValue(f"is not valid JSON ({error})", "a JSON array of aggregation stages") from None
    stages = [parsed] if isinstance(parsed, dict) else parsed
    if not isinstance(stages, list) or not all(
        isinstance(stage, dict) and len(stage) == 1 and str(next(iter(stage))).startswith("$")
        for stage in stages
    ):
        raise InvalidValue(
            "is not an array of aggregation stages",
            'a JSON array of one-key stage documents such as [{"$match": {...}}]',
        )
    return stages


def parse_filter_json(text: Any) -> dict[str, Any]:
    from bson import json_util  # pymongo's bson; imported lazily to keep config light

    if not isinstance(text, str):
        raise InvalidValue("is not a JSON text", "a MongoDB query filter as a JSON object")
    try:
        parsed = json_util.loads(text)
    except (ValueError, TypeError) as error:
        raise InvalidValue(
            f"is not valid JSON ({error})", "a MongoDB query filter as a JSON object"
        ) from None
    if not isinstance(parsed, dict):
        raise InvalidValue("is not a JSON object", "a MongoDB query filter as a JSON object")
    return parsed


def load_json(text: str, problem: str, fix: str, loads: Callable[[str], Any] = json.loads) -> Any:
    """``text`` read by ``loads`` (``json.loads``, or bson's ``json_util.loads`` for extended JSON);
    text it cannot read raises a :class:`ConfigError` with ``problem``, the parser's message as the
    cause, and ``fix``."""
    try:
        return loads(text)
    except (ValueError, TypeError) as error:  # bson raises TypeError for a malformed $-value
        raise ConfigError(problem, cause=str(error), fix=fix) from None


def is_secret_property(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def shown(name: str, value: Any) -> str:
    """A value as it may appear in messages: secrets are never echoed."""
    if is_secret_property(name):
        return "<hidden>"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text if len(text) <= 200 else text[:200] + "...")
