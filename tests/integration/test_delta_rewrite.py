"""The apply's commit without a MERGE (airflow_provider_mongocdc/tables/delta.py, ``DeltaTableStore._rewrite``): the
same batches committed to two copies of a table, one through delta-rs's MERGE and one through the
rewrite of the files that may hold a batch's keys, give the same rows, the same positions and the same
counts; a file whose keys no batch touches stays as it is; files written by delta-rs's MERGE
(strings as string_view) are read too; a table with settings the rewrite does not honour goes
through the MERGE; two writers rewriting the same file conflict, and the second changes nothing.
deltalake's own reader reads the tables (no Kafka needed)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_mongocdc.core.apply.batch import Commit
from airflow_provider_mongocdc.core.apply.layout import (
    APPLIED_AT,
    DELETED,
    DOCUMENT,
    GENERATION,
    ID,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
    OP,
    SOURCE_ORD,
    SOURCE_TS,
    TXN,
    DeclaredColumn,
    TableLayout,
)
from airflow_provider_mongocdc.core.base.errors import TableError
from airflow_provider_mongocdc.tables import arrow as arrow_tables
from airflow_provider_mongocdc.tables.delta import DeltaTableStore

pytestmark = pytest.mark.integration

TOPIC = "shop.inventory.items"
APP = f"mongocdc-{TOPIC}"


def batch(changes: list[tuple[str, str | None]], offset: int, layout: TableLayout) -> Commit:
    """A commit of ``changes`` (key, document; None: deleted) at ``offset`` onwards."""
    count = len(changes)
    columns = {
        ID: [key for key, _ in changes],
        DOCUMENT: [document for _, document in changes],
        OP: ["d" if document is None else "u" for _, document in changes],
        SOURCE_TS: [1_700_000_000_000_000 + offset] * count,
        SOURCE_ORD: [1] * count,
        TXN: [None] * count,
        KAFKA_PARTITION: [0] * count,
        KAFKA_OFFSET: list(range(offset, offset + count)),
        APPLIED_AT: [1_800_000_000_000_000] * count,
        GENERATION: [1] * count,
        DELETED: [document is None for _, document in changes],
    }
    for column in layout.declared:
        columns[column.name] = [None if document is None else len(document) for _, document in changes]
    deletes = sum(document is None for _, document in changes)
    metadata = {"mongocdc.topic": TOPIC}
    return Commit(columns, None, {APP: offset + count}, metadata, count, deletes)


def doc(key: int, version: int) -> str:
    return f'{{"_id": {key}, "v": {version}}}'


def rows(uri) -> list[dict]:
    table = DeltaTable(str(uri))
    return sorted(table.to_pyarrow_table().to_pylist(), key=lambda row: row[ID])


def operations(uri) -> list[str]:
    return [entry["operation"] for entry in reversed(DeltaTable(str(uri)).history())]


def apply_both(tmp_path, batches, layout, monkeypatch, prepare=None):
    """The batches committed through the MERGE and through the rewrite; the two tables' paths."""
    merged, rewritten = tmp_path / "merged", tmp_path / "rewritten"
    for uri in (merged, rewritten):
        DeltaTableStore(str(uri)).commit(batches[0], layout, "inventory.items", "test table")
        if prepare is not None:
            prepare(uri)
    results = {}
    for uri in (merged, rewritten):
        with monkeypatch.context() as patch:
            if uri == merged:
                patch.setattr(DeltaTableStore, "_rewritable", lambda *args: False)
            found = []
            for commit in batches[1:]:
                store = DeltaTableStore(str(uri))
                store.check_layout(layout)
                result = store.commit(commit, layout, "inventory.items", "test table")
                found.append({name: result.get(name) for name in ("inserted", "updated", "deleted")})
            results[uri] = found
    assert results[merged] == results[rewritten]
    assert rows(merged) == rows(rewritten)
    assert DeltaTable(str(merged)).transaction_version(APP) == DeltaTable(str(rewritten)).transaction_version(
        APP
    )
    return merged, rewritten


@pytest.mark.parametrize("few_files", [8, 0], ids=["a-pass-per-file", "keys-sorted-once"])
def test_the_rewrite_writes_what_the_merge_writes_and_keeps_untouched_files(tmp_path, monkeypatch, few_files):
    # Which files may hold a batch's keys is found either way (few files: a pass over the keys each).
    monkeypatch.setattr(arrow_tables, "_FEW_FILES", few_files)
    layout = TableLayout()
    first = batch([(str(key), doc(key, 0)) for key in range(100, 200)], 0, layout)
    low = batch([(str(key), doc(key, 0)) for key in range(300, 400)], 100, layout)  # a file of its own
    changes = [
        ("150", doc(150, 1)),  # an update
        ("151", None),  # a delete
        ("250", doc(250, 1)),  # an insert of a new key
        ("260", None),  # a delete of a key the table never held
    ]
    again = [("150", None), ("152", doc(152, 2)), ("250", doc(250, 2))]
    merged, rewritten = apply_both(
        tmp_path,
        [first, low, batch(changes, 200, layout), batch(again, 204, layout)],
        layout,
        monkeypatch,
    )
    assert operations(merged)[-2:] == ["MERGE", "MERGE"]
    assert operations(rewritten)[-2:] == ["WRITE", "WRITE"]
    table = {row[ID]: row for row in rows(rewritten)}
    assert "150" not in table and "151" not in table and "260" not in table
    assert table["250"][DOCUMENT] == doc(250, 2) and table["152"][DOCUMENT] == doc(152, 2)
    assert len(table) == 100 + 100 - 2 + 1  # 150 and 151 deleted, 250 inserted
    # The file of keys 300-399 is in every version since it was written: no batch key in its range.
    kept = [
        path
        for path in DeltaTable(str(rewritten)).file_uris()
        if path in set(DeltaTable(str(rewritten), version=1).file_uris())
    ]
    assert len(kept) == 1
    # A new key inside a file's _id bounds ("1500" sorts between "150" and "152") but in none of
    # its rows: every file stays, the new row goes in a file of its own.
    before_files = set(DeltaTable(str(rewritten)).file_uris())
    DeltaTableStore(str(rewritten)).commit(
        batch([("1500", doc(1500, 0))], 206, layout), layout, "inventory.items", "t"
    )
    after_files = set(DeltaTable(str(rewritten)).file_uris())
    assert before_files < after_files and len(after_files - before_files) == 1
    # Only deletes of keys the table does not hold: the positions move, the rows do not.
    store = DeltaTableStore(str(rewritten))
    before = rows(rewritten)
    store.commit(batch([("999", None)], 207, layout), layout, "inventory.items", "test table")
    assert rows(rewritten) == before and DeltaTable(str(rewritten)).transaction_version(APP) == 208


def test_files_written_by_the_merge_and_declared_columns_are_rewritten_alike(tmp_path, monkeypatch):
    layout = TableLayout((DeclaredColumn("size", "v", "long"),))
    first = batch([(str(key), doc(key, 0)) for key in range(1000)], 0, layout)

    def merge_once(uri):  # the table's one file written by delta-rs's MERGE (string_view columns)
        with monkeypatch.context() as patch:
            patch.setattr(DeltaTableStore, "_rewritable", lambda *args: False)
            DeltaTableStore(str(uri)).commit(
                batch([(str(key), doc(key, 1)) for key in range(0, 1000, 7)], 1000, layout),
                layout,
                "inventory.items",
                "test table",
            )

    changes = [(str(key), None if key % 3 == 0 else doc(key, 2)) for key in range(0, 1200, 5)]
    merged, rewritten = apply_both(
        tmp_path, [first, batch(changes, 2000, layout)], layout, monkeypatch, prepare=merge_once
    )
    assert operations(rewritten)[-1] == "WRITE"
    assert pa.table(DeltaTable(str(rewritten)).get_add_actions(flatten=True)).column(
        "num_records"
    ).to_pylist() == [len(rows(rewritten))]


def test_a_table_with_settings_the_rewrite_does_not_honour_is_merged(tmp_path, monkeypatch):
    layout = TableLayout()
    first = batch([(str(key), doc(key, 0)) for key in range(10)], 0, layout)

    def append_only_off(uri):  # any table setting: the MERGE, which honours them all
        DeltaTable(str(uri)).alter.set_table_properties({"delta.appendOnly": "false"})

    merged, rewritten = apply_both(
        tmp_path,
        [first, batch([("3", doc(3, 1)), ("4", None)], 10, layout)],
        layout,
        monkeypatch,
        prepare=append_only_off,
    )
    assert operations(rewritten)[-1] == "MERGE"


def test_two_writers_rewriting_the_same_file_conflict_and_the_second_changes_nothing(tmp_path):
    layout = TableLayout()
    uri = str(tmp_path / "table")
    DeltaTableStore(uri).commit(
        batch([(str(k), doc(k, 0)) for k in range(100)], 0, layout), layout, "a.b", "t"
    )
    first, second = DeltaTableStore(uri), DeltaTableStore(uri)
    for store in (first, second):
        store.check_layout(layout)
        store.table()  # both read version 0
    first.commit(batch([("5", doc(5, 1))], 100, layout), layout, "a.b", "t")
    with pytest.raises(TableError, match="concurrent transaction"):
        second.commit(batch([("6", doc(6, 1))], 100, layout), layout, "a.b", "t")
    table = {row[ID]: row[DOCUMENT] for row in rows(uri)}
    assert len(table) == 100 and table["5"] == doc(5, 1) and table["6"] == doc(6, 0)
    assert operations(uri) == ["WRITE", "WRITE"]


def test_the_apply_process_uses_the_system_allocator_and_leaves_pandas_out_of_pyarrow():
    """The apply application's own process: Arrow's memory from the C library's allocator, and
    pyarrow's conversions without importing pandas, which stays importable."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from airflow_provider_mongocdc.spark_apps import delta_apply\n"
        "from airflow_provider_mongocdc.tables import arrow\n"
        "import pyarrow as pa\n"
        "arrow.keep_pandas_out_of_pyarrow()\n"
        "table = pa.table({'a': ['x', 'y']}).filter(pa.array([True, False]))\n"
        "print(pa.default_memory_pool().backend_name, 'pandas' in sys.modules, table.num_rows)\n"
        "import pandas\n"
        "print(pa.array(pandas.Series([1, 2])).to_pylist())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["system False 1", "[1, 2]"]
