"""``$changeStreamSplitLargeEvent`` (MongoDB 7.0 / 6.0.9): events over 16 MB come as fragments
``splitEvent: {fragment: n, of: m}`` with their own resume tokens; the stage must be last;
resuming from a fragment's token continues with the next fragment, from the last one with the
next event."""

from __future__ import annotations

import pytest
from bson import encode
from pymongo.errors import OperationFailure

from tests.fidelity.streams import next_event

pytestmark = pytest.mark.fidelity

SPLIT = {"$changeStreamSplitLargeEvent": {}}
BIG = 9 * 1024 * 1024  # updateDescription + fullDocument (updateLookup) of this: about 18 MB


def _large_update(db):
    db.c.insert_one({"_id": 1, "a": "x"})
    db.c.update_one({"_id": 1}, {"$set": {"a": "y" * BIG}})
    db.c.insert_one({"_id": 2})


def test_large_event_comes_as_fragments_with_their_own_tokens(db):
    with db.c.watch([SPLIT], full_document="updateLookup", max_await_time_ms=200) as stream:
        _large_update(db)
        insert = next_event(stream)
        assert "splitEvent" not in insert and insert["documentKey"] == {"_id": 1}
        first = next_event(stream)
        second = next_event(stream)
        after = next_event(stream)
    assert first["splitEvent"] == {"fragment": 1, "of": 2}
    assert second["splitEvent"] == {"fragment": 2, "of": 2}
    assert list(first)[:2] == ["_id", "splitEvent"] and list(second)[:2] == ["_id", "splitEvent"]
    assert first["_id"] != second["_id"]
    for fragment in (first, second):
        assert len(encode(fragment)) <= 16 * 1024 * 1024
    # Every field of the event is in exactly one fragment, and the small ones come first.
    fields = [k for k in first if k not in ("_id", "splitEvent")] + [
        k for k in second if k not in ("_id", "splitEvent")
    ]
    assert sorted(fields) == sorted(
        ["operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey", "updateDescription"]
    )
    assert first["operationType"] == "update" and first["documentKey"] == {"_id": 1}
    assert len(first) > len(second)
    assert after["operationType"] == "insert" and after["documentKey"] == {"_id": 2}

    # Resuming from the first fragment's token gives the second fragment, then the next event.
    with db.c.watch([SPLIT], full_document="updateLookup", resume_after=first["_id"]) as stream:
        again = next_event(stream)
        assert again["splitEvent"] == {"fragment": 2, "of": 2} and again["_id"] == second["_id"]
        assert next_event(stream)["documentKey"] == {"_id": 2}
    # From the last fragment's token: the next event.
    with db.c.watch([SPLIT], full_document="updateLookup", start_after=second["_id"]) as stream:
        assert next_event(stream)["documentKey"] == {"_id": 2}


def test_without_the_stage_a_large_event_fails_the_stream(db):
    with db.c.watch(full_document="updateLookup", max_await_time_ms=200) as stream:
        _large_update(db)
        with pytest.raises(OperationFailure) as info:
            for _ in range(3):  # the insert may come in the failing batch
                next_event(stream)
    assert info.value.code == 10334  # BSONObjectTooLarge


def test_split_stage_must_be_last(db):
    with pytest.raises(OperationFailure):
        with db.c.watch([SPLIT, {"$match": {"operationType": "insert"}}]) as stream:
            stream.try_next()
