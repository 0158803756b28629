"""``configureFailPoint`` with ``failCommand``, as a mongod/mongos started with
``enableTestCommands=1`` implements it.

Modes: ``"alwaysOn"``, ``"off"``, ``{times: n}``, ``{skip: n}``, ``{activationProbability: p}``.
Data: ``failCommands`` (required), ``errorCode``, ``errorLabels``, ``closeConnection``,
``blockConnection``/``blockTimeMS``, ``appName``, ``writeConcernError``, ``failInternalCommands``,
``namespace``. The error message is always MongoDB's "Failing command via 'failCommand' failpoint".
"""

from __future__ import annotations

import random
import threading

from devtools.mongosim.errors import CommandError

FAILCOMMAND_MESSAGE = "Failing command via 'failCommand' failpoint"


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
            if data is not None:
                if not isinstance(data, dict):
                    raise CommandError(
                        14, "the 'data' option must be a BSON object", code_name="TypeMismatch"
                    )
                self.data = dict(data)
            self.entered = 0
            return previous

    def should_fail(self, command_name: str, app_name: str | None, ns: str | None) -> dict | None:
        """The fail point data when this command must fail (and count the activation), else None."""
        with self.lock:
            if self.mode == "off":
                return None
            data = self.data
            commands = data.get("failCommands") or []
            if command_name not in commands:
                return None
            if data.get("appName") and data["appName"] != app_name:
                return None
            if data.get("namespace") and data["namespace"] != ns:
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
