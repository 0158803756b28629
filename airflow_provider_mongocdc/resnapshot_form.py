"""The rule of the re-snapshot trigger form's Collections field, as a JSON Schema ``format``.

The API server validates a run's conf against the DAG's Params with ``jsonschema`` when Trigger is
pressed, and the form shows its answer. A ``pattern`` would answer with the regular expression
(``'orders' does not match '^\\s*(...)$'``); a ``format`` answers with its name, so the name is the
rule in words: ``'orders' is not a '<database>.<collection>, e.g. shop.orders'``. The check is
registered with ``jsonschema.FormatChecker`` (every checker Airflow creates has it) when this
module is imported: by the re-snapshot operator (DAG files) and by the provider's plugin, which
the API server loads.
"""

from __future__ import annotations

import re

from jsonschema import FormatChecker

COLLECTION_FORMAT = "<database>.<collection>, e.g. shop.orders"
# What parse_collections accepts: blank, or after stripping a database (not starting with a dot),
# a dot, and a collection that is not empty.
_COLLECTION = re.compile(r"^\s*([^.\s][^.]*\.\s*\S.*)?$")


def is_collection(value: object) -> bool:
    """Whether a form value names a collection with its database (or is blank); other types are
    left to the schema's ``type``."""
    return not isinstance(value, str) or bool(_COLLECTION.match(value))


def register() -> None:
    """Make every ``FormatChecker`` created from now on check :data:`COLLECTION_FORMAT`."""
    FormatChecker.checkers[COLLECTION_FORMAT] = (is_collection, ())


register()
