"""The same text-to-image project with four silent bugs pytest-dlcheck catches — it trains, the loss
falls, and the samples are bad:
- the latents are never multiplied by vae.config.scaling_factor (DF3);
- the sampler is a fresh DDIMScheduler(): linear betas and epsilon, for a model trained with SD's
  scaled_linear betas and v_prediction (DF4);
- no caption is ever dropped, so classifier-free guidance has no unconditional model (DF5);
- the EMA is updated every step but validation samples the raw weights (DF2)."""

import pytest
import tinysd


@pytest.fixture(scope="session")
def project():
    import torch
    from diffusers import DDIMScheduler, DDPMScheduler, UNet2DConditionModel
    from diffusers.training_utils import EMAModel

    tok = tinysd.build_tokenizer()
    text_encoder, vae, unet = tinysd.build_text_encoder(tok), tinysd.build_vae(), tinysd.build_unet()
    noise_scheduler = DDPMScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        prediction_type="v_prediction",
        clip_sample=False,
    )
    sampler = DDIMScheduler(steps_offset=1)  # BUG (DF4): its own defaults, not noise_scheduler's config
    ema = EMAModel(
        unet.parameters(), decay=0.999, use_ema_warmup=True, model_cls=UNet2DConditionModel, model_config=unet.config
    )
    data = tinysd.dataset()
    collate = tinysd.collate_fn(tok, proportion_empty_prompts=0.0)  # BUG (DF5): no caption dropout

    def training_inputs(batch):
        latents = vae.encode(batch["pixel_values"]).latent_dist.sample()  # BUG (DF3): no scaling_factor
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (latents.shape[0],))
        noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
        encoder_hidden_states = text_encoder(batch["input_ids"])[0]
        target = noise_scheduler.get_velocity(latents, noise, timesteps)
        return {
            "latents": latents,
            "noise": noise,
            "timesteps": timesteps,
            "noisy_latents": noisy_latents,
            "encoder_hidden_states": encoder_hidden_states,
            "target": target,
        }

    def condition(batch):  # the conditioning path alone (cheap: DF5 draws it 300 times)
        return text_encoder(batch["input_ids"])[0]

    pipe = tinysd.pipeline(vae, text_encoder, tok, unet, sampler)

    def sample_images():
        return tinysd.log_validation(pipe)  # BUG (DF2): the EMA is never copied in

    tinysd.train(unet, ema, training_inputs, [collate(data[:4]), collate(data[4:8])])
    return dict(
        pipeline=pipe,
        noise_scheduler=noise_scheduler,
        training_inputs=training_inputs,
        ema=ema,
        sample_images=sample_images,
        dataset=data,
        collator=collate,
        condition=condition,
    )


# the roles pytest-dlcheck reads, one dlcheck_<role> fixture each over the session's project (written out
# by hand they are eight two-line fixtures); the VAE, UNet, tokenizer, text encoder and sampler come from
# the pipeline
globals().update(
    tinysd.role_fixtures(
        "pipeline", "noise_scheduler", "training_inputs", "ema", "sample_images", "dataset", "collator", "condition"
    )
)
