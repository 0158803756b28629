"""docker-compose.yaml is valid for Docker Compose and describes the full stack.

Validated with compose-go (the library Docker Compose uses: the Compose specification's JSON
schema, interpolation, references), fetched from the Go module proxy by devtools/composecheck.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
CHECKER = REPO / "devtools" / "composecheck"


def _check(compose_file: Path) -> subprocess.CompletedProcess:
    go = shutil.which("go")
    if not go:
        pytest.skip("the Go toolchain is needed to run compose-go's validation (devtools/composecheck)")
    return subprocess.run(
        [go, "run", ".", str(compose_file)], cwd=CHECKER, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def project() -> dict:
    result = _check(REPO / "docker-compose.yaml")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_an_invalid_compose_file_is_rejected(tmp_path):
    broken = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    broken["services"]["kafka"]["depends_on"] = {"no-such-service": {"condition": "service_started"}}
    broken["services"]["mongo1"]["healthcheck"]["intervall"] = "5s"
    path = tmp_path / "docker-compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = _check(path)
    assert result.returncode != 0
    assert "intervall" in result.stderr or "no-such-service" in result.stderr


def test_every_image_is_pinned(project):
    for name, service in project["services"].items():
        image = service.get("image")
        assert image, f"{name} has no image"
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", f"{name} image {image} is not pinned"


def test_replica_set_kafka_spark_and_airflow_are_there_with_healthchecks(project):
    services = project["services"]
    for name in (
        "mongo1",
        "mongo2",
        "mongo3",
        "kafka",
        "postgres",
        "spark-master",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    ):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert "--replSet" in services["mongo1"]["command"]
    assert "rs.initiate" in " ".join(services["mongo-init"]["command"])
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    commands = {name: services[name]["command"] for name in services if name.startswith("airflow-")}
    assert commands["airflow-apiserver"] == ["api-server"]
    assert commands["airflow-scheduler"] == ["scheduler"]
    assert commands["airflow-dag-processor"] == ["dag-processor"]
    assert commands["airflow-triggerer"] == ["triggerer"]
    assert "postgresql" in services["airflow-scheduler"]["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]


def test_airflow_gets_the_provider_dags_connections_and_configuration(project):
    scheduler = project["services"]["airflow-scheduler"]
    env = scheduler["environment"]
    for variable in (
        "AIRFLOW_CONN_MONGOCDC_DEFAULT",
        "AIRFLOW_CONN_KAFKA_DEFAULT",
        "AIRFLOW_CONN_SPARK_DEFAULT",
        "AIRFLOW_VAR_MONGOCDC_CONNECTOR_CONFIG",
    ):
        json.loads(env[variable])
    assert json.loads(env["AIRFLOW_VAR_MONGOCDC_CONNECTOR_CONFIG"])["topic.prefix"]
    assert any(v["target"] == "/opt/airflow/dags" for v in scheduler["volumes"])
    assert scheduler["build"]["context"]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "pip install" in dockerfile and "constraints.txt" in dockerfile
    deps = scheduler["depends_on"]
    assert deps["mongo-init"]["condition"] == "service_completed_successfully"
    assert deps["kafka"]["condition"] == "service_healthy"
    init = " ".join(project["services"]["airflow-init"]["command"])
    assert "db migrate" in init and "pools set" in init
    prefix = json.loads(env["AIRFLOW_VAR_MONGOCDC_CONNECTOR_CONFIG"])["topic.prefix"]
    assert env["MONGOCDC_POOL"] == f"mongocdc_{prefix}"


def test_sharded_profile_has_config_servers_two_shards_and_mongos(project):
    services = project["services"]
    assert services["cfg"]["profiles"] == ["sharded"]
    assert "--configsvr" in services["cfg"]["command"]
    assert "--shardsvr" in services["shard1"]["command"] and "--shardsvr" in services["shard2"]["command"]
    assert services["mongos"]["command"][0] == "mongos"
    script = " ".join(services["mongos-init"]["command"])
    assert "shard1/shard1:27017" in script and "shard2/shard2:27017" in script


def test_every_airflow_setting_names_an_option_airflow_has(project):
    """A misspelt AIRFLOW__SECTION__KEY is ignored by Airflow without a word: each one the Airflow
    services get must name an option of Airflow's configuration (or of a provider's)."""
    from airflow.configuration import conf

    env = project["services"]["airflow-scheduler"]["environment"]
    settings = [name for name in env if name.startswith("AIRFLOW__")]
    assert "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME" in settings
    known = conf.configuration_description
    unknown = []
    for name in settings:
        section, _, key = name[len("AIRFLOW__") :].lower().partition("__")
        if key not in known.get(section, {}).get("options", {}):
            unknown.append(name)
    assert not unknown, f"not options of Airflow: {unknown}"
