"""The Iceberg adapter's rewrite of a batch, without Kafka: the data files that hold a batch's keys
are streamed into new files of the table's target size, the files that hold none stay, and a table
whose partition spec was changed by its owner is written through pyiceberg's own partitioned writer.
Read back by pyiceberg and polars (each must read the same rows)."""

from __future__ import annotations

import os

import polars
import pyarrow.parquet as pq
import pytest

from airflow_provider_mongocdc.core.apply.layout import ID, SOURCE_TS, TableLayout
from tests.integration.test_delta_rewrite import batch, doc

pytestmark = pytest.mark.integration
pytest.importorskip("pyiceberg")


def store(tmp_path):
    from airflow_provider_mongocdc.tables.iceberg import IcebergTableStore

    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}"}
    return IcebergTableStore(catalog, ("inventory", "items"))


def rows(table) -> dict[str, str]:
    """The table's documents by key, as pyiceberg and polars read them (the same for both)."""
    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    by_pyiceberg = {row[ID]: row["_doc"] for row in table.scan().to_arrow().to_pylist()}
    by_polars = dict(polars.scan_iceberg(table).select(ID, "_doc").collect().iter_rows())
    assert by_polars == by_pyiceberg
    return by_pyiceberg


def data_files(table) -> list:
    return [task.file for task in table.scan().plan_files()]


def test_a_rewrite_streams_into_files_of_the_target_size_and_keeps_the_files_without_batch_keys(tmp_path):
    layout = TableLayout()
    first = store(tmp_path)
    first.commit(batch([(f"a{n:05d}", doc(n, 0)) for n in range(3000)], 0, layout), layout, "items", "test")
    second = store(tmp_path)
    second.commit(batch([(f"z{n:05d}", doc(n, 0)) for n in range(10)], 3000, layout), layout, "items", "test")
    table = second.table()
    untouched = {f.file_path for f in data_files(table) if bytes(f.lower_bounds[1]).startswith(b"z")}
    with table.transaction() as transaction:  # files of about 100 KB of Arrow rows
        transaction.set_properties({"write.target-file-size-bytes": str(100_000)})

    changes = [(f"a{n:05d}", doc(n, 1)) for n in range(0, 3000, 3)] + [
        (f"a{n:05d}", None) for n in range(1, 60, 3)
    ]
    changes += [(f"b{n:05d}", doc(n, 2)) for n in range(500)]
    result = store(tmp_path).commit(batch(changes, 3010, layout), layout, "items", "test")

    reread = store(tmp_path)
    table = reread.table()
    expected = {
        f"a{n:05d}": doc(n, 1 if n % 3 == 0 else 0) for n in range(3000) if not (n % 3 == 1 and n < 60)
    }
    expected |= {f"b{n:05d}": doc(n, 2) for n in range(500)} | {f"z{n:05d}": doc(n, 0) for n in range(10)}
    assert rows(table) == expected
    assert (result["inserted"], result["updated"], result["deleted"]) == (500, 1000, 20), result
    files = data_files(table)
    assert untouched <= {f.file_path for f in files}  # the file without a batch key stays
    written = [f for f in files if f.file_path not in untouched]
    assert len(written) > 1 and sum(f.record_count for f in written) == len(expected) - 10, written
    for data_file in written:  # Iceberg's field ids in each file, whole _id bounds in the manifest
        schema = pq.read_schema(data_file.file_path.removeprefix("file://"))
        assert schema.field(ID).metadata[b"PARQUET:field_id"] == b"1"
        keys = pq.read_table(data_file.file_path.removeprefix("file://"), columns=[ID]).column(ID).to_pylist()
        assert (bytes(data_file.lower_bounds[1]).decode(), bytes(data_file.upper_bounds[1]).decode()) == (
            min(keys),
            max(keys),
        )
        assert data_file.null_value_counts[1] == 0 and data_file.value_counts[1] == len(keys)


def test_a_table_partitioned_by_its_owner_is_written_by_partition(tmp_path):
    from pyiceberg.transforms import IdentityTransform

    layout = TableLayout()
    first = store(tmp_path)
    first.commit(batch([(f"k{n:04d}", doc(n, 0)) for n in range(400)], 0, layout), layout, "items", "test")
    table = first.table()
    with table.update_spec() as update:
        update.add_field(SOURCE_TS, IdentityTransform(), "source_ts")

    changes = [(f"k{n:04d}", doc(n, 1)) for n in range(0, 400, 2)] + [
        (f"n{n:04d}", doc(n, 1)) for n in range(40)
    ]
    store(tmp_path).commit(batch(changes, 400, layout), layout, "items", "test")

    table = store(tmp_path).table()
    expected = {f"k{n:04d}": doc(n, 1 if n % 2 == 0 else 0) for n in range(400)}
    expected |= {f"n{n:04d}": doc(n, 1) for n in range(40)}
    assert rows(table) == expected
    assert {f.spec_id for f in data_files(table)} == {table.spec().spec_id}
    assert len(data_files(table)) == 2  # the rows of each batch's source time
