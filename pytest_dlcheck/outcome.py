"""What a check says when it fails, and how it is printed: ID and title, evidence, cause, fix, see."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

WIDTH = 100


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


@dataclass
class Rendered:
    check_id: str
    title: str
    domain: str
    rows: list[tuple[str, list[str]]] = field(default_factory=list)

    def __str__(self) -> str:
        head = f"{self.check_id} {self.title}"
        tag = f"[{self.domain}]"
        out = [head + " " * max(2, WIDTH - len(head) - len(tag)) + tag]
        for label, lines in self.rows:
            first = True
            for line in lines:
                for piece in textwrap.wrap(line, WIDTH - 12, break_long_words=False, replace_whitespace=False) or [""]:
                    out.append(f"  {label if first else '':<9} {piece}")
                    first = False
        return "\n".join(out)


def render_failure(check, exc: CheckFailed) -> str:
    r = Rendered(check.id, check.title, check.domain)
    r.rows.append(("evidence", list(exc.evidence)))
    r.rows.append(("cause", [exc.cause]))
    r.rows.append(("fix", [exc.fix]))
    r.rows.append(("see", [f"pytest --dlcheck-list {check.id}"]))
    return str(r)


def render_role_error(check, exc: RoleError) -> str:
    r = Rendered(check.id, check.title, check.domain)
    r.rows.append(("error", [exc.message]))
    r.rows.append(("role", [f"dlcheck_{exc.role} (the fixture that provides it, or the object it was derived from)"]))
    r.rows.append(("see", [f"pytest --dlcheck-list {check.id}"]))
    return str(r)
