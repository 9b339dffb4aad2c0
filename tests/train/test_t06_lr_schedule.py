"""T6: the LR schedule advances per optimizer step and warms up within the run."""

import tiny_train as tt

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
    assert "in 20 micro-batches of your step: optimizer.step() ran 5 times, lr_scheduler.step() 20 times (4.0 scheduler steps per optimizer step)" in text
    assert "warmup and decay run 4x too fast" in text and "inside the gradient-accumulation branch" in text


def test_scheduler_stepped_with_the_optimizer(project):
    project.conftest(tt.loop_project(extra=ACCUM.format(inside='state["lr_scheduler"].step()', outside="pass")))
    project.run("--dlcheck=T6").assert_outcome("T6", "passed")


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
    assert "warmup of 24 optimizer steps for a run of 6 optimizer steps, 12 micro-batches per epoch with gradient_accumulation_steps=4" in text
    assert "never reaches its peak" in text and "warmup_ratio" in text


def test_trainer_warmup_in_optimizer_steps(project):
    project.conftest(SFT.format(warmup=2))
    project.run("--dlcheck=T6").assert_outcome("T6", "passed")
