"""Update oplog entries in MongoDB's delta format (``{$v: 2, diff: {...}}``) and their parsing into
a change event's ``updateDescription``.

Diff layout (mongo/db/update/document_diff_serialization.h): ``d`` deleted fields, ``u`` updated
fields, ``i`` inserted fields, ``s<field>`` a sub-diff of an object or array; an array sub-diff has
``a: true``, ``u<index>``/``s<index>`` for changed elements and ``l`` for a new (smaller) length.

Operator updates are logged the way MongoDB's update driver logs them: each modified path once
(``$set: {"a.b": 1}`` gives ``a.b``; ``$push`` gives the appended indexes ``arr.3``; a field
created under a missing parent is logged at the first missing component). Pipeline updates are
logged as a structural diff of the two documents, as MongoDB computes for them.
"""

from __future__ import annotations

_MISSING = object()


def _equal(a, b) -> bool:
    """Binary equality (same types and values), as MongoDB's no-op detection uses."""
    if type(a) is not type(b):
        if isinstance(a, bool) or isinstance(b, bool):
            return False
        if not (isinstance(a, dict) and isinstance(b, dict)) and not (
            isinstance(a, list) and isinstance(b, list)
        ):
            return False
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            return False
        return all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except TypeError:
        return False


class _Node:
    """A diff under construction for an object or an array."""

    def __init__(self, is_array: bool):
        self.is_array = is_array
        self.deletes: dict = {}
        self.updates: dict = {}
        self.inserts: dict = {}
        self.children: dict = {}
        self.resize: int | None = None

    def child(self, name: str, is_array: bool) -> _Node:
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = _Node(is_array)
        return node

    def empty(self) -> bool:
        return not (
            self.deletes
            or self.updates
            or self.inserts
            or self.resize is not None
            or any(not c.empty() for c in self.children.values())
        )

    def serialize(self) -> dict:
        if self.is_array:
            out: dict = {"a": True}
            if self.resize is not None:
                out["l"] = self.resize
            entries = []
            for name, value in self.updates.items():
                entries.append((int(name), "u" + name, value))
            for name, node in self.children.items():
                if not node.empty():
                    entries.append((int(name), "s" + name, node.serialize()))
            for _, key, value in sorted(entries, key=lambda e: e[0]):
                out[key] = value
            return out
        out = {}
        if self.deletes:
            out["d"] = dict(self.deletes)
        if self.updates:
            out["u"] = dict(self.updates)
        if self.inserts:
            out["i"] = dict(self.inserts)
        for name, node in self.children.items():
            if not node.empty():
                out["s" + name] = node.serialize()
        return out


def _value_at(doc, parts):
    current = doc
    for part in parts:
        if isinstance(current, dict):
            if part not in current:
                return _MISSING
            current = current[part]
        elif isinstance(current, list) and part.isdigit():
            index = int(part)
            if index >= len(current):
                return _MISSING
            current = current[index]
        else:
            return _MISSING
    return current


def _log(root: _Node, old: dict, new: dict, parts: list[str], kind: str) -> None:
    """Log a modification at the path ``parts`` (kind: 'set' or 'delete')."""
    node = root
    parent_old = old
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(parent_old, list):
            if not part.isdigit():
                return
            exists = int(part) < len(parent_old)
        elif isinstance(parent_old, dict):
            exists = part in parent_old
        else:
            return
        if not exists or last:
            value = _value_at(new, parts[: depth + 1])
            if kind == "delete" and last:
                if exists and not node.is_array:
                    node.deletes[part] = False
                return
            if value is _MISSING:
                if exists and not node.is_array:
                    node.deletes[part] = False
                return
            if node.is_array:
                node.updates[part] = value
            elif exists:
                node.updates[part] = value
            else:
                node.inserts[part] = value
            return
        child_old = parent_old[int(part)] if isinstance(parent_old, list) else parent_old[part]
        child_new = _value_at(new, parts[: depth + 1])
        if not isinstance(child_old, (dict, list)) or type(child_new) is not type(child_old):
            # The parent changed type: log the whole parent value.
            if child_new is _MISSING:
                node.deletes[part] = False
            else:
                node.updates[part] = child_new
            return
        node = node.child(part, isinstance(child_old, list))
        parent_old = child_old


def _structural(node: _Node, old, new) -> None:
    if isinstance(old, dict):
        for key in old:
            if key not in new:
                node.deletes[key] = False
        for key, value in new.items():
            if key not in old:
                node.inserts[key] = value
            elif not _equal(old[key], value):
                if isinstance(old[key], dict) and isinstance(value, dict):
                    _structural(node.child(key, False), old[key], value)
                elif isinstance(old[key], list) and isinstance(value, list):
                    _structural(node.child(key, True), old[key], value)
                else:
                    node.updates[key] = value
        return
    # arrays
    for index in range(min(len(old), len(new))):
        a, b = old[index], new[index]
        if _equal(a, b):
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            _structural(node.child(str(index), False), a, b)
        elif isinstance(a, list) and isinstance(b, list):
            _structural(node.child(str(index), True), a, b)
        else:
            node.updates[str(index)] = b
    for index in range(len(old), len(new)):
        node.updates[str(index)] = new[index]
    if len(new) < len(old):
        node.resize = len(new)


def _operator_paths(update: dict) -> list[tuple[str, str]]:
    paths = []
    for op, fields in update.items():
        if not isinstance(fields, dict):
            continue
        for path in fields:
            if op == "$rename":
                paths.append(("delete", path))
                paths.append(("set", fields[path]))
            elif op == "$unset":
                paths.append(("delete", path))
            elif op in ("$push", "$addToSet"):
                paths.append(("append", path))
            else:
                paths.append(("set", path))
    return paths


def compute_diff(old: dict, new: dict, update) -> dict:
    """The ``diff`` of a delta update oplog entry turning ``old`` into ``new``."""
    root = _Node(False)
    if isinstance(update, dict) and update and next(iter(update)).startswith("$"):
        for kind, path in _operator_paths(update):
            parts = path.split(".")
            positional = next((i for i, p in enumerate(parts) if p.startswith("$")), None)
            if positional is not None:
                # Positional paths: diff the subtree above the first positional component.
                prefix = parts[:positional]
                old_sub, new_sub = _value_at(old, prefix), _value_at(new, prefix)
                if (
                    prefix
                    and old_sub is not _MISSING
                    and new_sub is not _MISSING
                    and type(old_sub) is type(new_sub)
                    and isinstance(old_sub, (dict, list))
                ):
                    node = root
                    for part in prefix[:-1]:
                        node = node.child(part, False)
                    _structural(node.child(prefix[-1], isinstance(old_sub, list)), old_sub, new_sub)
                elif prefix:
                    _log(root, old, new, prefix, "set")
                continue
            old_value, new_value = _value_at(old, parts), _value_at(new, parts)
            if kind == "delete":
                if old_value is not _MISSING and new_value is _MISSING:
                    _log(root, old, new, parts, "delete")
                continue
            if old_value is not _MISSING and new_value is not _MISSING and _equal(old_value, new_value):
                continue
            if (
                kind == "append"
                and isinstance(old_value, list)
                and isinstance(new_value, list)
                and len(new_value) >= len(old_value)
                and all(_equal(a, b) for a, b in zip(old_value, new_value))
            ):
                for index in range(len(old_value), len(new_value)):
                    _log(root, old, new, parts + [str(index)], "set")
                continue
            _log(root, old, new, parts, "set")
    else:
        _structural(root, old, new)
    return root.serialize()


def parse_diff(diff: dict, disambiguate: bool = False) -> dict:
    """updateDescription {updatedFields, removedFields, truncatedArrays} of a delta diff, plus
    ``disambiguatedPaths`` when ``disambiguate`` (a showExpandedEvents stream).

    As MongoDB's change_stream_document_diff_parser.cpp: a path is ambiguous from a component on
    that is a field name made of digits (not the first component) or holding a dot; its
    disambiguated form lists the components, array indexes as integers.
    """
    updated: dict = {}
    removed: list = []
    truncated: list = []
    disambiguated: dict = {}
    path: list = []  # (component, is array index, path ambiguous up to here)

    def push(name: str, is_index: bool) -> None:
        if path and path[-1][2]:
            path.append((name, is_index, True))
            return
        numeric = not is_index and len(path) >= 1 and _numeric_component(name)
        dotted = not is_index and not numeric and "." in name
        path.append((name, is_index, numeric or dotted))

    def record(name: str, is_index: bool) -> str:
        push(name, is_index)
        dotted_path = ".".join(part for part, _index, _ambiguous in path)
        if path[-1][2]:
            disambiguated[dotted_path] = [int(part) if index else part for part, index, _amb in path]
        path.pop()
        return dotted_path

    def walk(node: dict, is_array: bool) -> None:
        if is_array:
            if "l" in node:
                field = ".".join(part for part, _index, _ambiguous in path)
                truncated.append({"field": field, "newSize": node["l"]})
                if path[-1][2]:
                    disambiguated[field] = [int(part) if index else part for part, index, _amb in path]
            for key, value in node.items():
                if key in ("a", "l"):
                    continue
                if key.startswith("u"):
                    updated[record(key[1:], True)] = value
                elif key.startswith("s"):
                    push(key[1:], True)
                    walk(value, bool(value.get("a")))
                    path.pop()
            return
        for key, value in node.items():
            if key == "d":
                removed.extend(record(name, False) for name in value)
            elif key in ("u", "i"):
                for name, field_value in value.items():
                    updated[record(name, False)] = field_value
            elif key.startswith("s"):
                push(key[1:], False)
                walk(value, isinstance(value, dict) and bool(value.get("a")))
                path.pop()

    walk(diff, False)
    out = {"updatedFields": updated, "removedFields": removed, "truncatedArrays": truncated}
    if disambiguate:
        out["disambiguatedPaths"] = disambiguated
    return out


def _numeric_component(name: str) -> bool:
    """FieldRef::isNumericPathComponentStrict: digits only, no leading zero (but "0")."""
    return name.isdigit() and name.isascii() and (name == "0" or not name.startswith("0"))


def is_noop(old: dict, new: dict) -> bool:
    return _equal(old, new)


def same_value(a, b) -> bool:
    return _equal(a, b)
