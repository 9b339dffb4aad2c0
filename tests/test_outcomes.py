"""The four honest outcomes: a pass carries what it measured (-v, -rA, the JSON report), "not applicable"
is said as such and summarised apart from missing roles, a missing role names the fixture."""

import json

from llm.test_l11_eos_supervised import LM_COLLATOR

from pytest_dlcheck import entry, registry

NOT_APPLICABLE = """
    import pytest

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        import tiny
        return tiny.tokenizer()
"""


def test_a_pass_shows_what_it_measured(project, tmp_path):
    project.conftest(LM_COLLATOR.format(pad="tiny.PAD", eos=True))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=L11", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("L11", "passed")
    # -v: one line beside PASSED; -rA: the whole evidence under the passes
    run.fnmatch(["*::L11_eos_supervised PASSED (8 of 8 sampled documents end with a supervised stop token*"])
    run.fnmatch(["*dlcheck evidence*", "8 of 8 sampled documents end with a supervised stop token (<|endoftext|>)"])
    (result,) = json.loads(out.read_text())["results"]
    assert result["outcome"] == "passed"
    assert result["evidence"] == ["8 of 8 sampled documents end with a supervised stop token (<|endoftext|>)"]
    assert result["data"] == {"documents": 8, "unsupervised": 0, "truncated": 0}


def test_not_applicable_and_missing_role_are_summarised_apart(project, monkeypatch):
    # the throwaway check registers in this process: the registry is put back afterwards
    monkeypatch.setattr(registry, "_CHECKS", dict(registry._CHECKS))
    # its ID is judged once the conftest.py registering it is loaded, as a third-party pack's (the usage check
    # before any import knows the built-in IDs only)
    monkeypatch.setattr(entry, "_packs", lambda: True)
    project.conftest(
        NOT_APPLICABLE
        + """
    from pytest_dlcheck.registry import check

    @check("L99", domain="llm", title="a check that concerns other pipelines", roles=("tokenizer",))
    def check_other_kind(dlcheck):
        '''Not applicable to this one.

        What it does
            x
        Why it is bad
            x
        Example
            x
        Use instead
            x
        Known problems
            x
        Not applicable
            x
        '''
        dlcheck.not_applicable("this tokenizer has no image processor (a text-only pipeline)")
    """
    )
    run = project.run("--dlcheck=L99,L1")
    run.fnmatch(["*L99_other_kind SKIPPED (not applicable: *"])
    run.fnmatch(
        [
            "*dlcheck summary*",
            "skipped:   missing role: define fixture dlcheck_model (or dlcheck_trainer) in conftest.py (1 check)",
            "n/a:       not applicable: this tokenizer has no image processor (a text-only pipeline) (1 check)",
        ]
    )


def test_a_property_mode_pass_says_how_many_generated_batches_it_judged(project, tmp_path):
    project.conftest(LM_COLLATOR.format(pad="tiny.PAD", eos=True))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=L11", "--dlcheck-property", "--dlcheck-property-examples=10", f"--dlcheck-json={out}")
    run.assert_outcome("L11[property]", "passed")
    (generated,) = [r for r in json.loads(out.read_text())["results"] if r["nodeid"].endswith("[property]")]
    # one line for the whole search, not the evidence of every generated batch piled up
    assert len(generated["evidence"]) == 1, generated["evidence"]
    assert generated["evidence"][0].startswith("property mode: the invariant held on all ")
    assert generated["data"]["generated"] >= generated["data"]["judged"] >= 1


VISION_LOOP = """
    import pytest, torch
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))), batch_size=4)
"""


def test_a_pipeline_of_another_kind_is_not_asked_for_a_tokenizer(project):
    project.conftest(VISION_LOOP)
    run = project.run("--dlcheck=L2,L11,L3", "-rs")
    for cid in ("L2", "L11", "L3"):
        run.assert_outcome(cid, "skipped")
    assert "define fixture dlcheck_tokenizer" not in run.text, run.text
    run.fnmatch(["*not applicable: dlcheck_dataloader yields lists of tensors*no token batches to check*"])


def test_information_items_of_other_domains_do_not_speak_to_an_llm_pipeline(project):
    """DF1 (diffusion) and R5/R6 (RL) are notes for their own kind of training: on a causal-LM pipeline they
    are "not applicable", not an "info:" line in its summary."""
    project.conftest(LM_COLLATOR.format(pad="tiny.PAD", eos=True))
    run = project.run("--dlcheck=DF1,R5,R6", "-rs")
    for cid in ("DF1", "R5", "R6"):
        run.assert_outcome(cid, "skipped")
    assert "info:" not in run.text.split("dlcheck summary")[-1]
    run.fnmatch(["*n/a:*no reinforcement learning in the given fixtures*(2 checks)*"])


def test_an_info_line_in_the_summary_is_cut_where_a_clause_ends(project, monkeypatch):
    """An info item's summary line longer than the line allows ends at a clause with a pointer to -rA, never
    inside a word (it was cut at character 199: 'after a short run: n…')."""
    monkeypatch.setattr(registry, "_CHECKS", dict(registry._CHECKS))
    monkeypatch.setattr(entry, "_packs", lambda: True)
    project.conftest(
        NOT_APPLICABLE
        + """
    import pytest
    from pytest_dlcheck.registry import check

    @check("L98", domain="llm", title="an information item", roles=("tokenizer",))
    def check_info(dlcheck):
        '''Reports a number.

        What it does
            x
        Why it is bad
            x
        Example
            x
        Use instead
            x
        Known problems
            x
        Not applicable
            x
        '''
        pytest.skip("info: mean log Z 5.78 (range 5.76 to 5.8, 55 positions) on the sampled batches with the "
                    "current weights; ln(vocabulary 320) = 5.77; after a short run: not measured, select the "
                    "smoke checks (S1-S3) to measure log Z after a short run of your training")
    """
    )
    run = project.run("--dlcheck=L98")
    line = next(x for x in run.text.splitlines() if x.startswith("info:"))
    assert line.endswith("… (-rA)"), line
    assert line.startswith("info:      L98 mean log Z 5.78") and "after a short run: n…" not in line, line


IMAGE_DICTS = """
    import pytest, torch
    from torch.utils.data import DataLoader

    ROWS = [{"pixel_values": torch.randn(3, 8, 8), "labels": i % 4} for i in range(16)]

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():  # a transformers image-classification collate_fn: pixel_values and labels
        return DataLoader(ROWS, batch_size=4)
"""


def test_image_batches_of_mappings_get_no_tokenizer_or_tower_request(project):
    # run_image_classification_no_trainer's batches: a mapping with no input_ids. The llm checks (L7 included) and
    # the vlm checks are not applicable; they asked for dlcheck_tokenizer, dlcheck_compute_metrics, dlcheck_towers
    project.conftest(IMAGE_DICTS)
    run = project.run("--dlcheck=L2,L7,L11,X1,X3", "-rs")
    for cid in ("L2", "L7", "L11", "X1", "X3"):
        run.assert_outcome(cid, "skipped")
    text = " ".join(run.text.split())
    assert "missing role" not in text, text
    assert "carry no input_ids (keys: labels, pixel_values): they are not token batches" in text, text
    assert "carry images and no token ids (keys: labels, pixel_values): an image-only pipeline" in text, text


def test_token_batches_without_a_tokenizer_still_ask_for_it(project):
    # the twin: token batches and no tokenizer are an llm pipeline whose tokenizer is really missing
    project.conftest(
        IMAGE_DICTS.replace(
            'ROWS = [{"pixel_values": torch.randn(3, 8, 8), "labels": i % 4} for i in range(16)]',
            'ROWS = [{"input_ids": torch.arange(6), "attention_mask": torch.ones(6, dtype=torch.long), '
            '"labels": torch.arange(6)} for i in range(16)]',
        )
    )
    run = project.run("--dlcheck=L11", "-rs")
    run.assert_outcome("L11", "skipped")
    assert "define fixture dlcheck_tokenizer" in run.text, run.text
