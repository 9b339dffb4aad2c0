"""Re-creation of huggingface/diffusers examples/dreambooth/train_dreambooth.py (commit
58eb52c0803ea9af3abec60841c2a093bdf1f951), run as its README's "Training with prior-preservation loss" command
(examples/dreambooth/README.md:102-118), shrunk to a CPU-sized model that is built offline.

Kept as the script wires it:

- every component is loaded with ``from_pretrained(args.pretrained_model_name_or_path, subfolder=...)``:
  ``DDPMScheduler`` (subfolder "scheduler", which holds Stable Diffusion 1.x's PNDMScheduler config), the slow
  ``CLIPTokenizer`` (AutoTokenizer use_fast=False), ``CLIPTextModel``, ``AutoencoderKL``,
  ``UNet2DConditionModel``; the VAE and the text encoder frozen (``requires_grad_(False)``);
- prior preservation: the class images are generated first, when ``class_data_dir`` holds fewer than
  ``num_class_images``, by ``DiffusionPipeline.from_pretrained(pretrained, safety_checker=None)`` from
  ``class_prompt`` over a ``PromptDataset`` in batches of ``sample_batch_size``, saved as
  ``{index}-{sha1}.jpg``;
- ``DreamBoothDataset``: instance images paired with ``instance_prompt`` and class images with ``class_prompt``
  (length max(#class, #instance), index modulo each), Resize(resolution, BILINEAR) + RandomCrop (no
  --center_crop) + ToTensor + Normalize([0.5], [0.5]); prompts tokenized with padding="max_length",
  truncation, ``return_tensors="pt"``; ``collate_fn(examples, with_prior_preservation=True)`` concatenates the
  instance then the class halves (pixel_values, input_ids, attention_mask); a shuffling DataLoader;
- ``torch.optim.AdamW(unet.parameters(), lr, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)``,
  ``get_scheduler(args.lr_scheduler, num_warmup_steps=lr_warmup_steps * num_processes, num_training_steps=...,
  num_cycles, power)``, ``accelerator.prepare(unet, optimizer, train_dataloader, lr_scheduler)``, the save / load
  state pre-hooks that write ``unet/`` with save_pretrained and read it back;
- the step under ``accelerator.accumulate(unet)``: latents = vae.encode(...).latent_dist.sample() *
  vae.config.scaling_factor, noise = randn_like, timesteps ~ randint(0, num_train_timesteps), add_noise,
  encode_prompt (no attention mask: --text_encoder_use_attention_mask is off), target by prediction_type,
  model_pred / target chunked in two along the batch, instance MSE + prior_loss_weight * prior MSE,
  accelerator.backward, clip_grad_norm_ when sync_gradients, optimizer.step, lr_scheduler.step,
  zero_grad(set_to_none=False); checkpointing by ``accelerator.save_state(output_dir/checkpoint-<global_step>)``
  and ``--resume_from_checkpoint latest`` (the newest checkpoint-* by step number, accelerator.load_state);
- the end of training: ``DiffusionPipeline.from_pretrained(pretrained, unet=unwrap(unet), text_encoder=...)``
  with its scheduler rebuilt ``from_config`` (no learned variance here), the pipeline the README then samples
  with (guidance_scale 7.5).

Shrunk: the "pretrained" SD-1.x directory is written offline by :func:`write_pretrained` from configs (the
pattern of the diffusers_t2i project, copied: a small CLIP BPE vocabulary, a 1-layer CLIP text encoder, an
8/16-channel VAE whose scaling_factor is calibrated to its latents, a 16/32-channel UNet), saved with
``StableDiffusionPipeline.save_pretrained`` and read back as the script reads a hub model. 512 px -> 16 px,
77 tokens -> 12; 5 photos of a dog -> 4 drawn 24 x 20 "sks dog" images; num_class_images 200 -> 4, placed in
class_data_dir beforehand as drawn dogs of other coats (the README allows existing class images; the script's
generation block runs and finds nothing to add: generating them with the pipeline's 50 default steps costs
~10 s here); max_train_steps 800 as the README (the checks run
a few steps). Hyper-parameters are the README command's: train_batch_size 1, lr 5e-6, constant, warmup 0,
prior_loss_weight 1.0; mixed precision "no" (CPU), no --seed (as the README), no --push_to_hub (no network),
no validation_prompt (the README sets none: the script never samples during training).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

SIZE = 16
WORDS = ["a", "photo", "of", "sks", "dog"]


def default_args(pretrained: str, output_dir: str, instance_dir: str, class_dir: str, **overrides):
    args = argparse.Namespace(
        pretrained_model_name_or_path=pretrained,
        revision=None,
        variant=None,
        tokenizer_name=None,
        instance_data_dir=instance_dir,
        class_data_dir=class_dir,
        instance_prompt="a photo of sks dog",
        class_prompt="a photo of dog",
        with_prior_preservation=True,
        prior_loss_weight=1.0,
        num_class_images=4,  # README: 200
        output_dir=output_dir,
        seed=None,
        resolution=SIZE,  # README: 512
        center_crop=False,
        train_text_encoder=False,
        train_batch_size=1,
        sample_batch_size=4,
        num_train_epochs=1,
        max_train_steps=800,
        checkpointing_steps=500,
        checkpoints_total_limit=None,
        resume_from_checkpoint=None,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        learning_rate=5e-6,
        scale_lr=False,
        lr_scheduler="constant",
        lr_warmup_steps=0,
        lr_num_cycles=1,
        lr_power=1.0,
        use_8bit_adam=False,
        dataloader_num_workers=0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_weight_decay=1e-2,
        adam_epsilon=1e-08,
        max_grad_norm=1.0,
        push_to_hub=False,  # README: --push_to_hub (no network here)
        mixed_precision="no",
        prior_generation_precision=None,
        set_grads_to_none=False,
        offset_noise=False,
        snr_gamma=None,
        pre_compute_text_embeddings=False,
        tokenizer_max_length=None,
        text_encoder_use_attention_mask=False,
        class_labels_conditioning=None,
        validation_prompt=None,
    )
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


# ---------------------------------------------------------------------------------------------------
# the "pretrained" Stable Diffusion 1.x directory and the instance photos, written from configs / drawn


def _clip_vocab(directory: str) -> None:
    """vocab.json / merges.txt of a byte-level CLIP BPE: the 256 byte symbols (alone and with </w>) and merges
    that make each prompt word one token."""
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


def draw_dog(k: int, width: int = 24, height: int = 20, coat=(140, 90, 40)):
    """One "photo of a dog": a body, head and ears on a grass-and-sky background, placed by k; the sks dog is
    the brown one."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), (110, 170, 230))
    d = ImageDraw.Draw(img)
    d.rectangle([0, height * 2 // 3, width, height], fill=(70, 150, 60))
    x = 4 + 3 * (k % 4)
    dark = tuple(c * 2 // 3 for c in coat)
    d.rectangle([x, 9, x + 10, 14], fill=coat)
    d.ellipse([x + 8, 5, x + 14, 11], fill=coat)
    d.rectangle([x + 9, 3, x + 10, 6], fill=dark)
    d.rectangle([x + 1, 14, x + 2, 17], fill=dark)
    d.rectangle([x + 8, 14, x + 9, 17], fill=dark)
    return img


def write_class_images(directory: str, n: int = 4) -> str:
    """Existing "photos of a dog" placed in class_data_dir (the README: 'You can place existing images in
    class_data_dir, and the training script will generate any additional images'), 16 x 16 as the pipeline
    would generate them: with num_class_images = n, generate_class_images then has nothing to add."""
    os.makedirs(directory, exist_ok=True)
    coats = [(230, 230, 225), (40, 35, 30), (200, 160, 90), (120, 120, 125)]
    for k in range(n):
        draw_dog(k, coat=coats[k % 4]).resize((SIZE, SIZE)).save(os.path.join(directory, f"{k}-existing.jpg"))
    return directory


def write_instance_images(directory: str, n: int = 4) -> str:
    os.makedirs(directory, exist_ok=True)
    for k in range(n):
        draw_dog(k).save(os.path.join(directory, f"dog{k}.png"))
    return directory


def write_pretrained(directory: str) -> str:
    """An SD-1.x-shaped model directory (model_index.json, scheduler/, tokenizer/, text_encoder/, vae/, unet/),
    written by StableDiffusionPipeline.save_pretrained from tiny configs."""
    import tempfile

    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from torchvision import transforms
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab_dir = tempfile.mkdtemp(prefix="rc_db_vocab")
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
    to_pixels = transforms.Compose(
        [
            transforms.Resize(SIZE),
            transforms.CenterCrop(SIZE),
            transforms.ToTensor(),
            transforms.Normalize([0.5], [0.5]),
        ]
    )
    with torch.no_grad():
        latents = vae.encode(torch.stack([to_pixels(draw_dog(k)) for k in range(8)])).latent_dist.sample()
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
    scheduler = PNDMScheduler(  # Stable Diffusion 1.x's scheduler/scheduler_config.json
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        set_alpha_to_one=False,
        skip_prk_steps=True,
        steps_offset=1,
        trained_betas=None,
    )
    StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    ).save_pretrained(directory)
    return directory


# ---------------------------------------------------------------------------------------------------
# data


class DreamBoothDataset(Dataset):
    def __init__(self, instance_data_root, instance_prompt, tokenizer, class_data_root=None, class_prompt=None,
                 class_num=None, size=512, center_crop=False, tokenizer_max_length=None):  # fmt: skip
        from torchvision import transforms

        self.size, self.center_crop, self.tokenizer = size, center_crop, tokenizer
        self.tokenizer_max_length = tokenizer_max_length
        self.instance_images_path = sorted(Path(instance_data_root).iterdir())
        self.num_instance_images = len(self.instance_images_path)
        self.instance_prompt = instance_prompt
        self._length = self.num_instance_images
        if class_data_root is not None:
            self.class_data_root = Path(class_data_root)
            self.class_data_root.mkdir(parents=True, exist_ok=True)
            self.class_images_path = sorted(self.class_data_root.iterdir())
            n = len(self.class_images_path)
            self.num_class_images = min(n, class_num) if class_num is not None else n
            self._length = max(self.num_class_images, self.num_instance_images)
            self.class_prompt = class_prompt
        else:
            self.class_data_root = None
        self.image_transforms = transforms.Compose(
            [
                transforms.Resize(size, interpolation=transforms.InterpolationMode.BILINEAR),
                transforms.CenterCrop(size) if center_crop else transforms.RandomCrop(size),
                transforms.ToTensor(),
                transforms.Normalize([0.5], [0.5]),
            ]
        )

    def __len__(self):
        return self._length

    def __getitem__(self, index):
        from PIL import Image
        from PIL.ImageOps import exif_transpose

        example = {}
        instance_image = exif_transpose(Image.open(self.instance_images_path[index % self.num_instance_images]))
        if not instance_image.mode == "RGB":
            instance_image = instance_image.convert("RGB")
        example["instance_images"] = self.image_transforms(instance_image)
        text_inputs = tokenize_prompt(self.tokenizer, self.instance_prompt, self.tokenizer_max_length)
        example["instance_prompt_ids"] = text_inputs.input_ids
        example["instance_attention_mask"] = text_inputs.attention_mask
        if self.class_data_root:
            class_image = exif_transpose(Image.open(self.class_images_path[index % self.num_class_images]))
            if not class_image.mode == "RGB":
                class_image = class_image.convert("RGB")
            example["class_images"] = self.image_transforms(class_image)
            class_text_inputs = tokenize_prompt(self.tokenizer, self.class_prompt, self.tokenizer_max_length)
            example["class_prompt_ids"] = class_text_inputs.input_ids
            example["class_attention_mask"] = class_text_inputs.attention_mask
        return example


def collate_fn(examples, with_prior_preservation=False):
    has_attention_mask = "instance_attention_mask" in examples[0]
    input_ids = [example["instance_prompt_ids"] for example in examples]
    pixel_values = [example["instance_images"] for example in examples]
    if has_attention_mask:
        attention_mask = [example["instance_attention_mask"] for example in examples]
    if with_prior_preservation:  # class and instance examples in one batch: one forward pass
        input_ids += [example["class_prompt_ids"] for example in examples]
        pixel_values += [example["class_images"] for example in examples]
        if has_attention_mask:
            attention_mask += [example["class_attention_mask"] for example in examples]
    pixel_values = torch.stack(pixel_values).to(memory_format=torch.contiguous_format).float()
    batch = {"input_ids": torch.cat(input_ids, dim=0), "pixel_values": pixel_values}
    if has_attention_mask:
        batch["attention_mask"] = torch.cat(attention_mask, dim=0)
    return batch


class PromptDataset(Dataset):
    def __init__(self, prompt, num_samples):
        self.prompt, self.num_samples = prompt, num_samples

    def __len__(self):
        return self.num_samples

    def __getitem__(self, index):
        return {"prompt": self.prompt, "index": index}


def tokenize_prompt(tokenizer, prompt, tokenizer_max_length=None):
    max_length = tokenizer_max_length if tokenizer_max_length is not None else tokenizer.model_max_length
    return tokenizer(prompt, truncation=True, padding="max_length", max_length=max_length, return_tensors="pt")


def encode_prompt(text_encoder, input_ids, attention_mask, text_encoder_use_attention_mask=None):
    attention_mask = attention_mask.to(text_encoder.device) if text_encoder_use_attention_mask else None
    return text_encoder(input_ids.to(text_encoder.device), attention_mask=attention_mask, return_dict=False)[0]


def generate_class_images(args, accelerator) -> None:
    """main()'s prior-preservation block: fill class_data_dir up to num_class_images with the base model."""
    from diffusers import DiffusionPipeline

    class_images_dir = Path(args.class_data_dir)
    class_images_dir.mkdir(parents=True, exist_ok=True)
    cur_class_images = len(list(class_images_dir.iterdir()))
    if cur_class_images >= args.num_class_images:
        return
    pipeline = DiffusionPipeline.from_pretrained(
        args.pretrained_model_name_or_path, torch_dtype=torch.float32, safety_checker=None, revision=args.revision
    )
    pipeline.set_progress_bar_config(disable=True)
    sample_dataset = PromptDataset(args.class_prompt, args.num_class_images - cur_class_images)
    sample_dataloader = accelerator.prepare(
        torch.utils.data.DataLoader(sample_dataset, batch_size=args.sample_batch_size)
    )
    pipeline.to(accelerator.device)
    for example in sample_dataloader:
        for i, image in enumerate(pipeline(example["prompt"]).images):
            hash_image = hashlib.sha1(image.tobytes()).hexdigest()
            image.save(class_images_dir / f"{example['index'][i] + cur_class_images}-{hash_image}.jpg")
    del pipeline


# ---------------------------------------------------------------------------------------------------
# main(): loading, optimizer, scheduler, accelerator


class Frozen:
    """What main() loads once and never trains: tokenizer, text encoder, VAE, noise scheduler."""

    def __init__(self, args):
        from diffusers import AutoencoderKL, DDPMScheduler
        from transformers import AutoTokenizer, CLIPTextModel

        path = args.pretrained_model_name_or_path
        self.tokenizer = AutoTokenizer.from_pretrained(
            path, subfolder="tokenizer", revision=args.revision, use_fast=False
        )
        self.noise_scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler")
        self.text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder", revision=args.revision)
        self.vae = AutoencoderKL.from_pretrained(path, subfolder="vae", revision=args.revision)
        self.vae.requires_grad_(False)
        self.text_encoder.requires_grad_(False)
        self.weight_dtype = torch.float32


def make_accelerator(args):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    return Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=None,
        project_config=ProjectConfiguration(project_dir=args.output_dir, logging_dir=Path(args.output_dir, "logs")),
    )


def train_dataset(args, tokenizer):
    return DreamBoothDataset(
        instance_data_root=args.instance_data_dir,
        instance_prompt=args.instance_prompt,
        class_data_root=args.class_data_dir if args.with_prior_preservation else None,
        class_prompt=args.class_prompt,
        class_num=args.num_class_images,
        tokenizer=tokenizer,
        size=args.resolution,
        center_crop=args.center_crop,
        tokenizer_max_length=args.tokenizer_max_length,
    )


def make_training(args, frozen, dataset):
    """main() from the UNet loading to accelerator.prepare: fresh objects on every call."""
    from diffusers import UNet2DConditionModel
    from diffusers.optimization import get_scheduler

    accelerator = make_accelerator(args)
    path = args.pretrained_model_name_or_path
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet", revision=args.revision)

    def save_model_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            for model in models:
                model.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()  # so that the model is not saved again

    def load_model_hook(models, input_dir):
        while len(models) > 0:
            model = models.pop()
            load_model = UNet2DConditionModel.from_pretrained(input_dir, subfolder="unet")
            model.register_to_config(**load_model.config)
            model.load_state_dict(load_model.state_dict())
            del load_model

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)

    learning_rate = args.learning_rate
    if args.scale_lr:
        learning_rate *= args.gradient_accumulation_steps * args.train_batch_size * accelerator.num_processes
    optimizer = torch.optim.AdamW(
        unet.parameters(),
        lr=learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        weight_decay=args.adam_weight_decay,
        eps=args.adam_epsilon,
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.train_batch_size,
        shuffle=True,
        collate_fn=lambda examples: collate_fn(examples, args.with_prior_preservation),
        num_workers=args.dataloader_num_workers,
    )
    num_warmup_steps_for_scheduler = args.lr_warmup_steps * accelerator.num_processes
    if args.max_train_steps is None:
        len_after_sharding = math.ceil(len(loader) / accelerator.num_processes)
        per_epoch = math.ceil(len_after_sharding / args.gradient_accumulation_steps)
        num_training_steps_for_scheduler = args.num_train_epochs * accelerator.num_processes * per_epoch
    else:
        num_training_steps_for_scheduler = args.max_train_steps * accelerator.num_processes
    lr_scheduler = get_scheduler(
        args.lr_scheduler,
        optimizer=optimizer,
        num_warmup_steps=num_warmup_steps_for_scheduler,
        num_training_steps=num_training_steps_for_scheduler,
        num_cycles=args.lr_num_cycles,
        power=args.lr_power,
    )
    unet, optimizer, loader, lr_scheduler = accelerator.prepare(unet, optimizer, loader, lr_scheduler)
    frozen.vae.to(accelerator.device, dtype=frozen.weight_dtype)
    frozen.text_encoder.to(accelerator.device, dtype=frozen.weight_dtype)
    unet.train()  # the epoch loop's unet.train()
    return {
        "model": unet,
        "optimizer": optimizer,
        "lr_scheduler": lr_scheduler,
        "accelerator": accelerator,
        "train_dataloader": loader,
        "args": args,
    }


# ---------------------------------------------------------------------------------------------------
# the training step


def training_inputs(args, frozen, batch):
    """The step's body up to the UNet call."""
    vae, noise_scheduler = frozen.vae, frozen.noise_scheduler
    model_input = vae.encode(batch["pixel_values"].to(dtype=frozen.weight_dtype)).latent_dist.sample()
    model_input = model_input * vae.config.scaling_factor
    if args.offset_noise:
        noise = torch.randn_like(model_input) + 0.1 * torch.randn(
            model_input.shape[0], model_input.shape[1], 1, 1, device=model_input.device
        )
    else:
        noise = torch.randn_like(model_input)
    bsz = model_input.shape[0]
    timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,), device=model_input.device)
    timesteps = timesteps.long()
    noisy_model_input = noise_scheduler.add_noise(model_input, noise, timesteps)
    encoder_hidden_states = encode_prompt(
        frozen.text_encoder, batch["input_ids"], batch["attention_mask"], args.text_encoder_use_attention_mask
    )
    if noise_scheduler.config.prediction_type == "epsilon":
        target = noise
    elif noise_scheduler.config.prediction_type == "v_prediction":
        target = noise_scheduler.get_velocity(model_input, noise, timesteps)
    else:
        raise ValueError(f"Unknown prediction type {noise_scheduler.config.prediction_type}")
    return {
        "latents": model_input,
        "noise": noise,
        "timesteps": timesteps,
        "noisy_latents": noisy_model_input,
        "encoder_hidden_states": encoder_hidden_states,
        "target": target,
    }


def loss_of(args, frozen, unet, x):
    from diffusers.training_utils import compute_snr

    model_pred = unet(x["noisy_latents"], x["timesteps"], x["encoder_hidden_states"], return_dict=False)[0]
    target, timesteps = x["target"], x["timesteps"]
    if args.with_prior_preservation:  # the instance half, then the class half
        model_pred, model_pred_prior = torch.chunk(model_pred, 2, dim=0)
        target, target_prior = torch.chunk(target, 2, dim=0)
        prior_loss = F.mse_loss(model_pred_prior.float(), target_prior.float(), reduction="mean")
    if args.snr_gamma is None:
        loss = F.mse_loss(model_pred.float(), target.float(), reduction="mean")
    else:
        noise_scheduler = frozen.noise_scheduler
        snr = compute_snr(noise_scheduler, timesteps)
        divisor = snr + 1 if noise_scheduler.config.prediction_type == "v_prediction" else snr
        weights = torch.stack([snr, args.snr_gamma * torch.ones_like(timesteps)], dim=1).min(dim=1)[0] / divisor
        loss = F.mse_loss(model_pred.float(), target.float(), reduction="none")
        loss = (loss.mean(dim=list(range(1, len(loss.shape)))) * weights).mean()
    if args.with_prior_preservation:
        loss = loss + args.prior_loss_weight * prior_loss
    return loss


def train_step(args, frozen, state, batch):
    """One iteration of the inner loop (``for step, batch in enumerate(train_dataloader)``)."""
    accelerator, unet, optimizer, lr_scheduler = (
        state["accelerator"],
        state["model"],
        state["optimizer"],
        state["lr_scheduler"],
    )
    with accelerator.accumulate(unet):
        loss = loss_of(args, frozen, unet, training_inputs(args, frozen, batch))
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(unet.parameters(), args.max_grad_norm)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad(set_to_none=args.set_grads_to_none)
    if accelerator.sync_gradients:
        state["global_step"] = state.get("global_step", 0) + 1
    return loss


# ---------------------------------------------------------------------------------------------------
# the end of training: the pipeline that is saved and sampled from


def final_pipeline(args, frozen, accelerator, unet):
    from diffusers import DiffusionPipeline

    pipeline = DiffusionPipeline.from_pretrained(
        args.pretrained_model_name_or_path,
        unet=accelerator.unwrap_model(unet),
        text_encoder=accelerator.unwrap_model(frozen.text_encoder),
        revision=args.revision,
        variant=args.variant,
    )
    scheduler_args = {}
    if "variance_type" in pipeline.scheduler.config:
        variance_type = pipeline.scheduler.config.variance_type
        scheduler_args["variance_type"] = (
            "fixed_small" if variance_type in ["learned", "learned_range"] else variance_type
        )
    pipeline.scheduler = pipeline.scheduler.from_config(pipeline.scheduler.config, **scheduler_args)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline
