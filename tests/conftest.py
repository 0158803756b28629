"""Shared fixtures: a real Kafka broker, a throwaway Airflow home, spark-submit from the venv.

Set before anything imports Airflow: AIRFLOW_HOME points to a temporary directory with SQLite,
examples off and the repo's dags/ folder, so no test touches a user's Airflow installation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="mongocdc-airflow-home-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(_AIRFLOW_HOME / "logs"),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:8080/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
)

pytest_plugins = ["devtools.mongosim.pytest_plugin"]


# The markers of the suite's parts (pyproject's [tool.pytest.ini_options] markers): each test's are
# recorded in the JUnit XML (its "markers" property), so that .ci/durations.py can count per marker.
SUITE_MARKERS = ("unit", "integration", "e2e", "fidelity", "driver_suite", "faults", "interop", "slow")


def pytest_collection_modifyitems(items):
    for item in items:
        names = sorted({marker.name for marker in item.iter_markers()} & set(SUITE_MARKERS))
        item.user_properties.append(("markers", ",".join(names)))


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs three workers) one broker serves every worker: the
    controller starts it before the workers exist, and they inherit its address as
    ``MONGOCDC_TEST_KAFKA_BOOTSTRAP`` (each test uses names of its own). Tests that stop or kill a
    broker start a dedicated one."""
    if hasattr(config, "workerinput") or os.environ.get("MONGOCDC_TEST_KAFKA_BOOTSTRAP"):
        return
    if not getattr(config.option, "numprocesses", None) or config.option.collectonly:
        return
    from devtools.kafka import KafkaBroker

    broker = KafkaBroker()
    broker.__enter__()
    config._mongocdc_shared_broker = broker
    os.environ["MONGOCDC_TEST_KAFKA_BOOTSTRAP"] = broker.bootstrap_servers


def pytest_unconfigure(config):
    broker = getattr(config, "_mongocdc_shared_broker", None)
    if broker is not None:
        os.environ.pop("MONGOCDC_TEST_KAFKA_BOOTSTRAP", None)
        broker.__exit__(None, None, None)


@pytest.fixture(scope="session")
def kafka_broker():
    """The real Apache Kafka broker for this test session (None when an external one is used)."""
    if os.environ.get("MONGOCDC_TEST_KAFKA_BOOTSTRAP"):
        yield None
        return
    from devtools.kafka import KafkaBroker

    with KafkaBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker) -> str:
    """bootstrap.servers of the session's broker (or MONGOCDC_TEST_KAFKA_BOOTSTRAP)."""
    return os.environ.get("MONGOCDC_TEST_KAFKA_BOOTSTRAP") or kafka_broker.bootstrap_servers


@pytest.fixture
def unique_name(request) -> str:
    """A name unique to this test, usable as topic prefix or transactional.id."""
    import uuid

    base = "".join(c if c.isalnum() else "_" for c in request.node.name)[:40]
    return f"{base}_{uuid.uuid4().hex[:8]}"


# A copy of the session's metadata database right after ``airflow db migrate``: a test's own
# Airflow home starts from a copy of it instead of migrating again (tests/e2e/airflow_stack.py).
MIGRATED_DB = _AIRFLOW_HOME / "migrated.db"


@pytest.fixture(scope="session")
def airflow_env() -> dict[str, str]:
    """Environment for Airflow subprocesses, with the metadata database migrated once (its copy:
    ``MIGRATED_DB``)."""
    env = dict(os.environ)
    result = subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"airflow db migrate failed:\n{result.stdout}\n{result.stderr}"
    shutil.copyfile(_AIRFLOW_HOME / "airflow.db", MIGRATED_DB)
    return env


@pytest.fixture(scope="session")
def spark_submit() -> str:
    path = shutil.which("spark-submit")
    assert path, "spark-submit is not on PATH: install the project with the constraints (make test)"
    return path
