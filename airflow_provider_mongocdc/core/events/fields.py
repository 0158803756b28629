"""Field exclusion, renaming and name adjustment inside event values.

``field.exclude.list`` and ``field.renames`` entries are ``<db>.<collection>.<field>[.<nested>...]``
(``*`` in the database or collection part matches any characters; names match case-insensitively,
as in Debezium). Exclusions apply first, then renames in the order given, then
``field.name.adjustment.mode`` (see :func:`airflow_provider_mongocdc.core.events.schema.adjust_field_name`). They act on every document
an event carries and on the dotted paths of ``updateDescription`` (``updatedFields``,
``removedFields``, ``truncatedArrays[].field``). A rename whose new name already exists next to the
renamed field is an error naming the document rather than a silent overwrite. Documents are never
modified in place: only the containers on a changed path are copied. The rules for arrays and
dotted paths: docs/design.md, "Events", "Field exclusions and renames".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import NameAdjustmentMode
from airflow_provider_mongocdc.core.events.schema import adjust_field_name


def _namespace_regex(database: str, collection: str) -> re.Pattern[str]:
    def part(text: str) -> str:
        return ".*".join(re.escape(piece) for piece in text.split("*"))

    return re.compile(part(database) + r"\." + part(collection), re.IGNORECASE)


def _significant(parts: list[str]) -> tuple[list[str], list[int]]:
    """Path segments without array indexes, and their positions. Consecutive indexes (arrays of
    arrays) are kept, as in Debezium."""
    names: list[str] = []
    positions: list[int] = []
    previous_index = False
    for position, part in enumerate(parts):
        is_index = part.isdigit()
        if is_index and not previous_index and 0 < position:
            previous_index = True
            continue
        previous_index = is_index
        names.append(part)
        positions.append(position)
    return names, positions


class _Rule:
    __slots__ = ("namespace", "nodes", "new_name", "text")

    def __init__(self, path: str, new_name: str | None):
        database, collection, *nodes = path.split(".")
        self.namespace = _namespace_regex(database, collection)
        self.nodes = nodes
        self.new_name = new_name
        self.text = path if new_name is None else f"{path}:{new_name}"


class FieldTransform:
    """The rules that apply to one collection."""

    __slots__ = ("rules", "adjustment", "namespace")

    def __init__(self, rules: list[_Rule], adjustment: str, namespace: str):
        self.rules = rules
        self.adjustment = adjustment
        self.namespace = namespace

    # -- full documents ----------------------------------------------------------------------------
    def document(self, doc: Mapping[str, Any] | None) -> Any:
        """A full document with the rules applied (``None`` stays ``None``)."""
        if doc is None:
            return None
        for rule in self.rules:
            doc = self._apply(doc, rule.nodes, rule)
        if self.adjustment != NameAdjustmentMode.NONE:
            doc = _adjust(doc, self.adjustment)
        return doc

    def _apply(self, value: Any, nodes: list[str], rule: _Rule) -> Any:
        if isinstance(value, list):
            changed = [
                self._apply(item, nodes, rule) if isinstance(item, Mapping) else item for item in value
            ]
            return changed if any(a is not b for a, b in zip(changed, value)) else value
        if not isinstance(value, Mapping):
            return value
        head = nodes[0]
        if head not in value:
            return value
        if len(nodes) == 1:
            if rule.new_name is None:
                return {k: v for k, v in value.items() if k != head}
            return self._rename_key(value, head, rule)
        child = value[head]
        new_child = self._apply(child, nodes[1:], rule) if isinstance(child, (Mapping, list)) else child
        if new_child is child:
            return value
        copy = dict(value)
        copy[head] = new_child
        return copy

    def _rename_key(self, value: Mapping[str, Any], old: str, rule: _Rule) -> dict[str, Any]:
        new = rule.new_name
        assert new is not None
        if new != old and new in value:
            raise self._conflict(rule, new)
        return {(new if k == old else k): v for k, v in value.items()}

    def _conflict(self, rule: _Rule, existing: str) -> ConfigError:
        return ConfigError(
            f"field.renames entry '{rule.text}' cannot be applied to a {self.namespace} document",
            cause=f"the document already has a field '{existing}' where the renamed field would go",
            fix="choose a new name that is not used, or drop the existing field with field.exclude.list",
        )

    # -- update descriptions -----------------------------------------------------------------------
    def updated_fields(self, updated: Mapping[str, Any] | None) -> Any:
        """``updateDescription.updatedFields`` (dotted names) with the rules applied."""
        if updated is None:
            return None
        result: Mapping[str, Any] = updated
        for rule in self.rules:
            out: dict[str, Any] = {}
            for key, value in result.items():
                parts = key.split(".")
                names, positions = _significant(parts)
                nodes = rule.nodes
                if len(names) >= len(nodes) and names[: len(nodes)] == nodes:
                    if rule.new_name is None:
                        continue
                    parts[positions[len(nodes) - 1]] = rule.new_name
                    new_key = ".".join(parts)
                    if new_key != key and (new_key in result or new_key in out):
                        raise self._conflict(rule, new_key)
                    out[new_key] = value
                elif len(names) < len(nodes) and nodes[: len(names)] == names:
                    out[key] = self._apply(value, nodes[len(names) :], rule)
                else:
                    out[key] = value
            result = out
        if self.adjustment != NameAdjustmentMode.NONE:
            result = {
                self._adjust_path(key): _adjust(value, self.adjustment) for key, value in result.items()
            }
        return result

    def paths(self, paths: list[str] | None) -> list[str] | None:
        """Dotted field paths (``removedFields``) with the rules applied; excluded ones vanish."""
        if paths is None:
            return None
        out: list[str] = []
        for path in paths:
            mapped = self._map_path(path)
            if mapped is not None:
                out.append(mapped)
        return out

    def truncated_arrays(self, arrays: list[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
        """``truncatedArrays`` entries with their ``field`` paths mapped; excluded ones vanish."""
        if arrays is None:
            return None
        out = []
        for entry in arrays:
            mapped = self._map_path(entry.get("field", ""))
            if mapped is not None:
                copy = dict(entry)
                copy["field"] = mapped
                out.append(copy)
        return out

    def _map_path(self, path: str) -> str | None:
        parts = path.split(".")
        for rule in self.rules:
            names, positions = _significant(parts)
            nodes = rule.nodes
            if len(names) >= len(nodes) and names[: len(nodes)] == nodes:
                if rule.new_name is None:
                    return None
                parts[positions[len(nodes) - 1]] = rule.new_name
        mapped = ".".join(parts)
        return self._adjust_path(mapped) if self.adjustment != NameAdjustmentMode.NONE else mapped

    def _adjust_path(self, path: str) -> str:
        return ".".join(
            part if part.isdigit() else adjust_field_name(part, self.adjustment) for part in path.split(".")
        )


def _adjust(value: Any, mode: str) -> Any:
    if isinstance(value, Mapping):
        return {adjust_field_name(key, mode): _adjust(item, mode) for key, item in value.items()}
    if isinstance(value, list):
        return [_adjust(item, mode) for item in value]
    return value


class FieldRules:
    """``field.exclude.list``, ``field.renames`` and ``field.name.adjustment.mode`` of one
    configuration; :meth:`for_collection` returns ``None`` when nothing applies (the common
    case, which then costs nothing per event)."""

    def __init__(self, config: ConnectorConfig):
        self._rules = [_Rule(path, None) for path in config.field_exclude_list or ()]
        self._rules += [_Rule(path, new) for path, new in config.field_renames or ()]
        self._adjustment = config.field_name_adjustment_mode
        self._cache: dict[tuple[str, str], FieldTransform | None] = {}

    def for_collection(self, database: str, collection: str) -> FieldTransform | None:
        key = (database, collection)
        if key in self._cache:
            return self._cache[key]
        namespace = f"{database}.{collection}"
        rules = [rule for rule in self._rules if rule.namespace.fullmatch(namespace)]
        transform = (
            FieldTransform(rules, self._adjustment, namespace)
            if rules or self._adjustment != NameAdjustmentMode.NONE
            else None
        )
        self._cache[key] = transform
        return transform
