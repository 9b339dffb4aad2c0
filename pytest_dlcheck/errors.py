"""The bottom of the core: what a check raises and the sentinel of a role nobody provided. Every other
module may import this one; it imports nothing of the plugin."""

from __future__ import annotations

from typing import Any


class CheckFailed(AssertionError):
    """Raised by :meth:`CheckContext.fail`; rendered without a traceback."""

    def __init__(self, evidence: list[str], cause: str, fix: str, data: dict | None = None):
        super().__init__(evidence[0] if evidence else cause)
        self.evidence = evidence
        self.cause = cause
        self.fix = fix
        self.data = data or {}


class RoleError(Exception):
    """A user's object (a role) raised or is unusable: reported as the user's error, naming the role,
    without a traceback into plugin internals."""

    def __init__(self, role: str, message: str):
        super().__init__(f"dlcheck_{role}: {message}")
        self.role = role
        self.message = message


class _Missing:
    """The value of a role nobody provided. Falsy, and never a valid user object."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
