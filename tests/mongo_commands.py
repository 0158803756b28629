"""A pymongo command listener that records what a client sent and got back (tests only)."""

from __future__ import annotations

from pymongo import monitoring


class Recorder(monitoring.CommandListener):
    """Every command a client started (name, command), and the replies and failures it got."""

    def __init__(self):
        self.commands: list[tuple[str, dict]] = []
        self.failures: list[tuple[str, dict]] = []
        self.replies: list[tuple[str, dict]] = []

    def started(self, event):
        self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event):
        self.replies.append((event.command_name, dict(event.reply)))

    def failed(self, event):
        self.failures.append((event.command_name, dict(event.failure)))

    def names(self) -> list[str]:
        return [name for name, _ in self.commands]
