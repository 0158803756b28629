"""What the table formats' adapters share of Arrow: the Arrow types and schema of a table's layout,
and pyarrow's one look for pandas taken as absent in the apply's own processes."""

from __future__ import annotations

import bisect
import importlib.abc
import sys
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mongocdc.core.apply.layout import DELETED, TableLayout, decimal_digits

# Rows per batch when a table's file is read again to be rewritten: memory holds a batch, not the file.
REWRITE_BATCH_ROWS = 65_536
# Up to this many files, whether a file may hold a batch's keys is found by a pass over the keys per
# file; beyond, by sorting the keys once.
_FEW_FILES = 8

_SIMPLE_TYPES = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "binary": pa.binary(),
}


class _NoPandas(importlib.abc.MetaPathFinder):
    """An import of pandas fails while this finder is first on ``sys.meta_path``."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def keep_pandas_out_of_pyarrow() -> None:
    """Let pyarrow take pandas as absent, in a process that is the apply's alone (call it nowhere
    else). pyarrow imports pandas (installed with Airflow) the first time it converts anything, only
    to ask whether the value is a pandas object: about 0.3 CPU-s of imports, and the apply hands
    pyarrow no pandas object. pyarrow asks once per process and keeps the answer; it is asked here
    while an import of pandas fails. pandas stays importable for any other code."""
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])  # pyarrow's one look for pandas
    finally:
        sys.meta_path.remove(finder)


def arrow_type(layout_type: str) -> pa.DataType:
    """The Arrow type of a layout's type name (Delta's names: string, long, decimal(p,s)...)."""
    digits = decimal_digits(layout_type)
    if digits is not None:
        return pa.decimal128(*digits)
    return _SIMPLE_TYPES[layout_type]


def arrow_schema(layout: TableLayout, with_deleted: bool = False) -> pa.Schema:
    """The table's Arrow schema (``with_deleted``: the source's ``_deleted`` flag in hard-delete mode too)."""
    fields = [pa.field(name, arrow_type(kind), nullable) for name, kind, nullable in layout.columns()]
    if with_deleted and not layout.soft_delete:
        fields.append(pa.field(DELETED, pa.bool_(), False))
    return pa.schema(fields)


class BatchKeys:
    """A batch's keys, asked whether one of them lies within a file's ``_id`` bounds (the bounds
    inclusive, compared as UTF-8 bytes as Arrow and Python both compare strings): a pass over the
    keys for each of the first few files, then the keys sorted once (sorting 100 000 keys costs
    more than a few passes over them)."""

    def __init__(self, keys: pa.Array | pa.ChunkedArray):
        self._keys = keys
        self._asked = 0
        self._ordered: list[str] | None = None

    def within(self, low: str, high: str) -> bool:
        if not len(self._keys):
            return False
        self._asked += 1
        if self._ordered is None and self._asked <= _FEW_FILES:
            inside = pc.and_(pc.greater_equal(self._keys, low), pc.less_equal(self._keys, high))
            return bool(pc.any(inside).as_py())
        if self._ordered is None:
            self._ordered = sorted(self._keys.to_pylist())
        at = bisect.bisect_left(self._ordered, low)
        return at < len(self._ordered) and self._ordered[at] <= high
