"""The one exception type the lab raises for problems a user can act on."""

from __future__ import annotations


class LabError(Exception):
    """A lab operation failed; ``str(err)`` says why.

    ``node`` names the node at fault (if one is), and ``log_tail`` holds the
    last lines of its log, so a CLI can show them under the message.
    """

    def __init__(self, message: str, *, node: str | None = None, log_tail: str | None = None):
        super().__init__(message)
        self.node = node
        self.log_tail = log_tail


class RunFailed(LabError):
    """One repetition could not run (e.g. a node failed to start); the batch goes on with the next."""
