"""``configureFailPoint``, as a mongod/mongos started with ``enableTestCommands=1`` implements it.

Modes (MongoDB's FailPoint, src/mongo/util/fail_point.h): ``"alwaysOn"``, ``"off"``,
``{times: n}``, ``{skip: n}`` (then always on), ``{activationProbability: p}``.

Fail points:

``failCommand`` (src/mongo/db/commands.cpp, ``CommandHelpers::evaluateFailCommandFailPoint``)
    Fails a command before it runs. Data: ``failCommands`` (required), ``errorCode``,
    ``errorLabels``, ``closeConnection``, ``blockConnection``/``blockTimeMS``, ``appName``,
    ``namespace``, ``writeConcernError`` (the command runs, then the reply carries it). The error
    message is always MongoDB's "Failing command via 'failCommand' failpoint".
``failGetMoreAfterCursorCheckout`` (src/mongo/db/commands/getmore_cmd.cpp)
    Fails a getMore once its cursor is checked out, with ``errorCode`` (default InternalError),
    "Hit the 'failGetMoreAfterCursorCheckout' failpoint"; ``appName``/``namespace`` filter as for
    failCommand. The error is the cursor's own, so a change stream's getMore gets MongoDB's
    ``ResumableChangeStreamError`` label for a resumable code, as for a real failure.
``onPrimaryTransactionalWrite`` (src/mongo/db/transaction/transaction_participant.cpp; members only)
    Fires on the primary for each statement of a retryable write about to be written (once for
    all the documents of an insert command, as one storage commit). Data: ``closeConnection``
    (default true: the connection is closed before the reply), ``failBeforeCommitExceptionCode``
    (the statement fails with that code and is not written).
"""

from __future__ import annotations

import random
import threading

from devtools.mongosim.errors import CommandError

FAIL_COMMAND = "failCommand"
FAIL_GET_MORE = "failGetMoreAfterCursorCheckout"
ON_PRIMARY_TRANSACTIONAL_WRITE = "onPrimaryTransactionalWrite"
FAILCOMMAND_MESSAGE = "Failing command via 'failCommand' failpoint"
FAIL_GET_MORE_MESSAGE = "Hit the 'failGetMoreAfterCursorCheckout' failpoint"


class FailPoint:
    def __init__(self):
        self.mode = "off"
        self.times = 0
        self.skip = 0
        self.probability = 1.0
        self.data: dict = {}
        self.entered = 0
        self.lock = threading.Lock()

    def configure(self, mode, data) -> int:
        with self.lock:
            previous = self.entered
            if mode == "off":
                self.mode = "off"
            elif mode == "alwaysOn":
                self.mode = "alwaysOn"
            elif isinstance(mode, dict) and "times" in mode:
                times = int(mode["times"])
                if times < 0:
                    raise CommandError(2, "'times' option to 'mode' must be positive")
                self.mode = "times" if times else "off"
                self.times = times
            elif isinstance(mode, dict) and "skip" in mode:
                self.mode = "skip"
                self.skip = int(mode["skip"])
            elif isinstance(mode, dict) and "activationProbability" in mode:
                self.mode = "random"
                self.probability = float(mode["activationProbability"])
            else:
                raise CommandError(2, "'mode' must be one of 'off', 'alwaysOn', 'times', and 'skip'")
            if data is not None and not isinstance(data, dict):
                raise CommandError(14, "the 'data' option must be a BSON object", code_name="TypeMismatch")
            # Without 'data' the fail point has none (FailPoint::setMode with an empty BSONObj).
            self.data = dict(data or {})
            self.entered = 0
            return previous

    def fire(self, accept=None) -> dict | None:
        """The fail point's data when it fires now (``accept(data)``, when given, must hold
        first, as in MongoDB's ``FailPoint::executeIf``), else None."""
        with self.lock:
            if self.mode == "off":
                return None
            data = self.data
            if accept is not None and not accept(data):
                return None
            if self.mode == "skip":
                if self.skip > 0:
                    self.skip -= 1
                    return None
            elif self.mode == "random":
                if random.random() >= self.probability:
                    return None
            elif self.mode == "times":
                self.times -= 1
                if self.times <= 0:
                    self.mode = "off"
            self.entered += 1
            return dict(data)


def command_filter(command_name: str, app_name: str | None, ns: str | None, listed: bool = True):
    """failCommand's activation filter (``CommandHelpers::shouldActivateFailCommandFailPoint``):
    the command is listed (unless ``listed`` is False: failGetMoreAfterCursorCheckout lists
    getMore itself), and the application name and namespace match when given."""

    def accept(data: dict) -> bool:
        if listed and command_name not in (data.get("failCommands") or []):
            return False
        if data.get("appName") and data["appName"] != app_name:
            return False
        if data.get("namespace") and data["namespace"] != ns:
            return False
        return True

    return accept


def get_more_error(data: dict) -> CommandError:
    """The error ``failGetMoreAfterCursorCheckout`` throws."""
    code = data.get("errorCode")
    return CommandError(int(code) if code is not None else 1, FAIL_GET_MORE_MESSAGE)
