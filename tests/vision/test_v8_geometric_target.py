"""V8: geometric augmentation moves the boxes/masks with the image."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

DETECTION = """
    import pytest, torch, tiny_vision as tv
    from torchvision.transforms import v2 as T

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        tf = T.Compose([T.ToImage(), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True)])
        return tv.ShapesDetection(8, {how}=tf)
"""


@pytest.mark.parametrize("how, outcome", [("transform", "failed"), ("transforms", "passed")])
def test_horizontal_flip_applied_to_the_image_only(project, how, outcome):
    # transform= is applied to the image alone (a StandardTransform); transforms= gets (image, target)
    project.conftest(DETECTION.format(how=how))
    run = project.run("--dlcheck=V8", "-rA")
    run.assert_outcome("V8", outcome)
    if outcome == "passed":
        run.fnmatch(
            [
                "*::V8_geometric_target PASSED (8 of 8 seeded passes of a synthetic 128×96 image with a matching box*",
                "*dlcheck evidence*",
                "8 of 8 seeded passes of a synthetic 128×96 image with a matching box (shaped like dlcheck_dataset*) "
                "through the train transform: the box follows the object (IoU ≥ 1.00, limit 0.5); train transform: "
                "ToImage → RandomHorizontalFlip → ToDtype(float32, scale=True)",
            ]
        )
        assert "dlcheck_dataset[0], dlcheck_dataset[1] read 6 times each: no read is another mirrored" in run.text
    if outcome == "failed":
        text = section(run, "V8")
        assert "synthetic 128×96 image, object at [12.0, 12.0, 44.0, 40.0] with a matching box" in text
        assert (
            "the object is at [84.0, 12.0, 116.0, 40.0] in the 128×96 output but the target has box "
            "[12.0, 12.0, 44.0, 40.0] (IoU 0.00)" in text
        )
        assert "trials leave the target behind; train transform: ToImage → RandomHorizontalFlip" in text
        assert "the dataset was given transform= (image only) with target_transform=None" in text
        assert "pass a joint transforms=T.Compose([...])" in text


SEGMENTATION = """
    import pytest, torch, tiny_vision as tv

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.ShapesSegmentation(8, mask={mask!r}, transforms=tv.segmentation_tf(train=True))
"""


@pytest.mark.parametrize("mask, outcome", [("plain", "failed"), ("tv", "passed")])
def test_plain_tensor_masks_are_not_flipped_by_transforms_v2(project, mask, outcome):
    project.conftest(SEGMENTATION.format(mask=mask))
    run = project.run("--dlcheck=V8", "-rA")
    run.assert_outcome("V8", outcome)
    if outcome == "passed":
        run.fnmatch(
            [
                "*dlcheck evidence*",
                "8 of 8 seeded passes of a synthetic 128×96 image with a matching mask (shaped like dlcheck_dataset*) "
                "through the train transform: the mask follows the object (IoU ≥ 1.00, limit 0.5); *",
            ]
        )
    if outcome == "failed":
        # the same transform moves a tv_tensors.Mask with the image, so what the dataset hands it decides: its
        # examples re-read show the image mirrored and the mask left behind (a synthetic plain mask is no evidence:
        # transformers' segmentation examples wrap theirs before the transform, found blind)
        text = section(run, "V8")
        assert "the mask no longer matches the image" in text
        assert "the image is mirrored horizontally relative to read 0, the mask is identical to read 0's" in text
        assert "tv_tensors.Mask" in text


CUSTOM = """
    import random, pytest, torch, tiny_vision as tv
    from torchvision.transforms import v2 as T

    class FlippingDataset(torch.utils.data.Dataset):
        # a hand-written dataset that flips at random, without torchvision's joint transforms
        def __init__(self):
            self.inner = tv.ShapesDetection(8, boxes="plain", transforms=T.Compose([T.ToImage(), T.ToDtype(torch.float32, scale=True)]))

        def __len__(self):
            return len(self.inner)

        def __getitem__(self, i):
            image, target = self.inner[i]
            if random.random() < 0.5:
                image = image.flip(-1)
                {flip_boxes}
            return image, target

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return FlippingDataset()

    @pytest.fixture(scope="session")
    def dlcheck_box_format():
        return "xyxy"
"""

FLIP_BOXES = """w = image.shape[-1]
                b = target["boxes"].clone()
                target["boxes"] = torch.stack([w - b[:, 2], b[:, 1], w - b[:, 0], b[:, 3]], dim=1)"""


@pytest.mark.parametrize("flip_boxes, outcome", [("", "failed"), (FLIP_BOXES, "passed")])
def test_custom_dataset_flips_the_image_not_the_boxes(project, flip_boxes, outcome):
    project.conftest(CUSTOM.format(flip_boxes=flip_boxes))
    run = project.run("--dlcheck=V8", "-rA")
    run.assert_outcome("V8", outcome)
    if outcome == "passed":
        run.fnmatch(
            ["*dlcheck evidence*", "*read 6 times each: no read is another mirrored with its target left identical"]
        )
        assert "seeded passes" not in run.text  # a hand-written dataset has no transform to call: the re-reads judge
    if outcome == "failed":
        text = section(run, "V8")
        assert (
            "] read 6 times: one read is the other mirrored horizontally (correlation 1.00 after flipping back" in text
        )
        assert "but its target is identical: boxes [" in text
        assert "the dataset flips the image but not its boxes/masks" in text


def test_classification_has_nothing_to_move(project):
    project.conftest("""
        import pytest, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_dataset():
            return tv.Shapes([0, 1, 2, 3], transform=tv.classification_tf(train=True))
    """)
    run = project.run("--dlcheck=V8")
    run.assert_outcome("V8", "skipped")
    assert (
        "not applicable: V8 judges boxes and masks moving with the image; the sampled targets (4 examples of "
        "dlcheck_dataset) are class labels (classification)"
    ) in run.text


TUTORIAL = """
    import pytest, torch
    from torchvision import tv_tensors
    from torchvision.transforms import v2 as T

    class PennFudanLike(torch.utils.data.Dataset):
        # the PyTorch detection tutorial: boxes wrapped as BoundingBoxes inside __getitem__, the v2 pipeline
        # ends in ToPureTensor, so the items come out as plain tensors
        def __init__(self, n, wrap):
            self.n, self.wrap = n, wrap
            self.transforms = T.Compose([T.RandomHorizontalFlip(0.5), T.ToDtype(torch.float, scale=True),
                                         T.ToPureTensor()])

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            img = torch.zeros(3, 96, 128, dtype=torch.uint8)
            img[:, 20:50, 10 + i:40 + i] = 255
            boxes = torch.tensor([[10.0 + i, 20.0, 40.0 + i, 50.0]])
            target = {{"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(96, 128)) if self.wrap
                       else boxes, "labels": torch.tensor([1])}}
            return self.transforms(tv_tensors.Image(img), target)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return PennFudanLike(8, wrap={wrap})
"""


def test_the_detection_tutorials_wrapped_boxes_and_to_pure_tensor_pass(project):
    project.conftest(TUTORIAL.format(wrap=True))
    run = project.run("--dlcheck=V8", "-rA")
    assert "wrap them: target['boxes'] = tv_tensors.BoundingBoxes" not in run.text, run.text
    run.assert_outcome("V8", "passed")


def test_the_same_pipeline_with_plain_boxes_still_fails(project):
    project.conftest(TUTORIAL.format(wrap=False))
    run = project.run("--dlcheck=V8")
    run.assert_outcome("V8", "failed")


SEPARATE_CALLS = """
    import numpy as np, pytest, torch, tiny_vision as tv
    from torchvision import transforms as T1, tv_tensors
    from torchvision.transforms import v2 as T

    class Segmentation(torch.utils.data.Dataset):
        # a hand-written segmentation dataset: VOC-style PIL image and "L" mask, augmented in __getitem__
        def __init__(self, joint):
            self.base = tv.ShapesSegmentation(8, mask="pil")
            self.joint = joint
            self.flip = T1.RandomHorizontalFlip()          # transforms v1: every call draws anew
            self.tf = T.Compose([T.ToImage(), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True)])

        def __len__(self):
            return len(self.base)

        def __getitem__(self, i):
            img, mask = self.base[i]
            if self.joint:                                  # v2, one call: one draw moves both
                img, mask = self.tf(img, tv_tensors.Mask(torch.from_numpy(np.array(mask))))
                return img, mask.as_subclass(torch.Tensor).long()
            img, mask = self.flip(img), self.flip(mask)     # two calls: two independent draws
            return T1.functional.to_tensor(img), torch.from_numpy(np.array(mask)).long()

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return Segmentation(joint={joint})
"""


@pytest.mark.parametrize("joint, outcome", [(False, "failed"), (True, "passed")])
def test_same_random_transform_called_separately_on_image_and_mask(project, joint, outcome):
    project.conftest(SEPARATE_CALLS.format(joint=joint))
    run = project.run("--dlcheck=V8", "-rA")
    run.assert_outcome("V8", outcome)
    if outcome == "failed":
        text = section(run, "V8")
        assert "2 examples read 6 times each: in " in text
        assert "re-reads (" in text and "%) the mask no longer matches the image" in text
        assert "dlcheck_dataset[0] read " in text and "read 0's" in text
        assert "mirrored horizontally relative to read 0" in text
        assert "the image and its mask get separate random draws" in text
        assert "img, mask = transforms(img, tv_tensors.Mask(mask))" in text
    else:
        run.fnmatch(
            [
                "*dlcheck evidence*",
                "dlcheck_dataset[[]0] (* re-reads: every mask moved exactly as its image), dlcheck_dataset[[]*] read 6 "
                "times each: no read is another mirrored with its target left identical",
            ]
        )


# torchvision's segmentation reference (presets.py / transforms.py): RandomResize (the mask NEAREST), then
# RandomHorizontalFlip, then RandomCrop's pad_if_smaller, which pads the image with 0 and the mask with 255 at
# the right and bottom. Resized below the crop size, two reads with opposite flips share an identical padded band:
# the image's content and the mask's content are both mirrored, the band is not. Counting the band, the image
# looked "the same" (correlation above 0.95) while its mask agreed on too few pixels to be "the same": a false
# alarm on the reference. Separate draws for image and mask must still fail.
PADDED = """
    import random
    import numpy as np, pytest, torch, tiny_vision as tv
    from torchvision import transforms as T1
    from torchvision.transforms import functional as F

    class PaddedSegmentation(torch.utils.data.Dataset):
        def __init__(self, joint):
            self.base = tv.ShapesSegmentation(8, mask="pil")
            self.joint = joint
            self.flip = T1.RandomHorizontalFlip()            # transforms v1: every call draws anew

        def __len__(self):
            return len(self.base)

        def __getitem__(self, i):
            img, mask = self.base[i]
            img = F.resize(img, [20, 20])
            mask = F.resize(mask, [20, 20], interpolation=T1.InterpolationMode.NEAREST)
            if self.joint:                                     # the reference's RandomHorizontalFlip: one draw
                if random.random() < 0.5:
                    img, mask = F.hflip(img), F.hflip(mask)
            else:                                              # two calls: two independent draws
                img, mask = self.flip(img), self.flip(mask)
            img, mask = F.pad(img, [0, 0, 20, 20], fill=0), F.pad(mask, [0, 0, 20, 20], fill=255)  # pad_if_smaller
            img = F.normalize(F.to_tensor(img), mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
            return img, torch.as_tensor(np.array(mask), dtype=torch.int64)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return PaddedSegmentation(joint={joint})
"""


@pytest.mark.parametrize("joint, outcome", [(False, "failed"), (True, "passed")])
def test_flip_then_pad_to_the_crop_size_compares_the_content(project, joint, outcome):
    project.conftest(PADDED.format(joint=joint))
    run = project.run("--dlcheck=V8", "-rA")
    run.assert_outcome("V8", outcome)
    if outcome == "failed":
        text = section(run, "V8")
        assert "%) the mask no longer matches the image" in text
        assert "mirrored horizontally relative to" in text
        assert "the image and its mask get separate random draws" in text
    else:
        run.fnmatch(
            [
                "*dlcheck evidence*",
                "dlcheck_dataset[[]0] (* re-reads: every mask moved exactly as its image), dlcheck_dataset[[]*] read 6 "
                "times each: no read is another mirrored with its target left identical",
            ]
        )


WRAPPED_THEN_PLAIN = """
    import pytest, torch, tiny_vision as tv

    class PlainAfter(torch.utils.data.Dataset):
        # transformers' run_semantic_segmentation_no_trainer: the mask wrapped as tv_tensors.Mask for the joint
        # transform, handed on as a plain tensor (its with_transform returns plain labels)
        def __init__(self):
            self.inner = tv.ShapesSegmentation(8, mask="tv", transforms=tv.segmentation_tf(train=True))

        def __len__(self):
            return len(self.inner)

        def __getitem__(self, i):
            image, mask = self.inner[i]
            return image, mask.as_subclass(torch.Tensor)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return PlainAfter()

    @pytest.fixture(scope="session")
    def dlcheck_train_transform():
        return tv.segmentation_tf(train=True)
"""


def test_masks_wrapped_before_the_transform_and_plain_after_it_pass(project):
    """Found blind: V8 fed the train transform a synthetic plain-tensor mask (the type the dataset hands out) and told
    the user to wrap masks the pipeline already wraps. The transform moves a tv_tensors.Mask with the image, so the
    dataset's own re-reads decide: the mask follows."""
    project.conftest(WRAPPED_THEN_PLAIN)
    run = project.run("--dlcheck=V8", "-rA")
    run.assert_outcome("V8", "passed")
    assert "the masks are plain tensors" not in run.text
