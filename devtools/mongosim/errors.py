"""Command errors with MongoDB's codes, code names, messages and error labels."""

from __future__ import annotations

CODE_NAMES = {
    1: "InternalError",
    2: "BadValue",
    6: "HostUnreachable",
    7: "HostNotFound",
    8: "UnknownError",
    9: "FailedToParse",
    11: "UserNotFound",
    13: "Unauthorized",
    14: "TypeMismatch",
    18: "AuthenticationFailed",
    20: "IllegalOperation",
    24: "LockTimeout",
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
    89: "NetworkTimeout",
    91: "ShutdownInProgress",
    96: "OperationFailed",
    100: "UnsatisfiableWriteConcern",
    112: "WriteConflict",
    115: "CommandNotSupported",
    117: "ConflictingOperationInProgress",
    125: "CommandFailed",
    133: "FailedToSatisfyReadPreference",
    136: "CappedPositionLost",
    150: "StaleEpoch",
    166: "CommandNotSupportedOnView",
    189: "PrimarySteppedDown",
    202: "NetworkInterfaceExceededTimeLimit",
    225: "TransactionTooOld",
    234: "RetryChangeStream",
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
    9001: "SocketException",
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

# Error categories of MongoDB's src/mongo/base/error_codes.yml, for the codes a server returns to
# clients (ErrorCodes::isRetriableError, isNetworkError, isNeedRetargettingError, isSnapshotError,
# isNonResumableChangeStreamError).
RETRIABLE_ERRORS = {6, 7, 89, 91, 134, 189, 262, 358, 402, 9001, 10107, 11600, 11602, 13435, 13436, 50915}
NETWORK_ERRORS = {6, 7, 89, 9001}
NEED_RETARGETTING_ERRORS = {150, 13388}  # StaleEpoch, StaleConfig
SNAPSHOT_ERRORS = {239, 246, 250, 272}
NON_RESUMABLE_CHANGE_STREAM_ERRORS = {280, 286}
RETRY_CHANGE_STREAM = 234
FAILED_TO_SATISFY_READ_PREFERENCE = 133
# isTransientTransactionError's own list (src/mongo/db/error_labels.cpp): WriteConflict, LockTimeout,
# PreparedTransactionInProgress, ShardCannotRefreshDueToLocksHeld, StaleDbVersion.
TRANSIENT_TRANSACTION_ERRORS = {112, 24, 267, 343, 249}
NO_SUCH_TRANSACTION = 251
COMMIT_OR_ABORT = {"committransaction", "aborttransaction"}
# NotPrimaryError: replies with one of these codes carry the server's topologyVersion (mongod's
# appendErrorLabelsAndTopologyVersion; shutdown errors only in quiesce mode, which the simulator
# never enters), by which drivers tell a fresh error from a stale one.
NOT_PRIMARY_ERRORS = {189, 10107, 11602, 13435, 13436}


def is_transient_transaction_error(code: int, has_write_concern_error: bool, commit_or_abort: bool) -> bool:
    """MongoDB's ``isTransientTransactionError`` (src/mongo/db/error_labels.cpp)."""
    if code in TRANSIENT_TRANSACTION_ERRORS or code in SNAPSHOT_ERRORS or code in NEED_RETARGETTING_ERRORS:
        return True
    if commit_or_abort:
        # On NoSuchTransaction it is safe to retry the whole transaction only if the data cannot
        # be rolled back.
        return code == NO_SUCH_TRANSACTION and not has_write_concern_error
    return code in RETRIABLE_ERRORS or code == NO_SUCH_TRANSACTION


def error_labels(
    command: str,
    code: int | None,
    write_concern_code: int | None,
    txn_number: bool,
    autocommit: bool,
    change_stream: bool,
) -> list[str]:
    """The ``errorLabels`` mongod adds to a reply, as MongoDB's ``ErrorLabelBuilder::build``
    (src/mongo/db/error_labels.cpp) decides them.

    ``command`` is the command's name in lower case; ``code`` the command's error code (None when
    it succeeded); ``write_concern_code`` the code of its ``writeConcernError``; ``txn_number``
    and ``autocommit`` whether the command carried those session fields; ``change_stream``
    whether the failing aggregate (or the aggregate that opened the getMore's cursor) is a
    ``$changeStream``.
    """
    labels = []
    commit_or_abort = command in COMMIT_OR_ABORT
    if (
        code is not None
        and txn_number
        and autocommit
        and is_transient_transaction_error(code, write_concern_code is not None, commit_or_abort)
    ):
        labels.append("TransientTransactionError")
    elif (
        txn_number
        and (not autocommit or commit_or_abort)
        and (code in RETRIABLE_ERRORS or write_concern_code in RETRIABLE_ERRORS)
    ):
        labels.append("RetryableWriteError")
    # Change streams run neither in a transaction nor as a retryable write: the change-stream
    # labels only come when neither label above did.
    resumable = (
        command in ("aggregate", "getmore")
        and change_stream
        and code is not None
        and write_concern_code is None
        and (
            code in RETRIABLE_ERRORS
            or code in NETWORK_ERRORS
            or code in NEED_RETARGETTING_ERRORS
            or code in (RETRY_CHANGE_STREAM, FAILED_TO_SATISFY_READ_PREFERENCE)
        )
    )
    if not labels and resumable:
        labels.append("ResumableChangeStreamError")
    elif code in NON_RESUMABLE_CHANGE_STREAM_ERRORS:
        labels.append("NonResumableChangeStreamError")
    return labels


class CommandError(Exception):
    """A command failure, serialised as MongoDB does ({ok: 0, errmsg, code, codeName, ...}).

    The reply's ``errorLabels`` are decided by :func:`error_labels` when the reply is made
    (``Endpoint.error_reply``), unless a ``failCommand`` fail point set them (``fixed_labels``).
    ``change_stream`` marks an error of a change stream's aggregate or getMore.
    """

    def __init__(self, code: int, errmsg: str, code_name: str | None = None, **extra):
        super().__init__(errmsg)
        self.code = code
        self.errmsg = errmsg
        self.labels: list[str] = []
        self.fixed_labels = False
        self.change_stream = False
        self.code_name = code_name or CODE_NAMES.get(code, f"Location{code}")
        self.extra = extra

    def copy(self) -> CommandError:
        """The same error (code, message, fields), without labels or marks."""
        return CommandError(self.code, self.errmsg, code_name=self.code_name, **self.extra)

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
    )


def fatal_change_stream(message: str) -> CommandError:
    return CommandError(280, message)
