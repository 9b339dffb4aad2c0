"""Tiny real diffusers components built offline from configs (RECIPES.md §6): a small text-to-image
training setup — images + captions, a real tokenizer (tests/tiny.py), CLIPTextModel, AutoencoderKL,
UNet2DConditionModel, DDPM/DDIM schedulers, EMAModel, a StableDiffusionPipeline — whose knobs introduce
one real bug at a time. Imported by the tests and by the throwaway user projects they write."""

from __future__ import annotations

import functools
import random
import textwrap
from types import SimpleNamespace

import tiny  # noqa: F401  (offline environment first)
from helpers import flat  # noqa: F401  (the diffusion tests use tinydiff.flat)

# pytester's in-process runs put sys.modules back afterwards (tests/conftest.py explains): import here (once per process) every lazily-loaded diffusers/transformers module
# the tiny setup uses: imported inside a run, they would be imported again in every run (seconds each).


def _import_once() -> None:
    import torch  # noqa: F401
    from diffusers import (  # noqa: F401  # noqa: F401
        AutoencoderKL,
        DDIMScheduler,
        DDPMPipeline,
        DDPMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
        UNet2DModel,
    )
    from diffusers.training_utils import EMAModel  # noqa: F401
    from transformers import CLIPTextConfig, CLIPTextModel  # noqa: F401


_import_once()

SIZE = 16  # image side in pixels; the VAE halves it, so latents are 4×8×8
SD1_FACTOR = 0.18215
CAPTIONS = [
    "a red square",
    "a blue circle",
    "the quick brown fox",
    "hello world",
    "a b c d e f",
    "once upon a time",
    "Name a colour.",
    "Blue is a colour.",
    "the lazy dog",
    "what is 2+2?",
    "a tiny model",
    "how are you today?",
]


def images(n: int = 12, seed: int = 0):
    """Smooth synthetic RGB images in [-1, 1] (low-frequency noise upsampled), like normalized photos."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 4, 4, generator=g) * 2 - 1
    return F.interpolate(low, size=(SIZE, SIZE), mode="bilinear", align_corners=False).clamp(-1, 1)


def tokenizer():
    tok = tiny.tokenizer()
    tok.model_max_length = 16
    return tok


def text_encoder(tok, seed: int = 0):
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    cfg = CLIPTextConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return CLIPTextModel(cfg).eval()


def vae(stats: str = "sd", scaling_factor: float | None = None, seed: int = 0):
    """A tiny AutoencoderKL. ``stats="sd"``: its latents have std 1/0.18215 ≈ 5.49 like Stable Diffusion's
    VAE (posterior std ~0, means rescaled), so SD's factor fits it; ``stats="unit"``: a freshly initialised
    VAE whose sampled latents have std ≈ 1.06 (SD's factor does not fit it)."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    kw = {} if scaling_factor is None else {"scaling_factor": scaling_factor}
    v = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        sample_size=SIZE,
        **kw,
    ).eval()
    if stats == "sd":
        with torch.no_grad():
            q = v.quant_conv
            q.weight[4:] = 0
            q.bias[4:] = -30.0  # log-variance: posterior std e^-15
            mean = v.encode(images()).latent_dist.mean
            scale = (1 / SD1_FACTOR) / float(mean.std())
            q.weight[:4] *= scale
            q.bias[:4] *= scale
    return v


def unet(seed: int = 0):
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=SIZE // 2,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        norm_num_groups=8,
        cross_attention_dim=16,
        attention_head_dim=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )


def noise_scheduler(**kw):
    from diffusers import DDPMScheduler

    base = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False)
    base.update(kw)
    return DDPMScheduler(**base)


def dataset(n: int = 12):
    imgs = images(n)
    return [{"pixel_values": imgs[i], "caption": CAPTIONS[i % len(CAPTIONS)]} for i in range(n)]


def collator(tok, p_empty: float = 0.1):
    """Caption dropout in the collator (diffusers' proportion_empty_prompts), then tokenization."""
    import torch

    def collate(examples):
        caps = ["" if random.random() < p_empty else e["caption"] for e in examples]
        ids = tok(
            caps, padding="max_length", max_length=tok.model_max_length, truncation=True, return_tensors="pt"
        ).input_ids
        return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]), "input_ids": ids}

    return collate


def training_inputs(
    vae,
    text_encoder,
    sched,
    *,
    factor="config",
    timesteps="uniform",
    noise_scale=1.0,
    noising=None,
    target="config",
    null=None,
    p_null=0.0,
):
    """The body of a diffusers text-to-image training step up to the UNet call, with knobs for its bugs:
    factor None (omitted) or a number (hard-coded); timesteps "fixed" / "narrow"; noise_scale; noising (the
    scheduler add_noise is taken from); target "noise" (hard-coded); null "zeros"/"uncond" with p_null
    (embedding-level dropout)."""
    import torch

    def fn(batch):
        px = batch["pixel_values"]
        lat = vae.encode(px).latent_dist.sample()
        if factor == "config":
            lat = lat * vae.config.scaling_factor
        elif factor is not None:
            lat = lat * factor
        noise = torch.randn_like(lat) * noise_scale
        bsz = lat.shape[0]
        T = sched.config.num_train_timesteps
        if timesteps == "fixed":
            t = torch.full((bsz,), 500, dtype=torch.long)
        elif timesteps == "narrow":
            t = torch.randint(0, 50, (bsz,))
        elif timesteps == "cubic":  # the T2I-Adapter's schedule: every level drawn, the noisy ones more often
            t = ((1 - (torch.rand((bsz,)) ** 3)) * T).long().clamp(0, T - 1)
        else:
            t = torch.randint(0, T, (bsz,))
        noisy = (noising or sched).add_noise(lat, noise, t)
        ehs = text_encoder(batch["input_ids"])[0]
        if null is not None:
            drop = torch.rand(bsz) < p_null
            null_ehs = torch.zeros_like(ehs) if null == "zeros" else empty_embedding(text_encoder).expand_as(ehs)
            ehs = torch.where(drop[:, None, None], null_ehs, ehs)
        pt = sched.config.prediction_type
        if target == "noise" or pt == "epsilon":
            tgt = noise
        elif pt == "v_prediction":
            tgt = sched.get_velocity(lat, noise, t)
        else:
            tgt = lat
        return {
            "latents": lat,
            "noise": noise,
            "timesteps": t,
            "noisy_latents": noisy,
            "encoder_hidden_states": ehs,
            "target": tgt,
        }

    return fn


@functools.cache
def _empty_ids():
    tok = tokenizer()
    return tok([""], padding="max_length", max_length=tok.model_max_length, return_tensors="pt").input_ids


def empty_embedding(text_encoder):
    return text_encoder(_empty_ids())[0]


def train(unet, vae, text_encoder, sched, ema, batch, steps: int = 2):
    """A couple of real optimizer steps (and EMA updates), so raw weights and EMA differ as mid-training."""
    import torch
    import torch.nn.functional as F

    fn = training_inputs(vae, text_encoder, sched)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    for _ in range(steps):
        with torch.no_grad():
            x = fn(batch)
        pred = unet(x["noisy_latents"], x["timesteps"], x["encoder_hidden_states"]).sample
        F.mse_loss(pred, x["target"]).backward()
        opt.step()
        opt.zero_grad()
        if ema is not None:
            ema.step(unet.parameters())


LAST: list = []  # every setup() of this process, for the tests' leave-no-trace assertions


def setup(
    *,
    vae_stats="sd",
    scaling_factor=None,
    scheduler=None,
    inference=None,
    p_empty=0.1,
    ema_use="store",
    steps=0,
    **inputs_kw,
):
    """Everything a clean small text-to-image training project has, with one knob per bug.

    scheduler: kwargs of the training DDPMScheduler (prediction_type, rescale_betas_zero_snr…).
    inference: kwargs for the DDIM sampler built from the training config (None: from_config as is), or
    the string "defaults" for a DDIMScheduler() with diffusers' defaults, "lcm" for an LCMScheduler from it; the pipeline gets a copy (its
    constructor rewrites clip_sample/steps_offset in place). ema_use: "store" (store/copy_to/sample/
    restore), "never" (samples the raw weights), "no-restore" (copy_to without restore), "unstepped"
    (store/copy_to sampling, but training never calls ema.step). steps: real
    optimizer + EMA steps taken first (mid-training state). The other keywords go to :func:`training_inputs`."""
    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from diffusers.training_utils import EMAModel

    if inputs_kw.get("noising") == "linear":  # noised by another scheduler: DDPM's default linear betas
        inputs_kw["noising"] = noise_scheduler(beta_schedule="linear", beta_start=0.0001, beta_end=0.02)
    elif inputs_kw.get("noising") == "euler":  # EulerDiscreteScheduler.add_noise: x0 + σ·noise (variance-exploding)
        from diffusers import EulerDiscreteScheduler

        inputs_kw["noising"] = EulerDiscreteScheduler.from_config(noise_scheduler(**(scheduler or {})).config)
    tok = tokenizer()
    te = text_encoder(tok)
    v = vae(vae_stats, scaling_factor)
    u = unet()
    sched = noise_scheduler(**(scheduler or {}))
    if inference == "defaults":
        infer = DDIMScheduler(steps_offset=1)
    elif inference == "lcm":  # consistency distillation's sampler (LCM-LoRA): few steps, guidance distilled in
        from diffusers import LCMScheduler

        infer = LCMScheduler.from_config(sched.config)
    else:
        infer = DDIMScheduler.from_config(sched.config, steps_offset=1, **(inference or {}))
    ema = EMAModel(
        u.parameters(), decay=0.999, use_ema_warmup=True, model_cls=UNet2DConditionModel, model_config=u.config
    )
    data = dataset()
    collate = collator(tok, p_empty)
    rng = random.getstate()
    random.seed(0)
    batch = collate(data[:4])
    random.setstate(rng)
    if steps:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            train(u, v, te, sched, None if ema_use == "unstepped" else ema, batch, steps)  # "unstepped": no ema.step
    pipe = StableDiffusionPipeline(
        vae=v,
        text_encoder=te,
        tokenizer=tok,
        unet=u,
        scheduler=type(infer).from_config(infer.config),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)

    def sample():
        return pipe("a red square", num_inference_steps=2, height=SIZE, width=SIZE, output_type="pt").images

    def sample_images():
        if ema_use == "never":
            return sample()
        if ema_use == "no-restore":
            ema.copy_to(u.parameters())
            return sample()
        ema.store(u.parameters())
        ema.copy_to(u.parameters())
        try:
            return sample()
        finally:
            ema.restore(u.parameters())

    def condition(batch):  # the conditioning path alone: the collator's caption dropout, then the encoder
        return te(batch["input_ids"])[0]

    ns = SimpleNamespace(
        tokenizer=tok,
        text_encoder=te,
        vae=v,
        unet=u,
        model=u,
        noise_scheduler=sched,
        inference_scheduler=infer,
        ema=ema,
        dataset=data,
        collator=collate,
        pipeline=pipe,
        sample_images=sample_images,
        condition=condition,
        training_inputs=training_inputs(v, te, sched, **inputs_kw),
    )
    ns.snapshot = snapshot_state(ns)
    LAST.append(ns)
    random.seed(0)  # the user's conftest seeds its run: the statistical checks draw the same way every time
    torch.manual_seed(0)
    return ns


def snapshot_state(ns) -> dict:
    """Everything a check must leave as it found it: weights, EMA, modes, requires_grad, scheduler configs."""
    out = {}
    for name in ("unet", "vae", "text_encoder"):
        module = getattr(ns, name)
        out[name] = {k: v.detach().clone() for k, v in module.state_dict().items()}
        out[name + ".modes"] = [m.training for m in module.modules()]
        out[name + ".grad"] = [p.requires_grad for p in module.parameters()]
    out["ema"] = [t.clone() for t in ns.ema.shadow_params]
    out["ema.attrs"] = (ns.ema.optimization_step, ns.ema.temp_stored_params, ns.ema.cur_decay_value)
    out["schedulers"] = [dict(s.config) for s in (ns.noise_scheduler, ns.inference_scheduler)]
    out["tokenizer"] = (ns.tokenizer.padding_side, ns.tokenizer.model_max_length, ns.tokenizer.pad_token)
    return out


def assert_same_state(before: dict, after: dict) -> None:
    import torch

    for key, value in before.items():
        other = after[key]
        if isinstance(value, dict) and value and isinstance(next(iter(value.values())), torch.Tensor):
            for k in value:
                assert torch.equal(value[k], other[k]), f"{key}.{k} changed"
        elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            assert all(torch.equal(a, b) for a, b in zip(value, other)), f"{key} changed"
        else:
            assert value == other, f"{key} changed: {value!r} -> {other!r}"


CLEAN_ROLES = ("pipeline", "noise_scheduler", "training_inputs", "dataset", "collator", "ema", "sample_images")


def conftest(roles=CLEAN_ROLES, **knobs) -> str:
    """A user conftest.py exposing ``setup(**knobs)``'s objects as dlcheck_<role> fixtures."""
    out = [
        f"""
        import pytest, tinydiff

        @pytest.fixture(scope="session")
        def sd():
            return tinydiff.setup(**{knobs!r})
        """
    ]
    for role in roles:
        out.append(f"""
        @pytest.fixture(scope="session")
        def dlcheck_{role}(sd):
            return sd.{role}
        """)
    return "\n".join(textwrap.dedent(block) for block in out)


# ---- pixel-space, unconditional: diffusers' train_unconditional.py ----------------------------------------


def pixel_unet(seed: int = 0):
    """A tiny UNet2DModel that denoises 3-channel pixels, unconditional (no cross-attention, no class
    embedding), as diffusers' examples/unconditional_image_generation builds it."""
    import torch
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    return UNet2DModel(
        sample_size=SIZE,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(16, 32),
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
    )


def pixel_training_inputs(sched):
    """train_unconditional.py's step up to the UNet call: noise the clean images themselves."""
    import torch

    def fn(batch):
        clean = batch["input"]
        noise = torch.randn_like(clean)
        t = torch.randint(0, sched.config.num_train_timesteps, (clean.shape[0],))
        return {
            "latents": clean,
            "noise": noise,
            "timesteps": t,
            "noisy_latents": sched.add_noise(clean, noise, t),
            "target": noise,
        }

    return fn


def pixel_setup(*, pixels="[-1, 1]"):
    """A clean pixel-space unconditional DDPM training (UNet2DModel + DDPMScheduler + DDPMPipeline, images
    normalised to [-1, 1] as train_unconditional.py does); ``pixels="[0, 1]"`` forgets that Normalize."""
    import torch
    from diffusers import DDPMPipeline, DDPMScheduler

    u = pixel_unet()
    sched = DDPMScheduler(num_train_timesteps=1000)
    imgs = images()
    if pixels == "[0, 1]":
        imgs = (imgs + 1) / 2
    data = [{"input": imgs[i]} for i in range(len(imgs))]

    def collate(examples):
        return {"input": torch.stack([e["input"] for e in examples])}

    pipe = DDPMPipeline(unet=u, scheduler=DDPMScheduler.from_config(sched.config))
    pipe.set_progress_bar_config(disable=True)
    ns = SimpleNamespace(
        unet=u,
        model=u,
        noise_scheduler=sched,
        pipeline=pipe,
        dataset=data,
        collator=collate,
        training_inputs=pixel_training_inputs(sched),
    )
    torch.manual_seed(0)
    return ns


PIXEL_ROLES = ("pipeline", "noise_scheduler", "training_inputs", "dataset", "collator")


def pixel_conftest(roles=PIXEL_ROLES, **knobs) -> str:
    """A user conftest.py exposing ``pixel_setup(**knobs)``'s objects as dlcheck_<role> fixtures."""
    out = [
        f"""
        import pytest, tinydiff

        @pytest.fixture(scope="session")
        def ddpm():
            return tinydiff.pixel_setup(**{knobs!r})
        """
    ]
    for role in roles:
        out.append(f"""
        @pytest.fixture(scope="session")
        def dlcheck_{role}(ddpm):
            return ddpm.{role}
        """)
    return "\n".join(textwrap.dedent(block) for block in out)
