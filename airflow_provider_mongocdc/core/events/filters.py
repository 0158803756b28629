"""Which databases, collections and documents are captured.

:meth:`Filters.collection_included` (client side, authoritative) applies the include/exclude lists
as Debezium does: with ``filters.match.mode=regex`` each item is a regular expression matched
against the *whole* name, case-insensitively; with ``literal`` an exact name. ``admin``,
``config``, ``local`` and ``system.*`` collections are never captured.
:meth:`Filters.change_stream_pipeline` is the equivalent ``$match`` stage, so MongoDB drops
uninteresting events before they cross the network; :meth:`Filters.snapshot_included` and
:meth:`Filters.snapshot_filter` select what a snapshot copies. See docs/design.md, "Filters".
"""

from __future__ import annotations

import re
from typing import Any

from bson import json_util
from bson.regex import Regex

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import CaptureScope, FullUpdateType, MatchMode

BUILT_IN_DATABASES = frozenset({"admin", "config", "local"})
DATA_OPERATION_TYPES = ("insert", "update", "replace", "delete")
_OPERATIONS_BY_CODE = {"c": ("insert",), "u": ("update", "replace"), "d": ("delete",)}


def _anchored(patterns: tuple[str, ...]) -> str:
    return "^(?:" + "|".join(f"(?:{pattern})" for pattern in patterns) + ")$"


class _NameMatcher:
    """Include or exclude matching of whole names."""

    __slots__ = ("include", "patterns", "literals", "regex")

    def __init__(self, include: tuple[str, ...] | None, exclude: tuple[str, ...] | None, literal: bool):
        self.include = include is not None
        self.patterns = include if include is not None else exclude
        self.literals: frozenset[str] | None = None
        self.regex: re.Pattern[str] | None = None
        if self.patterns is not None:
            if literal:
                self.literals = frozenset(self.patterns)
            else:
                self.regex = re.compile(_anchored(self.patterns), re.IGNORECASE)

    def __call__(self, name: str) -> bool:
        if self.patterns is None:
            return True
        if self.literals is not None:
            hit = name in self.literals
        else:
            assert self.regex is not None
            hit = self.regex.fullmatch(name) is not None
        return hit if self.include else not hit


class Filters:
    """Filters of one connector configuration. Results are cached per name."""

    def __init__(self, config: ConnectorConfig):
        self.config = config
        literal = config.filters_match_mode == MatchMode.LITERAL
        self._database = _NameMatcher(config.database_include_list, config.database_exclude_list, literal)
        self._collection = _NameMatcher(
            config.collection_include_list, config.collection_exclude_list, literal
        )
        snapshot = config.snapshot_include_collection_list
        self._snapshot = re.compile(_anchored(snapshot), re.IGNORECASE) if snapshot else None
        self._captured: dict[tuple[str, str], bool] = {}
        self._snapshot_filters = {
            namespace: json_util.loads(text) for namespace, text in config.filter_overrides.items()
        }

    # -- client side ---------------------------------------------------------------------------
    def database_included(self, database: str) -> bool:
        """Whether changes in ``database`` can be captured at all."""
        return database not in BUILT_IN_DATABASES and self._database(database)

    def collection_included(self, database: str, collection: str) -> bool:
        """Whether changes to ``<database>.<collection>`` are captured."""
        key = (database, collection)
        hit = self._captured.get(key)
        if hit is None:
            hit = (
                self.database_included(database)
                and not collection.startswith("system.")
                and self._collection(f"{database}.{collection}")
                and self._in_scope(database, collection)
            )
            self._captured[key] = hit
        return hit

    def _in_scope(self, database: str, collection: str) -> bool:
        scope, target = self.config.capture_scope, self.config.capture_target
        if scope == CaptureScope.DATABASE:
            return database == target
        if scope == CaptureScope.COLLECTION:
            return f"{database}.{collection}" == target
        return True

    def snapshot_included(self, database: str, collection: str) -> bool:
        """Whether a snapshot copies ``<database>.<collection>``."""
        if not self.config.snapshots_data or not self.collection_included(database, collection):
            return False
        return self._snapshot is None or self._snapshot.fullmatch(f"{database}.{collection}") is not None

    def snapshot_filter(self, database: str, collection: str) -> dict[str, Any]:
        """The query a snapshot uses for ``<database>.<collection>`` (``{}``: every document)."""
        found = self._snapshot_filters.get(f"{database}.{collection}")
        return dict(found) if found else {}

    # -- server side ---------------------------------------------------------------------------
    def operation_types(self) -> list[str]:
        """Change stream operation types that produce events (minus ``skipped.operations``)."""
        skipped = {op for code in self.config.skipped_operations for op in _OPERATIONS_BY_CODE.get(code, ())}
        return [op for op in DATA_OPERATION_TYPES if op not in skipped]

    def change_stream_match(self) -> dict[str, Any]:
        """The ``$match`` stage equivalent to the filters (see docs/design.md, "Filters")."""
        conditions: list[dict[str, Any]] = [{"operationType": {"$in": self.operation_types()}}]
        config = self.config
        literal = config.filters_match_mode == MatchMode.LITERAL
        if config.database_include_list:
            conditions.append(
                {"ns.db": {"$in": list(config.database_include_list)}}
                if literal
                else {"ns.db": _regex(config.database_include_list)}
            )
        elif config.database_exclude_list:
            conditions.append(
                {"ns.db": {"$nin": list(config.database_exclude_list)}}
                if literal
                else {"ns.db": {"$not": _regex(config.database_exclude_list)}}
            )
        if config.collection_include_list:
            conditions.append(_namespace_condition(config.collection_include_list, literal, include=True))
        elif config.collection_exclude_list:
            conditions.append(_namespace_condition(config.collection_exclude_list, literal, include=False))
        match = conditions[0] if len(conditions) == 1 else {"$and": conditions}
        return {"$match": match}

    def change_stream_pipeline(self) -> list[dict[str, Any]]:
        """The aggregation pipeline to pass to ``watch()``."""
        return [self.change_stream_match()]

    def change_stream_options(self) -> dict[str, Any]:
        """Keyword arguments for pymongo's ``watch()`` that ``capture.mode`` and the cursor
        properties imply (``full_document``, ``full_document_before_change``,
        ``max_await_time_ms``, ``batch_size``)."""
        config = self.config
        options: dict[str, Any] = {"batch_size": config.max_batch_size}
        if config.update_full:
            options["full_document"] = (
                "updateLookup"
                if config.capture_mode_full_update_type == FullUpdateType.LOOKUP
                else "whenAvailable"
            )
        if config.pre_image:
            options["full_document_before_change"] = "whenAvailable"
        if config.cursor_max_await_time_ms:
            options["max_await_time_ms"] = config.cursor_max_await_time_ms
        return options


def _regex(patterns: tuple[str, ...]) -> Regex:
    return Regex(_anchored(patterns), "i")


def _namespace_condition(patterns: tuple[str, ...], literal: bool, *, include: bool) -> dict[str, Any]:
    if literal:
        pairs = []
        for namespace in patterns:
            database, _, collection = namespace.partition(".")
            pairs.append({"ns.db": database, "ns.coll": collection})
        if include:
            return pairs[0] if len(pairs) == 1 else {"$or": pairs}
        return {"$nor": pairs}
    test = {
        "$regexMatch": {
            "input": {"$concat": ["$ns.db", ".", "$ns.coll"]},
            "regex": _anchored(patterns),
            "options": "i",
        }
    }
    return {"$expr": test if include else {"$eq": [test, False]}}
