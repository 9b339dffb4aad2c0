"""Real-code corpus: diffusers examples/text_to_image/train_text_to_image.py (see rc_t2i_train.py for what
was shrunk). Handed to pytest-dlcheck with the diffusion roles (the validation pipeline, the training
noise scheduler, the step's inputs, the caption conditioning, the EMA, the EMA-wrapped validation) and
the plain-loop roles (a factory returning the accelerator-prepared UNet/optimizer/scheduler with the
EMA and the Accelerator, the script's step, its loss, accelerator.save_state / load_state).

RC_T2I_INNER_OPTIMIZER=1 (an experiment only) hands the torch AdamW inside the AcceleratedOptimizer over
as state['optimizer'] (the step keeps using the accelerate wrapper, kept under 'accelerated_optimizer'),
and leaves the prepared train_dataloader out of the state, to see what the training checks do once they
can hook the optimizer and snapshot the state."""

import os

os.environ.update(
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    DIFFUSERS_OFFLINE="1",
    HF_DATASETS_DISABLE_PROGRESS_BARS="1",
    TOKENIZERS_PARALLELISM="false",
    OMP_NUM_THREADS="1",
)

import pytest
import torch

torch.set_num_threads(1)

import rc_t2i_train as t2i


@pytest.fixture(scope="session")
def t2i_run(tmp_path_factory):
    from diffusers.utils import logging as dlog

    dlog.set_verbosity_error()
    pretrained = t2i.write_pretrained(str(tmp_path_factory.mktemp("sd-tiny")))
    args = t2i.default_args(pretrained, str(tmp_path_factory.mktemp("sd-out")))
    torch.manual_seed(args.seed)
    frozen = t2i.Frozen(args)
    dataset = t2i.train_dataset(args, frozen.tokenizer)
    state = t2i.make_training(args, frozen, dataset)
    for step, batch in enumerate(state["train_dataloader"]):  # the first steps of the script's loop
        t2i.train_step(args, frozen, state, batch)
        if step == 1:
            break
    pipeline = t2i.validation_pipeline(args, frozen, state["accelerator"], state["model"])
    return {"args": args, "frozen": frozen, "dataset": dataset, "state": state, "pipeline": pipeline}


# ---- diffusion roles --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dlcheck_pipeline(t2i_run):
    return t2i_run["pipeline"]


@pytest.fixture(scope="session")
def dlcheck_noise_scheduler(t2i_run):
    return t2i_run["frozen"].noise_scheduler


@pytest.fixture(scope="session")
def dlcheck_training_inputs(t2i_run):
    args, frozen = t2i_run["args"], t2i_run["frozen"]
    return lambda batch: t2i.training_inputs(args, frozen, batch)


@pytest.fixture(scope="session")
def dlcheck_condition(t2i_run):
    text_encoder = t2i_run["frozen"].text_encoder
    return lambda batch: text_encoder(batch["input_ids"], return_dict=False)[0]


@pytest.fixture(scope="session")
def dlcheck_ema(t2i_run):
    return t2i_run["state"]["ema"]


@pytest.fixture(scope="session")
def dlcheck_sample_images(t2i_run):
    run = t2i_run
    state = run["state"]
    return lambda: t2i.validate_with_ema(
        run["args"], run["pipeline"], state["accelerator"], state["model"], state["ema"]
    )


@pytest.fixture(scope="session")
def dlcheck_dataloader(t2i_run):
    return t2i_run["state"]["train_dataloader"]


# ---- plain-loop roles -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dlcheck_make_training(t2i_run):
    args, frozen, dataset = t2i_run["args"], t2i_run["frozen"], t2i_run["dataset"]
    inner = os.environ.get("RC_T2I_INNER_OPTIMIZER") == "1"

    def make():
        state = t2i.make_training(args, frozen, dataset)
        if inner:
            state["accelerated_optimizer"] = state["optimizer"]
            state["optimizer"] = state["optimizer"].optimizer
            state.pop("train_dataloader")  # its state_dict() raises for a plain (non-stateful) DataLoader
        return state

    return make


@pytest.fixture(scope="session")
def dlcheck_train_step(t2i_run):
    args, frozen = t2i_run["args"], t2i_run["frozen"]

    def step(state, batch):
        if "accelerated_optimizer" not in state:
            return t2i.train_step(args, frozen, state, batch)
        inner, state["optimizer"] = state["optimizer"], state["accelerated_optimizer"]
        try:
            return t2i.train_step(args, frozen, state, batch)
        finally:
            state["optimizer"] = inner

    return step


@pytest.fixture(scope="session")
def dlcheck_compute_loss(t2i_run):
    args, frozen = t2i_run["args"], t2i_run["frozen"]
    return lambda model, batch: t2i.loss_of(args, frozen, model, t2i.training_inputs(args, frozen, batch))


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    def save(state, path):
        """The script's checkpointing: accelerator.save_state(output_dir/checkpoint-<global_step>)."""
        os.makedirs(path, exist_ok=True)
        state["accelerator"].save_state(os.path.join(path, f"checkpoint-{state.get('global_step', 0)}"))

    return save


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    def load(state, path):
        """--resume_from_checkpoint latest: the newest checkpoint-* directory, accelerator.load_state."""
        dirs = sorted((d for d in os.listdir(path) if d.startswith("checkpoint")), key=lambda x: int(x.split("-")[1]))
        chosen = dirs[-1] if dirs else None
        if chosen is None:
            return  # "Checkpoint 'latest' does not exist. Starting a new training run."
        state["accelerator"].load_state(os.path.join(path, chosen))
        state["global_step"] = int(chosen.split("-")[1])

    return load
