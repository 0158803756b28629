"""The delta-rs adapter of the apply: a collection's Delta table as
:class:`~airflow_provider_mongocdc.core.apply.run.TableStore` (``deltalake``, no JVM).

Each apply commit is ONE Delta commit: a MERGE of the batch's rows on ``_id`` (insert, update,
delete or mark deleted; the re-snapshot sweep as its "not matched by source" clause) that also
records the application transactions (the next offset of each partition, the snapshot generation)
and the commit's metadata. A hard-delete table that delta-rs's defaults created (no partitions, no
table features, no column no longer declared) on the local file system takes the same commit without
the MERGE: the files that may hold a batch's key (by their ``_id`` statistics) are copied without the
batch's keys into one new file that also holds the batch's rows, and one commit removes them and adds
it (:meth:`DeltaTableStore._rewrite`; the same rows as the MERGE, with half of its CPU on a table
whose every file holds a changed key). The first commit creates the table (name ``<db>.<collection>``, a
description naming the topic). A declared column new to the table is added and filled from ``_doc``
in one commit before the apply's first. Compaction (``optimize.compact``) and vacuum record when they
ran as application transactions of their own commits. Every failure of delta-rs or of the storage
becomes one :class:`~airflow_provider_mongocdc.core.base.errors.TableError` in words; the table then
stays at its last commit.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from airflow_provider_mongocdc.core.apply.batch import Commit
from airflow_provider_mongocdc.core.apply.layout import (
    APPLIED_AT,
    DELETED,
    DOCUMENT,
    GENERATION,
    ID,
    OP,
    SYSTEM_NAMES,
    TableLayout,
)
from airflow_provider_mongocdc.core.apply.settings import MIN_VACUUM_RETENTION_S
from airflow_provider_mongocdc.core.apply.state import (
    TableState,
    compacted_app_id,
    vacuumed_app_id,
)
from airflow_provider_mongocdc.core.apply.values import Misfits, column_values
from airflow_provider_mongocdc.core.base.errors import TableError
from airflow_provider_mongocdc.core.base.redaction import redact_secrets, secret_values
from airflow_provider_mongocdc.tables.arrow import REWRITE_BATCH_ROWS, BatchKeys, arrow_schema, arrow_type

log = logging.getLogger("airflow_provider_mongocdc.apply")

# Delta's names of the Arrow types a table's schema reports, for comparing with the layout.
_DELTA_NAMES = {"timestamp_ntz": "timestamp_ntz"}
# A file's ``_id`` bounds shorter than this are whole values (longer ones may be cut prefixes).
_EXACT_BOUND_CHARS = 32
# The colours of delta-rs's error chains ("\x1b[31m↳\x1b[0m"): left out of the error's words.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _delta_type_name(field: Any) -> str:
    """The Delta type name of a field of a deltalake schema."""
    kind = field.type
    text = getattr(kind, "type", None) or str(kind)
    if str(text).startswith("decimal"):
        precision, scale = getattr(kind, "precision", None), getattr(kind, "scale", None)
        if precision is not None:
            return f"decimal({precision},{scale})"
    return str(text)


def _keys(keys: list[str], batch: pa.RecordBatch) -> pa.Array:
    return pa.array(keys, batch.schema.field(ID).type)


def _matching(table: DeltaTable, columns: list[str], condition) -> pa.Table:
    """The rows of ``columns`` for which ``condition(batch)`` holds. Filtered batch by batch, not by
    the Arrow dataset's filter: delta-rs writes strings as ``string_view``, which the dataset's
    statistics pruning cannot compare with the schema's ``string``."""
    found = []
    for batch in table.to_pyarrow_dataset().to_batches(columns=columns):
        if batch.num_rows:
            found.append(batch.filter(condition(batch)))
    return pa.Table.from_batches(found) if found else pa.table({name: [] for name in columns})


class DeltaTableStore:
    """One collection's Delta table at ``uri`` (a local path or an object-store URI)."""

    def __init__(
        self, uri: str, storage_options: Mapping[str, str] | None = None, *, conn_id: str | None = None
    ):
        self.uri = uri
        self.storage_options = dict(storage_options or {}) or None
        self.conn_id = conn_id
        self._table: DeltaTable | None = None
        self._new_columns: list[str] = []
        self._stale_columns: list[str] = []

    # -- errors ------------------------------------------------------------------------------------------
    def _failed(self, what: str, error: BaseException) -> TableError:
        """delta-rs's or the storage's error as one TableError, without credentials: the secret
        storage options' values wherever they appear, and what :func:`redact_uri` finds (signed URLs'
        signatures, tokens, keys). The error travels to the task log, the result file and the page
        as it is built here."""
        where = (
            f"the storage options of the connection {self.conn_id!r}"
            if self.conn_id
            else "the storage options"
        )
        secrets = secret_values(self.storage_options)
        text = " ".join(_ANSI_ESCAPE.sub("", redact_secrets(str(error), secrets)).split())
        return TableError(
            f"Could not {what} the Delta table at {redact_secrets(self.uri, secrets)}",
            cause=f"{type(error).__name__}: {text[:500]}",
            fix=f"check that the location exists and can be written, and {where}; the table stays at its "
            "last commit, and the next run continues from there",
        )

    # -- reading ---------------------------------------------------------------------------------------
    def table(self) -> DeltaTable | None:
        if self._table is None:
            try:
                self._table = DeltaTable(self.uri, storage_options=self.storage_options)
            except TableNotFoundError:
                return None
            except (DeltaError, OSError) as error:
                raise self._failed("read", error) from None
        return self._table

    def version(self) -> int | None:
        table = self.table()
        return None if table is None else table.version()

    def app_version(self, app_id: str) -> int | None:
        table = self.table()
        return None if table is None else table.transaction_version(app_id)

    def description(self) -> str:
        table = self.table()
        if table is None:
            return ""
        metadata = table.metadata()
        return " ".join(part for part in (metadata.name or "", metadata.description or "") if part)

    def check_layout(self, layout: TableLayout) -> list[str]:
        """Refuse a column whose type changed; note the new and the no longer declared ones."""
        table = self.table()
        if table is None:
            return []
        existing = {field.name: _delta_type_name(field) for field in table.schema().fields}
        missing = [name for name, _, _ in layout.columns() if name in SYSTEM_NAMES and name not in existing]
        if missing:
            raise TableError(
                f"The Delta table at {self.uri} lacks the apply's column(s) {', '.join(missing)}",
                cause="it was written by something else, or with soft_delete off and now on"
                if missing == [DELETED]
                else "it was written by something else",
                fix="keep soft_delete as the table was created, or apply to a new location",
            )
        if not layout.soft_delete and DELETED in existing:
            # Only a table created with soft_delete on has the column (no declared column takes the name).
            raise TableError(
                f"The Delta table at {self.uri} keeps deleted documents (its column {DELETED}): it was "
                "created with soft_delete on, and soft_delete is now off",
                cause=f"with soft_delete off the apply removes the rows of deleted documents and writes no "
                f"{DELETED}, which every row of this table must have (a new row would fail delta-rs's "
                "validation); the rows already marked deleted would stay",
                fix="set soft_delete back to true, or apply to a new location",
            )
        notes = []
        for name, kind, _ in layout.columns():
            have = existing.get(name)
            if have is not None and have != kind and _DELTA_NAMES.get(have) != kind:
                raise TableError(
                    f"The column {name} of the Delta table at {self.uri} is {have}, but it is declared {kind}",
                    cause="a declared column's type cannot change in place",
                    fix=f"declare the field as a new column name, or keep {have}",
                )
        declared = {column.name for column in layout.declared}
        self._new_columns = [column.name for column in layout.declared if column.name not in existing]
        self._stale_columns = [name for name in existing if name not in SYSTEM_NAMES and name not in declared]
        if self._new_columns:
            notes.append(f"new declared column(s) {', '.join(self._new_columns)}: added and filled from _doc")
        if self._stale_columns:
            notes.append(
                f"column(s) {', '.join(self._stale_columns)} are no longer declared: rows written from now on "
                "have null there"
            )
        return notes

    def documents(self, keys: list[str]) -> dict[str, str]:
        table = self.table()
        if table is None or not keys:
            return {}
        try:
            found = _matching(
                table, [ID, DOCUMENT], lambda batch: pc.is_in(batch.column(ID), _keys(keys, batch))
            )
        except (DeltaError, OSError) as error:
            raise self._failed("read", error) from None
        return {
            key: doc
            for key, doc in zip(found.column(ID).to_pylist(), found.column(DOCUMENT).to_pylist())
            if doc
        }

    # -- writing ---------------------------------------------------------------------------------------
    def _properties(self, commit: Commit) -> CommitProperties:
        return CommitProperties(
            custom_metadata=commit.metadata,
            app_transactions=[
                Transaction(app_id, version) for app_id, version in sorted(commit.versions.items())
            ],
        )

    def _data(self, commit: Commit, layout: TableLayout) -> pa.Table:
        schema = arrow_schema(layout, with_deleted=True)
        return pa.table({name: commit.columns[name] for name in schema.names}, schema=schema)

    def commit(self, commit: Commit, layout: TableLayout, name: str, description: str) -> dict[str, Any]:
        table = self.table()
        try:
            if table is None:
                return self._create(commit, layout, name, description)
            return self._merge(table, commit, layout)
        except CommitFailedError as error:
            raise TableError(
                f"Another writer committed to the Delta table at {self.uri} while this apply prepared its "
                "commit",
                cause="delta-rs refused the commit: "
                + redact_secrets(" ".join(str(error).split()), secret_values(self.storage_options))[:300],
                fix="give each table one apply (the connector's pool does); nothing of this batch was applied, "
                "and the next run continues from the table as it is",
            ) from None
        except DeltaError as error:
            raise self._failed("write", error) from None
        except (OSError, pa.ArrowException) as error:
            raise self._failed("write", error) from None
        finally:
            self._table = None  # read again: the version moved

    def _create(self, commit: Commit, layout: TableLayout, name: str, description: str) -> dict[str, Any]:
        data = self._data(commit, layout)
        if not layout.soft_delete:
            data = data.filter(pc.invert(data.column(DELETED))).drop_columns([DELETED])
        if self.uri_is_local():
            Path(self.uri).mkdir(parents=True, exist_ok=True)
        try:
            write_deltalake(
                self.uri,
                data,
                mode="error",
                name=name,
                description=description,
                storage_options=self.storage_options,
                commit_properties=self._properties(commit),
            )
        except DeltaError as error:
            if "already exists" not in str(error):
                raise
            raise CommitFailedError(f"the table was created by another writer first: {error}") from None
        return {"version": 0, "inserted": data.num_rows, "deleted": 0, "swept": 0, "created": True}

    def uri_is_local(self) -> bool:
        return "://" not in self.uri or self.uri.startswith("file://")

    def stale_columns(self) -> list[str]:
        """The table's columns :meth:`check_layout` found no longer declared."""
        return list(self._stale_columns)

    def evolve(
        self, layout: TableLayout, refill: list[str] = (), versions: Mapping[str, int] | None = None
    ) -> list[str]:
        """The declared columns :meth:`check_layout` found missing, added and filled from ``_doc``,
        and the ``refill`` ones (declared again after rows were written without them) filled again,
        in one commit that records ``versions``."""
        table = self.table()
        refilled = [name for name in refill if name not in self._new_columns]
        if table is None or not (self._new_columns or refilled):
            return []
        added = list(self._new_columns)
        self._new_columns = added + refilled
        try:
            self._add_columns(table, layout, versions or {})
        except (DeltaError, OSError) as error:
            raise self._failed("add columns to", error) from None
        # (check_layout's notes name the new columns)
        return [f"column(s) {', '.join(refilled)} declared again: filled again from _doc"] if refilled else []

    def _add_columns(self, table: DeltaTable, layout: TableLayout, versions: Mapping[str, int]) -> None:
        """New declared columns: added and filled from ``_doc`` in one commit (a MERGE that updates
        only them, with the schema merged)."""
        columns = [column for column in layout.declared if column.name in self._new_columns]
        rows = table.to_pyarrow_dataset().to_table(columns=[ID, DOCUMENT])
        only = TableLayout(tuple(columns))
        misfits = Misfits()
        keys, documents = rows.column(ID).to_pylist(), rows.column(DOCUMENT).to_pylist()
        values = [column_values(only, key, document, misfits) for key, document in zip(keys, documents)]
        source = pa.table(
            {
                ID: pa.array(keys, pa.string()),
                **{
                    column.name: pa.array([row[index] for row in values], arrow_type(column.type))
                    for index, column in enumerate(columns)
                },
            }
        )
        if source.num_rows == 0:
            present = {field.name for field in table.schema().fields}
            missing = [column for column in columns if column.name not in present]
            if missing:
                table.alter.add_columns(
                    [pa.field(column.name, arrow_type(column.type), True) for column in missing]
                )
        else:
            table.merge(
                source,
                f"t.{quoted(ID)} = s.{quoted(ID)}",
                source_alias="s",
                target_alias="t",
                merge_schema=True,
                commit_properties=CommitProperties(
                    custom_metadata={"mongocdc.added_columns": [column.name for column in columns]},
                    app_transactions=[
                        Transaction(app_id, version) for app_id, version in sorted(versions.items())
                    ],
                ),
            ).when_matched_update(
                updates={quoted(column.name): f"s.{quoted(column.name)}" for column in columns}
            ).execute()
        for line in misfits.describe(only.declared):
            log.warning("%s: %s", self.uri, line)
        log.info("%s: added the column(s) %s, filled from _doc", self.uri, ", ".join(self._new_columns))
        self._new_columns = []
        self._table = None

    def _merge(self, table: DeltaTable, commit: Commit, layout: TableLayout) -> dict[str, Any]:
        properties = self._properties(commit)
        soft = layout.soft_delete
        names = layout.names()
        nulls = {quoted(name): "NULL" for name in self._stale_columns}
        if commit.rows == 0:
            return self._state_only(table, commit, layout, properties)
        data = self._data(commit, layout)
        if self._rewritable(table, commit, layout):
            files = self._files_with_keys(table, data.column(ID))
            if files is not None:
                done = self._rewrite(table, data, layout, properties, files)
                if done is not None:
                    return done
        swept = (
            self._count_swept(table, commit.sweep, soft, commit.columns[ID])
            if commit.sweep is not None
            else 0
        )
        everything = {quoted(name): f"s.{quoted(name)}" for name in names} | nulls
        merger = table.merge(
            data,
            f"t.{quoted(ID)} = s.{quoted(ID)}",
            source_alias="s",
            target_alias="t",
            commit_properties=properties,
        )
        deleted = f"s.{quoted(DELETED)}"
        if soft:
            kept = {
                quoted(name): f"s.{quoted(name)}"
                for name in names
                if name not in (DOCUMENT, *(column.name for column in layout.declared))
            }
            merger = merger.when_matched_update(updates=kept, predicate=deleted)
            merger = merger.when_matched_update(updates=everything, predicate=f"NOT {deleted}")
        else:
            merger = merger.when_matched_delete(predicate=deleted)
            merger = merger.when_matched_update(updates=everything)
        merger = merger.when_not_matched_insert(updates=everything, predicate=f"NOT {deleted}")
        if commit.sweep is not None:
            old = f"t.{quoted(GENERATION)} < {int(commit.sweep)}"
            if soft:
                merger = merger.when_not_matched_by_source_update(
                    updates=self._swept_updates(commit), predicate=f"{old} AND NOT t.{quoted(DELETED)}"
                )
            else:
                merger = merger.when_not_matched_by_source_delete(predicate=old)
        metrics = merger.execute()
        return {
            "version": table.version(),
            "inserted": metrics.get("num_target_rows_inserted", 0),
            "updated": metrics.get("num_target_rows_updated", 0),
            "deleted": metrics.get("num_target_rows_deleted", 0),
            "swept": swept,
        }

    def _rewritable(self, table: DeltaTable, commit: Commit, layout: TableLayout) -> bool:
        """Whether :meth:`_rewrite` writes what the MERGE would: hard deletes, no sweep, every column
        of the table declared, a local table of delta-rs's default protocol without partitions or
        settings (no deletion vectors, change data feed, constraints or column mapping to honour)."""
        if layout.soft_delete or commit.sweep is not None or self._stale_columns or not self.uri_is_local():
            return False
        protocol = table.protocol()
        if (
            protocol.min_reader_version != 1
            or protocol.min_writer_version > 2
            or protocol.reader_features
            or protocol.writer_features
        ):
            return False
        metadata = table.metadata()
        if metadata.partition_columns or metadata.configuration:
            return False
        return [field.name for field in table.schema().fields] == layout.names()

    def _files_with_keys(self, table: DeltaTable, keys: pa.ChunkedArray) -> list[dict[str, Any]] | None:
        """The table's files whose ``_id`` bounds may hold one of ``keys`` (all of a file without
        whole bounds); None when a file lies outside the table's directory."""
        files = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        batch = BatchKeys(keys)
        found = []
        for file in files:
            path = file["path"]
            if "://" in path or path.startswith("/") or ".." in path.split("/"):
                return None
            low, high = file.get(f"min.{ID}"), file.get(f"max.{ID}")
            if (
                isinstance(low, str)
                and isinstance(high, str)
                and len(low) < _EXACT_BOUND_CHARS
                and len(high) < _EXACT_BOUND_CHARS
                and not batch.within(low, high)
            ):
                continue
            found.append(file)
        return found

    def _rewrite(
        self,
        table: DeltaTable,
        source: pa.Table,
        layout: TableLayout,
        properties: CommitProperties,
        files: list[dict[str, Any]],
    ) -> dict[str, Any] | None:
        """The MERGE's result written without a join: the rows of ``files`` whose key is not in the
        batch and the batch's rows that are not deleted, in one new file; one commit removes
        ``files``, adds it and records the positions. Rows are streamed file by file, so memory
        holds a batch of rows, not the table; a file none of whose rows has a batch's key stays. None
        (nothing written) when a file's columns are not the table's, in its order."""
        schema = arrow_schema(layout)
        root = Path(self.uri.removeprefix("file://"))
        files = list(files)
        readers = [pq.ParquetFile(root / unquote(file["path"])) for file in files]
        if any(reader.schema_arrow.names != schema.names for reader in readers):
            return None
        keys = source.column(ID)
        name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        target = root / name
        present: list[pa.ChunkedArray] = []
        nulls = dict.fromkeys(schema.names, 0)
        bounds: list[Any] = []
        count = 0

        def write(writer: pq.ParquetWriter, rows: pa.Table) -> None:
            nonlocal count
            if rows.num_rows == 0:
                return
            if rows.schema != schema:
                rows = rows.cast(schema)
            writer.write_table(rows)
            count += rows.num_rows
            for column in schema.names:
                nulls[column] += rows.column(column).null_count
            extremes = pc.min_max(rows.column(ID))
            bounds.extend((extremes["min"].as_py(), extremes["max"].as_py()))

        try:
            # Dictionaries for the columns of few values only: the keys and documents are all distinct.
            # No Parquet statistics of the documents (long texts no reader filters on by range).
            dictionary = [column for column in schema.names if column not in (ID, DOCUMENT)]
            statistics = [column for column in schema.names if column != DOCUMENT]
            with pq.ParquetWriter(
                target, schema, compression="snappy", use_dictionary=dictionary, write_statistics=statistics
            ) as writer:
                for file, parquet in zip(list(files), readers):
                    ids = parquet.read(columns=[ID], use_threads=False).column(ID).cast(keys.type)
                    hit = pc.is_in(ids, value_set=keys)
                    if not pc.any(hit).as_py():  # its bounds hold a key, its rows do not: it stays
                        files.remove(file)
                        continue
                    present.append(ids.filter(hit))
                    keep = pc.invert(hit).combine_chunks()
                    at = 0
                    for batch in parquet.iter_batches(batch_size=REWRITE_BATCH_ROWS, use_threads=False):
                        rows = pa.Table.from_batches([batch])
                        if rows.schema != schema:  # delta-rs writes strings as string_view
                            rows = rows.cast(schema)
                        write(writer, rows.filter(keep.slice(at, batch.num_rows)))
                        at += batch.num_rows
                live = pc.invert(source.column(DELETED))
                write(writer, source.filter(live).drop_columns([DELETED]))
            now_ms = int(time.time() * 1000)
            actions: list[AddAction | RemoveAction] = [
                RemoveAction(file["path"], True, now_ms, file["size_bytes"], {}) for file in files
            ]
            if count:
                stats = {
                    "numRecords": count,
                    "minValues": {ID: min(bounds)},
                    "maxValues": {ID: max(bounds)},
                    "nullCount": nulls,
                }
                actions.append(
                    AddAction(
                        name,
                        target.stat().st_size,
                        {},
                        now_ms,
                        True,
                        json.dumps(stats, separators=(",", ":")),
                    )
                )
            if actions:
                table.create_write_transaction(
                    actions, "append", table.schema(), commit_properties=properties
                )
            else:  # only deletes of keys the table does not hold: the positions alone
                empty = pa.Table.from_pylist([], schema=schema)
                write_deltalake(table, empty, mode="append", commit_properties=properties)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        finally:
            if not count:
                target.unlink(missing_ok=True)
        held = pa.chunked_array([chunk for found in present for chunk in found.chunks], keys.type)
        in_table = pc.is_in(keys, value_set=held)
        deleted = source.column(DELETED)
        return {
            "version": DeltaTable(self.uri, storage_options=self.storage_options).version(),
            "inserted": pc.sum(pc.and_not(pc.invert(deleted), in_table)).as_py() or 0,
            "updated": pc.sum(pc.and_(pc.invert(deleted), in_table)).as_py() or 0,
            "deleted": pc.sum(pc.and_(deleted, in_table)).as_py() or 0,
            "swept": 0,
        }

    @staticmethod
    def _swept_updates(commit: Commit) -> dict[str, str]:
        applied = commit.columns[APPLIED_AT][0] if commit.columns[APPLIED_AT] else None
        updates = {quoted(DELETED): "true", quoted(OP): "'d'"}
        if applied is not None:
            updates[quoted(APPLIED_AT)] = (
                f"arrow_cast({int(applied)}, 'Timestamp(Microsecond, Some(\"UTC\"))')"
            )
        return updates

    def _count_swept(self, table: DeltaTable, sweep: int, soft: bool, keys: list[str] | None = None) -> int:
        """The table's rows a sweep removes: older than its generation and not in the batch."""

        def condition(batch: pa.RecordBatch):
            old = pc.less(batch.column(GENERATION), sweep)
            if keys:
                old = pc.and_(old, pc.invert(pc.is_in(batch.column(ID), _keys(keys, batch))))
            if soft:
                old = pc.and_(old, pc.invert(batch.column(DELETED)))
            return old

        columns = [ID, GENERATION, *([DELETED] if soft else [])]
        return _matching(table, columns, condition).num_rows

    def _state_only(
        self, table: DeltaTable, commit: Commit, layout: TableLayout, properties: CommitProperties
    ) -> dict[str, Any]:
        """A commit without rows: the sweep alone, or only the positions and snapshot state."""
        swept = self._count_swept(table, commit.sweep, layout.soft_delete) if commit.sweep is not None else 0
        if swept:  # delta-rs writes no commit for a delete or update that matches nothing
            old = f"{quoted(GENERATION)} < {int(commit.sweep)}"
            if layout.soft_delete:
                updates = self._swept_updates(commit)
                if APPLIED_AT not in commit.columns or not commit.columns[APPLIED_AT]:
                    updates.pop(quoted(APPLIED_AT), None)
                table.update(
                    predicate=f"{old} AND NOT {quoted(DELETED)}",
                    updates=updates,
                    commit_properties=properties,
                )
            else:
                table.delete(predicate=old, commit_properties=properties)
            return {"version": table.version(), "deleted": swept, "swept": swept}
        # The table's own schema: a commit of positions alone needs no layout (and may come from
        # `mongocdc tables reset-positions`, which knows none).
        empty = pa.Table.from_batches([], schema=pa.schema(table.schema()))
        write_deltalake(table, empty, mode="append", commit_properties=properties)
        return {
            "version": DeltaTable(self.uri, storage_options=self.storage_options).version(),
            "deleted": 0,
            "swept": 0,
        }

    # -- maintenance -------------------------------------------------------------------------------------
    def maintain(
        self, state: TableState, compact: bool, vacuum_retention_s: float | None, now_s: int
    ) -> dict[str, Any]:
        table = self.table()
        done: dict[str, Any] = {}
        if table is None:
            return done
        try:
            if compact:
                metrics = table.optimize.compact()
                done["compacted"] = {
                    "files_removed": metrics.get("numFilesRemoved", 0),
                    "files_added": metrics.get("numFilesAdded", 0),
                }
                self._table = None
                table = self.table()
                if done["compacted"]["files_removed"]:
                    # delta-rs's OPTIMIZE records no application transaction: when it ran goes in a
                    # commit of its own (no data), so that the schedule holds across runs.
                    empty = pa.Table.from_batches([], schema=pa.schema(table.schema()))
                    write_deltalake(
                        table,
                        empty,
                        mode="append",
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(compacted_app_id(state.topic), now_s)]
                        ),
                    )
                    self._table = None
                    table = self.table()
            if vacuum_retention_s is not None:
                # delta-rs takes whole hours: rounded up, so that no file younger than asked goes,
                # and never under the settings' minimum. Its own check (against the table's
                # delta.deletedFileRetentionDuration, a week by default) is off: the settings decide.
                hours = math.ceil(max(vacuum_retention_s, MIN_VACUUM_RETENTION_S) / 3600)
                removed = table.vacuum(
                    retention_hours=hours,
                    dry_run=False,
                    enforce_retention_duration=False,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(vacuumed_app_id(state.topic), now_s)]
                    ),
                )
                done["vacuumed"] = {"files_removed": len(removed)}
        except (DeltaError, OSError) as error:
            raise self._failed("compact or vacuum", error) from None
        finally:
            self._table = None
        if any(sum(part.values()) for part in done.values()):
            log.info("%s: maintenance %s", self.uri, done)
        return done
