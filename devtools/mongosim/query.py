"""Query matching, sorting, projection, updates and aggregation, on top of mongomock.

mongomock implements MongoDB's query language, update operators, projection and most
aggregation stages over plain dicts; the simulator uses them as they are and adds:
- a fast path for the filters that dominate snapshot and CDC workloads (equality and ranges on
  top-level fields, ``_id`` lookups), with MongoDB's type bracketing;
- a BSON-order sort key (mongomock's comparison is patched for MinKey/MaxKey/Timestamp/Decimal);
- the aggregation stages mongomock lacks: ``$bucketAuto``, ``$unset``, ``$replaceWith``,
  ``$sortByCount`` (``$collStats`` and ``$changeStream`` are handled by the server itself).
"""

from __future__ import annotations

import copy
import math
import random

import mongomock
from mongomock import aggregate as mm_aggregate
from mongomock import filtering as mm_filtering
from mongomock.collection import _updaters as MM_UPDATERS  # noqa: N812

from devtools.mongosim import bsonutil
from devtools.mongosim.errors import CommandError

bsonutil.patch_mongomock()

_MISSING = object()
_COMPARISONS = {"$eq", "$gt", "$gte", "$lt", "$lte", "$in", "$ne", "$nin", "$exists"}


def _scalar(value) -> bool:
    return not isinstance(value, (dict, list, tuple)) and bsonutil.type_order(value) != 50


def _cmp_pred(op: str, bound):
    bkey = bsonutil.sort_key(bound)
    border = bkey[0]
    bracket_free = border in (-1, 127)

    def same_bracket(value_key) -> bool:
        return bracket_free or value_key[0] == border

    if op == "$gt":
        return lambda k: same_bracket(k) and k > bkey
    if op == "$gte":
        return lambda k: same_bracket(k) and k >= bkey
    if op == "$lt":
        return lambda k: same_bracket(k) and k < bkey
    if op == "$lte":
        return lambda k: same_bracket(k) and k <= bkey
    raise KeyError(op)


def compile_filter(spec: dict | None):
    """A predicate doc -> bool implementing MongoDB's matching for ``spec``."""
    if not spec:
        return lambda doc: True
    if not isinstance(spec, dict):
        raise CommandError(2, "Expected field filter to be of type object")
    fast = _compile_fast(spec)
    if fast is not None:
        return fast

    def slow(doc, _spec=spec):
        try:
            return mm_filtering.filter_applies(_spec, doc)
        except mongomock.OperationFailure as error:
            raise CommandError(2, str(error)) from error
        except NotImplementedError as error:
            raise CommandError(2, f"unsupported query operator in the simulator: {error}") from error

    return slow


def _compile_fast(spec: dict):
    """Predicates for top-level fields with scalar equality and range operators, else None."""
    checks = []
    for field, cond in spec.items():
        if field.startswith("$") or "." in field:
            return None
        if isinstance(cond, dict):
            if not cond or not all(op in ("$eq", "$gt", "$gte", "$lt", "$lte", "$in") for op in cond):
                return None
            preds = []
            for op, arg in cond.items():
                if op == "$in":
                    if not isinstance(arg, list) or not all(_scalar(a) for a in arg):
                        return None
                    keys = {bsonutil.sort_key(a) for a in arg if a is not None}
                    has_null = any(a is None for a in arg)
                    preds.append(("in", keys, has_null))
                else:
                    if not _scalar(arg):
                        return None
                    if op == "$eq":
                        preds.append(("eq", bsonutil.sort_key(arg), arg is None))
                    else:
                        preds.append(("cmp", _cmp_pred(op, arg), None))
            checks.append((field, preds))
        elif _scalar(cond):
            checks.append((field, [("eq", bsonutil.sort_key(cond), cond is None)]))
        else:
            return None

    def predicate(doc, _checks=checks, _spec=spec):
        for field, preds in _checks:
            value = doc.get(field, _MISSING)
            if isinstance(value, (list, tuple)):
                return mm_filtering.filter_applies(_spec, doc)  # array semantics: let mongomock decide
            if value is _MISSING:
                for kind, _arg, null_ok in preds:
                    if kind == "cmp" or not null_ok:
                        return False
                continue
            key = bsonutil.sort_key(value)
            for kind, arg, _null in preds:
                if kind == "eq":
                    if key != arg:
                        return False
                elif kind == "in":
                    if key not in arg:
                        return False
                elif not arg(key):
                    return False
        return True

    return predicate


def id_equality(spec) -> tuple[bool, object]:
    """(True, value) when the filter is {_id: <scalar>} or {_id: {$eq: <scalar>}}."""
    if isinstance(spec, dict) and len(spec) == 1 and "_id" in spec:
        cond = spec["_id"]
        if isinstance(cond, dict) and len(cond) == 1 and "$eq" in cond:
            cond = cond["$eq"]
        if (
            not isinstance(cond, dict)
            and _scalar(cond)
            or isinstance(cond, dict)
            and cond
            and not any(k.startswith("$") for k in cond)
        ):
            return True, cond
    return False, None


def shard_key_values(spec, shard_key: dict) -> dict | None:
    """The equality values of every shard key field in a filter, else None."""
    if not isinstance(spec, dict):
        return None
    values = {}
    for field in shard_key:
        if field not in spec:
            return None
        cond = spec[field]
        if isinstance(cond, dict) and len(cond) == 1 and "$eq" in cond:
            cond = cond["$eq"]
        if isinstance(cond, dict) and any(k.startswith("$") for k in cond):
            return None
        values[field] = cond
    return values


# -- field paths -----------------------------------------------------------------------------------
def get_path(doc, path: str, default=_MISSING):
    current = doc
    for part in path.split("."):
        if isinstance(current, dict):
            if part not in current:
                return default
            current = current[part]
        elif isinstance(current, list) and part.isdigit():
            index = int(part)
            if index >= len(current):
                return default
            current = current[index]
        else:
            return default
    return current


# -- sort ------------------------------------------------------------------------------------------
def _sort_value(doc, field: str, descending: bool):
    value = doc.get(field, None) if "." not in field else get_path(doc, field, None)
    if isinstance(value, list):
        if not value:
            return (-2,)  # an empty array sorts before null
        keys = [bsonutil.sort_key(v) for v in value]
        return max(keys) if descending else min(keys)
    return bsonutil.sort_key(value)


class _Reversed:
    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __lt__(self, other):
        return other.key < self.key

    def __eq__(self, other):
        return self.key == other.key


def sort_docs(docs: list, sort_spec) -> list:
    if not sort_spec:
        return docs
    items = list(sort_spec.items()) if isinstance(sort_spec, dict) else list(sort_spec)
    fields = []
    for field, direction in items:
        if field == "$natural":
            if direction < 0:
                docs = list(reversed(docs))
            continue
        if isinstance(direction, dict):  # {$meta: ...}
            continue
        if direction not in (1, -1, 1.0, -1.0):
            raise CommandError(
                15974,
                "Illegal key in $sort specification: " + f"{field}: {direction}",
                code_name="Location15974",
            )
        fields.append((field, direction < 0))
    if not fields:
        return docs
    if len(fields) == 1:
        field, desc = fields[0]
        return sorted(docs, key=lambda d: _sort_value(d, field, desc), reverse=desc)

    def key(doc):
        return tuple(
            _Reversed(_sort_value(doc, f, True)) if desc else _sort_value(doc, f, False) for f, desc in fields
        )

    return sorted(docs, key=key)


# -- projection ------------------------------------------------------------------------------------
_projector = mongomock.MongoClient().db.projector


def project(doc: dict, projection) -> dict:
    if projection is None or projection == {}:
        return doc
    spec = dict(projection)
    # {field: true} / {field: false} behave like 1 / 0.
    for key, value in list(spec.items()):
        if isinstance(value, bool):
            spec[key] = int(value)
        elif isinstance(value, float):
            spec[key] = int(value)
    try:
        if any(isinstance(v, dict) and not set(v) <= {"$slice", "$elemMatch"} for v in spec.values()) or any(
            isinstance(v, str) for v in spec.values()
        ):
            return _aggregate_project(doc, spec)
        projected = _projector._copy_only_fields(doc, spec, dict)  # pylint: disable=protected-access
        if "_id" in projected and next(iter(projected)) != "_id":
            projected = {"_id": projected["_id"], **{k: v for k, v in projected.items() if k != "_id"}}
        return projected
    except ValueError as error:
        raise CommandError(31254, f"Invalid projection: {error}", code_name="Location31254") from error
    except mongomock.OperationFailure as error:
        raise CommandError(2, str(error)) from error


def _aggregate_project(doc, spec):
    result = run_pipeline([doc], [{"$project": spec}])
    return result[0] if result else {}


# -- updates ---------------------------------------------------------------------------------------
_updater = mongomock.MongoClient().db.updater


def is_operator_update(update) -> bool:
    return isinstance(update, dict) and bool(update) and next(iter(update)).startswith("$")


def validate_update(update) -> None:
    if isinstance(update, list):
        return
    if not isinstance(update, dict):
        raise CommandError(14, "Update argument must be either an object or an array")
    if is_operator_update(update):
        for op, fields in update.items():
            if not op.startswith("$"):
                raise CommandError(
                    9,
                    "Unknown modifier: " + op + ". Expected a valid update modifier "
                    "or pipeline-style update specified as an array",
                )
            if op not in MM_UPDATERS and op not in (
                "$rename",
                "$setOnInsert",
                "$currentDate",
                "$addToSet",
                "$pull",
                "$pullAll",
                "$push",
                "$bit",
            ):
                raise CommandError(
                    9,
                    f"Unknown modifier: {op}. Expected a valid update modifier or "
                    "pipeline-style update specified as an array",
                )
            if not isinstance(fields, dict):
                raise CommandError(
                    9,
                    f"Modifiers operate on fields but we found type "
                    f"{bsonutil.type_name(fields)} instead. For example: {{$mod: "
                    "{<field>: ...}} not {$set: 1}",
                )
        paths = [p for fields in update.values() if isinstance(fields, dict) for p in fields]
        for i, a in enumerate(paths):
            for b in paths[i + 1 :]:
                if a == b or a.startswith(b + ".") or b.startswith(a + "."):
                    raise CommandError(40, f"Updating the path '{b}' would create a conflict at '{a}'")
    else:
        for key in update:
            if key.startswith("$"):
                raise CommandError(
                    2,
                    "The dollar ($) prefixed field '"
                    + key
                    + "' in '"
                    + key
                    + "' is not allowed in the context of an update's replacement document."
                    " Consider using an aggregation pipeline with $replaceWith.",
                    code_name="BadValue",
                )


def apply_update(doc: dict, query: dict, update, is_insert: bool, array_filters=None) -> dict:
    """The document after the update (a new dict; ``doc`` is not modified)."""
    new = copy.deepcopy(doc)
    try:
        if isinstance(update, list):
            result = run_pipeline([new], update)
            if len(result) != 1:
                raise CommandError(2, "pipeline update must return exactly one document")
            new = result[0]
        elif is_operator_update(update):
            if array_filters:
                raise CommandError(2, "arrayFilters are not supported by the simulator")
            _updater._apply_update_document(new, query or {}, update, is_insert)  # pylint: disable=protected-access
        else:
            replacement = dict(update)
            if (
                "_id" in doc
                and "_id" in replacement
                and not bsonutil.values_equal(doc["_id"], replacement["_id"])
            ):
                raise CommandError(
                    66,
                    "After applying the update, the (immutable) field '_id' was found "
                    f"to have been altered to _id: {bsonutil.to_relaxed_json(replacement['_id'])}",
                )
            new = {"_id": doc["_id"]} if "_id" in doc else {}
            for key, value in replacement.items():
                if key != "_id":
                    new[key] = value
    except CommandError:
        raise
    except mongomock.WriteError as error:
        raise CommandError(getattr(error, "code", None) or 2, str(error)) from error
    except mongomock.OperationFailure as error:
        raise CommandError(getattr(error, "code", None) or 2, str(error)) from error
    except NotImplementedError as error:
        raise CommandError(2, f"unsupported update in the simulator: {error}") from error
    except (KeyError, TypeError, ValueError) as error:
        raise CommandError(14, f"cannot apply the update: {error}") from error
    if "_id" in doc:
        if "_id" not in new:
            new = {"_id": doc["_id"], **new}
        elif not bsonutil.values_equal(doc["_id"], new["_id"]):
            raise CommandError(
                66, "Performing an update on the path '_id' would modify the immutable field '_id'"
            )
        elif next(iter(new)) != "_id":
            new = {"_id": new["_id"], **{k: v for k, v in new.items() if k != "_id"}}
    return new


def upsert_seed(query: dict, update) -> dict:
    """The document an upsert starts from: the equality fields of the query (as mongomock does)."""
    if not is_operator_update(update) and not isinstance(update, list):
        return {}
    try:
        seed = _updater._expand_dots(copy.deepcopy(dict(query or {})))  # pylint: disable=protected-access
        seed, _ = _updater._discard_operators(seed)  # pylint: disable=protected-access
    except mongomock.WriteError as error:
        raise CommandError(54, str(error), code_name="NotSingleValueField") from error
    return dict(seed) if isinstance(seed, dict) else {}


# -- aggregation -----------------------------------------------------------------------------------
class _DatabaseShim:
    """What mongomock's $lookup needs: get_collection(name).find(filter)."""

    def __init__(self, resolver):
        self._resolver = resolver

    def get_collection(self, name):
        docs = self._resolver(name)

        class _Coll:
            def find(self, spec):
                pred = compile_filter(spec)
                return [copy.deepcopy(d) for d in docs if pred(d)]

        return _Coll()


def _bucket_auto(docs, _database, options):
    if not isinstance(options, dict) or "groupBy" not in options or "buckets" not in options:
        raise CommandError(
            40246, "$bucketAuto requires 'groupBy' and 'buckets' to be specified", code_name="Location40246"
        )
    group_by = options["groupBy"]
    buckets = options["buckets"]
    if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets <= 0:
        raise CommandError(
            40243, "The $bucketAuto 'buckets' field must be greater than 0", code_name="Location40243"
        )
    output = options.get("output") or {"count": {"$sum": 1}}
    values = []
    for doc in docs:
        try:
            value = mm_aggregate._parse_expression(group_by, doc, ignore_missing_keys=True)  # pylint: disable=protected-access
        except KeyError:
            value = None
        values.append((bsonutil.sort_key(value), value, doc))
    values.sort(key=lambda item: item[0])
    size = len(values)
    # MongoDB's DocumentSourceBucketAuto::populateBuckets: round(n / buckets) documents per bucket,
    # documents with equal values stay together, the last bucket takes whatever is left.
    approx = max(1, int(math.floor(size / buckets + 0.5)))
    out = []
    index = 0
    for number in range(buckets):
        if index >= size:
            break
        is_last = number == buckets - 1
        start_index = index
        index = min(size, index + approx)
        while index < size and (is_last or values[index][0] == values[index - 1][0]):
            index += 1
        members = values[start_index:index]
        maximum = values[index][1] if index < size else members[-1][1]
        doc = {"_id": {"min": members[0][1], "max": maximum}}
        accumulated = mm_aggregate._accumulate_group(output, [m[2] for m in members])  # pylint: disable=protected-access
        accumulated.pop("_id", None)
        doc.update(accumulated)
        out.append(doc)
    return out


def _unset(docs, _database, options):
    fields = [options] if isinstance(options, str) else list(options)
    return mm_aggregate._handle_project_stage(docs, _database, {f: 0 for f in fields})  # pylint: disable=protected-access


def _replace_with(docs, database, options):
    return mm_aggregate._handle_replace_root_stage(docs, database, {"newRoot": options})  # pylint: disable=protected-access


def _sort_by_count(docs, database, options):
    grouped = mm_aggregate._handle_group_stage(docs, database, {"_id": options, "count": {"$sum": 1}})  # pylint: disable=protected-access
    return sorted(grouped, key=lambda d: -d["count"])


def _group_stage(docs, database, options):
    grouped = mm_aggregate._handle_group_stage(docs, database, options)  # pylint: disable=protected-access
    return [
        {"_id": d["_id"], **{k: v for k, v in d.items() if k != "_id"}} if "_id" in d else d for d in grouped
    ]


def _sort_stage(docs, _database, options):
    return sort_docs(list(docs), options)


def _match_stage(docs, _database, options):
    pred = compile_filter(options)
    return [d for d in docs if pred(d)]


def _sample_stage(docs, _database, options):
    if not isinstance(options, dict) or not isinstance(options.get("size"), int) or options["size"] < 0:
        raise CommandError(
            28746, "size argument to $sample must be a non-negative integer", code_name="Location28746"
        )
    docs = list(docs)
    size = options["size"]
    if size >= len(docs):
        random.shuffle(docs)
        return docs
    return random.sample(docs, size)


def _limit_stage(docs, _database, options):
    if not isinstance(options, int) or options <= 0:
        raise CommandError(15958, "the limit must be positive", code_name="Location15958")
    return list(docs)[:options]


def _project_stage(docs, database, options):
    """mongomock's $project, with computed fields on dotted paths built as embedded documents
    ({"ns.viewOn": "x"} gives {ns: {viewOn: "x"}}, as MongoDB's projection does) instead of
    top-level fields named with a dot."""
    projected = mm_aggregate._handle_project_stage(docs, database, options)  # pylint: disable=protected-access
    dotted = [
        field
        for field, value in options.items()
        if "." in field and not (isinstance(value, (bool, int, float)) and value in (0, 1))
    ]
    if not dotted:
        return projected
    out = []
    for doc in projected:
        doc = dict(doc)
        for field in dotted:
            if field not in doc:
                continue
            value = doc.pop(field)
            *parents, last = field.split(".")
            target = doc
            for part in parents:
                child = target.get(part)
                child = dict(child) if isinstance(child, dict) else {}
                target[part] = child
                target = child
            target[last] = value
        out.append(doc)
    return out


mm_aggregate._PIPELINE_HANDLERS.update(
    {  # pylint: disable=protected-access
        # Left out on purpose (README): answered as stages MongoDB does not know.
        "$out": None,
        "$merge": None,
        "$project": _project_stage,
        "$bucketAuto": _bucket_auto,
        "$unset": _unset,
        "$replaceWith": _replace_with,
        "$sortByCount": _sort_by_count,
        "$sort": _sort_stage,
        "$match": _match_stage,
        "$sample": _sample_stage,
        "$limit": _limit_stage,
        "$group": _group_stage,
    }
)

# The aggregation stages of MongoDB 7.0/8.0 (MongoDB's documentation, "Aggregation Stages"): a
# name outside this list is "Unrecognized pipeline stage name" (40324), as on MongoDB; a listed
# stage the simulator does not implement is refused with the same error (see the README).
STAGES = {
    "$addFields",
    "$bucket",
    "$bucketAuto",
    "$changeStream",
    "$changeStreamSplitLargeEvent",
    "$collStats",
    "$count",
    "$currentOp",
    "$densify",
    "$documents",
    "$facet",
    "$fill",
    "$geoNear",
    "$graphLookup",
    "$group",
    "$indexStats",
    "$limit",
    "$listLocalSessions",
    "$listSampledQueries",
    "$listSearchIndexes",
    "$listSessions",
    "$lookup",
    "$match",
    "$merge",
    "$out",
    "$planCacheStats",
    "$project",
    "$querySettings",
    "$redact",
    "$replaceRoot",
    "$replaceWith",
    "$sample",
    "$search",
    "$searchMeta",
    "$set",
    "$setWindowFields",
    "$shardedDataDistribution",
    "$skip",
    "$sort",
    "$sortByCount",
    "$unionWith",
    "$unset",
    "$unwind",
    "$vectorSearch",
}

_READ_ONLY_STAGES = {
    "$match",
    "$sort",
    "$limit",
    "$skip",
    "$count",
    "$sample",
    "$group",
    "$bucketAuto",
    "$bucket",
    "$sortByCount",
    "$project",
}


def unrecognized_stage(name: str) -> CommandError:
    """MongoDB's error for a stage name it does not know (the simulator's answer for the stages it
    leaves out, too)."""
    return CommandError(40324, f"Unrecognized pipeline stage name: '{name}'", code_name="Location40324")


def run_pipeline(docs: list, pipeline: list, resolver=None) -> list:
    """Run an aggregation pipeline over docs (which are not modified)."""
    if not isinstance(pipeline, list):
        raise CommandError(14, "'pipeline' option must be specified as an array")
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1:
            raise CommandError(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
                code_name="Location40323",
            )
        name = next(iter(stage))
        if name not in STAGES or mm_aggregate._PIPELINE_HANDLERS.get(name) is None:  # pylint: disable=protected-access
            raise unrecognized_stage(name)
    if any(next(iter(stage)) not in _READ_ONLY_STAGES for stage in pipeline):
        docs = copy.deepcopy(docs)
    else:
        docs = list(docs)
    database = _DatabaseShim(resolver or (lambda name: []))
    try:
        return list(mm_aggregate.process_pipeline(docs, database, copy.deepcopy(pipeline), None))
    except CommandError:
        raise
    except mongomock.OperationFailure as error:
        raise CommandError(getattr(error, "code", None) or 2, str(error)) from error
    except NotImplementedError as error:
        raise CommandError(2, f"unsupported aggregation in the simulator: {error}") from error
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        raise CommandError(2, f"aggregation failed: {error!r}") from error
