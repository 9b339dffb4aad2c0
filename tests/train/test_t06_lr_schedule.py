"""T6: the LR schedule advances per optimizer step and warms up within the run."""

import sys
from pathlib import Path

import pytest
import tiny_train as tt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
import lightning_kinds as lk  # noqa: E402

ACCUM = """
    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, index):
            x, y = batch
            loss = nn.functional.cross_entropy(state["model"](x), y) / 4
            loss.backward()
            if (index + 1) % 4 == 0:
                state["optimizer"].step()
                state["optimizer"].zero_grad()
                {inside}
            {outside}
            return loss * 4
        return step
"""


def test_scheduler_stepped_every_micro_batch(project):
    project.conftest(tt.loop_project(extra=ACCUM.format(inside="pass", outside='state["lr_scheduler"].step()')))
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert (
        "in 80 micro-batches of your step: optimizer.step() ran 20 times, lr_scheduler.step() 80 times (4.0 scheduler steps per optimizer step)"
        in text
    )
    assert "warmup and decay run 4x too fast" in text and "inside the gradient-accumulation branch" in text


def test_scheduler_stepped_with_the_optimizer(project):
    project.conftest(tt.loop_project(extra=ACCUM.format(inside='state["lr_scheduler"].step()', outside="pass")))
    run = project.run("--dlcheck=T6", "-rA")
    run.fnmatch(["*::T6_lr_schedule PASSED (smoke run of 80 steps: the learning rate at its 20 optimizer steps is*"])
    run.fnmatch(
        [
            "smoke run of 80 steps: the learning rate at its 20 optimizer steps is 0.00333, 0.00667, 0.01, 0.01, …, "
            "0.01 (not 0 throughout; scheduler: LambdaLR)",
            "in 80 micro-batches of your step: optimizer.step() ran 20 times, lr_scheduler.step() 20 times (1 per "
            "optimizer step; more than 1.5 counts micro-batches)",
        ]
    )


SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS * 4, "completion": tiny.COMPLETIONS * 4}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, max_steps=-1, num_train_epochs=2,
                                 gradient_accumulation_steps=4, warmup_steps={warmup})
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
"""


def test_trainer_warmup_counted_in_micro_batches(project):
    # 24 examples / batch 2 = 12 micro-batches per epoch, x 2 epochs = 24: a warmup in micro-batches
    project.conftest(SFT.format(warmup=24))
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert (
        "warmup of 24 optimizer steps for a run of 6 optimizer steps, 12 micro-batches per epoch with gradient_accumulation_steps=4"
        in text
    )
    assert "never reaches its peak" in text and "warmup_ratio" in text


def test_trainer_warmup_in_optimizer_steps(project):
    project.conftest(SFT.format(warmup=2))
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", "passed")
    run.fnmatch(
        [
            "the Trainer's warmup of 2 optimizer steps fits in its run of 6 optimizer steps (gradient_accumulation_steps=4)"
        ]
    )


TRAINED_FIRST = """
    import pytest, tiny, torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok)
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS * 4, "completion": tiny.COMPLETIONS * 4}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, max_steps=2, warmup_steps=1)
        optimizers = {optimizers}
        trainer = SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=data, optimizers=optimizers)
        trainer.train()  # handed over after a run: its scheduler has decayed to LR 0, its optimizer holds moments
        return trainer
"""


def test_a_trainer_handed_over_after_train_is_judged_on_a_fresh_schedule(project):
    """The Trainer's own scheduler of the finished run (linear to 0 at step 2) is not the clone's; a user's
    stepped scheduler starts again from its first step. Neither is 'LR 0 at every step'."""
    project.conftest(TRAINED_FIRST.format(optimizers="(None, None)"))
    project.run("--dlcheck=T6").assert_outcome("T6", "passed")
    project.conftest(
        TRAINED_FIRST.format(
            optimizers=(
                "(lambda opt: (opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2) * max(0.0, 1 - s / 2))))"
                "(torch.optim.AdamW(model.parameters(), lr=1e-3))"
            )
        )
    )
    project.run("--dlcheck=T6").assert_outcome("T6", "passed")


@pytest.mark.parametrize("module", ["ManualClassifier", "ManualSchedEveryBatch"])
def test_lightning_manual_optimization_steps_the_scheduler_per_optimizer_step(project, module):
    """Lightning's manual optimization with gradient accumulation by hand (opt.step() every 2 batches):
    self.lr_schedulers().step() every batch runs the schedule twice too fast; inside the accumulation branch
    it is once per optimizer step."""
    project.conftest(lk.PROJECT.format(module=module))
    if module == "ManualClassifier":
        run = project.run("--dlcheck=T6", "-rA")
        run.assert_outcome("T6", "passed")
        run.fnmatch(
            [
                "in 40 batches of ManualClassifier.training_step (manual optimization): optimizer.step() ran 20 "
                "times, lr_scheduler.step() 20 times (1 per optimizer step; more than 1.5 counts micro-batches)"
            ]
        )
        return
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = " ".join(tt.section(run, "T6").split())
    assert (
        "in 40 batches of ManualSchedEveryBatch.training_step (manual optimization): optimizer.step() ran 20 times, "
        "lr_scheduler.step() 40 times (2.0 scheduler steps per optimizer step); scheduler: LambdaLR" in text
    ), text
    assert "warmup and decay run 2x too fast" in text
    assert "sch.step() (sch = self.lr_schedulers()) right after opt.step()" in text


# README's "A transformers / TRL Trainer user writes one fixture", with tiny pieces built as the tests build them
# and the user's own schedule (a warmup of {warmup} optimizer steps for the run its 3 epochs plan)
README_TRAINER = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    def build_model():
        return tiny.llama(tiny.tokenizer())

    def build_tokenizer():
        return tiny.tokenizer()

    def load_my_data():  # 48 examples: 24 micro-batches of 2 per epoch
        return Dataset.from_dict({{"prompt": tiny.PROMPTS * 8, "completion": tiny.COMPLETIONS * 8}})

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        return SFTTrainer(
            model=build_model(),
            processing_class=build_tokenizer(),
            args=SFTConfig(output_dir=str(tmp_path_factory.mktemp("sft")), max_steps=10,
                           # the user's real configuration (CPU-only and quiet for the test machine)
                           num_train_epochs=3, per_device_train_batch_size=2, gradient_accumulation_steps={accum},
                           warmup_steps={warmup}, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                           activation_checkpointing=False, disable_tqdm=True),
            train_dataset=load_my_data(),
        )
"""


def test_the_readme_trainer_example_with_a_correct_warmup_passes(project):
    """max_steps=10 keeps the handed-over Trainer short; the run launched without it is 3 epochs x 24 = 72
    optimizer steps, which hold the warmup of 20. The old check judged the warmup against max_steps=10 and
    failed it as 'counted in micro-batches'."""
    project.conftest(README_TRAINER.format(accum=1, warmup=20))
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", "passed")
    text = " ".join(run.text.split())
    assert (
        "the handed-over Trainer plans a shorter run than its epochs: max_steps=10 stops it before its warmup of 20 "
        "optimizer steps ends; judged against the 72 optimizer steps its 3 epochs plan (the run without max_steps)"
        in text
    ), text
    assert "the Trainer's warmup of 20 optimizer steps fits in its run of 72 optimizer steps" in text


def test_the_readme_trainer_example_with_a_warmup_in_micro_batches_fails(project):
    """The same short Trainer with gradient_accumulation_steps=4: the 3 epochs are 18 optimizer steps, and a
    warmup of 72 (the run's micro-batches) never ends."""
    project.conftest(README_TRAINER.format(accum=4, warmup=72))
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert (
        "warmup of 72 optimizer steps for a run of 18 optimizer steps, 24 micro-batches per epoch with "
        "gradient_accumulation_steps=4" in text
    ), text
    assert "the handed-over Trainer plans a shorter run than its epochs: max_steps=10" in text
    assert "fits in its 72 micro-batches: warmup counted in micro-batches instead of optimizer steps" in text
    assert "use warmup_ratio" in text


def test_a_warmup_longer_than_the_run_is_not_blamed_on_micro_batches(project):
    """Without accumulation a warmup longer than the run (max_steps=-1: the 3 epochs are 72 optimizer steps and
    144 samples) is no micro-batch count; the cause says what the numbers show."""
    project.conftest(README_TRAINER.format(accum=1, warmup=200).replace("max_steps=10", "max_steps=-1"))
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert "warmup of 200 optimizer steps for a run of 72 optimizer steps" in text
    assert "micro-batches instead" not in text and "samples instead" not in text
    assert "warmup_steps asks for 200 optimizer steps and the run has 72" in text


SIZED = """
    import pytest, torch, tiny_train as tt
    import torch.nn.functional as F
    from transformers import get_linear_schedule_with_warmup

    EPOCHS, ACCUM = 3, 2

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader(64, batch_size=8, shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_num_epochs():
        return EPOCHS

    @pytest.fixture(scope="session")
    def dlcheck_make_training(dlcheck_dataloader):
        def make():
            torch.manual_seed(0)
            model = tt.MLP()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            total = {total}
            return {{"model": model, "optimizer": opt,
                    "lr_scheduler": get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=total)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, i):
            x, y = batch
            loss = F.cross_entropy(state["model"](x), y) / ACCUM
            loss.backward()
            if (i + 1) % ACCUM == 0:  # the scheduler steps with the optimizer
                state["optimizer"].step()
                state["lr_scheduler"].step()
                state["optimizer"].zero_grad()
            return loss.detach()
        return step
"""


@pytest.mark.parametrize(
    ("total", "outcome"),
    [("len(dlcheck_dataloader) * EPOCHS", "failed"), ("len(dlcheck_dataloader) * EPOCHS // ACCUM", "passed")],
)
def test_a_loop_s_schedule_is_sized_for_the_optimizer_steps_it_takes(project, total, outcome):
    # accelerate's local_sgd.py sizes the schedule len(loader) * epochs with gradient accumulation 2: it runs half its
    # decay (blind set 11's missed T6); sized in optimizer steps it passes
    project.conftest(SIZED.format(total=total))
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", outcome)
    text = " ".join(run.text.split())
    assert "the run takes 12 (8 batches an epoch x dlcheck_num_epochs=3, one optimizer step every 2 micro-batches)" in (
        text
    )
