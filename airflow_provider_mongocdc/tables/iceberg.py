"""The pyiceberg adapter of the apply: a collection's Apache Iceberg table as
:class:`~airflow_provider_mongocdc.core.apply.run.TableStore`.

The table is ``<namespace>.<collection>`` in a catalog (a SQL catalog on SQLite under the location
by default; a database, REST, Glue or Hive catalog from an Airflow ``iceberg`` connection), with
the apply's layout and ``_id`` as its identifier field. Each apply commit is ONE Iceberg snapshot,
committed through the catalog's atomic swap of the table's metadata: the data files that may hold
a batch's keys (by their ``_id`` bounds, kept whole: ``write.metadata.metrics.column._id=full``),
or with a sweep every file, are read, their rows without the batch's keys (and without the swept
ones) are written again with the batch's rows, and one overwrite replaces those files. The snapshot's
summary holds the table's whole apply state (the next offset per partition, the snapshot
generation, the snapshot under way, the topic's identity...) under the same names as the Delta
tables' application transactions, carried from snapshot to snapshot; a run reads them from the
current snapshot (walking back past snapshots written by anything else). A concurrent writer's
commit makes this one fail (the catalog refuses a commit whose base is not the table's current
metadata): nothing of it is applied, and the next run continues from the table as it is.

Maintenance: small files compacted into one (a snapshot of its own that carries the state), snapshots
older than the retention expired (the current one always kept), files no snapshot uses any more
removed (orphan files, on the local file system and fsspec stores). Every failure of pyiceberg, the
catalog or the storage becomes one :class:`~airflow_provider_mongocdc.core.base.errors.TableError` in
words; the table then stays at its last snapshot.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
    decimal_digits,
)
from airflow_provider_mongocdc.core.apply.state import TableState, compacted_app_id, vacuumed_app_id
from airflow_provider_mongocdc.core.apply.values import Misfits, column_values
from airflow_provider_mongocdc.core.base.errors import TableError
from airflow_provider_mongocdc.core.base.redaction import redact_secrets, redact_uri, secret_values
from airflow_provider_mongocdc.tables.arrow import REWRITE_BATCH_ROWS, BatchKeys, arrow_schema, arrow_type

log = logging.getLogger("airflow_provider_mongocdc.apply")

# The snapshot summary property that says a snapshot carries the apply's state.
STATE_MARK = "mongocdc.state"
# Iceberg's names of the layout's types (``str`` of a pyiceberg type), for comparing with a table.
_ICEBERG_NAMES = {
    "string": "string",
    "long": "long",
    "integer": "int",
    "short": "int",
    "byte": "int",
    "double": "double",
    "float": "float",
    "boolean": "boolean",
    "date": "date",
    "timestamp": "timestamptz",
    "binary": "binary",
}
TABLE_PROPERTIES = {
    # Whole _id bounds in the manifests: a batch's keys find the files that may hold them exactly.
    f"write.metadata.metrics.column.{ID}": "full",
    # No bounds of the documents (long texts no reader filters on by range).
    f"write.metadata.metrics.column.{DOCUMENT}": "counts",
    "format-version": "2",
    # A commit the catalog refuses (another writer's came first) fails: pyiceberg would otherwise
    # replay this snapshot's files on the other's, and the batch's rows would be there twice.
    "commit.retry.num-retries": "0",
    # Each commit writes the table's metadata anew: the last 20 kept, older ones removed by the commit.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
}
# Files below this size are compacted when compaction is due.
_SMALL_FILE_BYTES = 32 * 1024 * 1024


def iceberg_type_name(layout_type: str) -> str:
    digits = decimal_digits(layout_type)
    if digits is not None:
        return f"decimal({digits[0]}, {digits[1]})"
    return _ICEBERG_NAMES[layout_type]


class IcebergTableStore:
    """One collection's Iceberg table ``identifier`` (``(namespace, table)``) in the catalog of
    ``catalog_properties`` (pyiceberg's ``load_catalog`` properties)."""

    def __init__(
        self,
        catalog_properties: Mapping[str, str],
        identifier: tuple[str, str],
        *,
        conn_id: str | None = None,
        catalog_name: str = "mongocdc",
        uri: str | None = None,
    ):
        self.catalog_properties = dict(catalog_properties)
        self.identifier = identifier
        self.conn_id = conn_id
        self.catalog_name = catalog_name
        self.uri = uri or f"iceberg://{catalog_name}/{identifier[0]}/{identifier[1]}"
        self._catalog: Any = None
        self._table: Any = None
        self._loaded = False
        self._new_columns: list[str] = []
        self._stale_columns: list[str] = []
        self._secrets = secret_values(self.catalog_properties)

    # -- errors ------------------------------------------------------------------------------------------
    def _failed(self, what: str, error: BaseException) -> TableError:
        where = (
            f"the Iceberg connection {self.conn_id!r}"
            if self.conn_id
            else "the catalog (the tables' location)"
        )
        text = redact_secrets(redact_uri(" ".join(str(error).split())), self._secrets)[:500]
        return TableError(
            f"Could not {what} the Iceberg table {'.'.join(self.identifier)}",
            cause=f"{type(error).__name__}: {text}",
            fix=f"check that the catalog is reachable and may be written, and {where}; the table stays at "
            "its last snapshot, and the next run continues from there",
        )

    # -- the catalog and the table -----------------------------------------------------------------------
    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            uri = self.catalog_properties.get("uri", "")
            if self.catalog_properties.get("type") == "sql" and uri.startswith("sqlite:///"):
                Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            for attempt in range(3):
                try:
                    self._catalog = load_catalog(self.catalog_name, **self.catalog_properties)
                    break
                except Exception as error:  # pyiceberg raises many kinds for a catalog it cannot reach
                    # Two processes creating a new SQL catalog's tables at once: the second finds
                    # them made; it loads the catalog again.
                    if attempt < 2 and "already exists" in str(error):
                        time.sleep(0.2 * (attempt + 1))
                        continue
                    raise self._failed("reach the catalog of", error) from None
        return self._catalog

    def table(self) -> Any:
        if not self._loaded:
            from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

            catalog = self.catalog()
            try:
                self._table = catalog.load_table(self.identifier)
            except (NoSuchTableError, NoSuchNamespaceError):
                self._table = None
            except Exception as error:
                raise self._failed("read", error) from None
            self._loaded = True
        return self._table

    def _reload(self) -> None:
        self._table, self._loaded = None, False

    def _state_snapshot(self) -> Any:
        """The latest snapshot that carries the apply's state (maintenance by others skipped)."""
        table = self.table()
        if table is None:
            return None
        snapshot = table.current_snapshot()
        while snapshot is not None:
            if snapshot.summary is not None and snapshot.summary.get(STATE_MARK) == "1":
                return snapshot
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        return None

    def _state(self) -> dict[str, str]:
        snapshot = self._state_snapshot()
        if snapshot is None:
            return {}
        return {
            key: value
            for key, value in snapshot.summary.additional_properties.items()
            if key.startswith("mongocdc:")
        }

    def version(self) -> int | None:
        table = self.table()
        if table is None:
            return None
        snapshot = table.current_snapshot()
        return 0 if snapshot is None else int(snapshot.sequence_number)

    def app_version(self, app_id: str) -> int | None:
        value = self._state().get(app_id)
        return None if value is None else int(value)

    def description(self) -> str:
        table = self.table()
        if table is None:
            return ""
        return table.properties.get("comment", "")

    # -- the layout --------------------------------------------------------------------------------------
    def check_layout(self, layout: TableLayout) -> list[str]:
        table = self.table()
        if table is None:
            return []
        existing = {field.name: str(field.field_type) for field in table.schema().fields}
        missing = [name for name, _, _ in layout.columns() if name in SYSTEM_NAMES and name not in existing]
        if missing:
            raise TableError(
                f"The Iceberg table {'.'.join(self.identifier)} lacks the apply's column(s) {', '.join(missing)}",
                cause="it was written by something else, or with soft_delete off and now on"
                if missing == [DELETED]
                else "it was written by something else",
                fix="keep soft_delete as the table was created, or apply to another namespace",
            )
        if DELETED in existing and not layout.soft_delete:
            raise TableError(
                f"The Iceberg table {'.'.join(self.identifier)} keeps deleted documents (its column "
                f"{DELETED}): it was created with soft_delete on, and soft_delete is now off",
                cause="applying it with hard deletes would leave its rows marked deleted as they are",
                fix="set soft_delete back to true, or apply to another namespace",
            )
        for name, kind, _ in layout.columns():
            have = existing.get(name)
            if have is not None and have != iceberg_type_name(kind):
                raise TableError(
                    f"The column {name} of the Iceberg table {'.'.join(self.identifier)} is {have}, but it is "
                    f"declared {kind}",
                    cause="a declared column's type cannot change in place",
                    fix=f"declare the field as a new column name, or keep {have}",
                )
        declared = {column.name for column in layout.declared}
        self._new_columns = [column.name for column in layout.declared if column.name not in existing]
        self._stale_columns = [name for name in existing if name not in SYSTEM_NAMES and name not in declared]
        notes = []
        if self._new_columns:
            notes.append(f"new declared column(s) {', '.join(self._new_columns)}: added and filled from _doc")
        if self._stale_columns:
            notes.append(
                f"column(s) {', '.join(self._stale_columns)} are no longer declared: rows written from now on "
                "have null there"
            )
        return notes

    def stale_columns(self) -> list[str]:
        return list(self._stale_columns)

    def evolve(
        self, layout: TableLayout, refill: list[str] = (), versions: Mapping[str, int] | None = None
    ) -> list[str]:
        """The declared columns new to the table added, and those and the ``refill`` ones filled from
        ``_doc``, in one transaction (the schema's update and one overwrite snapshot)."""
        table = self.table()
        refilled = [name for name in refill if name not in self._new_columns]
        if table is None or not (self._new_columns or refilled):
            return []
        columns = [column for column in layout.declared if column.name in (*self._new_columns, *refilled)]
        only = TableLayout(tuple(columns))
        misfits = Misfits()
        try:
            transaction = table.transaction()
            if self._new_columns:
                from pyiceberg.io.pyarrow import pyarrow_to_schema  # noqa: F401 (pyarrow's schema visitor)

                with transaction.update_schema() as update:
                    for column in columns:
                        if column.name in self._new_columns:
                            update.add_column(column.name, _iceberg_type(column.type))
            schema = transaction.table_metadata.schema().as_arrow()
            removed = []
            sink = _DataFiles(transaction.table_metadata, table.io)
            for task in table.scan().plan_files():
                rows = self._read(table, task.file.file_path)
                keys = rows.column(ID).to_pylist()
                documents = rows.column(DOCUMENT).to_pylist()
                values = [
                    column_values(only, key, document, misfits) for key, document in zip(keys, documents)
                ]
                for index, column in enumerate(columns):
                    array = pa.array([row[index] for row in values], arrow_type(column.type))
                    if column.name in rows.column_names:
                        rows = rows.set_column(rows.column_names.index(column.name), column.name, array)
                    else:
                        rows = rows.append_column(column.name, array)
                removed.append(task.file)
                sink.write(_cast(rows, schema))
            self._overwrite(transaction, removed, sink.close(), self._carried(versions or {}))
            transaction.commit_transaction()
        except TableError:
            raise
        except Exception as error:
            raise self._failed("add columns to", error) from None
        finally:
            self._reload()
        for line in misfits.describe(only.declared):
            log.warning("%s: %s", self.uri, line)
        self._new_columns = []
        return [f"column(s) {', '.join(refilled)} declared again: filled again from _doc"] if refilled else []

    # -- reading -----------------------------------------------------------------------------------------
    def documents(self, keys: list[str]) -> dict[str, str]:
        table = self.table()
        if table is None or not keys:
            return {}
        from pyiceberg.expressions import In

        try:
            found = table.scan(row_filter=In(ID, set(keys)), selected_fields=(ID, DOCUMENT)).to_arrow()
        except Exception as error:
            raise self._failed("read", error) from None
        return {
            key: document
            for key, document in zip(found.column(ID).to_pylist(), found.column(DOCUMENT).to_pylist())
            if document
        }

    def _read(self, table: Any, path: str) -> pa.Table:
        with table.io.new_input(path).open() as stream:
            return pq.read_table(stream)

    # -- writing -----------------------------------------------------------------------------------------
    def _carried(
        self, versions: Mapping[str, int], metadata: Mapping[str, Any] | None = None
    ) -> dict[str, str]:
        """The snapshot summary properties of a new snapshot: the state carried from the last one,
        with ``versions`` (and the commit's ``metadata``, as JSON text) over it."""
        properties = dict(self._state())
        properties.update({key: str(int(value)) for key, value in versions.items()})
        for key, value in (metadata or {}).items():
            properties[key] = json.dumps(value, separators=(",", ":"))
        properties[STATE_MARK] = "1"
        return properties

    def _overwrite(
        self, transaction: Any, removed: list[Any], files: list[Any], properties: dict[str, str]
    ) -> None:
        """One snapshot of ``transaction``: ``removed`` data files out, the new data ``files`` in."""
        if not removed and not files:
            empty = pa.Table.from_batches([], schema=transaction.table_metadata.schema().as_arrow())
            transaction.append(empty, snapshot_properties=properties)
            return
        with transaction.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for data_file in removed:
                overwrite.delete_data_file(data_file)
            for data_file in files:
                overwrite.append_data_file(data_file)

    def commit(self, commit: Commit, layout: TableLayout, name: str, description: str) -> dict[str, Any]:
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError

        try:
            table = self.table()
            if table is None:
                return self._create(commit, layout, description)
            return self._rewrite(table, commit, layout)
        except (CommitFailedException, TableAlreadyExistsError) as error:
            raise TableError(
                f"Another writer committed to the Iceberg table {'.'.join(self.identifier)} while this apply "
                "prepared its commit",
                cause=f"the catalog refused the commit: {' '.join(str(error).split())[:300]}",
                fix="give each table one apply (the connector's pool does); nothing of this batch was applied, "
                "and the next run continues from the table as it is",
            ) from None
        except TableError:
            raise
        except Exception as error:
            raise self._failed("write", error) from None
        finally:
            self._reload()

    def _data(self, commit: Commit, layout: TableLayout) -> pa.Table:
        schema = arrow_schema(layout, with_deleted=True)
        return pa.table({name: commit.columns[name] for name in schema.names}, schema=schema)

    def _create(self, commit: Commit, layout: TableLayout, description: str) -> dict[str, Any]:
        catalog = self.catalog()
        namespace, _ = self.identifier
        try:
            catalog.create_namespace_if_not_exists(namespace)
        except Exception as error:
            # Two writers creating it at one moment: the second one's insert fails in some catalogs
            # (the SQL catalog's unique key) although the namespace now exists.
            if not _namespace_exists(catalog, namespace):
                raise TableError(
                    f"The Iceberg namespace {namespace!r} cannot be created",
                    cause=f"{type(error).__name__}: {redact_secrets(redact_uri(str(error)), self._secrets)[:300]}",
                    fix="create the namespace in the catalog, or give the catalog's principal the right to create "
                    "namespaces, or set 'namespace_prefix' to one it may use",
                ) from None
        data = self._data(commit, layout)
        if not layout.soft_delete:
            data = data.filter(pc.invert(data.column(DELETED))).drop_columns([DELETED])
        schema = arrow_schema(layout)
        transaction = catalog.create_table_transaction(
            self.identifier, schema=schema, properties={**TABLE_PROPERTIES, "comment": description}
        )
        with transaction.update_schema() as update:
            update.set_identifier_fields(ID)
        properties = self._carried(commit.versions, commit.metadata)
        transaction.append(
            _cast(data, transaction.table_metadata.schema().as_arrow()), snapshot_properties=properties
        )
        transaction.commit_transaction()
        return {"version": 1, "inserted": data.num_rows, "deleted": 0, "swept": 0, "created": True}

    def _rewrite(self, table: Any, commit: Commit, layout: TableLayout) -> dict[str, Any]:
        """The batch's rows, the rows they replace or delete, and the sweep, in one snapshot. A file
        that may hold a batch key is read key column first; only a file that holds one (or a row the
        sweep takes) is rewritten, streamed batch by batch into the new data file with the batch's rows."""
        if commit.rows == 0 and commit.sweep is None:  # the positions and state alone
            transaction = table.transaction()
            self._overwrite(transaction, [], [], self._carried(commit.versions, commit.metadata))
            transaction.commit_transaction()
            self._reload()
            return {"version": self.version(), "inserted": 0, "updated": 0, "deleted": 0, "swept": 0}
        data = self._data(commit, layout)
        soft = layout.soft_delete
        schema = table.schema().as_arrow()
        keys = data.column(ID).cast(schema.field(ID).type)
        applied = commit.columns[APPLIED_AT][0] if commit.columns.get(APPLIED_AT) else int(time.time() * 1e6)
        removed: list[Any] = []
        held: list[pa.ChunkedArray] = []
        previous: list[pa.Table] = []  # with soft deletes: the rows a batch's delete marks
        swept = 0
        sweep = commit.sweep
        batch = BatchKeys(keys)
        sink = _DataFiles(table.metadata, table.io)
        try:
            for task in table.scan().plan_files():
                if sweep is not None and task.file.record_count == 0:
                    continue
                if sweep is None and not _may_hold(task.file, batch):
                    continue
                with table.io.new_input(task.file.file_path).open() as stream:
                    parquet = pq.ParquetFile(stream)
                    heads = [ID] + ([GENERATION] + ([DELETED] if soft else []) if sweep is not None else [])
                    head = parquet.read(columns=heads, use_threads=False)
                    ids = head.column(ID).cast(keys.type)
                    hit = (
                        pc.is_in(ids, value_set=keys)
                        if len(keys)
                        else pa.chunked_array([pa.array([False] * head.num_rows)])
                    ).combine_chunks()
                    old = None  # the rows the sweep takes (not the batch's)
                    if sweep is not None:
                        old = pc.and_(pc.less(head.column(GENERATION), sweep), pc.invert(hit))
                        if soft:
                            old = pc.and_(old, pc.invert(head.column(DELETED)))
                        old = old.combine_chunks()
                    if not pc.any(hit if old is None else pc.or_(hit, old)).as_py():
                        continue  # its bounds hold a key, its rows do not: it stays
                    removed.append(task.file)
                    held.append(ids.filter(hit))
                    count = 0 if old is None else pc.sum(old).as_py() or 0
                    swept += count
                    drop = pc.or_(hit, old) if count and not soft else hit
                    keep = pc.invert(drop)
                    at = 0
                    for chunk in parquet.iter_batches(batch_size=REWRITE_BATCH_ROWS, use_threads=False):
                        rows = pa.Table.from_batches([chunk])
                        size = chunk.num_rows
                        if soft:
                            previous.append(rows.filter(hit.slice(at, size)))
                        survivors = rows.filter(keep.slice(at, size))
                        if count and soft:
                            marked = old.slice(at, size).filter(keep.slice(at, size))
                            if pc.any(marked).as_py():
                                survivors = _marked_deleted(survivors, marked, applied)
                        sink.write(_cast(survivors, schema))
                        at += size
            in_table = (
                pc.is_in(keys, value_set=pa.chunked_array([c for h in held for c in h.chunks], keys.type))
                if held
                else pa.chunked_array([pa.array([False] * len(keys))])
            )
            deleted = data.column(DELETED)
            live = data.filter(pc.invert(deleted))
            if soft:
                sink.write(_cast(live, schema))
                gone = data.filter(pc.and_(deleted, in_table))
                if gone.num_rows and previous:
                    sink.write(_cast(_keep_documents(gone, pa.concat_tables(previous), layout), schema))
            else:
                sink.write(_cast(live.drop_columns([DELETED]), schema))
            files = sink.close()
        except BaseException:
            sink.abandon()
            raise
        transaction = table.transaction()
        self._overwrite(transaction, removed, files, self._carried(commit.versions, commit.metadata))
        transaction.commit_transaction()
        self._reload()
        return {
            "version": self.version(),
            "inserted": pc.sum(pc.and_not(pc.invert(deleted), in_table)).as_py() or 0,
            "updated": pc.sum(pc.and_(pc.invert(deleted), in_table)).as_py() or 0,
            "deleted": (pc.sum(pc.and_(deleted, in_table)).as_py() or 0) + swept,
            "swept": swept,
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
                small = [
                    task.file
                    for task in table.scan().plan_files()
                    if task.file.file_size_in_bytes < _SMALL_FILE_BYTES
                ]
                if len(small) > 1:
                    schema = table.schema().as_arrow()
                    sink = _DataFiles(table.metadata, table.io)
                    for data_file in small:
                        sink.write(_cast(self._read(table, data_file.file_path), schema))
                    transaction = table.transaction()
                    self._overwrite(
                        transaction,
                        small,
                        sink.close(),
                        self._carried({compacted_app_id(state.topic): now_s}),
                    )
                    transaction.commit_transaction()
                    self._reload()
                    table = self.table()
                done["compacted"] = {
                    "files_removed": len(small) if len(small) > 1 else 0,
                    "files_added": 1 if len(small) > 1 else 0,
                }
            if vacuum_retention_s is not None:
                expired = self._expire(table, now_s - vacuum_retention_s)
                orphans = self._remove_orphans(table, now_s - vacuum_retention_s)
                transaction = table.transaction()
                self._overwrite(transaction, [], [], self._carried({vacuumed_app_id(state.topic): now_s}))
                transaction.commit_transaction()
                done["vacuumed"] = {"snapshots_expired": expired, "files_removed": orphans}
        except TableError:
            raise
        except Exception as error:
            raise self._failed("compact or vacuum", error) from None
        finally:
            self._reload()
        if any(sum(part.values()) for part in done.values()):
            log.info("%s: maintenance %s", self.uri, done)
        return done

    def _expire(self, table: Any, cutoff_s: float) -> int:
        """Snapshots made before ``cutoff_s`` (the apply's clock less the retention) expired, the
        current one kept."""
        current = table.current_snapshot()
        old = [
            snapshot.snapshot_id
            for snapshot in table.snapshots()
            if snapshot.timestamp_ms < cutoff_s * 1000
            and (current is None or snapshot.snapshot_id != current.snapshot_id)
        ]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
            self._reload()
        return len(old)

    def _remove_orphans(self, table: Any, cutoff_s: float) -> int:
        """Files under the table's location that no snapshot uses, last modified before ``cutoff_s``,
        removed (local file systems and fsspec stores; others: none): data files, and the manifests
        and manifest lists of expired snapshots (the metadata files are the commits' to remove)."""
        table = self.table()
        used: set[str] = set()
        for snapshot in table.snapshots():
            used.add(_path(snapshot.manifest_list))
            for manifest in snapshot.manifests(table.io):
                used.add(_path(manifest.manifest_path))
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                    used.add(_path(entry.data_file.file_path))
        location = table.location().rstrip("/")
        try:
            import fsspec

            filesystem, root = fsspec.core.url_to_fs(location + "/data")
            listed = filesystem.find(root, detail=True)
            _, metadata_root = fsspec.core.url_to_fs(location + "/metadata")
            listed.update(
                (name, info)
                for name, info in filesystem.find(metadata_root, detail=True).items()
                if name.endswith(".avro")
            )
        except (ImportError, ValueError, FileNotFoundError, OSError):
            return 0
        removed = 0
        for name, info in listed.items():
            if _path(name) in used:
                continue
            modified = info.get("mtime") or info.get("LastModified")
            stamp = modified.timestamp() if hasattr(modified, "timestamp") else modified
            if stamp is not None and float(stamp) < cutoff_s:
                filesystem.rm_file(name)
                removed += 1
        return removed


class _DataFiles:
    """New data files of a table (its ``metadata`` and ``io``), from Arrow tables of its schema written
    one after the other: an unpartitioned table's are streamed into Parquet files of about the
    table's target size (``write.target-file-size-bytes``, in Arrow bytes as pyiceberg counts it),
    with the table's Parquet settings and dictionaries only for the columns of few values (not the
    keys or the documents); any other table's rows are gathered and written by pyiceberg's writer
    (one file per partition)."""

    def __init__(self, metadata: Any, io: Any):
        from pyiceberg.schema import sanitize_column_names
        from pyiceberg.utils.properties import property_as_int

        self._metadata, self._io = metadata, io
        schema = metadata.schema()
        self._streamed = metadata.spec().is_unpartitioned() and sanitize_column_names(schema) == schema
        self._target = property_as_int(metadata.properties, "write.target-file-size-bytes", 512 * 1024 * 1024)
        self._gathered: list[pa.Table] = []
        self._writer: Any = None
        self._output: Any = None
        self._path = ""
        self._bytes = 0
        self._paths: list[str] = []
        self._files: list[Any] = []

    def write(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        if not self._streamed:
            self._gathered.append(rows)
            return
        if self._writer is None:
            self._open(rows.column_names)
        self._writer.write(rows)
        self._bytes += rows.nbytes
        if self._bytes >= self._target:
            self._finish()

    def _open(self, names: list[str]) -> None:
        from pyiceberg.io.pyarrow import ParquetFormatWriter
        from pyiceberg.table.locations import load_location_provider

        provider = load_location_provider(
            table_location=self._metadata.location, table_properties=self._metadata.properties
        )
        self._path = provider.new_data_location(data_file_name=f"00000-0-{uuid.uuid4()}.parquet")
        self._paths.append(self._path)
        self._output = self._io.new_output(self._path)
        self._writer = ParquetFormatWriter(self._output, self._metadata.schema(), self._metadata.properties)
        # The keys and the documents are all distinct: a dictionary of them is built only to be dropped.
        self._writer._parquet_writer_kwargs["use_dictionary"] = [n for n in names if n not in (ID, DOCUMENT)]

    def _finish(self) -> None:
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        writer, self._writer, self._bytes = self._writer, None, 0
        statistics = writer.close()
        self._files.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=self._path,
                file_format=FileFormat.PARQUET,
                partition=Record(),
                file_size_in_bytes=len(self._output),
                sort_order_id=None,
                spec_id=self._metadata.default_spec_id,
                equality_ids=None,
                key_metadata=None,
                **statistics.to_serialized_dict(),
            )
        )

    def close(self) -> list[Any]:
        """The data files written (to add in one snapshot)."""
        if self._writer is not None:
            self._finish()
        if self._gathered:
            from pyiceberg.io.pyarrow import _dataframe_to_data_files

            rows, self._gathered = pa.concat_tables(self._gathered), []
            self._files.extend(_dataframe_to_data_files(self._metadata, rows, self._io))
        return self._files

    def abandon(self) -> None:
        """After a failure: the files written so far removed (no snapshot holds them)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # the failure being raised is the one that counts
                pass
        for path in self._paths:
            try:
                self._io.delete(path)
            except Exception:
                pass


def _namespace_exists(catalog: Any, namespace: str) -> bool:
    try:
        return bool(catalog.namespace_exists(namespace))
    except Exception:
        return False


def _path(uri: str) -> str:
    """A file's path without its scheme and authority's ``file://`` (to compare listings)."""
    return uri.split("://", 1)[1].lstrip("/") if "://" in uri else uri.lstrip("/")


def _iceberg_type(layout_type: str) -> Any:
    from pyiceberg.io.pyarrow import pyarrow_to_schema
    from pyiceberg.table.name_mapping import MappedField, NameMapping

    schema = pyarrow_to_schema(
        pa.schema([pa.field("x", arrow_type(layout_type))]),
        name_mapping=NameMapping([MappedField(field_id=1, names=["x"])]),
    )
    return schema.fields[0].field_type


def _cast(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` as the table's Arrow schema (its columns in order, nulls for missing ones)."""
    columns = []
    for field in schema:
        if field.name in rows.column_names:
            columns.append(rows.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(rows.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _may_hold(data_file: Any, keys: BatchKeys) -> bool:
    """Whether a data file's ``_id`` bounds (whole: the table's metrics mode for ``_id`` is full)
    may hold one of a batch's keys; a file without bounds may."""
    lower, upper = (data_file.lower_bounds or {}).get(1), (data_file.upper_bounds or {}).get(1)
    if lower is None or upper is None:
        return True
    return keys.within(bytes(lower).decode("utf-8", "replace"), bytes(upper).decode("utf-8", "replace"))


def _marked_deleted(rows: pa.Table, mask: pa.Array, applied_us: int) -> pa.Table:
    """With soft deletes: the swept rows marked deleted (``_op`` d, ``_deleted``, ``_applied_at``)."""
    index = rows.column_names.index
    rows = rows.set_column(index(DELETED), DELETED, pc.or_(rows.column(DELETED), mask))
    rows = rows.set_column(index(OP), OP, pc.if_else(mask, "d", rows.column(OP)))
    stamp = pa.scalar(applied_us, pa.timestamp("us", tz="UTC"))
    return rows.set_column(
        index(APPLIED_AT), APPLIED_AT, pc.if_else(mask, stamp, rows.column(APPLIED_AT).cast(stamp.type))
    )


def _keep_documents(gone: pa.Table, previous: pa.Table, layout: TableLayout) -> pa.Table:
    """With soft deletes: a deleted key's row keeps its last ``_doc`` and declared columns (the
    batch's delete sets the rest), as the Delta tables' MERGE does."""
    kept = [DOCUMENT, *(column.name for column in layout.declared)]
    last = {key: index for index, key in enumerate(previous.column(ID).to_pylist())}
    picks = [last.get(key) for key in gone.column(ID).to_pylist()]
    rows = gone
    for name in kept:
        if name not in previous.column_names:
            continue
        values = previous.column(name).take(pa.array(picks, pa.int64()))
        if name in rows.column_names:
            rows = rows.set_column(rows.column_names.index(name), name, values)
    return rows
