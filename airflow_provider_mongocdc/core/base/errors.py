"""Errors raised by the connector: each names what happened, the cause and the fix."""

from __future__ import annotations


class MongoCdcError(Exception):
    """Base class. ``str(error)`` is one line: ``<problem>. Cause: <cause>. Fix: <fix>``."""

    def __init__(self, problem: str, *, cause: str | None = None, fix: str | None = None):
        self.problem = problem.rstrip(". ")
        self.cause = cause.rstrip(". ") if cause else None
        self.fix = fix.rstrip(". ") if fix else None
        super().__init__(str(self))

    def __str__(self) -> str:
        text = self.problem + "."
        if self.cause:
            text += f" Cause: {self.cause}."
        if self.fix:
            text += f" Fix: {self.fix}."
        return text

    def __reduce__(self):  # keep cause and fix when pickled across Spark or Airflow processes
        return (_rebuild, (type(self), self.problem, self.cause, self.fix))


def _rebuild(cls, problem, cause, fix):
    error = cls.__new__(cls)
    MongoCdcError.__init__(error, problem, cause=cause, fix=fix)
    return error


class ConfigError(MongoCdcError):
    """A connector property is unknown, missing or has an invalid value."""


class ConnectionFailedError(MongoCdcError):
    """MongoDB or Kafka could not be reached after the configured retries."""


class AuthenticationError(MongoCdcError):
    """The server refused the credentials."""


class TopologyError(MongoCdcError):
    """The deployment cannot be captured as it is (for example a standalone server without oplog)."""


class OffsetError(MongoCdcError):
    """The offset store is unreadable, inconsistent, or an offset operation was refused."""


class ResumePointPurgedError(MongoCdcError):
    """The stored resume point is no longer in the oplog: a re-snapshot is needed."""


class OversizeEventError(MongoCdcError):
    """A change event is larger than the Kafka producer may send."""


class DeliveryError(MongoCdcError):
    """Kafka did not accept or commit the events; the offset was not advanced."""


class LeaseHeldError(MongoCdcError):
    """Another snapshot or window of the same connector holds the connector's lease."""


class SparkProcessDiedError(MongoCdcError):
    """A process of the Spark application (its driver JVM, an executor JVM or a pyspark worker)
    died while the application ran (core/base/process_death.py)."""


class TableError(MongoCdcError):
    """A Delta table cannot be written or read as the apply needs (its location, its owner, its
    layout)."""


class EventFormatError(MongoCdcError):
    """A record of a topic is not a MongoDB change event the apply can read."""
