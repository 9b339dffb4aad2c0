"""Real-code corpus: pytorch/vision references/segmentation/train.py (FCN with aux loss, presets applied jointly
to image and mask, cross-entropy with ignore_index=255, poly LambdaLR per iteration, ConfusionMatrix,
checkpoint/--resume), see rc_tv_seg.py for what was shrunk. Handed to pytest-dlcheck as a vision project
(model, datasets, loaders, joint transforms, criterion, ignore index, metric, eval function) and as a plain
loop (factory, the reference's iteration as the step, its checkpoint dict and --resume).

RC_SEG_WEIGHTS_ONLY=0 in the environment resumes with torch.load(..., weights_only=False) instead of the
reference's plain torch.load, and RC_SEG_EPOCHS=<n> sets --epochs (default 30, the reference's): both experiments
only; the defaults are the reference's behaviour."""

import os

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")

import functools

import pytest
import torch

torch.set_num_threads(1)

import rc_tv_seg as ref

STEPS_PER_EPOCH = 32 // 8  # 32 training images, batch 8, drop_last=True


@pytest.fixture(scope="session")
def seg_args(tmp_path_factory):
    epochs = int(os.environ.get("RC_SEG_EPOCHS", "30"))
    return ref.default_args(output_dir=str(tmp_path_factory.mktemp("out")), epochs=epochs)


@pytest.fixture(scope="session")
def seg_loaders(seg_args):
    return ref.data_loaders(seg_args)


# ---- vision roles -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dlcheck_model(seg_args):
    torch.manual_seed(0)
    return ref.build(seg_args, STEPS_PER_EPOCH)[0]


@pytest.fixture(scope="session")
def dlcheck_dataset(seg_loaders):
    return seg_loaders[0].dataset


@pytest.fixture(scope="session")
def dlcheck_eval_dataset(seg_loaders):
    return seg_loaders[1].dataset


@pytest.fixture(scope="session")
def dlcheck_dataloader(seg_loaders):
    return seg_loaders[0]


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader(seg_loaders):
    return seg_loaders[1]


@pytest.fixture(scope="session")
def dlcheck_train_transform(seg_args):
    return ref.get_transform(True, seg_args)


@pytest.fixture(scope="session")
def dlcheck_eval_transform(seg_args):
    return ref.get_transform(False, seg_args)


@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return ref.criterion


@pytest.fixture(scope="session")
def dlcheck_num_classes():
    return ref.NUM_CLASSES


@pytest.fixture(scope="session")
def dlcheck_ignore_index():
    return 255


@pytest.fixture(scope="session")
def dlcheck_metric():
    return ref.ConfusionMatrix(ref.NUM_CLASSES)


@pytest.fixture(scope="session")
def dlcheck_eval_fn():
    def eval_fn(model, loader):
        return ref.evaluate(model, loader, device="cpu", num_classes=ref.NUM_CLASSES)

    return eval_fn


# ---- plain-loop roles -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dlcheck_make_training(seg_args):
    import copy

    def make():
        args = copy.deepcopy(seg_args)
        model, optimizer, lr_scheduler = ref.build(args, STEPS_PER_EPOCH)
        return {
            "model": model,
            "optimizer": optimizer,
            "lr_scheduler": lr_scheduler,
            "args": args,
            "progress": {"index": -1},
        }

    return make


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def train_step(state, batch, index):
        """One iteration of train_one_epoch (the LambdaLR steps every iteration, as in the reference)."""
        model = state["model"]
        if index % STEPS_PER_EPOCH == 0:
            model.train()
        image, target = batch
        loss = ref.train_iteration(model, ref.criterion, state["optimizer"], state["lr_scheduler"], image, target)
        state["progress"]["index"] = index
        return loss

    return train_step


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    def save(state, path):
        # main() after every epoch: utils.save_on_master(checkpoint, output_dir/model_{epoch}.pth), then the same
        # checkpoint onto output_dir/checkpoint.pth; ``path`` is checkpoint.pth, the one a user passes to --resume
        # (a kill while it is rewritten leaves model_{epoch}.pth, written just before, complete)
        epoch = max(0, (state["progress"]["index"] + 1) // STEPS_PER_EPOCH - 1)
        ckpt = ref.checkpoint_dict(state["model"], state["optimizer"], state["lr_scheduler"], epoch, state["args"])
        ref.save_on_master(ckpt, os.path.join(os.path.dirname(path), f"model_{epoch}.pth"))
        ref.save_on_master(ckpt, path)

    return save


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    load = torch.load
    if os.environ.get("RC_SEG_WEIGHTS_ONLY", "") == "0":
        load = functools.partial(torch.load, weights_only=False)

    def resume(state, path):
        ref.resume(path, state["model"], state["optimizer"], state["lr_scheduler"], state["args"], load=load)

    return resume
