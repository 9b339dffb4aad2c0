"""Real-code corpus: diffusers examples/dreambooth/train_dreambooth.py with prior preservation (see
rc_dreambooth.py for what was shrunk), handed to pytest-dlcheck the way the diffusers_t2i project hands over
train_text_to_image.py: the diffusion roles (the pipeline built at the end of training, the training noise
scheduler, the step's inputs, the prompt conditioning, the prepared dataloader) and the plain-loop roles (a
factory returning the accelerator-prepared UNet / optimizer / scheduler with the Accelerator, the script's step,
its loss with the prior term, accelerator.save_state / load_state as --checkpointing_steps and
--resume_from_checkpoint latest use them). No dlcheck_sample_images: the README's command sets no
validation_prompt, so the script never samples while it trains."""

import os

os.environ.update(
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    DIFFUSERS_OFFLINE="1",
    TOKENIZERS_PARALLELISM="false",
    OMP_NUM_THREADS="1",
)

import pytest
import torch

torch.set_num_threads(1)

import rc_dreambooth as db


@pytest.fixture(scope="session")
def db_run(tmp_path_factory):
    from diffusers.utils import logging as dlog

    dlog.set_verbosity_error()
    pretrained = db.write_pretrained(str(tmp_path_factory.mktemp("sd-tiny")))
    instance_dir = db.write_instance_images(str(tmp_path_factory.mktemp("dog")))
    args = db.default_args(
        pretrained,
        str(tmp_path_factory.mktemp("db-out")),
        instance_dir,
        db.write_class_images(str(tmp_path_factory.mktemp("class-images"))),
    )
    db.generate_class_images(args, db.make_accelerator(args))
    frozen = db.Frozen(args)
    dataset = db.train_dataset(args, frozen.tokenizer)
    state = db.make_training(args, frozen, dataset)
    for step, batch in enumerate(state["train_dataloader"]):  # the first steps of the script's loop
        db.train_step(args, frozen, state, batch)
        if step == 1:
            break
    pipeline = db.final_pipeline(args, frozen, state["accelerator"], state["model"])
    return {"args": args, "frozen": frozen, "dataset": dataset, "state": state, "pipeline": pipeline}


# ---- diffusion roles --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dlcheck_pipeline(db_run):
    return db_run["pipeline"]


@pytest.fixture(scope="session")
def dlcheck_noise_scheduler(db_run):
    return db_run["frozen"].noise_scheduler


@pytest.fixture(scope="session")
def dlcheck_training_inputs(db_run):
    args, frozen = db_run["args"], db_run["frozen"]
    return lambda batch: db.training_inputs(args, frozen, batch)


@pytest.fixture(scope="session")
def dlcheck_condition(db_run):
    args, text_encoder = db_run["args"], db_run["frozen"].text_encoder
    return lambda batch: db.encode_prompt(
        text_encoder, batch["input_ids"], batch["attention_mask"], args.text_encoder_use_attention_mask
    )


@pytest.fixture(scope="session")
def dlcheck_dataloader(db_run):
    return db_run["state"]["train_dataloader"]


# ---- plain-loop roles -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dlcheck_make_training(db_run):
    args, frozen, dataset = db_run["args"], db_run["frozen"], db_run["dataset"]
    return lambda: db.make_training(args, frozen, dataset)


@pytest.fixture(scope="session")
def dlcheck_train_step(db_run):
    args, frozen = db_run["args"], db_run["frozen"]
    return lambda state, batch: db.train_step(args, frozen, state, batch)


@pytest.fixture(scope="session")
def dlcheck_compute_loss(db_run):
    args, frozen = db_run["args"], db_run["frozen"]
    return lambda model, batch: db.loss_of(args, frozen, model, db.training_inputs(args, frozen, batch))


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    def save(state, path):
        """The script's checkpointing: on the main process only (train_dreambooth.py:1351),
        accelerator.save_state(output_dir/checkpoint-<global_step>)."""
        if state["accelerator"].is_main_process:
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


@pytest.fixture(scope="session")
def dlcheck_resume_dataloader():
    """What the script's epoch loop trains on after the resume: first_epoch = global_step //
    num_update_steps_per_epoch (train_dreambooth.py:1220), then ``for step, batch in enumerate(train_dataloader)``
    (1232-1236) on the prepared loader as it is, with no skip of the batches already trained."""
    return lambda state, dataloader, resumed_step: dataloader
