"""Small helpers the test modules share."""

from pytest_dlcheck.cost import add_cost


def flat(text: str) -> str:
    """A failure text with its wrapping undone (whitespace runs become one space), for substring asserts."""
    return " ".join(text.split())


def work_of(doc: dict, cid: str) -> dict:
    """A check's work in a JSON report with the shared runs it made added back (the report counts a shared run's
    passes as the run's, under ``shared``, not as its maker's): forward, backward, optimizer_steps, and the
    per-model and per-routine forward passes."""
    total = dict(next(r["cost"] for r in doc["results"] if r["id"] == cid))
    for run in doc["shared"].values():
        if run["made_by"] == cid:
            total = add_cost(total, run.get("cost") or {})
    for key in ("forward", "backward", "optimizer_steps"):
        total.setdefault(key, 0)
    return total


def role_fixtures(indent: str = "    ", **roles: str) -> str:
    """The conftest text of session-scoped ``dlcheck_<role>`` fixtures, each returning the expression given
    (``role_fixtures(make_training="make", train_step="step")``), indented as the conftest around it."""
    lines = []
    for role, value in roles.items():
        lines += ["@pytest.fixture(scope='session')", f"def dlcheck_{role}():", f"    return {value}", ""]
    return "\n".join(indent + line if line else "" for line in lines)


def no_leftover_process() -> None:
    """A launch left no process group open and no rank process alive."""
    import multiprocessing

    import torch

    assert not torch.distributed.is_initialized()
    assert not multiprocessing.active_children(), multiprocessing.active_children()
