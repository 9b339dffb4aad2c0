"""Re-creation of huggingface/diffusers examples/text_to_image/train_text_to_image.py (main branch, checked
against commit 58eb52c0), shrunk to a CPU-sized model that is built offline.

Kept as the script wires it:

- every component is loaded with ``from_pretrained(args.pretrained_model_name_or_path, subfolder=...)``:
  ``DDPMScheduler`` (subfolder "scheduler", which holds Stable Diffusion 1.x's PNDMScheduler config),
  ``CLIPTokenizer``, ``CLIPTextModel``, ``AutoencoderKL``, ``UNet2DConditionModel``; the VAE and the text
  encoder frozen (``requires_grad_(False)``), the UNet in train mode;
- ``EMAModel`` over a second UNet loaded from the same directory (``model_cls``/``model_config`` given);
- ``torch.optim.AdamW(unet.parameters(), lr, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)``,
  ``diffusers.optimization.get_scheduler(args.lr_scheduler, num_warmup_steps=lr_warmup_steps *
  num_processes, num_training_steps=...)``;
- a ``datasets`` dataset with image/text columns, ``with_transform(preprocess_train)``: Resize(resolution)
  + CenterCrop (--center_crop) + RandomHorizontalFlip (--random_flip) + ToTensor + Normalize([0.5],[0.5]);
  captions tokenized with padding="max_length", truncation; the script's collate_fn; a shuffling
  DataLoader;
- ``accelerator.prepare(unet, optimizer, train_dataloader, lr_scheduler)`` and the save/load state
  pre-hooks that write ``unet/`` and ``unet_ema/`` with save_pretrained and read them back;
- the step under ``accelerator.accumulate(unet)``: latents = vae.encode(...).latent_dist.sample() *
  vae.config.scaling_factor, noise, timesteps ~ randint(0, num_train_timesteps), add_noise, text
  embeddings, target by ``noise_scheduler.config.prediction_type`` (epsilon / v_prediction), MSE
  (or the min-SNR weighting with --snr_gamma), accelerator.backward, clip_grad_norm_ when
  sync_gradients, optimizer.step, lr_scheduler.step, zero_grad, then ema.step when sync_gradients;
- validation: ``StableDiffusionPipeline.from_pretrained(pretrained, vae=, text_encoder=, tokenizer=,
  unet=unwrap(unet), safety_checker=None, torch_dtype=weight_dtype)`` under
  ``torch.autocast(device.type)``, wrapped in ema.store / ema.copy_to / ema.restore.

Shrunk: the "pretrained" SD-1.x directory is written offline by :func:`write_pretrained` from configs
(a 548-token CLIP BPE vocabulary, a 1-layer CLIP text encoder, an 8/16-channel VAE, a 16/32-channel UNet),
saved with ``StableDiffusionPipeline.save_pretrained`` and read back exactly as the script reads a hub
model. The VAE's ``scaling_factor`` is calibrated to its own latents (as SD's 0.18215 is for SD's VAE):
the script uses ``vae.config.scaling_factor`` whatever it holds. 512 px -> 16 px, 77 tokens -> 12,
batch 16 -> 4, 20 validation steps -> 2; images are drawn shapes with captions. Hyper-parameters are
the script's defaults plus the README's ``--use_ema --center_crop --random_flip``; mixed precision "no"
(CPU), no xformers, no gradient checkpointing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random

import numpy as np
import torch
import torch.nn.functional as F

SIZE = 16
COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (40, 60, 230), "white": (245, 245, 245)}
SHAPES = ("square", "circle", "cross")
CAPTIONS = [f"a {c} {s}" for c in COLOURS for s in SHAPES]
WORDS = sorted({w for c in CAPTIONS for w in c.split()} | {"photo", "of", "the"})


def default_args(pretrained: str, output_dir: str, **overrides) -> argparse.Namespace:
    args = argparse.Namespace(
        pretrained_model_name_or_path=pretrained,
        revision=None,
        variant=None,
        dataset_name=None,
        image_column="image",
        caption_column="text",
        max_train_samples=None,
        validation_prompts=["a red circle"],
        output_dir=output_dir,
        cache_dir=None,
        seed=0,
        resolution=SIZE,
        center_crop=True,
        random_flip=True,
        train_batch_size=4,
        num_train_epochs=100,
        max_train_steps=None,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        learning_rate=1e-4,
        scale_lr=False,
        lr_scheduler="constant",
        lr_warmup_steps=500,
        snr_gamma=None,
        dream_training=False,
        use_8bit_adam=False,
        allow_tf32=False,
        use_ema=True,
        offload_ema=False,
        foreach_ema=False,
        non_ema_revision=None,
        dataloader_num_workers=0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_weight_decay=1e-2,
        adam_epsilon=1e-08,
        max_grad_norm=1.0,
        push_to_hub=False,
        mixed_precision="no",
        report_to="tensorboard",
        checkpointing_steps=500,
        checkpoints_total_limit=None,
        resume_from_checkpoint=None,
        noise_offset=0,
        input_perturbation=0,
        prediction_type=None,
        validation_epochs=5,
        image_interpolation_mode="lanczos",
        num_validation_inference_steps=2,  # the script hard-codes 20
    )
    for k, v in overrides.items():
        setattr(args, k, v)
    if args.non_ema_revision is None:
        args.non_ema_revision = args.revision
    return args


# ---------------------------------------------------------------------------------------------------
# the "pretrained" Stable Diffusion 1.x directory, written from configs


def _clip_vocab(directory: str) -> None:
    """vocab.json / merges.txt of a byte-level CLIP BPE: the 256 byte symbols (alone and with </w>) and
    merges that make each caption word one token."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            codes.append(256 + extra)
            extra += 1
    symbols = [chr(c) for c in codes]
    vocab = symbols + [s + "</w>" for s in symbols]
    merges = []
    for word in WORDS:
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        while len(pieces) > 1:
            merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [pieces[0] + pieces[1]] + pieces[2:]
            vocab.append(pieces[0])
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    with open(os.path.join(directory, "vocab.json"), "w") as fh:
        json.dump({t: i for i, t in enumerate(dict.fromkeys(vocab))}, fh)
    with open(os.path.join(directory, "merges.txt"), "w") as fh:
        fh.write("#version: 0.2\n" + "\n".join(dict.fromkeys(merges)) + "\n")


def draw(colour: str, shape: str, size: int = 20, jitter: int = 0):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (120, 120, 120))
    d = ImageDraw.Draw(img)
    c, r = size // 2 + jitter, size // 3
    fill = COLOURS[colour]
    if shape == "square":
        d.rectangle([c - r, c - r, c + r, c + r], fill=fill)
    elif shape == "circle":
        d.ellipse([c - r, c - r, c + r, c + r], fill=fill)
    else:
        d.rectangle([c - r, c - 1, c + r, c + 1], fill=fill)
        d.rectangle([c - 1, c - r, c + 1, c + r], fill=fill)
    return img


def write_pretrained(directory: str) -> str:
    """An SD-1.x-shaped model directory (model_index.json, scheduler/, tokenizer/, text_encoder/, vae/,
    unet/), written by StableDiffusionPipeline.save_pretrained from tiny configs."""
    import tempfile

    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab_dir = tempfile.mkdtemp(prefix="rc_t2i_vocab")
    _clip_vocab(vocab_dir)
    tokenizer = CLIPTokenizer(
        os.path.join(vocab_dir, "vocab.json"),
        os.path.join(vocab_dir, "merges.txt"),
        model_max_length=12,
        pad_token="<|endoftext|>",
    )
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=12,
            projection_dim=32,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        sample_size=SIZE,
    )
    # a pretrained VAE ships the factor that brings its latents to unit std (SD's VAE: 0.18215)
    from torchvision import transforms

    to_pixels = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5], [0.5])])
    with torch.no_grad():
        pixels = torch.stack([to_pixels(draw(*c.split()[1:], size=SIZE)) for c in CAPTIONS])
        latents = vae.encode(pixels).latent_dist.sample()
    vae.register_to_config(scaling_factor=float(1.0 / latents.std()))
    unet = UNet2DConditionModel(
        sample_size=SIZE // 2,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        norm_num_groups=8,
        cross_attention_dim=32,
        attention_head_dim=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )
    # Stable Diffusion 1.x's scheduler/scheduler_config.json
    scheduler = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        set_alpha_to_one=False,
        skip_prk_steps=True,
        steps_offset=1,
        trained_betas=None,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(directory)
    return directory


# ---------------------------------------------------------------------------------------------------
# main(): loading, data, optimizer, scheduler, accelerator


class Frozen:
    """What main() loads once and never trains: tokenizer, text encoder, VAE, noise scheduler."""

    def __init__(self, args):
        from diffusers import AutoencoderKL, DDPMScheduler
        from transformers import CLIPTextModel, CLIPTokenizer

        path = args.pretrained_model_name_or_path
        self.noise_scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler")
        self.tokenizer = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer", revision=args.revision)
        self.text_encoder = CLIPTextModel.from_pretrained(
            path, subfolder="text_encoder", revision=args.revision, variant=args.variant
        )
        self.vae = AutoencoderKL.from_pretrained(path, subfolder="vae", revision=args.revision, variant=args.variant)
        self.vae.requires_grad_(False)
        self.text_encoder.requires_grad_(False)
        self.weight_dtype = torch.float32


def train_dataset(args, tokenizer):
    """The imagefolder-style dataset (image, text) with the script's transforms applied on access."""
    import datasets
    from torchvision import transforms

    rng = random.Random(0)
    rows = {"image": [], "text": []}
    for caption in CAPTIONS:
        for _ in range(2):
            rows["image"].append(draw(*caption.split()[1:], size=20, jitter=rng.randint(-1, 1)))
            rows["text"].append(caption)
    dataset = datasets.Dataset.from_dict(
        rows, features=datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    )
    image_column, caption_column = args.image_column, args.caption_column

    def tokenize_captions(examples, is_train=True):
        captions = []
        for caption in examples[caption_column]:
            if isinstance(caption, str):
                captions.append(caption)
            elif isinstance(caption, (list, np.ndarray)):
                captions.append(random.choice(caption) if is_train else caption[0])
            else:
                raise ValueError(
                    f"Caption column `{caption_column}` should contain either strings or lists of strings."
                )
        inputs = tokenizer(
            captions, max_length=tokenizer.model_max_length, padding="max_length", truncation=True, return_tensors="pt"
        )
        return inputs.input_ids

    interpolation = getattr(transforms.InterpolationMode, args.image_interpolation_mode.upper(), None)
    train_transforms = transforms.Compose(
        [
            transforms.Resize(args.resolution, interpolation=interpolation),
            transforms.CenterCrop(args.resolution) if args.center_crop else transforms.RandomCrop(args.resolution),
            transforms.RandomHorizontalFlip() if args.random_flip else transforms.Lambda(lambda x: x),
            transforms.ToTensor(),
            transforms.Normalize([0.5], [0.5]),
        ]
    )

    def preprocess_train(examples):
        images = [image.convert("RGB") for image in examples[image_column]]
        examples["pixel_values"] = [train_transforms(image) for image in images]
        examples["input_ids"] = tokenize_captions(examples)
        return examples

    return dataset.with_transform(preprocess_train)


def collate_fn(examples):
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    pixel_values = pixel_values.to(memory_format=torch.contiguous_format).float()
    input_ids = torch.stack([example["input_ids"] for example in examples])
    return {"pixel_values": pixel_values, "input_ids": input_ids}


def train_dataloader(args, dataset):
    return torch.utils.data.DataLoader(
        dataset,
        shuffle=True,
        collate_fn=collate_fn,
        batch_size=args.train_batch_size,
        num_workers=args.dataloader_num_workers,
    )


def make_training(args, frozen, dataset):
    """main() from the UNet/EMA loading to accelerator.prepare: fresh objects every call."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration
    from diffusers import UNet2DConditionModel
    from diffusers.optimization import get_scheduler
    from diffusers.training_utils import EMAModel

    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=None,
        project_config=ProjectConfiguration(project_dir=args.output_dir),
    )
    # main(): "If passed along, set the training seed now." — the same seed in every process (not device_specific)
    if args.seed is not None:
        from accelerate.utils import set_seed

        set_seed(args.seed)
    path = args.pretrained_model_name_or_path
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet", revision=args.non_ema_revision)
    unet.train()
    ema_unet = None
    if args.use_ema:
        ema_unet = UNet2DConditionModel.from_pretrained(
            path, subfolder="unet", revision=args.revision, variant=args.variant
        )
        ema_unet = EMAModel(
            ema_unet.parameters(),
            model_cls=UNet2DConditionModel,
            model_config=ema_unet.config,
            foreach=args.foreach_ema,
        )

    def save_model_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            if args.use_ema:
                ema_unet.save_pretrained(os.path.join(output_dir, "unet_ema"))
            for i, model in enumerate(models):
                model.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()

    def load_model_hook(models, input_dir):
        if args.use_ema:
            load_model = EMAModel.from_pretrained(
                os.path.join(input_dir, "unet_ema"), UNet2DConditionModel, foreach=args.foreach_ema
            )
            ema_unet.load_state_dict(load_model.state_dict())
            ema_unet.to(accelerator.device)
            del load_model
        for _ in range(len(models)):
            model = models.pop()
            load_model = UNet2DConditionModel.from_pretrained(input_dir, subfolder="unet")
            model.register_to_config(**load_model.config)
            model.load_state_dict(load_model.state_dict())
            del load_model

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)

    learning_rate = args.learning_rate
    if args.scale_lr:
        learning_rate = (
            learning_rate * args.gradient_accumulation_steps * args.train_batch_size * accelerator.num_processes
        )
    optimizer = torch.optim.AdamW(
        unet.parameters(),
        lr=learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        weight_decay=args.adam_weight_decay,
        eps=args.adam_epsilon,
    )
    loader = train_dataloader(args, dataset)
    num_warmup_steps_for_scheduler = args.lr_warmup_steps * accelerator.num_processes
    if args.max_train_steps is None:
        len_after_sharding = math.ceil(len(loader) / accelerator.num_processes)
        per_epoch = math.ceil(len_after_sharding / args.gradient_accumulation_steps)
        num_training_steps_for_scheduler = args.num_train_epochs * per_epoch * accelerator.num_processes
    else:
        num_training_steps_for_scheduler = args.max_train_steps * accelerator.num_processes
    lr_scheduler = get_scheduler(
        args.lr_scheduler,
        optimizer=optimizer,
        num_warmup_steps=num_warmup_steps_for_scheduler,
        num_training_steps=num_training_steps_for_scheduler,
    )
    unet, optimizer, loader, lr_scheduler = accelerator.prepare(unet, optimizer, loader, lr_scheduler)
    if args.use_ema:
        ema_unet.to(accelerator.device)
    frozen.text_encoder.to(accelerator.device, dtype=frozen.weight_dtype)
    frozen.vae.to(accelerator.device, dtype=frozen.weight_dtype)
    return {
        "model": unet,
        "optimizer": optimizer,
        "lr_scheduler": lr_scheduler,
        "ema": ema_unet,
        "accelerator": accelerator,
        "train_dataloader": loader,
        "args": args,
    }


# ---------------------------------------------------------------------------------------------------
# the training step


def training_inputs(args, frozen, batch):
    """The step's body up to the UNet call."""
    vae, text_encoder, noise_scheduler = frozen.vae, frozen.text_encoder, frozen.noise_scheduler
    latents = vae.encode(batch["pixel_values"].to(frozen.weight_dtype)).latent_dist.sample()
    latents = latents * vae.config.scaling_factor
    noise = torch.randn_like(latents)
    if args.noise_offset:
        noise += args.noise_offset * torch.randn((latents.shape[0], latents.shape[1], 1, 1), device=latents.device)
    if args.input_perturbation:
        new_noise = noise + args.input_perturbation * torch.randn_like(noise)
    bsz = latents.shape[0]
    timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,), device=latents.device)
    timesteps = timesteps.long()
    if args.input_perturbation:
        noisy_latents = noise_scheduler.add_noise(latents, new_noise, timesteps)
    else:
        noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
    encoder_hidden_states = text_encoder(batch["input_ids"], return_dict=False)[0]
    if args.prediction_type is not None:
        noise_scheduler.register_to_config(prediction_type=args.prediction_type)
    if noise_scheduler.config.prediction_type == "epsilon":
        target = noise
    elif noise_scheduler.config.prediction_type == "v_prediction":
        target = noise_scheduler.get_velocity(latents, noise, timesteps)
    else:
        raise ValueError(f"Unknown prediction type {noise_scheduler.config.prediction_type}")
    return {
        "latents": latents,
        "noise": noise,
        "timesteps": timesteps,
        "noisy_latents": noisy_latents,
        "encoder_hidden_states": encoder_hidden_states,
        "target": target,
    }


def loss_of(args, frozen, unet, x):
    from diffusers.training_utils import compute_snr

    model_pred = unet(x["noisy_latents"], x["timesteps"], x["encoder_hidden_states"], return_dict=False)[0]
    if args.snr_gamma is None:
        return F.mse_loss(model_pred.float(), x["target"].float(), reduction="mean")
    noise_scheduler, timesteps = frozen.noise_scheduler, x["timesteps"]
    snr = compute_snr(noise_scheduler, timesteps)
    mse_loss_weights = torch.stack([snr, args.snr_gamma * torch.ones_like(timesteps)], dim=1).min(dim=1)[0]
    if noise_scheduler.config.prediction_type == "epsilon":
        mse_loss_weights = mse_loss_weights / snr
    elif noise_scheduler.config.prediction_type == "v_prediction":
        mse_loss_weights = mse_loss_weights / (snr + 1)
    loss = F.mse_loss(model_pred.float(), x["target"].float(), reduction="none")
    loss = loss.mean(dim=list(range(1, len(loss.shape)))) * mse_loss_weights
    return loss.mean()


def train_step(args, frozen, state, batch):
    """One iteration of the inner loop (``for step, batch in enumerate(train_dataloader)``)."""
    accelerator, unet, optimizer, lr_scheduler = (
        state["accelerator"],
        state["model"],
        state["optimizer"],
        state["lr_scheduler"],
    )
    with accelerator.accumulate(unet):
        x = training_inputs(args, frozen, batch)
        loss = loss_of(args, frozen, unet, x)
        avg_loss = accelerator.gather(loss.repeat(args.train_batch_size)).mean()
        state.setdefault("train_loss", 0.0)
        state["train_loss"] += avg_loss.item() / args.gradient_accumulation_steps
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(unet.parameters(), args.max_grad_norm)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
    if accelerator.sync_gradients:
        if args.use_ema:
            state["ema"].step(unet.parameters())
        state["global_step"] = state.get("global_step", 0) + 1
        state["train_loss"] = 0.0
    return loss


# ---------------------------------------------------------------------------------------------------
# validation


def validation_pipeline(args, frozen, accelerator, unet):
    from diffusers import StableDiffusionPipeline

    pipeline = StableDiffusionPipeline.from_pretrained(
        args.pretrained_model_name_or_path,
        vae=accelerator.unwrap_model(frozen.vae),
        text_encoder=accelerator.unwrap_model(frozen.text_encoder),
        tokenizer=frozen.tokenizer,
        unet=accelerator.unwrap_model(unet),
        safety_checker=None,
        revision=args.revision,
        variant=args.variant,
        torch_dtype=frozen.weight_dtype,
    )
    pipeline = pipeline.to(accelerator.device)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def log_validation(args, pipeline, accelerator):
    """log_validation's sampling loop (the pipeline built as the script builds it, passed in)."""
    from contextlib import nullcontext

    generator = None if args.seed is None else torch.Generator(device=accelerator.device).manual_seed(args.seed)
    images = []
    for prompt in args.validation_prompts:
        autocast_ctx = nullcontext() if torch.backends.mps.is_available() else torch.autocast(accelerator.device.type)
        with autocast_ctx:
            image = pipeline(
                prompt,
                num_inference_steps=args.num_validation_inference_steps,
                generator=generator,
                height=args.resolution,
                width=args.resolution,
            ).images[0]
        images.append(image)
    return images


def validate_with_ema(args, pipeline, accelerator, unet, ema_unet):
    """The end-of-epoch block: EMA weights in for validation, the trained ones back afterwards."""
    if args.use_ema:
        ema_unet.store(unet.parameters())
        ema_unet.copy_to(unet.parameters())
    images = log_validation(args, pipeline, accelerator)
    if args.use_ema:
        ema_unet.restore(unet.parameters())
    return images
