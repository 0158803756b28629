# The two commands of the README:
#   make test   creates .venv, installs the project with the pinned constraints, checks the code
#               with ruff (lint and format), fetches the Kafka broker jars and the interop suite's Kafka Connect
#               and Debezium jars with Maven, pymongo's test files from PyPI, installs Debian's
#               chromium and chromium-driver (the health page's browser test), and runs the test
#               suite (real Kafka, spark-submit, Airflow, MongoDB simulator or MONGOCDC_TEST_MONGODB_URI).
#   make demo   the main job: the CDC pipeline end to end on this machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Worker processes of make test (pytest-xdist, three on two cores: much of a test is waiting on
# Airflow, Spark or Kafka; each test file runs whole in one worker, so a
# module's servers are started once; files go to the workers in the suite's order, tests/e2e and
# tests/faults first and the many short unit tests last, so that the workers end together).
# 0 runs the suite in one process.
PYTEST_WORKERS ?= 3

.PHONY: test lint demo install kafka-jars interop-jars iceberg-jars debezium-jars pymongo-tests fidelity-driver browser bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The project and its pinned dependencies, installed with uv (pinned in constraints.txt; its own
# download cache in ~/.cache/uv): the same packages as pip installs, in about half pip's time.
$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -c constraints.txt -e ".[dev,delta,iceberg]"
	touch $@

install: $(VENV)/.installed

kafka-jars: install
	$(BIN)/python -m devtools.kafka fetch

# Kafka Connect's JsonConverter and Debezium's MongoDB connector for tests/interop (Maven), and
# the harness that runs them (javac).
interop-jars: install
	$(BIN)/python -m devtools.interop fetch

# iceberg-core and the SQLite JDBC driver for the Iceberg REST catalog server of the tests (Maven),
# and the server itself (javac).
iceberg-jars: install
	$(BIN)/python -m devtools.iceberg fetch

# Kafka Connect's runtime (ConnectStandalone) and Debezium's MongoDB connector for the side-by-side
# benchmark (bench l), Maven.
debezium-jars: install
	$(BIN)/python -m devtools.debezium fetch

# Debian's chromium and chromium-driver for tests/e2e/test_health_page.py (Selenium); installed with
# apt-get as root when either is missing.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
		echo "chromium and chromedriver are installed"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	else \
		echo "The browser test needs Debian's chromium and chromium-driver: run as root, or sudo apt-get install -y chromium chromium-driver" >&2; \
		exit 1; \
	fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# pymongo's own test files (the sdist of the pinned pymongo, from PyPI with pip), the judge of the
# MongoDB simulator: the fast part runs in make test (marker driver_suite), all of it in
# make fidelity-driver.
pymongo-tests: install
	$(BIN)/python -m devtools.mongosim.driver_suite fetch

test: install lint kafka-jars interop-jars iceberg-jars pymongo-tests browser
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The eight pymongo test files against fresh simulator replica sets of 3 members and 1; prints
# passed/failed per file and per cause, fails when a failure is no documented non-goal.
fidelity-driver: install pymongo-tests
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m devtools.mongosim.driver_suite run

demo: install kafka-jars
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m devtools.demo

bench: install kafka-jars debezium-jars
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench

clean:
	rm -rf $(VENV) devtools/kafka/target devtools/interop/target devtools/debezium/target devtools/mongosim/target .pytest_cache
