"""The Java JSON writer's texts (core/events/java_json.py, orjson fast path included) on generated BSON
documents equal the MongoDB Java driver's own (devtools/interop): Debezium's getDocumentValue
(strict, compact) and getDocumentId (relaxed), ``BsonDocument.toJson()`` (updatedFields) and the
relaxed and canonical modes in Debezium's compact layout."""

from __future__ import annotations

import random

import pytest
from bson.errors import InvalidDocument

from airflow_provider_mongocdc.core.events.java_json import document_writer, key_writer, updated_fields_writer
from tests.interop.support import as_read
from tests.unit.test_ejson_fast_path import generated, plain_document

pytestmark = pytest.mark.interop

WRITERS = {
    "value": document_writer("strict"),
    "toJson": updated_fields_writer("strict"),
    "relaxed": document_writer("relaxed"),
    "canonical": document_writer("canonical"),
}
KEY = key_writer("relaxed")


def documents():
    rng = random.Random("interop-fast-path")
    for index in range(120):
        yield (
            {"_id": index, **plain_document(rng, index)}
            if index % 3 == 0
            else {"_id": index, **generated(rng)}
        )


def test_generated_documents_are_written_as_the_java_driver_writes_them(harness):
    checked = fast = 0
    for source in documents():
        try:
            raw, document = as_read(source)
        except (InvalidDocument, UnicodeEncodeError, ValueError, OverflowError):
            continue  # a value BSON cannot hold (lone surrogate, key with NUL, int beyond 64 bits)
        texts = harness.document(raw)
        assert texts["ok"], texts
        for name, writer in WRITERS.items():
            assert writer.dumps(document) == texts[name], f"{name} of {source!r}"
        assert KEY.dumps(document["_id"]) == texts["key"]
        checked += 1
        fast += WRITERS["value"]._fast.text(document) is not None
    assert checked >= 100
    assert fast >= 40, f"the fast path wrote {fast} of {checked} documents"
