"""S2 and S3: a learning rate that diverges in a few steps spikes the loss and explodes the gradients."""

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402


def project_with_lr(lr: str) -> str:
    return tt.loop_project(optimizer=f"torch.optim.SGD(model.parameters(), lr={lr})")


def test_a_diverging_learning_rate(project):
    project.conftest(project_with_lr("3.0"))
    run = project.run("--dlcheck=S1,S2,S3")
    run.assert_outcome("S2", "failed")
    run.assert_outcome("S3", "failed")
    spike = tt.section(run, "S2")
    assert "step 5 of 20: loss 1171 = 130.9 x the mean 8.951 of the 4 steps before it (limit 3.0 x)" in spike
    assert "lr 3 is too high" in spike and "lower the learning rate" in spike
    grads = tt.section(run, "S3")
    assert "step 5 of 20: gradient norm 155.5 = 12 x the median 12.92 of steps 1-3 (limit 10.0 x)" in grads
    assert "clip gradients" in grads


def test_a_sane_learning_rate(project):
    project.conftest(project_with_lr("0.05"))
    run = project.run("--dlcheck=S1,S2,S3", "-rA")
    for cid in ("S1", "S2", "S3"):
        run.assert_outcome(cid, "passed")
    run.fnmatch(
        [
            "20-step smoke run: losses * -> *; the highest loss against the mean of the 5 steps before it is * x "
            "(step *; a spike is 3.0 x)"
        ]
    )
    run.fnmatch(
        [
            "20-step smoke run: gradient norms * -> *, at most * = * x the median * of steps 1-3 (step *; an "
            "explosion is 10.0 x)"
        ]
    )


REINFORCE = """
    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def loss(model, batch):
            # REINFORCE on the blobs: sample a class, reward 1 when it is right, baseline the batch mean
            x, y = batch
            logp = torch.log_softmax(model(x), -1)
            action = torch.multinomial(logp.exp().detach(), 1, generator=torch.Generator().manual_seed(0)).squeeze(1)
            reward = (action == y).float()
            return -(logp.gather(1, action[:, None]).squeeze(1) * (reward - reward.mean())).mean()
        return loss
"""


def test_a_policy_gradient_loss_is_not_judged_by_spikes(project):
    """A REINFORCE loss is centred on 0 and negative half the time: a spike as a multiple of its running mean
    means nothing, and S2 says so instead of passing or failing."""
    project.conftest(project_with_lr("0.05") + REINFORCE)
    run = project.run("--dlcheck=S2")
    run.assert_outcome("S2", "skipped")
    run.fnmatch(
        [
            "*not applicable: the loss takes negative values (step *: -*; a policy-gradient objective such as "
            "GRPO's): a spike as a multiple of its running mean means nothing*"
        ]
    )


# --------------------------------------------------------------------------------------------------
# S2 against the run's start: a loss that climbs steadily never jumps 3x over its running mean

LEAST_SQUARES = """
    import pytest, torch
    from torch import nn

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = nn.Linear(1, 1, bias=False)
            return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr={lr})}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        # y = 2x with x = +-1: the loss is (w - 2)^2 on every batch, its curvature 2, so SGD is stable below
        # lr 1 (= 2 / curvature) and above it multiplies the loss by (1 - 2 lr)^2 every step
        x = torch.tensor([1.0, -1.0] * 32)[:, None]
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, 2 * x), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.MSELoss()
"""


def test_a_loss_that_climbs_steadily_fails_against_the_start(project):
    """lr 1.04, just over the stability limit: the loss grows 1.08^2 = 1.17x a step (about 19x over 20
    steps), so no step is more than 1.6x the mean of the five before it; the running mean alone passed it."""
    project.conftest(LEAST_SQUARES.format(lr="1.04"))
    run = project.run("--dlcheck=S2")
    run.assert_outcome("S2", "failed")
    text = tt.section(run, "S2")
    found = re.search(
        r"step (\d+) of 20: the median loss of the last 5 steps, ([\d.]+), is ([\d.]+) x where the run began "
        r"\(([\d.]+) at step (\d), the lowest of the first 3; limit 3.0 x\)",
        text,
    )
    assert found, text
    level, ratio, start = float(found[2]), float(found[3]), float(found[4])
    assert ratio > 3.0 and level == pytest.approx(ratio * start, rel=0.02)
    assert "losses from the start: 1: " in text and "lr 1.04 is too high" in text
    assert "lower the learning rate" in text


def test_a_loss_that_wobbles_but_falls_passes(project, tmp_path):
    """A classifier on shuffled small batches: the loss goes up and down from batch to batch, and falls."""
    project.conftest(tt.loop_project(loader="tt.loader(64, batch_size=4, shuffle=True)"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=S2", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("S2", "passed")
    run.fnmatch(
        ["the median of 5 steps against the lowest of the first 3 is at most * x (step *; a divergence is 3.0 x)"]
    )
    (result,) = [r for r in json.loads(out.read_text())["results"] if r["id"] == "S2"]
    data = result["data"]
    assert data["last_loss"] < data["first_loss"] and data["largest_rise"] <= 3.0


# --------------------------------------------------------------------------------------------------
# S3 before clipping: a loop that clips at 1.0 shows "1 -> 1" at optimizer.step() whatever its gradients do

CLIPPED = """
    import pytest, torch, tiny_train as tt
    from torch import nn

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            return {{"model": model, "optimizer": optimizer,
                     "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma={gamma})}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        x, c = tt.blobs(64).tensors
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, c.float()[:, None]), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            x, y = batch
            loss = nn.functional.mse_loss(state["model"](x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(state["model"].parameters(), 1.0)
            state["optimizer"].step()
            state["lr_scheduler"].step()
            state["optimizer"].zero_grad()
            return loss
        return step
"""


def test_clipping_hides_an_explosion_from_the_step_not_from_s3(project):
    """ExponentialLR(gamma=1.6) (meant as 0.6): the learning rate grows 1.6x a step, to 0.05 x 1.6^19 = 380;
    the weights grow with it and the gradients with them, by orders of magnitude, while clip_grad_norm_(…, 1.0)
    leaves a norm of exactly 1 at every optimizer.step()."""
    project.conftest(CLIPPED.format(gamma="1.6"))
    run = project.run("--dlcheck=S3")
    run.assert_outcome("S3", "failed")
    text = tt.section(run, "S3")
    found = re.search(r"step (\d+) of 20: gradient norm ([\d.e+]+) = (\d+) x the median ([\d.]+) of steps 1-3", text)
    assert found, text
    assert float(found[3]) > 10 and float(found[2]) > 10 * float(found[4])
    before = re.search(r"gradient norms before clipping: ([^;]*?) at optimizer", text)
    assert before, text
    norms = [float(p.split(": ")[1]) for p in before[1].split(", ")]
    assert len(norms) == int(found[1]) and min(norms) > 1  # every step clipped: none of these reached the update
    after = re.search(r"at optimizer.step\(\), after your clipping: (.*?) \(the clip hides", text)
    assert after, text
    assert {p.split(": ")[1] for p in after[1].split(", ")} == {"1"}  # what a pre-step hook used to read
    assert "clip gradients" in text


def test_clipping_with_healthy_norms_passes(project):
    """The same loop with a decaying learning rate (gamma 0.9): it clips, and its norms before clipping stay
    within a few x of where they began."""
    project.conftest(CLIPPED.format(gamma="0.9"))
    run = project.run("--dlcheck=S3", "-rA")
    run.assert_outcome("S3", "passed")
    run.fnmatch(
        [
            "20-step smoke run: gradient norms * -> * (before clipping), at most * = * x the median * of steps 1-3 "
            "(step *; an explosion is 10.0 x)",
            "* of 20 steps clipped: at optimizer.step() the norm was at most 1",
        ]
    )


TRAINER = """
    import pytest, tiny, torch
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma={gamma})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), per_device_train_batch_size=4, max_grad_norm=1.0, seed=0)
        return Trainer(model=model, args=args, train_dataset=Dataset.from_list(tiny.tokenized(tok, 24)),
                       data_collator=DataCollatorForLanguageModeling(tok, mlm=False), optimizers=(opt, sched))
"""


def test_a_trainer_s_clip_hides_nothing_from_s3(project):
    """The Trainer clips at max_grad_norm=1.0 before its optimizer step: S3 reads the grad_norm it logs (what its
    clip_grad_norm_ returned), and shows the norm the step was left with apart."""
    project.conftest(TRAINER.format(gamma="1.6"))
    run = project.run("--dlcheck=S3")
    run.assert_outcome("S3", "failed")
    text = tt.section(run, "S3")
    found = re.search(r"step (\d+) of 20: gradient norm ([\d.e+]+) = (\d+) x the median ([\d.]+) of steps 1-3", text)
    assert found and float(found[3]) > 10, text
    after = re.search(r"at optimizer.step\(\), after your clipping: (.*?) \(the clip hides", text)
    assert after and {p.split(": ")[1] for p in after[1].split(", ")} == {"1"}, text


def test_a_trainer_that_clips_healthy_norms_passes(project):
    project.conftest(TRAINER.format(gamma="0.9"))
    run = project.run("--dlcheck=S3", "-rA")
    run.assert_outcome("S3", "passed")
    run.fnmatch(["20-step smoke run: gradient norms * -> * (before clipping), at most * = * x the median *"])


# --------------------------------------------------------------------------------------------------
# S3 and a Trainer that clips and logs less often than every step: its logged grad_norm is the norm before clipping,
# the gradients at its optimizer step are clipped; the two are never one series (found blind on transformers'
# run_object_detection.py: logging_strategy="epoch", norms 1, 1, 1, 1, 1 after clipping then 283 before it)

REGRESSOR_TRAINER = """
    import pytest, torch
    from torch import nn
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Regressor(nn.Module):
        # targets around 50 +- 50, as a detector's box regression in pixels: gradient norms in the hundreds
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

        def forward(self, x, labels=None):
            out = self.net(x).squeeze(-1)
            return {{"loss": nn.functional.mse_loss(out, labels), "logits": out}}

    class LogEvery(TrainerCallback):
        def __init__(self, n):
            self.n = n

        def on_step_end(self, args, state, control, **kwargs):
            control.should_log = state.global_step % self.n == 0

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(48, 8, generator=g)
        y = 30 * x[:, :3].sum(-1) + 50
        model = Regressor()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma={gamma})
        args = TrainingArguments(str(tmp_path_factory.mktemp("o")), report_to="none", use_cpu=True, max_steps=20,
                                 per_device_train_batch_size=8, save_strategy="no", disable_tqdm=True,
                                 max_grad_norm=1.0, seed=0, {logging})
        return Trainer(model=model, args=args, optimizers=(opt, sched), callbacks={callbacks},
                       train_dataset=Dataset.from_list([{{"x": a.tolist(), "labels": float(b)}} for a, b in zip(x, y)]))
"""


def regressor_trainer(gamma: str, logging: str = 'logging_strategy="epoch"', callbacks: str = "[]") -> str:
    return REGRESSOR_TRAINER.format(gamma=gamma, logging=logging, callbacks=callbacks)


@pytest.mark.parametrize("logging", ['logging_strategy="epoch"', 'logging_strategy="no"', "logging_steps=5"])
def test_a_trainer_logging_less_often_compares_norms_before_clipping(project, logging):
    """Norms in the hundreds, clipped to 1 at every step, falling as the learning rate decays (gamma 0.9): the
    smoke run logs every step whatever the user's cadence, so S3 compares the norms before clipping only."""
    project.conftest(regressor_trainer("0.9", logging))
    run = project.run("--dlcheck=S3", "-rA")
    run.assert_outcome("S3", "passed")
    run.fnmatch(
        [
            "20-step smoke run: gradient norms 1?? -> 1?? (before clipping), at most * = * x the median 1?? of steps "
            "1-3 (step *; an explosion is 10.0 x)",
            "20 of 20 steps clipped: at optimizer.step() the norm was at most 1",
        ]
    )


def test_a_trainer_logging_per_epoch_whose_norms_explode_fails(project):
    """The same Trainer with the learning rate growing 2x a step (gamma 2.0, meant 0.2): its norms before clipping
    grow past 10x their start while the clip leaves 1 at every optimizer step."""
    project.conftest(regressor_trainer("2.0"))
    run = project.run("--dlcheck=S3")
    run.assert_outcome("S3", "failed")
    text = tt.section(run, "S3")
    found = re.search(r"step (\d+) of 20: gradient norm ([\d.e+]+) = (\d+) x the median ([\d.]+) of steps 1-3", text)
    assert found and float(found[3]) > 10 and float(found[4]) > 100, text
    before = re.search(r"gradient norms before clipping: ([^;]*?) at optimizer", text)
    assert before and len(before[1].split(", ")) == int(found[1]), text
    assert min(float(p.split(": ")[1]) for p in before[1].split(", ")) > 50, text  # no clipped norm among them
    after = re.search(r"at optimizer.step\(\), after your clipping: (.*?) \(the clip hides", text)
    assert after and {p.split(": ")[1] for p in after[1].split(", ")} == {"1"}, text


def test_steps_a_trainer_does_not_log_are_not_compared_with_norms_before_clipping(project):
    """A callback of the user's lets the Trainer log every fifth step only: the other steps' norms are known only
    after the clipping, and S3 compares the four logged norms before clipping, saying which steps it left."""
    project.conftest(regressor_trainer("0.9", "logging_steps=1", "[LogEvery(5)]"))
    run = project.run("--dlcheck=S3", "-rA")
    run.assert_outcome("S3", "passed")
    run.fnmatch(
        [
            "20-step smoke run: gradient norms * -> * (before clipping), at most * = * x the median 1?? of steps 5, "
            "10 and 15 (step 20; an explosion is 10.0 x)",
            "16 of 20 steps not compared: their norm before clipping is not known (the Trainer clips at "
            "max_grad_norm=1 before its optimizer step and logs the norm before clipping (grad_norm) only at the "
            "steps it logs)",
        ]
    )


def test_too_few_norms_before_clipping_compares_the_norms_at_the_step_and_says_so(project):
    """Logged every tenth step only: two norms before clipping, too few for a baseline of three. S3 compares every
    step's norm at optimizer.step() instead (one kind: a clip only lowers them), and its pass leaves the norms before
    clipping not judged."""
    project.conftest(regressor_trainer("0.9", "logging_steps=1", "[LogEvery(10)]"))
    run = project.run("--dlcheck=S3", "-rA")
    run.assert_outcome("S3", "passed")
    run.fnmatch(
        [
            "*S3_grad_explosion PASSED (*partly judged: the gradient norms before clipping not judged)*",
            "20-step smoke run: gradient norms 1 -> 1 (at optimizer.step(), after any clipping of yours), at most 1 = "
            "1.00 x the median 1 of steps 1-3 (step *; an explosion is 10.0 x)",
            "the gradient norms before clipping: not judged, known at 2 of 20 steps (the Trainer clips at max_grad_norm=1 before "
            "its optimizer step and logs the norm before clipping (grad_norm) only at the steps it logs); the norms at "
            "optimizer.step() were compared instead, in which a clip would hide an explosion*",
        ]
    )
