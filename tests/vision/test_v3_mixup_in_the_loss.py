"""V3 on a classifier whose training loss mixes the batch itself (timm's Mixup/CutMix inside the loss, as
facebookresearch/deit's train_one_epoch does: ``samples, targets = mixup_fn(samples, targets)``). The model is then
called on the batch's images mixed among themselves, never on them as they come, and V3 said 'not applicable: ...
calls DistilledVisionTransformer on float32 (64, 3, 32, 32), not on the batch: its output is no prediction about the
batch's images' of a 10-class classifier (found blind, set 15). The pipeline's call is now read for what it is: each
row of the model's input lies, element by element, between two of the batch's images (a blend or a pasted patch),
so the model classifies the batch's images and V3 judges their class ids against its head. The twin: a loss that
calls the model on noise of the images' shape (a generator's draw) is still not applicable."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)

MIXED = """
    import pytest, torch, tiny_vision as tv
    from torch import nn
    from timm.data import Mixup
    from timm.loss import SoftTargetCrossEntropy

    LABELS = {labels}
    HEAD = 4

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(8, HEAD))
            return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.01)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        data = tv.Shapes(LABELS, transform=tv.classification_tf(train=False))
        return torch.utils.data.DataLoader(data, batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=HEAD)
        criterion = SoftTargetCrossEntropy()

        def compute_loss(model, batch):
            images, targets = batch
            {call}
        return compute_loss
"""

MIX = "images, targets = mixup(images, targets); return criterion(model(images), targets)"
NOISE = "return torch.nn.functional.cross_entropy(model(torch.randn_like(images)), targets)"


def test_a_classifier_trained_on_mixed_images_is_judged(project):
    project.conftest(MIXED.format(labels="[i % 4 for i in range(16)]", call=MIX))
    run = project.run("--dlcheck=V3", "-rA")
    run.assert_outcome("V3", "passed")
    text = " ".join(run.text.split())
    assert "not the batch" not in text, text[-3000:]
    assert "take 4 values 0–3, all in 0..3 (num_classes 4 from the model" in text, text[-3000:]


@pytest.mark.parametrize("call", [NOISE], ids=["noise-of-the-images-shape"])
def test_a_model_called_on_noise_is_still_not_applicable(project, call):
    project.conftest(MIXED.format(labels="[i % 4 for i in range(16)]", call=call))
    run = project.run("--dlcheck=V3", "-rA")
    run.assert_outcome("V3", "skipped")
    text = " ".join(run.text.split())
    assert "not applicable" in text and "not on the batch" in text, text[-3000:]
