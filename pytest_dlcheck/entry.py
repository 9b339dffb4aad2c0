"""pytest-dlcheck's entry point (``pytest11``): the options, the ini keys and the markers, and nothing else
until ``--dlcheck`` (or the ini key ``dlcheck``, or env ``PYTEST_DLCHECK``) or ``--dlcheck-list`` turns the
plugin on. Installed but not enabled, a test run imports this module alone. Turned on, the selection and the
settings are checked first (a typo is a usage error with "did you mean", before any heavy import), then the
hooks (:mod:`pytest_dlcheck.plugin`) and the default role fixtures are registered.

This module imports nothing of the plugin at import time: what it needs from the core it imports inside
the hooks that run once the plugin is on."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

ENV_VAR = "PYTEST_DLCHECK"
#: the registry's domains (``registry.DOMAINS``; a test says they are the same), for the markers and the help
DOMAINS = ("llm", "vision", "diffusion", "rl", "vlm", "train", "ckpt", "smoke", "dist")
#: ``session.DEFAULT_TIMEOUT`` (a test says they are the same), for the help
DEFAULT_TIMEOUT = 300.0
#: the names the hooks and the default role fixtures are registered under once the plugin is on
CORE_PLUGIN = "dlcheck-core"
FIXTURES_PLUGIN = "dlcheck-fixtures"

_ID_RE = re.compile(r"^([A-Z]+)(\d+)$")

_NO_CONFTEST = "; the checks are collected beside that module's file, no conftest.py needed"
#: the options that name a role's builder (``builders.NAMED`` has the roles; a test says they are the same)
_BUILDER_OPTIONS = {
    "dlcheck_trainer_builder": (
        "--dlcheck-trainer",
        "a function (called once, with tmp_path_factory if it takes it) or attribute giving the Trainer" + _NO_CONFTEST,
    ),
    "dlcheck_lightning_builder": (
        "--dlcheck-lightning",
        "a function or attribute giving the LightningModule, or (module, datamodule)" + _NO_CONFTEST,
    ),
    "dlcheck_make_training_builder": (
        "--dlcheck-make-training",
        "your make_training factory (handed over as is: the checks call it for fresh objects)" + _NO_CONFTEST,
    ),
    "dlcheck_algorithm_builder": (
        "--dlcheck-algorithm",
        "a function or attribute giving the Stable-Baselines3 algorithm" + _NO_CONFTEST,
    ),
}


# --------------------------------------------------------------------------------------------------
# options


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dlcheck", "deep-learning pipeline checks (pytest-dlcheck)")
    group.addoption(
        "--dlcheck",
        action="store",
        metavar="DOMAINS|IDS",
        help="run the checks of these domains or IDs beside each conftest.py that defines dlcheck_* "
        f"fixtures: {', '.join(DOMAINS)}, all, or IDs like L2,L11 (also: ini 'dlcheck', env {ENV_VAR})",
    )
    group.addoption(
        "--dlcheck-ignore",
        action="append",
        default=[],
        metavar="IDS",
        help="checks or domains not to run, e.g. V6,L13 (adds to ini 'dlcheck_ignore')",
    )
    group.addoption(
        "--dlcheck-list",
        action="store",
        nargs="?",
        const="all",
        default=None,
        metavar="ID",
        help="print the catalog (ID, domain, title, roles) and exit; with an ID or domain, print its docs",
    )
    group.addoption(
        "--dlcheck-samples",
        action="store",
        type=_positive_int,
        default=None,
        metavar="N",
        help="examples sampled per dataset/dataloader (default 8; ini 'dlcheck_samples')",
    )
    group.addoption(
        "--dlcheck-batch-size",
        action="store",
        type=_positive_int,
        default=None,
        metavar="N",
        help="examples per batch when collating sampled examples (default 4; ini 'dlcheck_batch_size')",
    )
    group.addoption(
        "--dlcheck-world-size",
        action="store",
        type=_positive_int,
        default=2,
        metavar="N",
        help="processes the dist checks launch the training in (torch.distributed, gloo on CPU; default 2)",
    )
    group.addoption(
        "--dlcheck-set",
        action="append",
        default=[],
        metavar="ID.NAME=VALUE",
        help="override a check's threshold, e.g. L1.atol=1e-3 (adds to ini 'dlcheck_set')",
    )
    group.addoption(
        "--dlcheck-property",
        action="store_true",
        default=None,
        help="also run the data checks (L2, L4, L11, L13, L14…) in property mode: on examples Hypothesis "
        "generates from yours, edge lengths favoured (ini 'dlcheck_property')",
    )
    group.addoption(
        "--dlcheck-property-examples",
        action="store",
        type=_positive_int,
        default=None,
        metavar="N",
        help="generated batches per property-mode check (default 30; ini 'dlcheck_property_examples')",
    )
    group.addoption(
        "--dlcheck-timeout",
        action="store",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="stop a check that runs longer than this (setup and call together) and report where it was "
        f"(default {DEFAULT_TIMEOUT:g}; 0 turns the bound off; ini 'dlcheck_timeout')",
    )
    group.addoption(
        "--dlcheck-json",
        action="store",
        default=None,
        metavar="PATH",
        help="write every check's outcome, evidence numbers, roles, library versions and timing as JSON",
    )
    group.addoption(
        "--dlcheck-twin",
        action="store_true",
        default=False,
        help="run and train a tiny twin of the model (same architecture from its config, two narrow layers) "
        "instead of the real weights; checks that need the real weights are not applicable",
    )
    group.addoption(
        "--dlcheck-report",
        action="store",
        default=None,
        metavar="PATH",
        help="write a self-contained HTML report with every check's outcome, evidence and pictures",
    )
    for dest, (option, what) in _BUILDER_OPTIONS.items():
        group.addoption(option, action="store", default=None, dest=dest, metavar="MODULE:ATTR", help=what)
    group.addoption(
        "--dlcheck-role",
        action="append",
        default=[],
        dest="dlcheck_role_builder",
        metavar="NAME=MODULE:ATTR",
        help="hand over any role without a conftest.py, e.g. dataloader=mypkg.data:train_loader "
        "(the attribute is the role; ATTR() calls it to build the role)",
    )
    group.addoption(
        "--dlcheck-init",
        action="store_true",
        default=False,
        help="write a starter conftest.py for the kind of training this project's source shows (Trainer, "
        "Lightning, Accelerate or plain loop), the roles it could not fill marked TODO, and exit",
    )
    parser.addini("dlcheck", "domains or check IDs to run (as --dlcheck)", default="")
    parser.addini("dlcheck_ignore", "checks or domains not to run", type="args", default=[])
    parser.addini("dlcheck_samples", "examples sampled per dataset/dataloader", default="")
    parser.addini("dlcheck_batch_size", "examples per collated batch", default="")
    parser.addini("dlcheck_property", "also run the data checks in property mode", type="bool", default=False)
    parser.addini("dlcheck_property_examples", "generated batches per property-mode check", default="")
    parser.addini("dlcheck_timeout", f"seconds a check may run (default {DEFAULT_TIMEOUT:g}; 0: no bound)", default="")
    parser.addini("dlcheck_twin", "as --dlcheck-twin: checks run a tiny twin of the model", type="bool", default=False)
    parser.addini("dlcheck_set", "threshold overrides, one ID.NAME=VALUE per line", type="linelist", default=[])


# --------------------------------------------------------------------------------------------------
# activation


def setting_source(config: pytest.Config, options: Any = None) -> tuple[str, str]:
    """The ``--dlcheck`` selection and where it came from (command line, env, ini), or ``("", "")``."""
    options = config.option if options is None else options
    if getattr(options, "dlcheck", None):
        return options.dlcheck, "command line"
    if os.environ.get(ENV_VAR):
        return os.environ[ENV_VAR], f"env {ENV_VAR}"
    value = config.getini("dlcheck")
    if value:
        return value, "ini"
    return "", ""


def _split(values: Any) -> list[str]:
    """``"llm,train"``, ``"V6 L13"`` and lists of those become a flat list of tokens (as ``registry.split_tokens``)."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [t for v in values for t in re.split(r"[,\s]+", v.strip()) if t]


def _builtin_catalog() -> dict[str, tuple[str, ...] | None]:
    """The built-in checks' IDs and setting names, read from the checks' source without importing them (they
    import torch): ID -> its setting names, or None where they are not written out in its ``@check(...)``."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("pytest_dlcheck.checks")
    out: dict[str, tuple[str, ...] | None] = {}
    for where in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(where).rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in re.finditer(r'@check\(\s*"([A-Z]+\d+)"(.*?)\)\s*\n(?:@.*\n)*\s*def ', text, re.S):
                args = m.group(2)
                literal = re.search(r"settings=\s*\(", args) is not None or "settings=" not in args
                out[m.group(1)] = tuple(re.findall(r'Setting\(\s*"(\w+)"', args)) if literal else None
    return out


def _packs() -> bool:
    """Whether a third-party check pack is installed (its IDs are known only once it is imported)."""
    import importlib.metadata

    return bool(importlib.metadata.entry_points(group="pytest_dlcheck.checks"))


def _check_usage(config: pytest.Config, spec: str, source: str, options: Any) -> None:
    """The selection, the ignore list and the setting overrides name known domains, checks and settings:
    judged on the checks' source, before anything heavy is imported. A third-party pack's IDs and settings
    are judged once it is loaded (``plugin.configure``)."""
    from .registry import did_you_mean, unknown_setting, unknown_token

    catalog = _builtin_catalog()
    packs: bool | None = None
    ignore = _split(config.getini("dlcheck_ignore")) + _split(getattr(options, "dlcheck_ignore", None))
    label = {"command line": "--dlcheck", "ini": "ini dlcheck"}.get(source, source)
    for what, tokens in ((label, _split(spec)), ("dlcheck ignore", ignore)):
        for token in tokens:
            if token == "all" or token in DOMAINS or token.upper() in catalog:
                continue
            if _ID_RE.match(token.upper()):
                packs = _packs() if packs is None else packs
                if packs:
                    continue
            raise pytest.UsageError(unknown_token(what, token, catalog))
    for name, parse in (
        ("dlcheck_samples", _positive_int),
        ("dlcheck_batch_size", _positive_int),
        ("dlcheck_property_examples", _positive_int),
        ("dlcheck_timeout", _seconds),
    ):
        value = config.getini(name)
        if value:
            try:
                parse(value)
            except Exception as exc:  # noqa: BLE001 - argparse.ArgumentTypeError, imported lazily
                raise pytest.UsageError(f"ini {name} = {value!r}: {exc}") from None
    sets = list(config.getini("dlcheck_set")) + list(getattr(options, "dlcheck_set", None) or [])
    for text in sets:
        key, sep, _ = text.partition("=")
        cid, dot, name = key.strip().partition(".")
        if not sep or not dot:
            raise pytest.UsageError(f"--dlcheck-set {text!r}: expected ID.NAME=VALUE, e.g. L1.atol=1e-3")
        cid = cid.upper()
        if cid not in catalog:
            packs = _packs() if packs is None else packs
            if packs and _ID_RE.match(cid):
                continue
            raise pytest.UsageError(f"--dlcheck-set {text!r}: unknown check ID {cid!r}{did_you_mean(cid, catalog)}")
        names = catalog[cid]
        if names is not None and name not in names:
            raise pytest.UsageError(unknown_setting(text, cid, name, names))


def _turn_on(config: pytest.Config, options: Any) -> str:
    """Check the usage and register the hooks and the default role fixtures, once; the selection ('' when
    the plugin stays off)."""
    if getattr(options, "dlcheck_list", None) is not None or getattr(options, "dlcheck_init", False):
        return ""
    spec, source = setting_source(config, options)
    if not spec:
        builder = next((o for d, (o, _) in _BUILDER_OPTIONS.items() if getattr(options, d, None)), None)
        builder = builder or ("--dlcheck-role" if getattr(options, "dlcheck_role_builder", None) else None)
        if builder:
            raise pytest.UsageError(
                f"{builder} names a role for the checks: say which to run, e.g. --dlcheck=llm,train"
            )
        return spec
    if config.pluginmanager.has_plugin(CORE_PLUGIN):
        return spec
    _check_usage(config, spec, source, options)
    from . import builders

    found = builders.resolve(config, options) if builders.given(options) else []
    from . import fixtures, plugin

    config.pluginmanager.register(plugin, CORE_PLUGIN)
    if not config.pluginmanager.has_plugin(FIXTURES_PLUGIN):
        config.pluginmanager.register(fixtures, FIXTURES_PLUGIN)
    if found:
        builders.register(config, found)
    return spec


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """With --dlcheck on, the default role fixtures are registered before the initial conftest.py files
    load: a role fixture from a module they name in ``pytest_plugins`` (global, like ours) is registered
    after ours then, and overrides the default as the user's own fixture must."""
    _turn_on(early_config, early_config.known_args_namespace)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "dlcheck: a pytest-dlcheck check item")
    for domain in DOMAINS:
        config.addinivalue_line("markers", f"dlcheck_{domain}: a pytest-dlcheck check of the {domain} domain")
    spec = _turn_on(config, config.option)
    if spec and config.option.dlcheck_list is None:
        from . import plugin

        plugin.configure(config, *setting_source(config))


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if config.option.dlcheck_init:
        from .init import write_conftest

        return write_conftest(config)
    if config.option.dlcheck_list is None:
        return None
    from .listing import print_catalog

    return print_catalog(config, config.option.dlcheck_list)
