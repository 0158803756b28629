"""The connector's records as a consumer reads them: the Kafka Connect JSON envelope unwrapped (with
or without schema) and the Debezium operation of a payload."""

from __future__ import annotations

import json
from typing import Any

from bson.binary import UuidRepresentation
from bson.json_util import JSONOptions

# json_util.loads options for the records' Extended JSON: binary UUIDs stay Binary values of their
# subtype (3 or 4), as the documents hold them.
UUIDS_AS_BINARY = JSONOptions(uuid_representation=UuidRepresentation.UNSPECIFIED)
# The fields of a Debezium 3.x change event's value, in their order.
ENVELOPE_FIELDS = ["before", "after", "updateDescription", "source", "op", "ts_ms", "transaction"]


def unwrapped(text: bytes | str | None) -> Any:
    """The ``payload`` of a Kafka Connect JSON key or value (the whole JSON when it has no schema
    envelope); None for a tombstone."""
    if text is None:
        return None
    envelope = json.loads(text)
    return envelope.get("payload", envelope)


class DebeziumRecord:
    """A data topic's record whose ``payload`` is a Debezium change event (None: a tombstone)."""

    payload: dict[str, Any] | None

    @property
    def op(self) -> str | None:
        return self.payload["op"] if self.payload else None
