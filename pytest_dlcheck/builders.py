"""Roles named on the command line, no conftest.py needed: ``--dlcheck-trainer=mypkg.train:build_trainer``
(and ``--dlcheck-lightning``, ``--dlcheck-make-training``, ``--dlcheck-algorithm``, ``--dlcheck-role
NAME=MOD:ATTR``). The options are judged before anything heavy is imported (the module is found, not
imported; the attribute is looked for in its source), the role fixtures are provided by a plugin this module
registers (session scope: each builder is called once, when the first check needs it), and the checks are
collected beside the builder's own module file, claimed in ``pytest_collect_file`` as a conftest.py that
defines roles is: every check item's parent chain is the user's own directory node.

This module imports nothing heavy: the user's module is imported when a check first needs its role."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: option dest -> (the option as written, the roles it provides, whether a function found there is called)
NAMED = {
    "dlcheck_trainer_builder": ("--dlcheck-trainer", ("trainer",), True),
    "dlcheck_lightning_builder": ("--dlcheck-lightning", ("lightning_module", "datamodule"), True),
    "dlcheck_make_training_builder": ("--dlcheck-make-training", ("make_training",), False),
    "dlcheck_algorithm_builder": ("--dlcheck-algorithm", ("algorithm",), True),
}
PLUGIN = "dlcheck-builders"
_CALL = "()"


@dataclass
class Builder:
    """One option: the module and attribute it names, the roles it provides and whether the attribute is
    called (a function building the object) or is the role's value itself (a factory role, ``ATTR`` without
    ``()`` under ``--dlcheck-role``)."""

    option: str
    text: str
    module: str
    attr: str
    roles: tuple[str, ...]
    call: bool
    origin: Path | None = None
    _value: Any = field(default=None, repr=False)
    _built: bool = False

    def build(self, request: pytest.FixtureRequest) -> Any:
        if self._built:
            return self._value
        from .isolation import as_user

        with as_user():
            obj = getattr(importlib.import_module(self.module), self.attr)
            if self.call and (inspect.isroutine(obj) or isinstance(obj, type) or _is_partial(obj)):
                kwargs = {}
                if _accepts(obj, "tmp_path_factory"):
                    kwargs["tmp_path_factory"] = request.getfixturevalue("tmp_path_factory")
                obj = obj(**kwargs)
        self._value, self._built = obj, True
        return obj

    def role_value(self, role: str, request: pytest.FixtureRequest) -> Any:
        value = self.build(request)
        if len(self.roles) == 2:  # --dlcheck-lightning: a module, or (module, datamodule)
            pair = tuple(value) if isinstance(value, (tuple, list)) and len(value) == 2 else (value, None)
            if role == self.roles[1] and pair[1] is None:
                from .errors import MISSING

                return MISSING
            return pair[self.roles.index(role)]
        return value


def _is_partial(obj: Any) -> bool:
    import functools

    return isinstance(obj, functools.partial)


def _accepts(obj: Any, name: str) -> bool:
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False
    return name in params


# --------------------------------------------------------------------------------------------------
# the options, judged before any heavy import


def role_names() -> set[str]:
    """Every role's name, read from the source that registers them (``role("name", ...)``) without
    importing the domains (they import torch)."""
    names: set[str] = set()
    for pkg in ("pytest_dlcheck", "pytest_dlcheck.checks"):
        spec = importlib.util.find_spec(pkg)
        for where in (spec.submodule_search_locations or []) if spec else []:
            for path in Path(where).rglob("*.py"):
                text = path.read_text(encoding="utf-8", errors="replace")
                names.update(re.findall(r'^\s*role\(\s*"(\w+)"', text, re.M))
    return names


def given(options: Any) -> list[tuple[str, str, tuple[str, ...], bool]]:
    """(option, MOD:ATTR text, roles, call) for each builder option given."""
    out = []
    for dest, (option, roles, call) in NAMED.items():
        text = getattr(options, dest, None)
        if text:
            out.append((option, text, roles, call))
    for text in getattr(options, "dlcheck_role_builder", None) or []:
        name, sep, target = text.partition("=")
        name = name.strip().removeprefix("dlcheck_")
        if not sep or not name:
            raise pytest.UsageError(
                f"--dlcheck-role {text!r}: expected NAME=MODULE:ATTRIBUTE, e.g. dataloader=mypkg.data:train_loader "
                "(ATTRIBUTE() calls it to build the role)"
            )
        known = role_names()
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise pytest.UsageError(
                f"--dlcheck-role {text!r}: no pytest-dlcheck role named {name!r}{hint}; the roles: pytest --dlcheck-list"
            )
        target = target.strip()
        call = target.endswith(_CALL)
        out.append(("--dlcheck-role", target.removesuffix(_CALL) if call else target, (name,), call))
    return out


def _search_path(config: pytest.Config) -> list[str]:
    """Where the user's modules are looked for: sys.path, then the invocation directory and the rootdir
    (``python -m pytest`` puts the first on sys.path; a bare ``pytest`` does not)."""
    extra = []
    for where in (config.invocation_params.dir, config.rootpath):
        if str(where) not in sys.path and str(where) not in extra:
            extra.append(str(where))
    return extra


def _siblings(module: str, config: pytest.Config) -> list[str]:
    import pkgutil

    parent, _, _ = module.rpartition(".")
    if parent:
        try:
            spec = importlib.util.find_spec(parent)
        except Exception:  # noqa: BLE001 - the parent itself is missing or broken
            return []
        where = list(spec.submodule_search_locations or []) if spec else []
        return [f"{parent}.{m.name}" for m in pkgutil.iter_modules(where)]
    where = [str(config.invocation_params.dir), str(config.rootpath)]
    return [m.name for m in pkgutil.iter_modules(where)]


def _top_level_names(source: str) -> set[str] | None:
    """The names a module's source binds at its top level, or None when it binds names the source does not
    say (``from x import *``, a module ``__getattr__``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
        else:  # an if/try/with block: the names it binds are bound somewhere in it
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
                elif isinstance(sub, ast.alias):
                    names.add(sub.asname or sub.name.split(".")[0])
    return None if "__getattr__" in names else names


def resolve(config: pytest.Config, options: Any) -> list[Builder]:
    """The builder options, each found: its module located (its parent packages imported, not the module
    itself) and its attribute looked for in the module's source. A usage error names the option and the
    closest name when one is close."""
    builders = []
    for option, text, roles, call in given(options):
        module, sep, attr = text.partition(":")
        module, attr = module.strip(), attr.strip()
        if not sep or not module or not attr:
            raise pytest.UsageError(f"{option} {text!r}: expected MODULE:ATTRIBUTE, e.g. mypkg.train:build_trainer")
        for where in _search_path(config):
            sys.path.append(where)
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        except Exception as exc:  # noqa: BLE001 - a parent package that raised on import
            raise pytest.UsageError(
                f"{option} {text!r}: importing {module.rpartition('.')[0]!r} raised {exc!r}"
            ) from None
        if spec is None:
            close = difflib.get_close_matches(module, _siblings(module, config), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise pytest.UsageError(
                f"{option} {text!r}: no module named {module!r}{hint}; looked on sys.path, in "
                f"{config.invocation_params.dir} and in the rootdir {config.rootpath}"
            )
        origin = Path(spec.origin) if spec.origin and spec.origin not in ("built-in", "frozen") else None
        if origin is not None and origin.suffix == ".py":
            names = _top_level_names(origin.read_text(encoding="utf-8", errors="replace"))
            if names is not None and attr not in names:
                public = sorted(n for n in names if not n.startswith("_"))
                close = difflib.get_close_matches(attr, public, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise pytest.UsageError(f"{option} {text!r}: {module} ({origin}) defines no {attr!r}{hint}")
        builders.append(Builder(option, text, module, attr, roles, call, origin))
    seen: dict[str, str] = {}
    for b in builders:
        for role in b.roles:
            if role in seen:
                raise pytest.UsageError(f"role {role} is named twice: by {seen[role]} and by {b.option} {b.text}")
            seen[role] = f"{b.option} {b.text}"
    return builders


# --------------------------------------------------------------------------------------------------
# the plugin: the role fixtures and the collection of the checks beside the builder's module


def _fixture(builder: Builder, role: str) -> Any:
    def provide(request: pytest.FixtureRequest) -> Any:
        return builder.role_value(role, request)

    provide.__name__ = f"dlcheck_{role}"
    provide.__doc__ = f"{role}, from {builder.option} {builder.text}"
    return pytest.fixture(scope="session", name=f"dlcheck_{role}")(provide)


class BuilderPlugin:
    """Collects the checks at the first builder's module file (the home of the roles named on the command
    line), and says after collection where they were to be collected when this run did not reach it."""

    def __init__(self, builders: list[Builder]) -> None:
        self.builders = builders
        self.home = next((b.origin for b in builders if b.origin is not None), None)
        self.conflict = False
        self.fixtures = types.ModuleType("pytest_dlcheck.builders.fixtures")
        for builder in builders:
            for role in builder.roles:
                setattr(self.fixtures, f"dlcheck_{role}", _fixture(builder, role))

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        from . import plugin  # as the entry point imports it (the module whose hooks are registered)

        if file_path.name == "conftest.py":
            # a conftest.py's own role fixture would override the one named on the command line for every
            # check that sees it (the builder's checks too): two sources for one role is a mistake to say
            twice = sorted(plugin._role_fixtures(parent.config, file_path) & set(vars(self.fixtures)))
            if twice:
                named = [f"{b.option} {b.text}" for b in self.builders if set(b.roles) & {t[8:] for t in twice}]
                self.conflict = True
                raise parent.CollectError(
                    f"{file_path}: defines {', '.join(twice)}, which {'; '.join(named)} names too: keep one of them"
                )
        if self.home is None or file_path != self.home:
            return None
        return plugin.DlcheckFile.from_parent(parent, path=file_path)

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str] | None:
        from .session import STATE_KEY

        state = config.stash.get(STATE_KEY, None)
        if (
            self.conflict
            or state is None
            or not state.selected
            or self.home is None
            or str(self.home) in state.role_files
        ):
            return None
        first = self.builders[0]
        return [
            f"dlcheck: the checks of {first.option} {first.text} are collected at {self.home}, which this run did "
            f"not collect: run pytest from {config.rootpath} without narrowing paths, or name that file"
        ]


def register(config: pytest.Config, builders: list[Builder]) -> None:
    """Register the builders' fixtures (after the default role fixtures, which they override) and the
    collection, once."""
    if config.pluginmanager.has_plugin(PLUGIN):
        return
    plugin = BuilderPlugin(builders)
    config.pluginmanager.register(plugin, PLUGIN)
    config.pluginmanager.register(plugin.fixtures, PLUGIN + "-fixtures")
