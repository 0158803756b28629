"""Command errors with MongoDB's codes, code names, messages and error labels."""

from __future__ import annotations

CODE_NAMES = {
    1: "InternalError",
    2: "BadValue",
    8: "UnknownError",
    9: "FailedToParse",
    11: "UserNotFound",
    13: "Unauthorized",
    14: "TypeMismatch",
    18: "AuthenticationFailed",
    20: "IllegalOperation",
    26: "NamespaceNotFound",
    27: "IndexNotFound",
    40: "ConflictingUpdateOperators",
    43: "CursorNotFound",
    47: "NoMatchingDocument",
    48: "NamespaceExists",
    50: "MaxTimeMSExpired",
    59: "CommandNotFound",
    61: "ShardKeyNotFound",
    66: "ImmutableField",
    72: "InvalidOptions",
    73: "InvalidNamespace",
    76: "NoReplicationEnabled",
    85: "IndexOptionsConflict",
    86: "IndexKeySpecsConflict",
    91: "ShutdownInProgress",
    96: "OperationFailed",
    100: "UnsatisfiableWriteConcern",
    112: "WriteConflict",
    115: "CommandNotSupported",
    117: "ConflictingOperationInProgress",
    125: "CommandFailed",
    136: "CappedPositionLost",
    189: "PrimarySteppedDown",
    202: "NetworkInterfaceExceededTimeLimit",
    225: "TransactionTooOld",
    236: "CursorInUse",
    237: "CursorKilled",
    244: "TransactionAborted",
    249: "NoSuchSession",
    251: "NoSuchTransaction",
    256: "TransactionCommitted",
    260: "InvalidResumeToken",
    262: "ExceededTimeLimit",
    263: "OperationNotSupportedInTransaction",
    267: "PreparedTransactionInProgress",
    280: "ChangeStreamFatalError",
    286: "ChangeStreamHistoryLost",
    10107: "NotWritablePrimary",
    10334: "BSONObjectTooLarge",
    11000: "DuplicateKey",
    11600: "InterruptedAtShutdown",
    11601: "Interrupted",
    11602: "InterruptedDueToReplStateChange",
    13388: "StaleConfig",
    13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary",
    40573: "Location40573",
}

# Codes after which a retryable write may be retried (the server adds RetryableWriteError).
RETRYABLE_WRITE_CODES = {
    6,
    7,
    89,
    91,
    189,
    262,
    9001,
    10107,
    11600,
    11602,
    13435,
    13436,
    63,
    150,
    13388,
    234,
    133,
}
# Codes that make a change stream resumable (the server adds ResumableChangeStreamError on getMore).
RESUMABLE_CHANGE_STREAM_CODES = {
    6,
    7,
    63,
    89,
    91,
    133,
    150,
    189,
    234,
    262,
    9001,
    10107,
    11600,
    11602,
    13388,
    13435,
    13436,
    43,
}
# "Not primary" and "node is recovering" codes (pymongo re-checks the server after these).
STATE_CHANGE_CODES = {10107, 13435, 11600, 11602, 13436, 189, 91}


class CommandError(Exception):
    """A command failure, serialised as MongoDB does ({ok: 0, errmsg, code, codeName, ...})."""

    def __init__(
        self, code: int, errmsg: str, labels: list[str] | None = None, code_name: str | None = None, **extra
    ):
        super().__init__(errmsg)
        self.code = code
        self.errmsg = errmsg
        self.labels = list(labels or [])
        self.code_name = code_name or CODE_NAMES.get(code, f"Location{code}")
        self.extra = extra

    def add_label(self, label: str) -> None:
        if label not in self.labels:
            self.labels.append(label)

    def to_reply(self) -> dict:
        reply = {"ok": 0.0, "errmsg": self.errmsg, "code": self.code, "codeName": self.code_name}
        reply.update(self.extra)
        if self.labels:
            reply["errorLabels"] = list(self.labels)
        return reply


class CloseConnection(Exception):
    """Close the client's connection without a reply (failCommand closeConnection)."""


def history_lost(during: str) -> CommandError:
    prefix = {
        "aggregate": "PlanExecutor error during aggregation :: caused by :: ",
        "getMore": "Executor error during getMore :: caused by :: ",
    }.get(during, "")
    return CommandError(
        286,
        prefix + "Resume of change stream was not possible, as the resume point may no longer "
        "be in the oplog.",
        labels=["NonResumableChangeStreamError"],
    )


def fatal_change_stream(message: str) -> CommandError:
    return CommandError(280, message, labels=["NonResumableChangeStreamError"])
