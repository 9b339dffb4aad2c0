"""X3: every trained tower's parameters sit in a param group with the declared LR."""

import tinyvlm  # noqa: F401  (imports the libraries before the in-process runs)
from helpers import flat
from transformers import get_linear_schedule_with_warmup  # noqa: F401  (imported outside the in-process runs)

STAGED = """
    import pytest, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tinyvlm.llava(tinyvlm.tokenizer())

    @pytest.fixture(scope="session")
    def dlcheck_stages():
        return tinyvlm.STAGES_VISION

    @pytest.fixture(scope="session")
    def dlcheck_stage_setup():
        return {setup}
"""


def test_one_global_lr_trains_the_vision_tower_ten_times_too_fast(project):
    project.conftest(STAGED.format(setup="tinyvlm.setup_one_lr"))
    run = project.run("--dlcheck=X1,X3")
    run.assert_outcome("X1", "passed")
    run.assert_outcome("X3", "failed")
    text = flat(run.section("X3"))
    assert "stage 'instruct': 1 param group at lr 2e-05" in text
    assert "vision 23,936 at lr 2e-05 declared 2e-06 ✗" in text
    assert "language_model 112,576 at lr 2e-05 declared 2e-05" in text
    assert (
        "one learning rate for every tower: the optimizer of stage 'instruct' trains all its parameters at lr 2e-05, "
        "so the vision tower trains at 2e-05 instead of its declared 2e-06 (10× higher)"
    ) in text
    assert "{'params': model.model.vision_tower.parameters(), 'lr': 2e-06}" in text
    assert "[*model.model.language_model.parameters(), *model.lm_head.parameters()]" in text
    assert "optimizers=(optimizer, None)" in text


def test_one_param_group_per_tower_passes(project):
    project.conftest(STAGED.format(setup="tinyvlm.setup_clean(tinyvlm.STAGES_VISION)"))
    run = project.run("--dlcheck=X1,X3", "-rA")
    run.assert_outcome("X1", "passed")
    run.assert_outcome("X3", "passed")
    run.fnmatch(
        [
            "*::X3_tower_lr PASSED (4 trained tower(s) in 2 stage(s) sit in param groups at their*",
            "*dlcheck evidence*",
            "*dlcheck evidence*",
            "4 trained tower(s) in 2 stage(s) sit in param groups at their declared LR (rtol 0.001), no trainable "
            "parameter outside a param group",
            "stage 'instruct': 3 param groups at lr 2e-05, 2e-06",
            "  vision          23,936 at lr 2e-06           declared 2e-06",
        ]
    )


CURRENT = """
    import pytest, torch, tinyvlm
    from transformers import get_linear_schedule_with_warmup

    @pytest.fixture(scope="session")
    def dlcheck_model():
        model = tinyvlm.llava(tinyvlm.tokenizer())
        model.model.vision_tower.requires_grad_(False)
        return model

    @pytest.fixture(scope="session")
    def dlcheck_stages():
        return tinyvlm.STAGES

    @pytest.fixture(scope="session")
    def dlcheck_stage():
        return "instruct"

    @pytest.fixture(scope="session")
    def dlcheck_optimizer(dlcheck_model):
        {optimizer}
        get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=100)   # lr is 0 now
        return optimizer
"""


def test_parameters_unfrozen_after_the_optimizer_was_built(project):
    project.conftest(
        CURRENT.format(
            optimizer="optimizer = torch.optim.AdamW(dlcheck_model.model.multi_modal_projector.parameters(), lr=2e-5)"
        )
    )
    run = project.run("--dlcheck=X3")
    run.assert_outcome("X3", "failed")
    text = flat(run.section("X3"))
    assert "dlcheck_model as set up for stage 'instruct'" in text
    assert "language_model 112,576 in no param group declared 2e-05 ✗" in text
    assert "112,576 trainable parameters of the language model are in no param group" in text
    assert "never update" in text


def test_scheduler_warmup_reads_the_initial_lr(project):
    project.conftest(
        CURRENT.format(
            optimizer="optimizer = torch.optim.AdamW(tinyvlm.groups(dlcheck_model, tinyvlm.STAGES['instruct']))"
        )
    )
    run = project.run("--dlcheck=X1,X3")
    run.assert_outcome("X1", "passed")
    run.assert_outcome("X3", "passed")


def test_no_optimizer_skips(project):
    project.conftest(STAGED.format(setup="lambda model, stage: None"))
    run = project.run("--dlcheck=X3")
    run.assert_outcome("X3", "skipped")
    assert (
        "missing role: define fixture dlcheck_optimizer (or dlcheck_trainer with its optimizer created) for "
        "dlcheck_stage in conftest.py, or return the optimizer from dlcheck_stage_setup: no optimizer to check"
    ) in run.text


TRAINER_NO_OPTIMIZER = """
    import pytest, tiny, tinyvlm
    from transformers import Trainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        model = tinyvlm.llava(tinyvlm.tokenizer())
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), learning_rate=2e-5)
        return Trainer(model=model, args=args)  # the optimizer is created when train() starts

    @pytest.fixture(scope="session")
    def dlcheck_stages():
        return tinyvlm.STAGES_VISION

    @pytest.fixture(scope="session")
    def dlcheck_stage():
        return "instruct"
"""


def test_a_trainer_without_its_optimizer_yet_is_judged_on_what_create_optimizer_builds(project):
    project.conftest(TRAINER_NO_OPTIMIZER)
    run = project.run("--dlcheck=X3")
    run.assert_outcome("X3", "failed")
    text = flat(run.section("X3"))
    assert "the optimizer the Trainer's create_optimizer builds" in text or "at lr 2e-05 declared 2e-06" in text
    assert "vision" in text and "declared 2e-06" in text
