"""T1: the loss before any step is near ln(classes) or below."""

import tiny_train as tt

SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok{init})
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig)
        return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=data)
"""


def test_huge_initializer_range_starts_confidently_wrong(project):
    project.conftest(SFT.format(init=", initializer_range=1.0"))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "x ln(300) = 5.704" in text and "logits are far too large" in text and "initializer_range" in text


def test_default_initialisation_passes(project):
    project.conftest(SFT.format(init=""))
    run = project.run("--dlcheck=T1", "-rA")
    run.fnmatch(["*::T1_initial_loss PASSED (initial loss * on batch 0 = 1.0* x ln(300) = 5.704*"])
    run.fnmatch(["initial loss * on batch 0 = 1.0? x ln(300) = 5.704 (fails above 1.5 x and 1.0 nats over ln(300))"])


def test_summed_loss_in_a_plain_loop(project):
    project.conftest(
        tt.loop_project(
            extra="""
    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss(reduction="sum")
    """
        )
    )
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "summed over the batch" in text and "reduction='mean'" in text


def test_plain_loop_mean_loss_passes(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    run.fnmatch(["initial loss 1.493 on batch 0 = 1.08 x ln(4) = 1.386 (fails above 1.5 x and 1.0 nats over ln(4))"])


REGRESSION = """
    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.MSELoss()
"""

DPO = """
    import copy, pytest, tiny
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok)
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS,
                                  "rejected": tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1]})
        args = tiny.trainer_args(tmp_path_factory.mktemp("dpo"), DPOConfig, max_length=64)
        return DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tok,
                          train_dataset=data)
"""


def test_a_regression_loss_is_not_applicable(project):
    # a plain loop regressing a float target with MSELoss: no classes, no ln(C)
    project.conftest(
        tt.loop_project(model="tt.MLP(classes=1)")
        .replace("def dlcheck_dataloader", "def _unused_loader")
        .replace("def dlcheck_loss_fn", "def _unused_loss_fn")
        + REGRESSION
    )
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "skipped")
    run.fnmatch(
        [
            "*not applicable: the targets are floats (float32 (8, 1)): a regression loss, not a cross-entropy over classes*"
        ]
    )


def test_a_dpo_loss_is_not_applicable(project):
    project.conftest(DPO)
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "skipped")
    run.fnmatch(
        [
            "*not applicable: DPOTrainer's loss is a sigmoid of policy/reference log-ratio margins, not a "
            "cross-entropy over classes: ln(classes) does not apply*"
        ]
    )


RESNET = """
    import pytest, torch
    from torch.utils.data import DataLoader, TensorDataset
    from torchvision.models import resnet50

    @pytest.fixture(scope="session")
    def dlcheck_model():
        torch.manual_seed(0)
        return resnet50(weights=None, num_classes=3)  # freshly initialised, BatchNorm with default running stats

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        x = torch.rand(16, 3, 64, 64, generator=g)
        return DataLoader(TensorDataset(x, torch.randint(0, 3, (16,), generator=g)), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_make_training(dlcheck_model):
        import copy
        def make():
            model = copy.deepcopy(dlcheck_model)
            return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return torch.nn.CrossEntropyLoss()
"""


def test_a_fresh_torchvision_resnet50_starts_near_ln_c(project):
    """A fresh ResNet's BatchNorm running statistics (mean 0, var 1) are not its activations': in eval mode its
    logits explode and the loss reads ~10x ln 3. The first training step normalises with the batch."""
    project.conftest(RESNET)
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    run.fnmatch(["*initial loss * on batch 0 = * x ln(3)*"])


HEAD_ON_LARGE_FEATURES = """
    import pytest, torch, tiny_train as tt
    from torch import nn

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            {order}
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader(scale={scale})

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()
"""
HEAD = "model.head = nn.Linear(32, 4)"
FREEZE = "for p in model.parameters(): p.requires_grad = False"


def test_the_start_of_a_head_frozen_at_its_random_init_is_named(project):
    """A new head put in place before the freeze, on features of unnormalised inputs (x10): the random head's
    logits (std ~7) start 11x ln(4) above a uniform prediction, and nothing can train them down."""
    project.conftest(HEAD_ON_LARGE_FEATURES.format(order=f"{HEAD}\n            {FREEZE}", scale=10.0))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "0 of the model's 420 parameters require grad (0%): nothing trains" in text, text
    assert "the output layer head (Linear 32->4) has its weight frozen (requires_grad=False) at its random" in text
    assert (
        "the logits at step 0 come from the output layer head, frozen at its random initialisation (logit std" in text
    )
    assert "model.head.requires_grad_(True)" in text
    # the twin, the head put in place after the freeze: it trains, so T1's cause is the logits' scale, not a
    # frozen head; on the inputs as they come (no x10) it passes
    project.conftest(HEAD_ON_LARGE_FEATURES.format(order=f"{FREEZE}\n            {HEAD}", scale=10.0))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "the logits are far too large at initialisation" in text and "frozen" not in text, text
    project.conftest(HEAD_ON_LARGE_FEATURES.format(order=f"{FREEZE}\n            {HEAD}", scale=1.0))
    project.run("--dlcheck=T1").assert_outcome("T1", "passed")


IMAGE_TO_IMAGE = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = {model}
            return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():  # an ImageFolder's (image, class) pairs
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.rand(32, 3, 16, 16, generator=g) * 255,
                                        {labels}), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def loss(model, batch):
            x, y = batch
            {loss}
        return loss
"""


def test_an_image_to_image_network_has_no_classes(project):
    # fast_neural_style: TransformerNet maps 0-255 images to images; its perceptual loss ignores the ImageFolder
    # label. T1 took the image's width (16) for a number of classes and failed at 1e8 x ln(16)
    project.conftest(
        IMAGE_TO_IMAGE.format(
            model="nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1))",
            loss="return 1e5 * nn.functional.mse_loss(model(x), x)",
            labels="torch.zeros(32, dtype=torch.long)",  # one class folder: shuffling tells nothing of their use
        )
    )
    run = project.run("--dlcheck=T1", "-rs")
    run.assert_outcome("T1", "skipped")
    assert "not applicable: the model's output (8, 3, 16, 16) is no row of class scores per example" in run.text


def test_the_same_images_under_a_classifier_head_are_judged(project):
    project.conftest(
        IMAGE_TO_IMAGE.format(
            model="nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), "
            "nn.Linear(8, 4))",
            loss="return nn.functional.cross_entropy(model(x / 255), y)",
            labels="torch.randint(0, 4, (32,), generator=g)",
        )
    )
    run = project.run("--dlcheck=T1", "-rA")
    assert run.outcome("T1") in ("passed", "failed"), run.text
    assert "no row of class scores" not in run.text


def test_a_segmentation_net_s_classes_are_its_channels_not_the_width(project):
    """Lightning's semantic_segmentation example, found blind: (batch, 19, H, 48) scores against (batch, H, 48)
    masks were read as 48 classes (the width). The classes of a channels-first dense prediction are dim 1."""
    project.conftest(
        IMAGE_TO_IMAGE.format(
            model="nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 5, 3, padding=1))",
            loss="return nn.functional.cross_entropy(model(x / 255), y)",
            labels="torch.randint(0, 5, (32, 16, 16), generator=g)",
        )
    )
    run = project.run("--dlcheck=T1", "-rA")
    assert run.outcome("T1") in ("passed", "failed"), run.text
    text = " ".join(run.text.split())
    assert "ln(5)" in text and "ln(16)" not in text, text


def test_a_segmentation_net_at_a_quarter_of_the_resolution_is_judged_on_its_channels(project):
    """transformers' run_semantic_segmentation_no_trainer, found blind: Segformer's (batch, 4, H/4, W/4) logits against
    (batch, H, W) masks, upsampled inside the loss, were read as ln(8), a quarter of the width."""
    project.conftest(
        IMAGE_TO_IMAGE.format(
            model="nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, stride=4), nn.ReLU(), nn.Conv2d(8, 5, 1))",
            loss="return nn.functional.cross_entropy(nn.functional.interpolate(model(x / 255), size=(16, 16), "
            "mode='bilinear'), y)",
            labels="torch.randint(0, 5, (32, 16, 16), generator=g)",
        )
    )
    run = project.run("--dlcheck=T1", "-rA")
    assert run.outcome("T1") in ("passed", "failed"), run.text
    text = " ".join(run.text.split())
    assert "ln(5)" in text and "ln(4)" not in text, text


DIRECT_NET = """
    import pytest, torch, tiny_lightning as tl
    import torch.nn.functional as F

    class Direct(tl.Classifier):
        # Lightning's demo Transformer: training_step calls the network it wraps, never the module's own forward
        def __init__(self, scale):
            super().__init__()
            with torch.no_grad():
                self.net.head.weight.mul_(scale)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return Direct({scale})

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs()
"""


def test_a_training_step_that_calls_its_one_network_directly_tells_the_classes(project):
    # the output of the one top-level network the step calls gives the number of classes (T1 had asked for
    # dlcheck_num_classes: blind set 10's Lightning transformer example)
    project.conftest(DIRECT_NET.format(scale=1.0))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    run.fnmatch(["*x ln(4) = 1.386*"])


def test_a_directly_called_network_that_starts_overconfident_fails(project):
    project.conftest(DIRECT_NET.format(scale=200.0))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    assert "ln(4) = 1.386" in " ".join(run.text.split())
