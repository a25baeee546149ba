"""The error a bad grader spec raises."""

from __future__ import annotations


class GraderError(ValueError):
    """A grader spec is invalid, or cannot run on this server.

    ``param`` is the dotted path of the offending field (``grader.graders.a.input``)
    so the service can return it as the OpenAI error's ``param``; the message names
    the field and the fix.
    """

    def __init__(self, message: str, param: str = "grader"):
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self):
        # Keeps ``param`` when the error crosses a process-pool boundary.
        return (type(self), (self.message, self.param))
