"""The rule of the re-snapshot trigger form's Collections field: ``<database>.<collection>``.

The field's schema says it twice. Its ``pattern`` (:data:`COLLECTION_PATTERN`) is for any JSON
Schema validator (an API client's, a form's). Its ``format`` (:data:`COLLECTION_FORMAT`) is for the
API server, which validates a run's conf against the DAG's Params with ``jsonschema`` and a
``FormatChecker`` when Trigger is pressed: the check registered here refuses a value with
:class:`CollectionRefused`, whose text is one line in words (what is wrong, the fix). jsonschema's
own errors print the schema and the instance after their message, and the form shows the whole
answer above its fields. The check is registered with ``jsonschema.FormatChecker`` (every checker
Airflow creates has it) when this module is imported: by the re-snapshot operator (DAG files) and by
the provider's plugin, which the API server loads.
"""

from __future__ import annotations

import re

from jsonschema import FormatChecker, ValidationError

from airflow_provider_mongocdc.core.base.errors import ConfigError

COLLECTION_FORMAT = "<database>.<collection>, e.g. shop.orders"
# What parse_collections accepts: blank, or after stripping a database (not starting with a dot),
# a dot, and a collection that is not empty. The same in Python's and in ECMA-262's regular
# expressions (a form's validator in a browser).
COLLECTION_PATTERN = r"^\s*([^.\s][^.]*\.\s*\S[\s\S]*)?$"
_COLLECTION = re.compile(COLLECTION_PATTERN)


class CollectionRefused(ValidationError):
    """A Collections value that is not ``<database>.<collection>``: ``str()`` is its message only."""

    def __str__(self) -> str:
        return self.message


def collection_error(name: str) -> ConfigError:
    """The error for a collection named without its database (``orders``, ``.orders``) or without
    the collection (``shop.``)."""
    database, dot, _ = name.partition(".")
    if dot and database:
        written = f"{database}.<collection>"
    else:
        written = f"<database>.{name.strip('.') or '<collection>'}"
    return ConfigError(
        f"`{name}` is not `<database>.<collection>`",
        cause="each collection to copy again is named with its database",
        fix=f"write it as {written}, e.g. shop.orders, or leave collections empty to copy every "
        "captured collection",
    )


def is_collection(value: object) -> bool:
    """Whether a form value names a collection with its database (or is blank); other types are
    left to the schema's ``type``. A value that does not raises :class:`CollectionRefused`."""
    if not isinstance(value, str) or _COLLECTION.match(value):
        return True
    raise CollectionRefused(str(collection_error(value.strip())))


def register() -> None:
    """Make every ``FormatChecker`` created from now on check :data:`COLLECTION_FORMAT`. The check
    is registered without exceptions to catch, so its :class:`CollectionRefused` is the error
    ``jsonschema.validate`` raises, not the cause of a ValidationError of its own."""
    FormatChecker.checkers[COLLECTION_FORMAT] = (is_collection, ())


register()
