"""The check registry: one decorator is the single source of truth for a check's ID, title, roles,
settings and doc. Importing this module imports nothing heavy; check modules are imported only when
the plugin is active (or the catalog is listed)."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Domains in catalog order. Selecting one of these with no registered check is allowed (it selects
#: nothing yet); any other name is an error.
DOMAINS = ("llm", "vision", "diffusion", "rl", "vlm", "train", "ckpt", "smoke", "dist")

#: Sections every check's doc must have, in this order (the ruff rule-doc sections, and when the check does
#: not concern a pipeline: it then skips "not applicable").
DOC_SECTIONS = ("What it does", "Why it is bad", "Example", "Use instead", "Known problems", "Not applicable")

ENTRY_POINT_GROUP = "pytest_dlcheck.checks"
#: the package of the built-in checks (``checks/`` at the top of the source tree, installed here)
BUILTIN_CHECKS = "pytest_dlcheck.checks"

_ID_RE = re.compile(r"^([A-Z]+)(\d+)$")


@dataclass(frozen=True)
class Setting:
    """A named, documented, overridable threshold of a check (``--dlcheck-set ID.name=value``)."""

    name: str
    default: Any
    help: str

    def parse(self, text: str) -> Any:
        kind = type(self.default)
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true/false, got {text!r}")
        return kind(text)


@dataclass(frozen=True)
class Check:
    id: str
    domain: str
    title: str
    roles: tuple[str, ...]
    func: Callable[..., Any]
    optional_roles: tuple[str, ...] = ()
    settings: tuple[Setting, ...] = ()
    summary: str = ""
    doc: dict[str, str] = field(default_factory=dict)
    #: the check states an invariant of collated batches, so it also runs on generated examples
    property_mode: bool = False
    #: with --dlcheck-twin: "" when the verdict carries over from a tiny twin of the model (wiring, masking,
    #: invariances, resume, schedules), else why it needs the real weights (the check is then not applicable)
    needs_real_weights: str = ""

    @property
    def sort_key(self) -> tuple[int, str, int]:
        prefix, number = _ID_RE.match(self.id).groups()
        return (DOMAINS.index(self.domain), prefix, int(number))

    @property
    def item_name(self) -> str:
        return f"{self.id}_{self.func.__name__.removeprefix('check_')}"

    def setting(self, name: str) -> Setting:
        for s in self.settings:
            if s.name == name:
                return s
        raise KeyError(f"{self.id} has no setting {name!r}")


_CHECKS: dict[str, Check] = {}

#: domain -> ``concerns(ctx) -> reason or None``: asked when a check of that domain misses a role, so a
#: pipeline of another kind hears "not applicable" rather than a request for a fixture that would not make
#: the check run (a vision project is not asked for a tokenizer); registered by the domain's package
_APPLICABILITY: dict[str, Callable[[Any], str | None]] = {}
_KIND_RULES: dict[str, Callable[[Any], str | None]] = {}


def applicability(domain: str) -> Callable[[Callable[[Any], str | None]], Callable[[Any], str | None]]:
    """Register the predicate that tells whether ``domain``'s checks concern the pipeline at all."""

    def register(fn: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        _APPLICABILITY[domain] = fn
        return fn

    return register


def kind_rule(domain: str) -> Callable[[Callable[[Any], str | None]], Callable[[Any], str | None]]:
    """Register the predicate that tells, before any of ``domain``'s checks runs, that the pipeline is of a
    kind the domain never concerns (a diffusers denoiser for the llm checks), decided from the objects."""

    def register(fn: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        _KIND_RULES[domain] = fn
        return fn

    return register


def wrong_kind(domain: str, ctx: Any) -> str | None:
    """Why ``domain``'s checks never concern this kind of pipeline, or None."""
    fn = _KIND_RULES.get(domain)
    return fn(ctx) if fn is not None else None


def not_concerned(domain: str, ctx: Any) -> str | None:
    """Why ``domain``'s checks do not concern the pipeline of ``ctx``, or None (they do, or cannot tell)."""
    fn = _APPLICABILITY.get(domain)
    return fn(ctx) if fn is not None else None


def parse_doc(text: str | None) -> tuple[str, dict[str, str]]:
    """Split a check docstring into its summary line and its titled sections."""
    lines = (text or "").expandtabs().splitlines()
    summary = lines[0].strip() if lines else ""
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines[1:]:
        stripped = line.strip()
        if stripped in DOC_SECTIONS:
            current = stripped
            sections[current] = []
        elif current is not None:
            sections[current].append(line.rstrip())
    # relative indentation is kept, so code in an Example section reads as code
    return summary, {k: textwrap.dedent("\n".join(v)).strip() for k, v in sections.items()}


#: the built-in checks whose verdict needs the user's real weights (not applicable with --dlcheck-twin), and why;
#: a check registered with ``needs_real_weights=`` says it itself
REAL_WEIGHTS = {
    "T1": "the initial loss of a pretrained model is a property of its weights",
    "T5": "an fp16 overflow depends on the real weights' and activations' magnitudes",
    "S1": "a short run's NaN/Inf comes from the real model's dynamics",
    "S2": "a loss spike is a property of the real model's run",
    "S3": "a gradient-norm explosion is a property of the real model's run",
    "S4": "how fast a DPO loss leaves ln 2 depends on the real policy",
    "S5": "a train/eval gap is a property of the real model's run",
    "L6": "logit drift is a property of the real model's logits",
    "X2": "the projector's scale is judged against the real towers' features",
    "V4": "detections after thresholds depend on the real detector's scores",
}


def check(
    id: str,
    *,
    domain: str,
    title: str,
    roles: tuple[str, ...] = (),
    optional_roles: tuple[str, ...] = (),
    settings: tuple[Setting, ...] = (),
    property_mode: bool = False,
    needs_real_weights: str = "",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a check. The decorated function is a plain pytest test function taking the ``dlcheck``
    fixture (a :class:`~pytest_dlcheck.context.CheckContext`). ``property_mode=True`` marks a check whose
    verdict is an invariant of the shared sample: ``--dlcheck-property`` also runs it on generated
    examples (see :mod:`pytest_dlcheck.property`)."""
    if not _ID_RE.match(id):
        raise ValueError(f"check id {id!r} must be letters then digits, like L11")
    if domain not in DOMAINS:
        raise ValueError(f"check {id}: unknown domain {domain!r}")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        old = _CHECKS.get(id)
        if old is not None and (old.func.__module__, old.func.__qualname__) != (func.__module__, func.__qualname__):
            raise ValueError(f"check id {id} registered twice ({_CHECKS[id].func.__module__}, {func.__module__})")
        summary, doc = parse_doc(func.__doc__)
        _CHECKS[id] = Check(
            id,
            domain,
            title,
            tuple(roles),
            func,
            tuple(optional_roles),
            tuple(settings),
            summary,
            doc,
            property_mode,
            needs_real_weights or REAL_WEIGHTS.get(id, ""),
        )
        func.dlcheck_id = id
        return func

    return decorate


_loaded = False


def load_checks() -> dict[str, Check]:
    """Import every built-in check module and every third-party pack (entry point group
    ``pytest_dlcheck.checks``) once; return the registry sorted by domain and number."""
    global _loaded
    if not _loaded:
        # the built-in checks are found like a pack, by name: the core imports no check module
        builtin = importlib.import_module(BUILTIN_CHECKS)
        for info in pkgutil.walk_packages(builtin.__path__, builtin.__name__ + "."):
            importlib.import_module(info.name)
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            ep.load()
        _loaded = True
    global _sorted
    stamp = (id(_CHECKS), len(_CHECKS))  # sorted once; a pack registering later (or a test's copy) sorts again
    if _sorted is None or _sorted[0] != stamp:
        _sorted = (stamp, dict(sorted(_CHECKS.items(), key=lambda kv: kv[1].sort_key)))
    return dict(_sorted[1])


#: the registry in domain and number order as :func:`load_checks` last sorted it, with the registry it sorted
_sorted: tuple[tuple[int, int], dict[str, Check]] | None = None


def did_you_mean(word: str, choices: Any) -> str:
    """`` (did you mean X?)`` with the closest of ``choices``, or ``""``."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_token(what: str, token: str, ids: Any) -> str:
    """The usage error of a ``--dlcheck`` / ignore token that is no domain and no check ID: the closest ID
    for a token shaped like one, else the closest domain."""
    upper = token.upper()
    hint = did_you_mean(upper, ids) if _ID_RE.match(upper) else ""
    hint = hint or did_you_mean(token.lower(), ("all", *DOMAINS)) or did_you_mean(upper, ids)
    return (
        f"{what}: unknown domain or check ID {token!r}{hint} (domains: {', '.join(('all', *DOMAINS))}; "
        "IDs: pytest --dlcheck-list)"
    )


def unknown_setting(text: str, cid: str, name: str, names: Any) -> str:
    """The usage error of ``--dlcheck-set ID.NAME=VALUE`` naming no setting of the check."""
    listed = ", ".join(names) or "none"
    return f"--dlcheck-set {text!r}: {cid} has no setting {name!r}{did_you_mean(name, names)} (settings: {listed})"


def select(tokens: list[str], ignore: list[str]) -> list[Check]:
    """Resolve ``--dlcheck`` tokens (domains, ``all``, or exact check IDs) minus the ignore list.
    Unknown names are an error, never silence."""
    checks = load_checks()

    def resolve(token: str, what: str) -> set[str]:
        if token == "all":
            return set(checks)
        if token in DOMAINS:
            return {cid for cid, c in checks.items() if c.domain == token}
        if token.upper() in checks:
            return {token.upper()}
        raise ValueError(unknown_token(what, token, checks))

    chosen: set[str] = set()
    for token in tokens:
        chosen |= resolve(token, "--dlcheck")
    for token in ignore:
        chosen -= resolve(token, "dlcheck ignore")
    return [c for cid, c in checks.items() if cid in chosen]


def split_tokens(values: list[str] | str | None) -> list[str]:
    """``"llm,train"``, ``"V6 L13"`` and lists of those all become a flat list of tokens."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [t for v in values for t in re.split(r"[,\s]+", v.strip()) if t]
