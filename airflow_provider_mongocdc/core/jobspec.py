"""The job spec: what an operator hands to a Spark application.

It carries the connector configuration (Debezium property names), the MongoDB connection
details, the Kafka client configuration and the run parameters (window end, collections, ...).
It travels as a JSON file that only its owner can read; the file's path, never its content, is
what goes on the spark-submit command line, so no credential reaches argv, the task log or
Spark's environment page. The application answers through a result file next to it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_mongocdc.core.base.errors import ConfigError, MongoCdcError
from airflow_provider_mongocdc.core.base.redaction import redact_uri

# Keys whose every value is secret (the Delta tables' storage options: keys, tokens, account names).
_SECRET_CONTAINERS = ("storage_options",)
_SECRET_MARKERS = ("password", "secret", "sasl.oauthbearer", "ssl.key", "token", "credential", "jaas")


def _redact(value: Any, key: str = "") -> Any:
    """Values under a secret-looking key become ``***``; every other text is shown with the
    credentials inside it hidden (:func:`~airflow_provider_mongocdc.core.mongo.connection.redact_uri`: URIs with a password,
    ``password=`` options, ``AWS_SESSION_TOKEN:`` properties)."""
    if isinstance(value, dict):
        if key in _SECRET_CONTAINERS:
            return {k: "***" for k in value}
        return {k: _redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact(v, key) for v in value]
    if value is not None and any(marker in key.lower() for marker in _SECRET_MARKERS):
        return "***"
    if isinstance(value, str):
        return redact_uri(value)
    return value


@dataclass
class JobSpec:
    application: str
    connector: dict[str, Any]
    mongo: dict[str, Any]
    kafka: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)

    def write(self, path: str | os.PathLike) -> Path:
        """Write the spec readable by its owner only (mode 0600); refuses to overwrite."""
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(self), handle)
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> JobSpec:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"The job spec file {path} does not exist",
                cause="the Spark application was started without the file its operator writes",
                fix="start the application through its Airflow operator, or pass --job-spec with a "
                "readable file (in cluster deploy mode, ship it with --files)",
            ) from None
        return cls(**data)

    def redacted(self) -> dict[str, Any]:
        """The spec with every secret replaced by ``***``, safe for logs: values of secret keys,
        and the credentials inside any text (a connection string's password, for one)."""
        return _redact(asdict(self))

    def __repr__(self) -> str:
        return f"JobSpec({self.redacted()!r})"


# What precedes a run's summary JSON in a line: the output of an application run without a result
# file, and the task log at DEBUG (the operator reads the result file).
SUMMARY_MARKER = "MONGOCDC_SUMMARY "


def write_result(path: str | os.PathLike | None, summary: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps({"status": "ok", "summary": summary}, default=str))


def write_failure(path: str | os.PathLike | None, error: BaseException) -> None:
    if not path:
        return
    payload = {"status": "failed", "error_type": type(error).__name__, "message": redact_uri(str(error))}
    if isinstance(error, MongoCdcError):
        payload.update(
            problem=redact_uri(error.problem),
            cause=error.cause and redact_uri(error.cause),
            fix=error.fix and redact_uri(error.fix),
        )
    Path(path).write_text(json.dumps(payload))


def read_result(path: str | os.PathLike) -> dict[str, Any] | None:
    """The application's answer, or None when it wrote none (it was killed or never started)."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
