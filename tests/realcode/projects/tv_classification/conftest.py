"""Real-code corpus: pytorch/vision references/classification/train.py (ResNet-18, presets, SGD + label
smoothing, LinearLR warmup + cosine in SequentialLR, model EMA, checkpoint/--resume), see rc_tv_train.py
for what was shrunk. Handed to pytest-dlcheck as a vision project (model, loaders, loss, eval function)
and as a plain loop (factory, the reference's iteration as the step, its checkpoint dict and --resume).

RC_TV_WEIGHTS_ONLY=0 in the environment loads with weights_only=False instead of the reference's True
(an experiment only; the default is the reference's behaviour)."""

import os

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_tv_train as ref

N_TRAIN_PER_CLASS, N_VAL_PER_CLASS = 32, 8
STEPS_PER_EPOCH = len(ref.CLASSES) * N_TRAIN_PER_CLASS // 32


@pytest.fixture(scope="session")
def tv_args(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagefolder")
    ref.write_image_folder(str(root / "train"), N_TRAIN_PER_CLASS, seed=0)
    ref.write_image_folder(str(root / "val"), N_VAL_PER_CLASS, seed=1)
    return ref.default_args(data_path=str(root), output_dir=str(tmp_path_factory.mktemp("out")))


@pytest.fixture(scope="session")
def tv_loaders(tv_args):
    return ref.data_loaders(tv_args)


# ---- vision roles -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dlcheck_model(tv_args):
    torch.manual_seed(0)
    return ref.build(tv_args)[0]


@pytest.fixture(scope="session")
def dlcheck_dataloader(tv_loaders):
    return tv_loaders[0]


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader(tv_loaders):
    return tv_loaders[1]


@pytest.fixture(scope="session")
def dlcheck_loss_fn(tv_args):
    return torch.nn.CrossEntropyLoss(label_smoothing=tv_args.label_smoothing)


@pytest.fixture(scope="session")
def dlcheck_eval_fn(dlcheck_loss_fn):
    def eval_fn(model, loader):
        return ref.evaluate(model, dlcheck_loss_fn, loader, device="cpu")

    return eval_fn


# ---- plain-loop roles -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dlcheck_make_training(tv_args):
    import copy

    def make():
        args = copy.deepcopy(tv_args)
        model, criterion, optimizer, lr_scheduler, model_ema = ref.build(args)
        return {
            "model": model,
            "optimizer": optimizer,
            "lr_scheduler": lr_scheduler,
            "model_ema": model_ema,
            "criterion": criterion,
            "args": args,
            "progress": {"index": -1},
        }

    return make


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def train_step(state, batch, index):
        """Iteration ``index % STEPS_PER_EPOCH`` of epoch ``index // STEPS_PER_EPOCH``; the scheduler steps
        after the epoch's last iteration, as main() calls lr_scheduler.step() after train_one_epoch."""
        epoch, i = divmod(index, STEPS_PER_EPOCH)
        model = state["model"]
        if i == 0:
            model.train()
        image, target = batch
        loss, _ = ref.train_iteration(
            model, state["criterion"], state["optimizer"], image, target, state["args"], i, epoch, state["model_ema"]
        )
        if i == STEPS_PER_EPOCH - 1:
            state["lr_scheduler"].step()
        state["progress"]["index"] = index
        return loss

    return train_step


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    def save(state, path):
        epoch = max(0, (state["progress"]["index"] + 1) // STEPS_PER_EPOCH - 1)
        ckpt = ref.checkpoint_dict(
            state["model"], state["optimizer"], state["lr_scheduler"], epoch, state["args"], state["model_ema"]
        )
        # as main() does after every epoch: model_{epoch}.pth, then checkpoint.pth (here: the path given)
        ref.save_on_master(ckpt, os.path.join(os.path.dirname(path), f"model_{epoch}.pth"))
        ref.save_on_master(ckpt, path)

    return save


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    weights_only = os.environ.get("RC_TV_WEIGHTS_ONLY", "1") != "0"

    def load(state, path):
        ref.resume(
            path,
            state["model"],
            state["optimizer"],
            state["lr_scheduler"],
            state["args"],
            state["model_ema"],
            weights_only=weights_only,
        )

    return load
