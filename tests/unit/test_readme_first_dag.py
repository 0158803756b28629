"""The README's first DAG is the text of ``dags/mongocdc_first_dag.py`` between its markers, and
that file is a valid DAG file: what a new user copies works."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "dags" / "mongocdc_first_dag.py"
START, END = "# START first_dag\n", "# END first_dag\n"


def snippet() -> str:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, (
        f"{EXAMPLE.name} needs one {START!r} and one {END!r}"
    )
    return text.split(START, 1)[1].split(END, 1)[0]


def test_readme_shows_exactly_the_example_file_between_its_markers():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"```python\n{snippet()}```\n" in readme, (
        "README.md's first DAG differs from dags/mongocdc_first_dag.py between '# START first_dag' and "
        "'# END first_dag': copy the file's text into the README's python block"
    )


def test_example_file_is_a_dag_file_with_a_snapshot_then_a_window(tmp_path):
    folder = tmp_path / "dags"
    folder.mkdir()
    shutil.copy(EXAMPLE, folder / EXAMPLE.name)  # the repository's .airflowignore skips it
    bag = DagBag(str(folder))
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == ["shop_cdc"]
    dag = bag.dags["shop_cdc"]
    snapshot, window = dag.get_task("snapshot"), dag.get_task("window")
    assert type(snapshot).__name__ == "MongoSnapshotOperator"
    assert type(window).__name__ == "MongoStreamWindowOperator"
    assert window.upstream_task_ids == {"snapshot"}
    assert snapshot.pool == window.pool == "mongocdc_shop"


def test_repository_dag_folder_does_not_load_the_example(monkeypatch):
    # It would capture the topic prefix "shop" of the connector list's connector "default".
    monkeypatch.delenv("MONGOCDC_CONNECTORS_FILE", raising=False)
    bag = DagBag(str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    assert "mongocdc_hourly" in bag.dags and "shop_cdc" not in bag.dags
