"""The vision checks on a video classification pipeline, as torchvision's video reference builds it
(references/video_classification: a Kinetics-style dataset giving (video, audio, label, video_idx), a collate_fn that
drops the audio, clips (C, T, H, W) normalised per channel, an r2plus1d-like Conv3d model, an evaluate() that reads
``data_loader.dataset.samples`` and ``.classes`` to aggregate its clips per video). Found blind (set 9): V2 handed the
evaluate a DataLoader over a torch Subset, which has no ``samples``, and blamed dlcheck_eval_fn for the
AttributeError; V1, V3, V5, V6 and V8 said "the data holds no images" of the (B, C, T, H, W) batches."""

import tiny_vision  # noqa: F401  (torchvision and the plugin's roles imported once, outside the runs)
from tiny_vision import section

CONFTEST = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.dataloader import default_collate
    from torchvision import transforms

    torch.set_num_threads(1)
    MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)   # the reference's presets


    class ConvertBCHWtoCBHW(nn.Module):   # the reference's transforms.py: frames (T, C, H, W) -> clip (C, T, H, W)
        def forward(self, vid):
            return vid.permute(1, 0, 2, 3)


    class ToFloat(nn.Module):
        def forward(self, vid):
            return vid.float()


    SCALED = transforms.Compose(
        [transforms.ConvertImageDtype(torch.float32), transforms.Normalize(MEAN, STD), ConvertBCHWtoCBHW()]
    )
    UNSCALED = transforms.Compose([ToFloat(), ConvertBCHWtoCBHW()])   # 0-255 frames, never scaled nor normalised


    class KineticsWithVideoId(Dataset):
        # torchvision's Kinetics + the reference's video index: 2 clips of 4 frames per 6-frame video
        def __init__(self, labels, seed, transform):
            self.classes = ["up", "down"]
            self.samples = [(f"{{i}}.mp4", c) for i, c in enumerate(labels)]
            g = torch.Generator().manual_seed(seed)
            self.videos = [torch.randint(0, 256, (6, 3, 12, 12), generator=g, dtype=torch.uint8) for _ in labels]
            self.transform = transform

        def __len__(self):
            return 2 * len(self.samples)

        def __getitem__(self, idx):
            video_idx, clip = divmod(idx, 2)
            video = self.videos[video_idx][2 * clip : 2 * clip + 4]
            if self.transform is not None:
                video = self.transform(video)
            return video, torch.empty(1, 0), self.samples[video_idx][1], video_idx


    def collate_fn(batch):   # remove audio from the batch
        return default_collate([(d[0], d[2], d[3]) for d in batch])


    class TinyR2Plus1d(nn.Module):
        def __init__(self, classes=2):
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv3d(3, 4, (1, 3, 3), padding=(0, 1, 1), bias=False), nn.BatchNorm3d(4), nn.ReLU(),
                nn.Conv3d(4, 4, (3, 1, 1), padding=(1, 0, 0), bias=False), nn.BatchNorm3d(4), nn.ReLU(),
            )
            self.pool = nn.AdaptiveAvgPool3d(1)
            self.fc = nn.Linear(4, classes)

        def forward(self, x):
            return self.fc(self.pool(self.stem(x)).flatten(1))


    def evaluate(model, data_loader):   # the reference's evaluate, reduced: clip scores aggregated per video
        model.eval()
        num_videos = len(data_loader.dataset.samples)
        num_classes = len(data_loader.dataset.classes)
        agg_preds = torch.zeros((num_videos, num_classes))
        scored = torch.zeros(num_videos, dtype=torch.bool)
        with torch.inference_mode():
            for video, target, video_idx in data_loader:
                preds = torch.softmax(model(video), dim=1)
                for b in range(video.size(0)):
                    agg_preds[video_idx[b].item()] += preds[b]
                    scored[video_idx[b].item()] = True
        {strict}
        return agg_preds


    @pytest.fixture(scope="session")
    def dlcheck_model():
        torch.manual_seed(0)
        return TinyR2Plus1d()


    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        labels = {labels}
        return DataLoader(KineticsWithVideoId(labels, 1, {tf}), batch_size=8, shuffle=False, collate_fn=collate_fn)


    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        data = KineticsWithVideoId([i % 2 for i in range(6)], 2, {tf})
        return DataLoader(data, batch_size=8, shuffle=False, collate_fn=collate_fn)


    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()   # the reference's criterion: unweighted


    @pytest.fixture(scope="session")
    def dlcheck_eval_fn():
        return evaluate
"""

BALANCED = "[i % 2 for i in range(24)]"  # 48 clips, 24 of each class
LENIENT = "pass"


def _conftest(tf="SCALED", labels=BALANCED, strict=LENIENT):
    return CONFTEST.format(tf=tf, labels=labels, strict=strict)


def test_video_classification_reference_is_judged_by_the_vision_checks(project):
    project.conftest(_conftest())
    run = project.run("--dlcheck=V1,V2,V3,V5,V6,V7,V8", "-rA")
    for cid in ("V1", "V2", "V3", "V6", "V7"):
        run.assert_outcome(cid, "passed")
    text = " ".join(run.text.split())
    assert "holds no image" not in text and "bug of pytest-dlcheck" not in text, run.text
    # V1: per-channel statistics over every frame of the normalised clips
    assert "8 train + 8 eval video clips (every frame counted): |values| ≤" in text
    assert "train and eval transforms apply the same Normalize (within 0.02)" in text
    # V2: the evaluate reads loader.dataset.samples / .classes of the user's dataset class; both halves judged
    assert "read twice under different seeds: identical" in text
    assert "dlcheck_eval_fn called twice right after model.train(): 0 of 2 modules" in text
    # V6: the labels come from the loader's batches (the dataset's own examples carry the audio in position 1)
    assert "the 2 classes are equally frequent (24 labels each) over 48 labels" in text
    # V7: the BatchNorm3d layers normalise over clips
    assert "each BatchNorm step normalises over 8 clips, at least 8" in text
    # V5 and V8: not applicable for what the targets are, not for a lack of images
    run.assert_outcome("V5", "skipped")
    run.assert_outcome("V8", "skipped")
    assert "V8 judges boxes and masks moving with the image; the sampled targets (8 examples from batches of " in text
    assert "are class labels (classification)" in text


def test_unscaled_0_255_video_fails_v1(project):
    project.conftest(_conftest(tf="UNSCALED"))
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = section(run, "V1")
    assert "train: 8 examples from batches of dlcheck_dataloader: dtype float32" in text
    assert "range 0 to 255" in text
    assert "the images reach the model as raw 0–255 pixel values: no step scales them to [0, 1]" in text  # cause
    assert "ConvertImageDtype(torch.float)" in text  # fix


def test_imbalanced_video_labels_read_from_the_batches_fail_v6(project):
    # 2 of 128 videos are class 1: 252 clips of class 0 for 4 of class 1, spread so the first batches hold both
    project.conftest(_conftest(labels="[int(i in (30, 90)) for i in range(128)]"))
    run = project.run("--dlcheck=V6")
    run.assert_outcome("V6", "failed")
    text = section(run, "V6")
    assert "examples from batches of dlcheck_dataloader" in text, text
    assert "class 0: 252" in text and "class 1: 4" in text, text
    assert "WeightedRandomSampler" in text  # fix


def test_an_eval_raising_on_v2s_bounded_loader_is_pytest_dlchecks_error(project):
    # an evaluate that insists on a score for every video: right on its own loader, never on 2 examples of it
    strict = 'if not scored.all(): raise ValueError(f"{int((~scored).sum())} videos have no scored clip")'
    project.conftest(_conftest(strict=strict))
    run = project.run("--dlcheck=V2")
    text = " ".join(run.text.split())
    assert "internal error of pytest-dlcheck" in text, run.text
    assert "ValueError: 4 videos have no scored clip" in text
    assert "the DataLoader V2 made over 2 examples of dlcheck_eval_dataloader.dataset (positions 0, 11;" in text
    assert "not on your pipeline's own data" in text
    assert "dlcheck_eval_fn: raised" not in text and "your role raised" not in text, run.text


FRAMES_FIRST = """
    import pytest, torch
    from torch.utils.data import DataLoader, Dataset

    class Clips(Dataset):   # transformers' VideoMAE layout: pixel_values (T, C, H, W) per clip
        def __len__(self):
            return 16

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"pixel_values": torch.randn(8, 3, 12, 12, generator=g), "labels": i % 2}

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(Clips(), batch_size=4)
"""


def test_clips_with_their_frames_first_are_said_unread_not_imageless(project):
    project.conftest(FRAMES_FIRST)
    run = project.run("--dlcheck=V1,V6", "-rs")
    for cid in ("V1", "V6"):
        run.assert_outcome(cid, "skipped")
    text = " ".join(run.text.split())
    assert (
        "V1_normalization: the examples of dlcheck_dataloader hold 4-D Tensors of shape (8, 3, 12, 12): video clips "
        "whose layout the vision checks do not read (they read clips channels first, (C, T, H, W) with C = 3 or 1)"
    ) in text, run.text
    assert "holds no image" not in text and "not applicable" not in text, run.text
