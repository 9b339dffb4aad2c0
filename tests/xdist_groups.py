"""``--dist loadgroup`` (scripts/test) under pytest 9: pytest-xdist 3.8 names an ``xdist_group`` mark's group
by appending ``@<group>`` to ``item._nodeid``, an attribute pytest 9 no longer reads (a node's id lives in
``item._id``), so every test was scheduled alone and the tests of one group ran on both workers: each worker
then made the group's shared runs (the examples' background run, rel_runs' in-process runs) again. This puts
the suffix where pytest 9 reads it, on the workers of a loadgroup run only; with a pytest whose nodeid still
honours xdist's suffix it finds the suffix there and does nothing. tests/test_xdist_groups.py runs it."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on an xdist worker of a --dist loadgroup run
        return
    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            from _pytest.nodeid import NodeId  # pytest >= 9: the id xdist's suffix no longer reaches

            item._id = NodeId.parse(item.nodeid + suffix)
