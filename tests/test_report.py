"""The reports: the dlcheck terminal summary, --dlcheck-json (validated against the shipped schema) and
--dlcheck-report (one self-contained HTML file, parsed here and rendered in headless Chromium)."""

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import pytest

from pytest_dlcheck.report import schema_path

BROKEN_LLM = """
    import pytest, tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(pad=tiny.EOS)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
"""


class Cards(HTMLParser):
    """Collects, per check card, its outcome, its text and the pictures it holds."""

    def __init__(self):
        super().__init__()
        self.cards, self.current, self.depth = {}, None, 0
        self.external = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("src", "href"):
            if attrs.get(key, "").startswith(("http:", "https:", "//")):
                self.external.append(attrs[key])
        if tag == "span" and "data-check" in attrs:  # a grouped "not applicable" / "missing role" entry
            self.cards.setdefault(
                attrs["data-check"], {"outcome": attrs["data-outcome"], "text": "", "kinds": [], "classes": []}
            )
            return
        if tag == "div" and "data-check" in attrs:
            self.current = self.cards.setdefault(
                attrs["data-check"], {"outcome": attrs["data-outcome"], "text": "", "kinds": [], "classes": []}
            )
            self.depth = 0
        if self.current is not None and tag == "div":
            self.depth += 1
            if "data-kind" in attrs:
                self.current["kinds"].append(attrs["data-kind"])
        if self.current is not None and tag == "span":
            self.current["classes"].append(attrs.get("class", ""))

    def handle_endtag(self, tag):
        if self.current is not None and tag == "div":
            self.depth -= 1
            if self.depth == 0:
                self.current = None

    def handle_data(self, data):
        if self.current is not None:
            self.current["text"] += data


@pytest.fixture
def broken_llm_reports(project, tmp_path):
    project.conftest(BROKEN_LLM)
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    run = project.run("--dlcheck=llm", f"--dlcheck-json={out_json}", f"--dlcheck-report={out_html}")
    return run, json.loads(out_json.read_text()), out_html


def test_reports_of_a_broken_llm_project(broken_llm_reports, tmp_path):
    run, doc, out_html = broken_llm_reports
    # terminal
    run.fnmatch(
        ["*= dlcheck summary =*", "llm *failed*passed*", "failed:    *L11*", "json: *r.json", "report: *r.html"]
    )
    # json
    jsonschema.validate(doc, json.loads(schema_path().read_text()))
    by_id = {r["id"]: r for r in doc["results"]}
    l11 = by_id["L11"]
    assert l11["outcome"] == "failed" and l11["nodeid"] == "conftest.py::L11_eos_supervised"
    assert l11["evidence"][0].startswith("8 of 8 sampled documents")
    assert "pad_token == eos_token" in l11["cause"] and l11["fix"]
    assert l11["roles"] == ["tokenizer", "dataloader"] and l11["duration"] > 0
    assert any(a["kind"] == "tokens" for a in l11["artifacts"])
    assert doc["schema_version"] == 2
    for outcome, n in doc["summary"].items():
        assert n == sum(r["outcome"] == outcome for r in doc["results"]), outcome
    assert sum(doc["summary"].values()) == len(doc["results"])
    assert {"torch", "transformers", "pytest"} <= set(doc["versions"])
    skipped = [r for r in doc["results"] if r["pytest_outcome"] == "skipped"]
    assert skipped and all(r["reason"] for r in skipped)
    assert {r["outcome"] for r in skipped} <= {"not_applicable", "missing_role", "skipped"}
    assert all(r["outcome"] == "missing_role" for r in skipped if r["reason"].startswith("missing role:"))
    # html
    page = out_html.read_text()
    parser = Cards()
    parser.feed(page)
    assert not parser.external, parser.external
    assert "<script" not in page and "<link" not in page
    for result in doc["results"]:
        assert parser.cards[result["id"]]["outcome"] == result["outcome"]
    # failures first, then passes with their evidence, then the grouped skips; the counts as in the JSON
    assert_report_order(page, doc)
    l11 = parser.cards["L11"]
    assert "final token <|endoftext|> (id 0) has label -100" in l11["text"]
    assert "tokens" in l11["kinds"]
    # the EOS at the end of a row is drawn as label -100, the prompt text as supervised
    assert "tok ign" in l11["classes"] and "tok sup" in l11["classes"]
    # what a browser shows
    shows_in_chromium(out_html, tmp_path)


def assert_report_order(page: str, doc: dict) -> None:
    """The page reads failures first, then errors, passes, undecided items, and the grouped "not applicable"
    and "missing role" lists; its counts are the JSON summary's."""
    order = [o for o in ("failed", "error", "passed", "skipped", "not_applicable", "missing_role") if doc["summary"][o]]
    positions = [page.index(f'<section id="{o}">') for o in order]
    assert positions == sorted(positions), order
    for outcome, n in doc["summary"].items():
        assert f'data-outcome="{outcome}"><span class="badge {outcome}">{n}</span>' in page, outcome
    cards = [(m, page.index(f'data-outcome="{m}"', page.index(f'<section id="{m}">'))) for m in order]
    assert [c[1] for c in cards] == sorted(c[1] for c in cards)


def test_shared_pictures_are_drawn_once_and_referenced():
    from pytest_dlcheck.html import render

    tokens = {
        "kind": "tokens",
        "rows": [{"name": "row 0", "tokens": ["a", "b"], "input_ids": [1, 2], "labels": [1, -100]}],
    }
    series = {
        "kind": "series",
        "series": {"resumed": [2.0, 1.5], "uninterrupted": [2.0, 1.4]},
        "marks": [{"x": 1, "label": "part"}],
    }
    base = {
        "domain": "llm",
        "roles": [],
        "duration": 0.1,
        "reason": "",
        "evidence": ["e"],
        "cause": "",
        "fix": "",
        "error": "",
        "error_kind": "",
        "data": {},
        "pytest_outcome": "passed",
    }
    results = [
        {**base, "nodeid": "c.py::L2", "id": "L2", "title": "labels", "outcome": "passed", "artifacts": [tokens]},
        {
            **base,
            "nodeid": "c.py::L11",
            "id": "L11",
            "title": "eos",
            "outcome": "failed",
            "cause": "c",
            "fix": "f",
            "artifacts": [tokens, series],
        },
        {
            **base,
            "nodeid": "c.py::L1",
            "id": "L1",
            "title": "pad",
            "outcome": "error",
            "error": "KeyError: x",
            "error_kind": "internal",
            "artifacts": [],
        },
        {
            **base,
            "nodeid": "c.py::V1",
            "id": "V1",
            "title": "norm",
            "outcome": "not_applicable",
            "evidence": [],
            "reason": "not applicable: a text pipeline",
            "artifacts": [],
        },
        {
            **base,
            "nodeid": "c.py::V2",
            "id": "V2",
            "title": "eval",
            "outcome": "not_applicable",
            "evidence": [],
            "reason": "not applicable: a text pipeline",
            "artifacts": [],
        },
    ]
    summary = {
        o: sum(r["outcome"] == o for r in results)
        for o in ("failed", "error", "passed", "not_applicable", "missing_role", "skipped")
    }
    doc = {
        "summary": summary,
        "results": results,
        "versions": {},
        "created": "now",
        "selection": "all",
        "duration": 1.0,
        "python": "3",
    }
    page = render(doc)
    assert_report_order(page, doc)
    # the token view is drawn once, in the failure that comes first, and the pass links to it
    assert page.count('class="tok sup"') == 2  # the legend's and the one supervised token
    assert page.count('data-ref="pic-') == 1 and "the same picture as" in page
    assert page.index("L11 eos") < page.index("the same picture as")
    assert "internal error of pytest-dlcheck" in page
    # one line for the two not-applicable checks, with their reason
    assert page.count("not applicable: a text pipeline") == 1
    assert page.count("<svg") == 1  # the resumed-run series with its mark


def test_pictures_are_drawn_by_matplotlib_as_inline_svg():
    from pytest_dlcheck.html import render_histogram, render_images, render_series

    image = {"pixels": [[[0.1, 0.2, 0.3]] * 8] * 8, "boxes": [[1, 1, 5, 6]], "title": "mean (0.1, 0.2, 0.3)"}
    svg = render_images({"kind": "images", "images": [image], "caption": "sampled inputs"})
    assert svg.count("<svg") == 1 and "sampled inputs" in svg
    assert "<svg" in render_histogram({"kind": "histogram", "values": [0.1, 0.5, 0.9], "title": "advantages"})
    assert "<svg" in render_series({"kind": "series", "series": {"loss": [3.0, 2.0, 1.5]}, "title": "loss"})


def _chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


def shows_in_chromium(out_html, tmp_path, expect="L11 end-of-sequence token is never supervised"):
    chromium = _chromium()
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", out_html.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "pytest-dlcheck report" in dom.stdout
    assert expect in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium, *flags, "--window-size=1200,1600", f"--screenshot={shot}", out_html.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # a drawn page, not a blank one


def test_report_of_the_broken_vision_example_draws_its_inputs(project, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent / "vision"))
    import tiny_vision  # noqa: F401  (keeps torchvision imported across in-process runs)

    examples = Path(__file__).parent.parent / "examples" / "vision"
    shutil.copytree(examples, project.pytester.path, dirs_exist_ok=True)
    out_json, out_html = tmp_path / "v.json", tmp_path / "v.html"
    run = project.run("--dlcheck=V1", f"--dlcheck-json={out_json}", f"--dlcheck-report={out_html}")
    doc = json.loads(out_json.read_text())
    jsonschema.validate(doc, json.loads(schema_path().read_text()))
    v1 = {r["nodeid"].split("/")[0]: r for r in doc["results"] if r["id"] == "V1"}
    assert v1["broken"]["outcome"] == "failed" and v1["clean"]["outcome"] == "passed", run.text
    images = [a for a in v1["broken"]["artifacts"] if a["kind"] == "images"]
    assert images and images[0]["images"][0]["title"].startswith("mean (")
    parser = Cards()
    parser.feed(out_html.read_text())
    assert "images" in parser.cards["V1"]["kinds"]
    assert out_html.read_text().count("<svg") >= 2
    shows_in_chromium(out_html, tmp_path, expect="V1 input normalization mismatch")


def test_the_schemas_are_self_contained():
    """Both schemas validate with plain ``jsonschema.validate`` (no registry): every $ref points inside its own
    file, and the postmortem's copy of a result is the report's (a postmortem is validated against its schema in
    tests/watch/test_watch_loops.py, a report in the tests above)."""
    report = json.loads(schema_path().read_text())
    postmortem = json.loads(schema_path().with_name("postmortem.schema.json").read_text())
    for schema in (report, postmortem):
        jsonschema.Draft202012Validator.check_schema(schema)
        refs = re.findall(r'"\$ref": "([^"]*)"', json.dumps(schema))
        assert refs and all(ref.startswith("#/$defs/") for ref in refs), refs
        assert all(ref.removeprefix("#/$defs/") in schema["$defs"] for ref in refs)
    for name in ("result", "artifact"):
        assert postmortem["$defs"][name] == report["$defs"][name], (
            f"copy report.schema.json's $defs/{name} into postmortem.schema.json"
        )
    # a result as --dlcheck-json and a postmortem write it, validated by each schema on its own
    result = {
        "nodeid": "conftest.py::S2_loss_spike", "id": "S2", "domain": "smoke", "title": "loss spike", "roles": [],
        "outcome": "failed", "pytest_outcome": "failed", "error_kind": "", "duration": 0.5, "reason": "",
        "evidence": ["step 12: loss 9.1, 6x its running median 1.5"], "cause": "c", "fix": "f", "error": "",
        "data": {}, "artifacts": [{"kind": "series"}], "cost": {}, "not_judged": [],
    }  # fmt: skip
    jsonschema.validate({"results": [result]}, {**report, "required": ["results"]})
    doc = {
        "schema_version": 1, "kind": "postmortem", "dlcheck_version": "0.1.0", "created": "now", "python": "3.11",
        "platform": "linux", "versions": {}, "results": [result],
        "run": {"framework": "loop", "step": 12, "policy": "raise", "every": 1, "rank": 0, "world_size": 1,
                "overrides": {}, "settings": {}, "notes": []},
        "history": {"step": [11, 12], "loss": [1.5, "nan"], "lr": [None, None], "grad_norm": [1.0, None], "metrics": {}},
    }  # fmt: skip
    jsonschema.validate(doc, postmortem)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc, "results": [{**result, "outcome": "fine"}]}, postmortem)


PIXEL_ENV = """
import numpy as np, pytest
import gymnasium as gym

class PointOnScreen(gym.Env):
    # a point on a 640x480 screen: observations in pixels, unscaled, so R8 fails and draws a histogram
    observation_space = gym.spaces.Box(np.array([0, 0, -20, -20], np.float32), np.array([640, 480, 20, 20], np.float32))
    action_space = gym.spaces.Discrete(4)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.state = np.array([*self.np_random.uniform((0, 0), (640, 480)), 0, 0], np.float32)
        return self.state.copy(), {}

    def step(self, action):
        dv = [(1, 0), (-1, 0), (0, 1), (0, -1)][int(action)]
        self.state[2:] = np.clip(self.state[2:] + dv, -20, 20)
        self.state[:2] = np.clip(self.state[:2] + self.state[2:], 0, (640, 480))
        return self.state.copy(), 0.0, False, False, {}

@pytest.fixture(scope="session")
def dlcheck_env():
    return PointOnScreen
"""


def test_the_report_without_matplotlib_leaves_its_figures_out_and_says_how_to_get_them(tmp_path):
    """matplotlib is not importable (blocked in a fresh interpreter): the HTML report is still written, without
    the figure and with one line saying how to get it; the failure and the dlcheck summary are printed."""
    (tmp_path / "conftest.py").write_text(PIXEL_ENV)
    code = (
        "import sys; sys.modules['matplotlib'] = None; import torch; torch.set_num_threads(1); import pytest; "
        "sys.exit(pytest.main(['-p', 'no:cacheprovider', '--dlcheck=R8', '--dlcheck-json=r.json', "
        "'--dlcheck-report=r.html']))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "R8 " in out and "= dlcheck summary =" in out and "report: " in out, out
    doc = json.loads((tmp_path / "r.json").read_text())
    (r8,) = [r for r in doc["results"] if r["id"] == "R8"]
    assert r8["outcome"] == "failed" and [a["kind"] for a in r8["artifacts"]] == ["histogram"]
    page = (tmp_path / "r.html").read_text()
    assert "<svg" not in page and 'data-kind="histogram"' not in page
    parser = Cards()
    parser.feed(page)
    assert parser.cards["R8"]["outcome"] == "failed" and "observations" in parser.cards["R8"]["text"]
    (note,) = re.findall(r'<div class="meta" id="no-figures">([^<]*)</div>', page)
    assert "1 figure(s) left out: matplotlib is not installed" in note
    assert "pip install &quot;pytest-dlcheck[report]&quot;" in note
