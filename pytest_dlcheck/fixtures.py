"""The plugin's fixtures: ``dlcheck`` (the check context) and the default ``dlcheck_<role>`` fixtures,
which a user's conftest.py overrides. A default derives its role from the others (a Trainer gives the
model, tokenizer, collator, datasets…) or resolves to MISSING, never raising."""

from __future__ import annotations

from typing import Any

import pytest

from .context import DEFAULTED_KEY, CheckContext, fixture_role
from .errors import MISSING
from .roles import derive
from .session import session_state

__all__ = [
    "dlcheck",
    "dlcheck_trainer",
    "dlcheck_model",
    "dlcheck_tokenizer",
    "dlcheck_collator",
    "dlcheck_dataset",
    "dlcheck_raw_dataset",
    "dlcheck_dataloader",
    "dlcheck_eval_dataset",
    "dlcheck_eval_dataloader",
    "dlcheck_optimizer",
    "dlcheck_lr_scheduler",
    "dlcheck_training_args",
    "dlcheck_compute_metrics",
    "dlcheck_inference_config",
]


def _default(request: pytest.FixtureRequest, name: str) -> Any:
    state = session_state(request.config)
    request.node.stash.setdefault(DEFAULTED_KEY, set()).add(name)

    def get(role: str) -> Any:
        try:
            return fixture_role(request, role)
        except pytest.FixtureLookupError:  # a domain's role has no default fixture
            return derive(role, get, state.derived)

    return state.guarded_user_call(name, lambda: derive(name, get, state.derived))


@pytest.fixture
def dlcheck(request: pytest.FixtureRequest):
    """The context of the running check: roles, settings, shared samples, ``fail``/``skip``."""
    return CheckContext.for_item(request)


@pytest.fixture
def dlcheck_trainer() -> Any:
    return MISSING


@pytest.fixture
def dlcheck_model(request):
    return _default(request, "model")


@pytest.fixture
def dlcheck_tokenizer(request):
    return _default(request, "tokenizer")


@pytest.fixture
def dlcheck_collator(request):
    return _default(request, "collator")


@pytest.fixture
def dlcheck_dataset(request):
    return _default(request, "dataset")


@pytest.fixture
def dlcheck_raw_dataset(request):
    return _default(request, "raw_dataset")


@pytest.fixture
def dlcheck_dataloader(request):
    return _default(request, "dataloader")


@pytest.fixture
def dlcheck_eval_dataset(request):
    return _default(request, "eval_dataset")


@pytest.fixture
def dlcheck_eval_dataloader(request):
    return _default(request, "eval_dataloader")


@pytest.fixture
def dlcheck_optimizer(request):
    return _default(request, "optimizer")


@pytest.fixture
def dlcheck_lr_scheduler(request):
    return _default(request, "lr_scheduler")


@pytest.fixture
def dlcheck_training_args(request):
    return _default(request, "training_args")


@pytest.fixture
def dlcheck_compute_metrics(request):
    return _default(request, "compute_metrics")


@pytest.fixture
def dlcheck_inference_config(request):
    return _default(request, "inference_config")
