"""An update whose event carries no document (``capture.mode=change_streams``, or a lookup that found
the document deleted): its ``updateDescription`` applied to the document the table (or the batch)
holds, as MongoDB applied it: arrays cut to their new length (``truncatedArrays``), then the
``updatedFields`` set (dotted paths, array indexes included) and the ``removedFields`` removed. The
result is written back in the topic's document JSON (``extended.json.mode``) by the connector's own
writer (:func:`~airflow_provider_mongocdc.core.events.java_json.document_writer`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bson import json_util
from bson.json_util import DatetimeConversion, JSONOptions

from airflow_provider_mongocdc.core.events.java_json import document_writer

# Dates out of the range of Python's datetime (years 1 to 9999, which MongoDB allows) read as
# DatetimeMS and are written back as they were.
_DECODE = JSONOptions(
    tz_aware=True, document_class=dict, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)


def _load(text: str) -> Any:
    return json_util.loads(text, json_options=_DECODE)


def _parent(document: Any, parts: list[str], create: bool) -> tuple[Any, str] | None:
    """The container of a dotted path's last part (created on the way when ``create``)."""
    current = document
    for part in parts[:-1]:
        if isinstance(current, list) and part.isdigit():
            index = int(part)
            if index >= len(current):
                if not create:
                    return None
                current.extend([None] * (index + 1 - len(current)))
            if current[index] is None and create:
                current[index] = {}
            current = current[index]
        elif isinstance(current, dict):
            if part not in current:
                if not create:
                    return None
                current[part] = {}
            current = current[part]
        else:
            return None
    return current, parts[-1]


def _set(document: dict[str, Any], path: str, value: Any) -> None:
    found = _parent(document, path.split("."), create=True)
    if found is None:
        return
    container, last = found
    if isinstance(container, list) and last.isdigit():
        index = int(last)
        if index >= len(container):
            container.extend([None] * (index + 1 - len(container)))
        container[index] = value
    elif isinstance(container, dict):
        container[last] = value


def _unset(document: dict[str, Any], path: str) -> None:
    found = _parent(document, path.split("."), create=False)
    if found is None:
        return
    container, last = found
    if isinstance(container, dict):
        container.pop(last, None)
    elif isinstance(container, list) and last.isdigit() and int(last) < len(container):
        container[int(last)] = None  # MongoDB's $unset of an array element leaves null


def _truncate(document: dict[str, Any], path: str, size: int) -> None:
    found = _parent(document, path.split("."), create=False)
    if found is None:
        return
    container, last = found
    target = container.get(last) if isinstance(container, dict) else None
    if isinstance(target, list):
        del target[size:]


class Patcher:
    """Applies update descriptions to document texts of one ``extended.json.mode``."""

    def __init__(self, json_mode: str = "strict"):
        self.writer = document_writer(json_mode)

    def apply(self, document_text: str, update: Mapping[str, Any]) -> str:
        document = _load(document_text)
        for item in update.get("truncatedArrays") or ():
            _truncate(document, str(item.get("field")), int(item.get("size") or 0))
        fields = update.get("updatedFields")
        if isinstance(fields, str):
            fields = _load(fields) if fields else {}
        elif isinstance(fields, Mapping):
            fields = _load(json.dumps(fields))
        for path, value in (fields or {}).items():
            _set(document, path, value)
        for path in update.get("removedFields") or ():
            _unset(document, str(path))
        return self.writer.dumps(document)
