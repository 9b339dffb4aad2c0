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


@dataclass(eq=False)
class Rendered:
    """A failure in the house format. pytest calls ``toterminal`` (colour where the terminal supports it);
    ``str()`` gives the plain text (xdist ships that)."""

    check_id: str
    title: str
    domain: str
    rows: list[tuple[str, list[str]]] = field(default_factory=list)

    def lines(self) -> list[tuple[str, str]]:
        """(label, text) pairs; the first is the header line."""
        head = f"{self.check_id} {self.title}"
        tag = f"[{self.domain}]"
        out = [("", head + " " * max(2, WIDTH - len(head) - len(tag)) + tag)]
        for label, texts in self.rows:
            first = True
            for text in texts:
                for piece in textwrap.wrap(text, WIDTH - 12, break_long_words=False, break_on_hyphens=False, replace_whitespace=False) or [""]:
                    out.append((label if first else "", piece))
                    first = False
        return out

    def toterminal(self, tw) -> None:
        markup = {"evidence": {"yellow": True}, "cause": {"red": True}, "fix": {"green": True}, "error": {"red": True}}
        for i, (label, text) in enumerate(self.lines()):
            if i == 0:
                tw.line(text, bold=True, red=True)
                continue
            tw.write(f"  {label:<9} ", **markup.get(label, {}), bold=bool(label))
            tw.line(text)

    def __str__(self) -> str:
        return "\n".join(text if i == 0 else f"  {label:<9} {text}" for i, (label, text) in enumerate(self.lines()))


def render_failure(check, exc: CheckFailed) -> Rendered:
    r = Rendered(check.id, check.title, check.domain)
    r.rows.append(("evidence", list(exc.evidence)))
    r.rows.append(("cause", [exc.cause]))
    r.rows.append(("fix", [exc.fix]))
    r.rows.append(("see", [f"pytest --dlcheck-list {check.id}"]))
    return r


def render_role_error(check, exc: RoleError) -> Rendered:
    r = Rendered(check.id, check.title, check.domain)
    r.rows.append(("error", [exc.message]))
    r.rows.append(("role", [f"dlcheck_{exc.role} (the fixture that provides it, or the object it was derived from)"]))
    r.rows.append(("see", [f"pytest --dlcheck-list {check.id}"]))
    return r
