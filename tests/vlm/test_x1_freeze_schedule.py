"""X1: each stage trains exactly the towers the declaration names."""

import pytest
import tinyvlm
from helpers import flat

from pytest_dlcheck.checks.vlm import measure as vlm
from pytest_dlcheck.errors import RoleError

PROJECT = """
    import pytest, torch, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tinyvlm.llava(tinyvlm.tokenizer())

    @pytest.fixture(scope="session")
    def dlcheck_stages():
        return {stages}

    {extra}
"""

SETUP = """
    @pytest.fixture(scope="session")
    def dlcheck_stage_setup():
        return {setup}
"""


def test_vision_tower_left_trainable_in_stage_1(project):
    project.conftest(
        PROJECT.format(stages="tinyvlm.STAGES", extra=SETUP.format(setup="tinyvlm.setup_vision_left_trainable"))
    )
    run = project.run("--dlcheck=X1")
    run.assert_outcome("X1", "failed")
    text = flat(run.section("X1"))
    assert "2 tower/stage pairs disagree with dlcheck_stages" in text
    assert "towers found on LlavaForConditionalGeneration" in text
    assert "'align' vision 23,936 / 23,936 frozen ✗" in text
    assert "'align' projector 6,272 / 6,272 trained (lr 1e-03)" in text
    assert "nothing freezes the vision tower in stages 'align' and 'instruct'" in text
    assert "model.model.vision_tower.requires_grad_(False)" in text
    assert "Traceback" not in run.text


def test_lm_head_outside_language_model_trains_in_stage_1(project):
    project.conftest(
        PROJECT.format(stages="tinyvlm.STAGES", extra=SETUP.format(setup="tinyvlm.setup_lm_head_left_trainable"))
    )
    run = project.run("--dlcheck=X1")
    run.assert_outcome("X1", "failed")
    text = flat(run.section("X1"))
    assert "1 tower/stage pair disagrees" in text
    assert "'align' language_model 19,264 / 112,576 frozen ✗" in text
    assert "(model.model.language_model: 0 / 93,312; model.lm_head: 19,264 / 19,264)" in text
    assert "lm_head sits outside" in text and "stage 'align' trains the language model's output layer" in text
    assert "model.lm_head.requires_grad_(False)" in text


def test_language_model_left_frozen_in_stage_2(project):
    """A stage-2 script that reuses the stage-1 freezing code and forgets to unfreeze the LM."""
    project.conftest(
        PROJECT.format(
            stages="tinyvlm.STAGES",
            extra=SETUP.format(
                setup="tinyvlm.setup_clean({'align': {'projector': 1e-3}, 'instruct': {'projector': 2e-5}})"
            ),
        )
    )
    run = project.run("--dlcheck=X1")
    run.assert_outcome("X1", "failed")
    text = flat(run.section("X1"))
    assert "'instruct' language_model 0 / 112,576 trained (lr 2e-05) ✗" in text
    assert "stage 'instruct' declares the language model trained" in text
    assert "model.model.language_model.requires_grad_(True); model.lm_head.requires_grad_(True)" in text


def test_clean_two_stage_setup_passes(project):
    project.conftest(
        PROJECT.format(stages="tinyvlm.STAGES", extra=SETUP.format(setup="tinyvlm.setup_clean(tinyvlm.STAGES)"))
    )
    run = project.run("--dlcheck=X1,X3", "-rA")
    run.assert_outcome("X1", "passed")
    run.assert_outcome("X3", "passed")
    run.fnmatch(
        [
            "*::X1_freeze_schedule PASSED (6 tower/stage pairs agree with dlcheck_stages*",
            "*::X3_tower_lr PASSED (3 trained tower(s) in 2 stage(s) sit in param groups at their*",
            "*dlcheck evidence*",
            "6 tower/stage pairs agree with dlcheck_stages: 'align': vision 0/23,936 frozen, projector 6,272/6,272 "
            "trained, language_model 0/112,576 frozen; 'instruct': vision 0/23,936 frozen, projector 6,272/6,272 "
            "trained, language_model 112,576/112,576 trained",
            "dlcheck_stage_setup run on dlcheck_model for each stage; towers found on LlavaForConditionalGeneration",
            "'instruct'  language_model      112,576 / 112,576     trained (lr 2e-05)",
            "*dlcheck evidence*",
            "3 trained tower(s) in 2 stage(s) sit in param groups at their declared LR (rtol 0.001), no trainable "
            "parameter outside a param group",
            "stage 'instruct': 2 param groups at lr 2e-05",
            "  language_model  112,576 at lr 2e-05          declared 2e-05",
        ]
    )


CURRENT = """
    @pytest.fixture(scope="session")
    def dlcheck_stage():
        return "align"
"""


def test_current_stage_of_a_model_set_up_by_hand(project):
    """No set-up callable: the model as given is read for dlcheck_stage; declared as lists (no LRs)."""
    project.conftest(
        PROJECT.format(stages="{'align': ['projector'], 'instruct': ['projector', 'lm']}", extra=CURRENT).replace(
            "return tinyvlm.llava(tinyvlm.tokenizer())",
            "m = tinyvlm.llava(tinyvlm.tokenizer()); m.model.vision_tower.requires_grad_(False); return m",
        )
    )
    run = project.run("--dlcheck=X1,X3")
    run.assert_outcome("X1", "failed")
    text = flat(run.section("X1"))
    assert "dlcheck_model as set up for stage 'align'" in text
    assert "'align' language_model 112,576 / 112,576 frozen ✗" in text
    assert "nothing freezes the language model in stage 'align'" in text
    run.assert_outcome("X3", "skipped")
    assert "declares no learning rates" in run.text


def test_without_stage_information_skips_naming_the_fixtures(project):
    project.conftest(PROJECT.format(stages="tinyvlm.STAGES", extra=""))
    run = project.run("--dlcheck=X1,X3")
    run.assert_outcome("X1", "skipped")
    assert "define fixture dlcheck_stage_setup" in run.text and "dlcheck_stage (the stage" in run.text


def test_declared_towers_on_a_hand_built_vlm(project):
    """Not a transformers VLM: the towers are declared by module name; the stage setup is buggy."""
    project.conftest("""
        import pytest, torch

        class TinyVLM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = torch.nn.Linear(8, 8)
                self.proj = torch.nn.Linear(8, 16)
                self.decoder = torch.nn.Linear(16, 16)
                self.head = torch.nn.Linear(16, 32)

        def setup(model, stage):
            model.encoder.requires_grad_(False)
            model.decoder.requires_grad_(stage == "instruct")
            return None

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return TinyVLM()

        @pytest.fixture(scope="session")
        def dlcheck_towers():
            return {"vision": "encoder", "projector": "proj", "language_model": ["decoder", "head"]}

        @pytest.fixture(scope="session")
        def dlcheck_stages():
            return {"align": ["projector"], "instruct": ["projector", "language_model"]}

        @pytest.fixture(scope="session")
        def dlcheck_stage_setup():
            return setup
    """)
    run = project.run("--dlcheck=X1")
    run.assert_outcome("X1", "failed")
    text = flat(run.section("X1"))
    assert "towers declared by dlcheck_towers" in text
    assert "(model.decoder: 0 / 272; model.head: 544 / 544)" in text
    assert "model.head.requires_grad_(False)" in text


def test_unknown_tower_in_the_declaration_is_a_role_error(project):
    project.conftest(PROJECT.format(stages="{'align': {'vison': 1e-3}}", extra=CURRENT))
    run = project.run("--dlcheck=X1")
    run.assert_outcome("X1", "failed")
    assert "dlcheck_stages" in run.text and "unknown tower 'vison'" in run.text


# ---- unit tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return tinyvlm.llava(tinyvlm.tokenizer())


def test_towers_found_on_llava(model):
    found = vlm.find_towers(model)
    assert found.paths == {
        "vision": ["model.vision_tower"],
        "projector": ["model.multi_modal_projector"],
        "language_model": ["model.language_model", "lm_head"],
    }
    state = vlm.count(model, found)
    assert state.counts["other"].total == 0
    assert sum(c.total for c in state.counts.values()) == sum(p.numel() for p in model.parameters())


def test_stage_setup_leaves_no_trace(model):
    found = vlm.find_towers(model)
    model.train()
    model.model.vision_tower.eval()
    before = [(n, p.requires_grad) for n, p in model.named_parameters()]
    modes = [m.training for m in model.modules()]
    state = vlm.apply_stage(model, tinyvlm.setup_clean(tinyvlm.STAGES), "align", lambda m: found)
    assert state.counts["vision"].trainable == 0 and state.counts["projector"].trainable == 6272
    assert [(n, p.requires_grad) for n, p in model.named_parameters()] == before
    assert [m.training for m in model.modules()] == modes


def test_parse_stages_forms():
    stages = vlm.parse_stages({"a": "mm_projector", "b": ["projector", "llm"], "c": {"vision_tower": 2e-6, "lm": None}})
    assert [(s.name, s.lrs) for s in stages] == [
        ("a", {"projector": None}),
        ("b", {"projector": None, "language_model": None}),
        ("c", {"vision": 2e-6, "language_model": None}),
    ]
    with pytest.raises(RoleError, match="positive number"):
        vlm.parse_stages({"a": {"projector": 0}})
    with pytest.raises(RoleError, match="stage:"):
        vlm.parse_stages(["projector"])


def test_stage_setup_returning_a_configured_copy_is_counted(project):
    """A set-up that builds its stage on a copy (as one wrapping the model with PEFT must) returns it."""
    setup = """(lambda clean: lambda model, stage: (lambda m: (m, clean(m, stage)))(__import__("copy").deepcopy(model)))(
            tinyvlm.setup_clean({'align': {'projector': 1e-3, 'vision': 1e-5}, 'instruct': tinyvlm.STAGES['instruct']}))"""
    project.conftest(PROJECT.format(stages="tinyvlm.STAGES", extra=SETUP.format(setup=setup)))
    run = project.run("--dlcheck=X1")
    run.assert_outcome("X1", "failed")
    text = flat(run.section("X1"))
    assert "'align' vision 23,936 / 23,936 frozen ✗" in text


def test_stage_setup_that_replaces_modules_is_reported(project):
    setup = "lambda model, stage: setattr(model, 'lm_head', torch.nn.Linear(64, 301, bias=False))"
    project.conftest(PROJECT.format(stages="tinyvlm.STAGES", extra=SETUP.format(setup=setup)))
    run = project.run("--dlcheck=X1")
    run.assert_outcome("X1", "failed")
    text = flat(run.section("X1"))
    assert "dlcheck_stage_setup" in text and "replaced or added modules of dlcheck_model" in text


TEXT_ONLY = """
    import pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tiny.gpt2(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        from transformers import DataCollatorForLanguageModeling
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
"""


def test_a_text_only_gpt2_is_not_asked_for_towers_or_stages(project):
    """A GPT-2 fine-tune under --dlcheck=vlm: no vision tower, so every vlm check is not applicable, and none
    asks for dlcheck_towers, dlcheck_stages or an image token."""
    project.conftest(TEXT_ONLY)
    run = project.run("--dlcheck=vlm")
    for cid in ("X1", "X2", "X3", "X4", "X5"):
        run.assert_outcome(cid, "skipped")
    assert "missing role" not in run.text, run.text
    run.fnmatch(
        [
            "n/a:*not applicable: GPT2LMHeadModel is a text-only model: its config has no vision_config and its forward "
            "takes no pixel_values, so it has no vision tower, projector or image tokens (5 checks)"
        ]
    )
