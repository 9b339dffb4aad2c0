"""No network, ever: the whole ``--dlcheck=all`` run on every example project, in a fresh process with
every outbound connection and DNS lookup blocked and recorded, and the Hugging Face libraries started
in online mode (HF_HUB_OFFLINE and friends unset before they are imported), so that any hub call a check
made would be attempted — and seen (rel_nonet, rel_background). Every in-process run of
tests/reliability blocks the network the same way, so every check on every real project is covered too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rel_background
from rel_nonet import NoNetwork

#: the tests that read the examples' background run share one worker under xdist (scripts/test: loadgroup)
pytestmark = pytest.mark.xdist_group("examples")


def test_the_blocker_sees_a_hub_request_in_online_mode():
    """The proof's own detector: under the guard the hub libraries are online, and a request is caught."""
    import huggingface_hub.constants
    import requests
    import transformers.utils.hub

    guard = NoNetwork()
    guard.install()
    try:
        assert not huggingface_hub.constants.is_offline_mode() and not transformers.utils.hub.is_offline_mode()
        with pytest.raises(OSError):
            requests.get("https://huggingface.co/api/models/gpt2", timeout=2)
    finally:
        guard.uninstall()
    assert huggingface_hub.constants.is_offline_mode(), "the guard did not put offline mode back"
    assert guard.attempts and "huggingface.co" in " ".join(guard.attempts), guard.attempts


def examples_run(tmp_path_factory):
    outcomes, attempts, text, _ = rel_background.examples_outcomes(tmp_path_factory.mktemp("background"))
    return outcomes, attempts, text


def test_every_check_on_every_example_runs_offline(tmp_path_factory):
    outcomes, attempts, text = examples_run(tmp_path_factory)
    domains = {n.split("/")[0] for n in outcomes}
    assert domains >= {"llm", "vision", "diffusion"}, text[-3000:]
    # a user's fixture building a TRL trainer queues the library's telemetry ping: the user's own business;
    # everything a check does runs offline (plugin._check_frame), so nothing is the plugin's
    theirs = [a for a in attempts if "[user]" not in a]
    assert not theirs, "network access attempted:\n" + "\n".join(theirs)


def test_no_check_crashes_on_an_example(tmp_path_factory):
    outcomes, attempts, text = examples_run(tmp_path_factory)
    internal = {n: t for n, (o, t) in outcomes.items() if "pytest-dlcheck internal error" in t}
    assert not internal, "\n\n".join(f"{n}:\n{t[-2500:]}" for n, t in internal.items())


def test_clean_examples_pass_every_domain(tmp_path_factory):
    """--dlcheck=all on a clean project: the checks of other domains skip, none fails."""
    outcomes, attempts, text = examples_run(tmp_path_factory)
    clean = {n: t for n, (o, t) in outcomes.items() if "/clean" in n and o in ("failed", "error")}
    assert not clean, "failures on clean example projects:\n\n" + "\n\n".join(
        f"{n}:\n{t[-1500:]}" for n, t in clean.items()
    )


def test_report_of_every_example_reads_failures_first(tmp_path_factory, tmp_path):
    """The HTML report of --dlcheck=all over every example project (broken and clean of each domain): the
    failures first, then errors, passes with their evidence, the grouped skips; counts as in the JSON and the
    terminal; each domain's pictures present; what a browser shows."""
    import jsonschema
    from test_report import Cards, assert_report_order, shows_in_chromium

    from pytest_dlcheck.report import schema_path

    outcomes, attempts, text, files = rel_background.examples_outcomes(tmp_path_factory.mktemp("background"))
    doc = json.loads(Path(files["json"]).read_text())
    jsonschema.validate(doc, json.loads(schema_path().read_text()))
    page = Path(files["html"]).read_text()
    assert_report_order(page, doc)
    assert doc["summary"]["failed"] and doc["summary"]["passed"] and doc["summary"]["not_applicable"]
    # the terminal's per-domain counts add up to the JSON's
    counted = {}
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if head in {r["domain"] for r in doc["results"]} and rest.strip() and rest.strip()[0].isdigit():
            # "llm        6 of 15 judged: 1 failed, 5 passed, 1 partly judged, 5 n/a, 3 skipped"
            for part in rest.split(":", 1)[1].split(","):
                n, label = part.strip().split(" ", 1)
                key = {"n/a": "not_applicable", "missing role": "missing_role", "partly judged": "passed"}.get(
                    label, label
                )
                counted[key] = counted.get(key, 0) + int(n)
    assert counted == {k: v for k, v in doc["summary"].items() if v}, (counted, doc["summary"])
    # pictures: each failing domain shows what settles it
    kinds = {}
    for r in doc["results"]:
        for a in r["artifacts"]:
            kinds.setdefault(r["domain"], set()).add(a["kind"])
    assert "tokens" in kinds.get("llm", set()) and "images" in kinds.get("vision", set()), kinds
    assert {"histogram", "bars"} <= kinds.get("diffusion", set()), kinds  # latents, noise, timesteps; DF5's rate
    assert "series" in kinds.get("ckpt", set()) and "series" in kinds.get("smoke", set()), kinds  # C1, smoke run
    parser = Cards()
    parser.feed(page)
    assert not parser.external
    shows_in_chromium(Path(files["html"]), tmp_path, expect="Failed")
