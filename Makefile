# The two commands of the README:
#   make test   creates .venv, installs the project with the pinned constraints, checks the code
#               with ruff (lint and format), fetches the Kafka broker jars and the interop suite's Kafka Connect
#               and Debezium jars with Maven, installs Debian's chromium and chromium-driver (the health
#               page's browser test), and runs the test suite (real Kafka, spark-submit, Airflow,
#               MongoDB simulator or MONGOCDC_TEST_MONGODB_URI).
#   make demo   the main job: the CDC pipeline end to end on this machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: test lint demo install kafka-jars interop-jars browser bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $@

install: $(VENV)/.installed

kafka-jars: install
	$(BIN)/python -m devtools.kafka fetch

# Kafka Connect's JsonConverter and Debezium's MongoDB connector for tests/interop (Maven), and
# the harness that runs them (javac).
interop-jars: install
	$(BIN)/python -m devtools.interop fetch

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

test: install lint kafka-jars interop-jars browser
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest $(PYTEST_ARGS)

demo: install kafka-jars
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m devtools.demo

bench: install kafka-jars
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench

clean:
	rm -rf $(VENV) devtools/kafka/target devtools/interop/target .pytest_cache
