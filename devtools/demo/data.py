"""The demo's sample data: a small ``shop`` database, and the changes applied after the snapshot.

The documents are generated from a fixed seed and cover the BSON types a CDC consumer meets:
ObjectId and string ``_id`` values, Decimal128 prices, datetimes (millisecond precision, as
MongoDB stores them), 64-bit integers, doubles, booleans, nulls, nested documents and arrays of
documents.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from bson import Decimal128, Int64, ObjectId
from pymongo import MongoClient
from pymongo.client_session import ClientSession
from pymongo.database import Database

COLLECTIONS = ("customers", "products", "orders")
SEED = 20260101

CUSTOMERS = 60
PRODUCTS = 40
ORDERS = 200

_FIRST = (
    "Ada",
    "Grace",
    "Alan",
    "Edsger",
    "Barbara",
    "Donald",
    "Frances",
    "Ken",
    "Margaret",
    "Niklaus",
    "Radia",
    "Tim",
    "Leslie",
    "Shafi",
    "John",
    "Hedy",
)
_LAST = (
    "Lovelace",
    "Hopper",
    "Turing",
    "Dijkstra",
    "Liskov",
    "Knuth",
    "Allen",
    "Thompson",
    "Hamilton",
    "Wirth",
    "Perlman",
    "Berners-Lee",
    "Lamport",
    "Goldwasser",
    "Backus",
    "Lamarr",
)
_CITIES = (
    ("Lisbon", "PT"),
    ("Utrecht", "NL"),
    ("Lyon", "FR"),
    ("Leipzig", "DE"),
    ("Turin", "IT"),
    ("Cork", "IE"),
    ("Gdansk", "PL"),
    ("Bergen", "NO"),
)
_CATEGORIES = ("books", "audio", "kitchen", "garden", "tools", "games", "office", "outdoor")
_ADJECTIVES = ("compact", "classic", "solid", "portable", "quiet", "bright", "modular", "sturdy")
_NOUNS = ("lamp", "kettle", "speaker", "notebook", "drill", "tent", "chair", "puzzle", "headset", "planter")
_STATUSES = ("new", "paid", "shipped", "delivered", "cancelled")
_EPOCH = datetime(2025, 9, 1, tzinfo=timezone.utc)


def _when(rng: random.Random, days: int = 120) -> datetime:
    """A datetime with millisecond precision (what MongoDB keeps)."""
    moment = _EPOCH + timedelta(seconds=rng.randrange(days * 86400), milliseconds=rng.randrange(1000))
    return moment


def _money(value: Decimal) -> Decimal128:
    return Decimal128(value.quantize(Decimal("0.01")))


@dataclass
class SampleData:
    customers: list[dict] = field(default_factory=list)
    products: list[dict] = field(default_factory=list)
    orders: list[dict] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.customers) + len(self.products) + len(self.orders)


def generate(seed: int = SEED) -> SampleData:
    rng = random.Random(seed)
    data = SampleData()
    for number in range(CUSTOMERS):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        city, country = rng.choice(_CITIES)
        data.customers.append(
            {
                "_id": ObjectId(),
                "name": f"{first} {last}",
                "email": f"{first.lower()}.{last.lower()}{number}@example.com",
                "address": {
                    "street": f"{rng.randrange(1, 200)} Main Street",
                    "city": city,
                    "country": country,
                    "zip": f"{rng.randrange(10000, 99999)}",
                },
                "tags": rng.sample(("newsletter", "vip", "b2b", "returns", "beta"), k=rng.randrange(0, 3)),
                "vip": rng.random() < 0.15,
                "loyalty_points": Int64(rng.randrange(0, 5_000_000_000)),
                "created_at": _when(rng),
                "phone": None if rng.random() < 0.3 else f"+351 9{rng.randrange(10_000_000, 99_999_999)}",
            }
        )
    for number in range(PRODUCTS):
        data.products.append(
            {
                "_id": f"SKU-{number + 1:04d}",
                "name": f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}",
                "price": _money(Decimal(rng.randrange(199, 25000)) / 100),
                "stock": rng.randrange(0, 500),
                "categories": rng.sample(_CATEGORIES, k=rng.randrange(1, 4)),
                "dimensions_cm": {
                    "w": round(rng.uniform(2, 80), 1),
                    "h": round(rng.uniform(2, 80), 1),
                    "d": round(rng.uniform(1, 40), 1),
                },
                "weight_kg": round(rng.uniform(0.05, 25), 3),
                "added_at": _when(rng, 365),
            }
        )
    for _ in range(ORDERS):
        customer = rng.choice(data.customers)
        items = []
        for product in rng.sample(data.products, k=rng.randrange(1, 5)):
            items.append({"sku": product["_id"], "qty": rng.randrange(1, 4), "unit_price": product["price"]})
        total = sum(item["unit_price"].to_decimal() * item["qty"] for item in items)
        placed = _when(rng)
        data.orders.append(
            {
                "_id": ObjectId(),
                "customer_id": customer["_id"],
                "status": rng.choice(_STATUSES),
                "items": items,
                "total": _money(total),
                "currency": "EUR",
                "placed_at": placed,
                "shipping": {
                    "method": rng.choice(("standard", "express", "pickup")),
                    "address": dict(customer["address"]),
                    "eta": placed + timedelta(days=rng.randrange(1, 8)),
                },
                "notes": [] if rng.random() < 0.7 else [{"at": placed, "text": "gift wrap"}],
            }
        )
    return data


def load(database: Database, data: SampleData) -> dict[str, int]:
    """Insert the sample data; returns the documents per collection."""
    counts = {}
    for name in COLLECTIONS:
        documents = getattr(data, name)
        database[name].insert_many(documents)
        counts[name] = len(documents)
    return counts


@dataclass
class AppliedChanges:
    """What :func:`apply_changes` did, as MongoDB reported it."""

    inserted: int = 0
    updated: int = 0
    replaced: int = 0
    deleted: int = 0
    transaction: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        parts = ", ".join(f"{n} {name}" for name, n in self.transaction.items())
        return (
            f"{self.inserted} inserted, {self.updated} updated, {self.replaced} replaced, "
            f"{self.deleted} deleted; one transaction with {parts}"
        )


def apply_changes(client: MongoClient, database: Database, seed: int = SEED) -> AppliedChanges:
    """Inserts, updates, a replace, a multi-document transaction across ``orders`` and
    ``products`` (an order and the stock it takes), and deletes."""
    rng = random.Random(seed + 1)
    applied = AppliedChanges()
    customers, products, orders = database.customers, database.products, database.orders
    now = datetime.now(timezone.utc).replace(microsecond=0)

    # Inserts: new customers and their first orders.
    new_customers = [
        {
            "_id": ObjectId(),
            "name": f"New Customer {n}",
            "email": f"new{n}@example.com",
            "address": {"city": "Porto", "country": "PT"},
            "tags": ["beta"],
            "vip": False,
            "loyalty_points": Int64(0),
            "created_at": now,
        }
        for n in range(5)
    ]
    applied.inserted += len(customers.insert_many(new_customers).inserted_ids)
    catalogue = list(products.find({}, {"price": 1}).sort("_id", 1))
    new_orders = []
    for customer in new_customers:
        product = rng.choice(catalogue)
        new_orders.append(
            {
                "_id": ObjectId(),
                "customer_id": customer["_id"],
                "status": "new",
                "items": [{"sku": product["_id"], "qty": 1, "unit_price": product["price"]}],
                "total": product["price"],
                "currency": "EUR",
                "placed_at": now,
                "shipping": {"method": "standard", "address": customer["address"], "eta": None},
                "notes": [],
            }
        )
    applied.inserted += len(orders.insert_many(new_orders).inserted_ids)

    # Updates: order status changes, loyalty points, a tag pushed, a nested field changed.
    for order in orders.find({"status": "paid"}, {"_id": 1}).sort("_id", 1).limit(8):
        applied.updated += orders.update_one(
            {"_id": order["_id"]},
            {
                "$set": {"status": "shipped", "shipping.eta": now + timedelta(days=2)},
                "$push": {"notes": {"at": now, "text": "handed to the carrier"}},
            },
        ).modified_count
    applied.updated += customers.update_many(
        {"vip": True}, {"$inc": {"loyalty_points": Int64(1000)}, "$addToSet": {"tags": "vip"}}
    ).modified_count
    some_customer = customers.find_one({"vip": False}, sort=[("_id", 1)])
    applied.updated += customers.update_one(
        {"_id": some_customer["_id"]},
        {"$set": {"address.city": "Braga", "phone": "+351 910000000"}, "$unset": {"tags": ""}},
    ).modified_count

    # A replace: a product document written anew (same _id).
    replaced = products.find_one({}, sort=[("_id", -1)])
    applied.replaced += products.replace_one(
        {"_id": replaced["_id"]},
        {
            "name": f"{replaced['name']} (2nd edition)",
            "price": _money(replaced["price"].to_decimal() * Decimal("1.1")),
            "stock": 25,
            "categories": ["refurbished"],
            "dimensions_cm": replaced["dimensions_cm"],
            "weight_kg": replaced["weight_kg"],
            "added_at": now,
            "discontinued": False,
        },
    ).modified_count

    # A multi-document transaction: an order and the stock it takes from two products.
    buyer = customers.find_one({}, sort=[("_id", 1)])
    picked = list(products.find({"stock": {"$gte": 3}}).sort("_id", 1).limit(2))

    def order_with_stock(session: ClientSession) -> dict[str, int]:
        items = [{"sku": p["_id"], "qty": 2, "unit_price": p["price"]} for p in picked]
        total = sum(item["unit_price"].to_decimal() * item["qty"] for item in items)
        orders.insert_one(
            {
                "_id": ObjectId(),
                "customer_id": buyer["_id"],
                "status": "paid",
                "items": items,
                "total": _money(total),
                "currency": "EUR",
                "placed_at": now,
                "shipping": {
                    "method": "express",
                    "address": buyer["address"],
                    "eta": now + timedelta(days=1),
                },
                "notes": [],
            },
            session=session,
        )
        for product in picked:
            products.update_one({"_id": product["_id"]}, {"$inc": {"stock": -2}}, session=session)
        return {"orders insert": 1, "products updates": len(picked)}

    with client.start_session() as session:
        applied.transaction = session.with_transaction(order_with_stock)

    # Deletes: cancelled orders, and a customer without orders.
    cancelled = [o["_id"] for o in orders.find({"status": "cancelled"}, {"_id": 1}).sort("_id", 1).limit(6)]
    applied.deleted += orders.delete_many({"_id": {"$in": cancelled}}).deleted_count
    with_orders = set(orders.distinct("customer_id"))
    for customer in customers.find({}, {"_id": 1}).sort("_id", -1):
        if customer["_id"] not in with_orders:
            applied.deleted += customers.delete_one({"_id": customer["_id"]}).deleted_count
            break
    return applied
