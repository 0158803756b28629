"""docs/configuration.md documents every property with its default and meaning; README.md links to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_mongocdc.core.config.compat import ALIASES, IGNORED, UNSUPPORTED
from airflow_provider_mongocdc.core.config.docs import render_property_table
from airflow_provider_mongocdc.core.config.properties import PROPERTIES

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOC = "docs/configuration.md"


def test_generated_property_table_is_in_sync_with_the_registry():
    text = (REPO / DOC).read_text(encoding="utf-8")
    assert render_property_table() in text, (
        f"{DOC} is out of date: run python -m airflow_provider_mongocdc.core.config.connector --write-docs {DOC}"
    )


def test_every_property_is_documented_with_default_and_meaning():
    text = (REPO / DOC).read_text(encoding="utf-8")
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


def test_readme_links_to_the_property_reference_instead_of_holding_a_copy():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "](docs/configuration.md#property-reference)" in readme
    assert "## Property reference" in (REPO / DOC).read_text(encoding="utf-8")
    assert "GENERATED PROPERTY TABLE" not in readme, "the property table lives in docs/configuration.md only"
