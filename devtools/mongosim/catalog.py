"""Databases and collections of one replica set (or standalone server), held in memory.

Documents are stored as decoded BSON dicts keyed by ``bsonutil.id_key(_id)``, in insertion
order (MongoDB's natural order for a collection without deletes). A stored document is never
mutated in place: updates store a new dict, so readers and transaction snapshots can share them.
"""

from __future__ import annotations

import uuid as uuidlib

from bson.binary import Binary

from devtools.mongosim import bsonutil

ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
INTERNAL_DBS = ("admin", "config", "local")


def new_uuid() -> Binary:
    return Binary(uuidlib.uuid4().bytes, 4)


def valid_collection_name(name) -> bool:
    return (
        isinstance(name, str)
        and bool(name)
        and "$" not in name
        and "\x00" not in name
        and not name.startswith(".")
    )


def valid_db_name(name) -> bool:
    return (
        isinstance(name, str) and bool(name) and not any(c in name for c in '/\\. "$\x00') and len(name) < 64
    )


class Collection:
    __slots__ = (
        "db",
        "name",
        "uuid",
        "options",
        "docs",
        "sizes",
        "total_size",
        "indexes",
        "shard_key",
        "version",
    )

    def __init__(self, db: str, name: str, options: dict | None = None, uuid: Binary | None = None):
        self.db = db
        self.name = name
        self.uuid = uuid or new_uuid()
        self.options = dict(options or {})
        self.docs: dict = {}
        self.sizes: dict = {}
        self.total_size = 0
        self.indexes: list[dict] = [dict(ID_INDEX)]
        self.shard_key: dict | None = None
        self.version = 0  # bumped on every write (transactions check it)

    @property
    def ns(self) -> str:
        return f"{self.db}.{self.name}"

    @property
    def pre_and_post_images(self) -> bool:
        option = self.options.get("changeStreamPreAndPostImages")
        return bool(isinstance(option, dict) and option.get("enabled"))

    def put(self, key, doc: dict, size: int | None = None) -> None:
        if size is None:
            size = bsonutil.bson_size(doc)
        old = self.sizes.get(key)
        if old is not None:
            self.total_size -= old
        self.docs[key] = doc
        self.sizes[key] = size
        self.total_size += size
        self.version += 1

    def remove(self, key) -> dict | None:
        doc = self.docs.pop(key, None)
        if doc is not None:
            self.total_size -= self.sizes.pop(key, 0)
            self.version += 1
        return doc

    def clone_empty(self, db: str, name: str) -> Collection:
        other = Collection(db, name, self.options, self.uuid)
        other.indexes = [dict(i) for i in self.indexes]
        other.shard_key = self.shard_key
        return other

    def info(self) -> dict:
        """The listCollections entry."""
        return {
            "name": self.name,
            "type": "collection",
            "options": dict(self.options),
            "info": {"readOnly": False, "uuid": self.uuid},
            "idIndex": dict(ID_INDEX),
        }

    def stats(self) -> dict:
        count = len(self.docs)
        size = self.total_size
        return {
            "count": count,
            "size": size,
            "avgObjSize": (size // count) if count else 0,
            "storageSize": _storage_size(size),
            "nindexes": len(self.indexes),
            "totalIndexSize": _index_size(count) * len(self.indexes),
            "indexSizes": {i["name"]: _index_size(count) for i in self.indexes},
        }


def _storage_size(size: int) -> int:
    # WiredTiger allocates in 4 KiB pages and compresses; report the data size rounded up to pages.
    return max(4096, (size + 4095) // 4096 * 4096)


def _index_size(count: int) -> int:
    return max(4096, (count * 24 + 4095) // 4096 * 4096)


class Catalog:
    """Databases -> collections."""

    def __init__(self):
        self.dbs: dict[str, dict[str, Collection]] = {}

    def get(self, db: str, name: str) -> Collection | None:
        colls = self.dbs.get(db)
        return colls.get(name) if colls else None

    def add(self, coll: Collection) -> None:
        self.dbs.setdefault(coll.db, {})[coll.name] = coll

    def remove(self, db: str, name: str) -> Collection | None:
        colls = self.dbs.get(db)
        if not colls:
            return None
        coll = colls.pop(name, None)
        if not colls:
            self.dbs.pop(db, None)
        return coll

    def collections(self, db: str) -> list[Collection]:
        return list(self.dbs.get(db, {}).values())

    def all_collections(self) -> list[Collection]:
        return [c for colls in self.dbs.values() for c in colls.values()]

    def database_names(self) -> list[str]:
        return [name for name, colls in self.dbs.items() if colls]
