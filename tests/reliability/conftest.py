"""Start the runs that need a fresh process (rel_background) as soon as collection is over, when the
tests that read them were collected, so they overlap the in-process runs."""

from __future__ import annotations

import rel_background

#: tests that wait for a background run: last in one process (started at collection, the run overlaps
#: everything else), first on an xdist worker (started by the test)
WAITING = (
    "test_two_runs_in_two_processes_under_xdist_agree",
    "test_every_check_on_every_example_runs_offline",
    "test_no_check_crashes_on_an_example",
    "test_clean_examples_pass_every_domain",
    "test_report_of_every_example_reads_failures_first",
    "test_the_train_example_fails_what_it_promises",
    "test_vlm_example_under_every_domain_fails_its_root_causes_only",
)


def pytest_collection_modifyitems(config, items):
    waiting = [i for i in items if "reliability" in i.nodeid and i.nodeid.rsplit("::", 1)[-1] in WAITING]
    if not waiting:
        return
    others = [i for i in items if i not in waiting]
    if hasattr(config, "workerinput"):
        # under xdist nothing starts the runs at collection (the controller collects nothing): the test that
        # needs one starts it, so these go first, and the run overlaps the rest of the suite instead of leaving
        # a worker waiting at the end while the other has nothing left to run
        items[:] = waiting + others
    else:
        items[:] = others + waiting


def pytest_collection_finish(session):
    if hasattr(session.config, "workerinput") or session.config.option.collectonly:
        return  # an xdist worker: the test that needs a run starts it
    names = {item.nodeid.rsplit("::", 1)[-1].split("[")[0] for item in session.items}
    base = session.config._tmp_path_factory.mktemp("background")
    if names & set(WAITING[1:]):
        rel_background.examples(base)
    if "test_two_runs_in_two_processes_under_xdist_agree" in names:
        rel_background.xdist_projects(base)


def pytest_sessionfinish(session):
    for run in rel_background._RUNS.values():
        if run.proc.poll() is None:
            run.proc.kill()
