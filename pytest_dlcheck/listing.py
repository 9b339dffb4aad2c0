"""``pytest --dlcheck-list [ID|DOMAIN]``: the catalog, or the full docs of some checks."""

from __future__ import annotations

import sys
import textwrap

import pytest

from . import registry
from .roles import ROLES


def role_line(check: registry.Check) -> str:
    parts = [ROLES[r].hint() if r in ROLES else f"dlcheck_{r}" for r in check.roles]
    if check.optional_roles:
        parts.append("optional: " + ", ".join(f"dlcheck_{r}" for r in check.optional_roles))
    return "; ".join(parts) or "-"


def explain(check: registry.Check) -> str:
    out = [f"{check.id} {check.title}  [{check.domain}]", "", check.summary, ""]
    out.append("Roles")
    out.append(textwrap.indent(role_line(check), "    "))
    for section in registry.DOC_SECTIONS:
        body = check.doc.get(section)
        if body:
            out += ["", section, textwrap.indent(body, "    ")]
    out += ["", "With --dlcheck-twin"]
    if check.needs_real_weights:
        twin_text = f"Not applicable: needs the real weights ({check.needs_real_weights})."
    else:
        twin_text = (
            "The verdict carries over from a tiny twin of the model (same architecture from its config, two "
            "narrow layers): what it judges is wiring, masking, invariances, resume or schedules, not the weights."
        )
    out.append(textwrap.indent(textwrap.fill(twin_text, 88), "    "))
    if check.settings:
        out += ["", "Settings (--dlcheck-set ID.NAME=VALUE, or ini dlcheck_set)"]
        for s in check.settings:
            out.append(f"    {check.id}.{s.name} = {s.default!r}")
            out.append(textwrap.indent(textwrap.fill(s.help, 88), "        "))
    return "\n".join(out)


def print_catalog(config: pytest.Config, what: str) -> int:
    from _pytest.config import create_terminal_writer

    checks = registry.load_checks()
    tw = create_terminal_writer(config, sys.stdout)
    if what == "all":
        tw.line(f"{'ID':<5} {'domain':<9} {'title':<58} roles")
        for c in checks.values():
            tw.line(f"{c.id:<5} {c.domain:<9} {c.title:<58} {role_line(c)}")
        tw.line("")
        tw.line("Roles (define a fixture named dlcheck_<role> in conftest.py):")
        for r in ROLES.values():
            tw.line(f"  {r.fixture:<26} {r.help}")
        tw.line("")
        tw.line("Details of one check: pytest --dlcheck-list ID")
        return 0
    try:
        chosen = registry.select(registry.split_tokens(what), [])
    except ValueError as exc:
        tw.line(f"ERROR: {str(exc).replace('--dlcheck:', '--dlcheck-list:', 1)}", red=True)
        return pytest.ExitCode.USAGE_ERROR
    for i, c in enumerate(chosen):
        if i:
            tw.line("-" * 80)
        tw.line(explain(c))
    return 0
