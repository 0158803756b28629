"""docs/configuration.md and README.md document every property with its default and meaning."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_mongocdc.core.config import (
    ALIASES,
    IGNORED,
    PROPERTIES,
    UNSUPPORTED,
    render_property_table,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCS = pytest.mark.parametrize("doc", ["docs/configuration.md", "README.md"])


@DOCS
def test_generated_property_table_is_in_sync_with_the_registry(doc):
    text = (REPO / doc).read_text(encoding="utf-8")
    assert render_property_table() in text, (
        f"{doc} is out of date: run python -m airflow_provider_mongocdc.core.config --write-docs {doc}"
    )


@DOCS
def test_every_property_is_documented_with_default_and_meaning(doc):
    text = (REPO / doc).read_text(encoding="utf-8")
    rows = {
        line.split("|")[1].strip().strip("`"): line for line in text.splitlines() if line.startswith("| `")
    }
    for prop in PROPERTIES:
        row = rows[prop.name]
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        if prop.required:
            assert cells[1] == "(required)"
        else:
            assert prop.default_for_docs() in cells[1]
        assert cells[3].startswith(prop.description[:40].replace("|", "\\|"))
    for name in list(ALIASES) + list(IGNORED) + list(UNSUPPORTED):
        assert f"`{name}`" in text, name
