"""T2: repeated steps on one batch memorise it."""

import json

import pytest
import tiny_train as tt
from helpers import flat


def test_softmax_before_cross_entropy_cannot_overfit(project):
    project.conftest(tt.loop_project(model="tt.SoftmaxMLP()"))
    run = project.run("--dlcheck=T2")
    run.assert_outcome("T2", "failed")
    text = tt.section(run, "T2")
    # the ladder shares one budget: 30 steps over 1x, 10x and 100x together, not 30 each
    assert "30 steps in all (T2.steps=30): lr 0.01 (1x)" in text and "(100x)" in text
    assert "outputs are probabilities" in text and "drop the final softmax" in text


def test_logits_model_overfits(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T2", "-rA")
    run.fnmatch(["*::T2_overfit_batch PASSED (batch 0 loss 1.493 -> *"])
    # the attempt stops once the loss is under the target: a handful of steps, not the 30 allowed
    steps = int(run.text.split("batch 0 loss 1.493 -> ")[2].split(" after ")[1].split(" steps")[0])
    assert 1 <= steps < 30
    run.fnmatch(
        [
            "batch 0 loss 1.493 -> * after * steps on that batch alone at lr 0.01 (1x your base LR), train mode, "
            "the model's randomness held fixed: *% less, 50% needed"
        ]
    )


SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, learning_rate=1e-3)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
"""


def test_sft_trainer_overfits_and_leaves_the_users_model_alone(project):
    project.conftest(SFT)
    run = project.run("--dlcheck=T1,T2,T3", "-rA")
    for cid in ("T1", "T2", "T3"):
        run.assert_outcome(cid, "passed")
    run.fnmatch(
        [
            "batch 0 loss * -> * after * steps on that batch alone at lr * (*x your base LR), train mode*: *% less, 50% needed*"
        ]
    )
    run.fnmatch(["all 20 trainable parameter tensors get a gradient from the loss on batch 0 (loss *)"])


GRPO = """
    import pytest, tiny
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kw):
        return [float(len(c)) for c in completions]

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("grpo"), GRPOConfig, num_generations=2, max_completion_length=8,
                                 per_device_train_batch_size=4)
        return GRPOTrainer(model=tiny.llama(tok), reward_funcs=reward, args=args, processing_class=tok,
                           train_dataset=Dataset.from_dict({"prompt": tiny.PROMPTS}))
"""


def test_grpo_has_no_batch_to_memorise_nor_classes(project):
    project.conftest(GRPO)
    run = project.run("--dlcheck=T1,T2")
    run.assert_outcome("T1", "skipped")
    run.assert_outcome("T2", "skipped")
    run.fnmatch(
        [
            "*not applicable: GRPOTrainer's loss is computed on completions it generates inside each step: there is "
            "no fixed batch to memorise*"
        ]
    )
    run.fnmatch(
        [
            "*not applicable: GRPOTrainer's loss is a policy-gradient objective on generated completions, not a "
            "cross-entropy over classes*"
        ]
    )


STOCHASTIC = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2))
            self.head = nn.Linear(33, 8)

        def forward(self, sample, timestep):
            return self.head(torch.cat([self.body(sample), timestep.float().reshape(-1, 1) / 1000], dim=1))

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = Net()
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr={lr})}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        return DataLoader([{{"pixel_values": torch.randn(8, generator=g)}} for _ in range(32)], batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def loss(model, batch):
            # a diffusion-style objective: fresh noise and timesteps at every call
            x = batch["pixel_values"]
            noise = torch.randn_like(x)
            t = torch.randint(0, 1000, (x.shape[0],))
            a = (1 - t.float() / 1000).reshape(-1, 1)
            return nn.functional.mse_loss(model(a.sqrt() * x + (1 - a).sqrt() * noise, t), noise)
        return loss
"""


def test_batchnorm_dropout_and_redrawn_noise_overfit_with_the_randomness_held_fixed(project):
    project.conftest(STOCHASTIC.format(lr=1e-2))
    run = project.run("--dlcheck=T2", "-rA")
    run.assert_outcome("T2", "passed")
    run.fnmatch(["*train mode, the model's randomness held fixed: *% less, 50% needed*"])


def test_a_loss_that_falls_too_slowly_is_not_conclusive(project):
    project.conftest(STOCHASTIC.format(lr=1e-6))  # a fine-tuning rate: the loss moves, slowly
    run = project.run("--dlcheck=T2", "--dlcheck-set", "T2.steps=5", "-rs")
    run.assert_outcome("T2", "skipped")
    run.fnmatch(["*not conclusive: batch 0 loss * fell to * at best * raise T2.steps to judge it*"])


def test_a_loss_that_does_not_move_at_any_rate_fails(project):
    project.conftest(STOCHASTIC.format(lr=0.0))
    run = project.run("--dlcheck=T2")
    run.assert_outcome("T2", "failed")
    assert "the loss does not move at all" in flat(run.section("T2"))


def test_an_optimizer_that_maximises_the_loss_rises_at_every_rate(project):
    # maximize=True (copied from a reward-maximising RL setup): every step climbs the cross-entropy
    project.conftest(tt.loop_project(optimizer="torch.optim.AdamW(model.parameters(), lr=1e-2, maximize=True)"))
    run = project.run("--dlcheck=T2")
    run.assert_outcome("T2", "failed")
    text = tt.section(run, "T2")
    assert "the loss rises at every learning rate tried, 100x below yours included" in text
    assert "the loss is maximised, not minimised" in text


def test_a_base_lr_that_diverges_on_one_batch_is_said_beside_the_pass(project):
    project.conftest(tt.loop_project(optimizer="torch.optim.SGD(model.parameters(), lr=30.0)"))
    run = project.run("--dlcheck=T2", "-rA")
    run.assert_outcome("T2", "passed")  # 0.1x halves it: the pipeline can learn
    run.fnmatch(["*(also tried: lr 30 (1x): *); at your base LR the loss diverged on this batch*too high for it*"])


FINE_TUNE = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from torchvision.models import resnet18

    def images(n=32, classes=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        protos = torch.randn(classes, 3, 32, 32, generator=torch.Generator().manual_seed(5))
        y = torch.randint(0, classes, (n,), generator=g)
        return TensorDataset(protos[y] + 0.5 * torch.randn(n, 3, 32, 32, generator=g), y)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = resnet18(weights=None)  # weights=... in a real fine-tune: offline here
            {freeze}
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(images(), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()
"""
NEW_HEAD = "model.fc = nn.Linear(model.fc.in_features, 4)"
FREEZE = "for p in model.parameters(): p.requires_grad = False"


def test_a_new_head_frozen_with_the_backbone_is_named(project):
    """The torchvision fine-tune with the freeze run after model.fc is replaced: the new head is frozen at its
    random init with everything else, and no step can change the loss."""
    project.conftest(FINE_TUNE.format(freeze=f"{NEW_HEAD}\n            {FREEZE}"))
    run = project.run("--dlcheck=T2")
    run.assert_outcome("T2", "failed")
    text = tt.section(run, "T2")
    assert "0 of the model's 11,178,564 parameters require grad (0%): nothing trains" in text, text
    assert (
        "the output layer fc (Linear 512->4) has its weight frozen (requires_grad=False) at its random "
        "initialisation: its values are uniform within ±1/sqrt(512) = ±0.0442" in text
    ), text
    assert "the freshly initialised output layer fc is frozen with the rest of the model" in text
    assert "then model.fc = nn.Linear(...)), or unfreeze it: model.fc.requires_grad_(True)" in text
    assert "gave data" not in run.text and "misaligned" not in text


def test_a_backbone_frozen_before_the_new_head_overfits(project):
    """The twin: freeze first, then replace fc; the 2,052 parameters of the head train (0.018% of the model)."""
    project.conftest(FINE_TUNE.format(freeze=f"{FREEZE}\n            {NEW_HEAD}"))
    run = project.run("--dlcheck=T2", "-rA")
    run.assert_outcome("T2", "passed")
    run.fnmatch(["*batch 0 loss * -> * after * steps on that batch alone at lr *"])


def test_a_steady_but_slow_loss_moves_up_early_and_the_ladder_keeps_to_the_budget(project, tmp_path):
    """SGD at 1e-3 halves the batch's loss, but in far more steps than half the budget: the loss falls steadily and
    too slowly, so the 1x attempt stops early and hands the rest to 10x, which halves it; all the attempts
    together spend at most T2.steps."""
    project.conftest(tt.loop_project(optimizer="torch.optim.SGD(model.parameters(), lr=1e-3)"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=T2", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("T2", "passed")
    run.fnmatch(["*(10x your base LR)*(also tried: lr 0.001 (1x): * after * steps)*"])
    t2 = next(r for r in json.loads(out.read_text())["results"] if r["id"] == "T2")
    data, series = t2["data"], t2["artifacts"][0]["series"]
    one_x = len(series["lr 0.001 (1x)"]) - 1  # steps at 1x (the curve holds the loss before the first step too)
    assert 3 <= one_x < 15, series  # moved up before spending its half of the budget
    assert data["steps_in_all"] == one_x + data["steps"] == t2["cost"]["optimizer_steps"] <= data["max_steps"] == 30


def test_every_rung_together_stays_within_a_small_budget(project, tmp_path):
    """A loss that never moves climbs the whole ladder: the steps of 1x, 10x and 100x add up to T2.steps."""
    project.conftest(STOCHASTIC.format(lr=0.0))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=T2", "--dlcheck-set", "T2.steps=12", f"--dlcheck-json={out}")
    run.assert_outcome("T2", "failed")
    text = flat(run.section("T2"))
    assert "12 steps in all (T2.steps=12): lr 0 (1x)" in text and "(100x)" in text, text
    t2 = next(r for r in json.loads(out.read_text())["results"] if r["id"] == "T2")
    assert t2["cost"]["optimizer_steps"] == 12, t2["cost"]


MULTI_LABEL = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            return {out}

    def tags(n=64, seed=0):
        # multi-label: each example carries the tags of the blobs it is near
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 8, generator=g)
        return TensorDataset(x, (x[:, :4] > 0).float())

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = Tagger()
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(tags(), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return {loss}
"""


def test_a_sigmoid_before_a_logits_loss_saturates(project):
    """torch.sigmoid in forward, then BCEWithLogitsLoss (which applies the sigmoid itself): the outputs stay in
    [0, 1] at every step, and over outputs in [0, 1] the loss's floor is above half the first loss whatever the
    weights (the old T2 said "not conclusive")."""
    project.conftest(MULTI_LABEL.format(out="torch.sigmoid(self.head(self.body(x)))", loss="nn.BCEWithLogitsLoss()"))
    run = project.run("--dlcheck=T2")
    run.assert_outcome("T2", "failed")
    text = tt.section(run, "T2")
    assert "the model's outputs lie within [0, 1] at every one of the" in text, text
    assert "descending on the outputs themselves (the weights left out, up to 300 steps): kept so, the loss" in text
    floor = float(text.split("the loss on batch 0 goes no lower than ")[1].split(",")[0])
    target = float(text.split("above the target ")[1].split(";")[0])
    assert floor > target, text
    assert "(a final sigmoid) and the loss expects logits (BCEWithLogitsLoss applies the sigmoid itself)" in text
    assert "drop the final sigmoid (torch.sigmoid / nn.Sigmoid) from the model and keep BCEWithLogitsLoss" in text


@pytest.mark.parametrize(
    "out, loss",
    [
        ("self.head(self.body(x))", "nn.BCEWithLogitsLoss()"),  # logits to the logits loss
        ("torch.sigmoid(self.head(self.body(x)))", "nn.BCELoss()"),  # probabilities to the probability loss
    ],
)
def test_outputs_matched_to_their_loss_overfit(project, out, loss):
    project.conftest(MULTI_LABEL.format(out=out, loss=loss))
    run = project.run("--dlcheck=T2", "-rA")
    run.assert_outcome("T2", "passed")
    run.fnmatch(["*batch 0 loss * -> * after * steps on that batch alone at lr *"])


def test_an_lbfgs_optimizer_is_stepped_with_a_closure(project):
    # time_sequence_prediction's LBFGS: its step takes a closure that re-evaluates the loss, and its flat parameter
    # list lives beside the pickled state (T2 had raised a TypeError, then an AttributeError: blind set 11)
    project.conftest(tt.loop_project(optimizer="torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)"))
    run = project.run("--dlcheck=T2", "-rA")
    assert "internal error" not in run.text, run.text
    run.assert_outcome("T2", "passed")
