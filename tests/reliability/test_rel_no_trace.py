"""No trace, proven for every registered check: each runs on real projects of its domain (one in-process
pytest run per domain, every check of the domain in it), and the state of the user's objects and of the
process before and after each check item is compared — parameters and buffers bit for bit, gradients,
requires_grad, train/eval modes, hooks, configs, tokenizer settings and vocabulary, dataloader and
sampler generators, optimizer/scheduler/EMA state, python/numpy/torch/CUDA RNGs, grad mode, environment,
and files left outside pytest's tmp paths (rel_tracker.py). A check of a domain without a project here
fails, naming the project to add."""

from __future__ import annotations

import pytest
import rel_projects
from rel_runs import pytest_tmp_paths, run_group
from rel_tracker import Tracker, check_id

from pytest_dlcheck import registry

CHECKS = registry.load_checks()
#: the tests that read rel_runs' in-process runs (made once per process) share one worker under xdist, with
#: test_rel_flake_xdist.py's (scripts/test: loadgroup)
pytestmark = pytest.mark.xdist_group("rel_runs")


@pytest.mark.parametrize("cid", list(CHECKS))
def test_check_leaves_no_trace(pytester, cid):
    check = CHECKS[cid]
    if check.domain not in rel_projects.PROJECTS:
        pytest.fail(
            f"{cid} ({check.domain}) has no real project to prove it leaves no trace: add a group for "
            f"{check.domain!r} to GROUPS in tests/reliability/rel_projects.py (conftest.py sources building real "
            f"{check.domain} objects, e.g. from tests/{check.domain}/'s helpers)",
            pytrace=False,
        )
    tracker, result = run_group(pytester, check.domain)
    text = result.stdout.str()
    assert "INTERNALERROR" not in text, text
    items = sorted(n for n in tracker.outcomes if check_id(n) == cid)
    assert items, f"{cid} was not collected:\n{text}"
    traces = {n: tracker.traces[n] for n in items if tracker.traces.get(n)}
    assert not traces, f"{cid} left a trace:\n" + "\n".join(f"{n}:\n  " + "\n  ".join(t) for n, t in traces.items())
    errors = {n: tracker.errors[n] for n in items if tracker.outcomes[n] == "error"}
    assert not errors, f"{cid} errored:\n" + "\n".join(errors.values())
    ran = [
        n
        for n in items
        if tracker.outcomes[n] != "skipped" or not tracker.reasons.get(n, "").startswith("missing role")
    ]
    assert ran, f"{cid} skipped for a missing role on every {check.domain} project: " + "; ".join(
        f"{n}: {tracker.reasons.get(n)}" for n in items
    )


def test_the_tracker_sees_each_kind_of_trace(pytester, monkeypatch):
    """The proof above is only as good as its detector: with pytest_dlcheck's guards sabotaged, a check
    that runs the model leaves a nudged weight, modes left in eval, an advanced RNG and a file in the
    project, and each is attributed to that check."""
    import contextlib

    import torch

    import pytest_dlcheck.checks.shared.lm
    import pytest_dlcheck.guard

    @contextlib.contextmanager
    def leaky_eval_mode(model):
        model.eval()
        with torch.no_grad():
            yield model
            next(model.parameters()).add_(1e-3)
        torch.rand(1)
        with open("leak.txt", "w") as f:
            f.write("x")

    monkeypatch.setattr(pytest_dlcheck.checks.shared.lm, "eval_mode", leaky_eval_mode)
    monkeypatch.setattr(pytest_dlcheck.guard, "preserved_rng", contextlib.nullcontext)
    (pytester.path / "p").mkdir()
    (pytester.path / "p" / "conftest.py").write_text(rel_projects.LLM_HAND)
    tracker = Tracker(pytester.path, pytest_tmp_paths(pytester), pytester.path.parent / "tmp-selftest")
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--dlcheck=L3,L1", plugins=[tracker])
    assert tracker.outcomes.keys() == {"p/conftest.py::L1_padding_side", "p/conftest.py::L3_special_tokens"}
    # L3 runs no model: with the RNG guard gone, only the check frame's own seeding shows
    assert all(t.startswith("process state") for t in tracker.traces["p/conftest.py::L3_special_tokens"])
    traces = "\n".join(tracker.traces["p/conftest.py::L1_padding_side"])
    assert "weight: changed (largest change 0.0" in traces, traces
    assert ".training: True -> False" in traces, traces
    assert "process state torch.random: changed" in traces, traces
    assert "leak.txt (written at /" in traces and "checks/shared/lm.py" in traces, traces
