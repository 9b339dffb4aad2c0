"""A prior over image embeddings (diffusers' kandinsky2_2 train_text_to_image_prior.py: a PriorTransformer trained
with DDPMScheduler(prediction_type='sample'), sampled with UnCLIPScheduler(clip_sample_range=10); found blind, set
15) denoises vectors, not pixels: DF3 is not applicable saying so (it had said "it denoises pixels"), and DF6 judges
the sampler's clamp against the training vectors (it had passed "clamps the predicted x0 to ±1, which fits [-1, 1]
images"). Buggy twin: a ±1 clamp on unit-variance vectors fails."""

CONFTEST = """
import pytest, torch
from torch.utils.data import DataLoader
from diffusers import DDPMScheduler, PriorTransformer, UnCLIPScheduler

DIM = 8


def prior():
    torch.manual_seed(0)
    return PriorTransformer(num_attention_heads=2, attention_head_dim=4, num_layers=1, embedding_dim=DIM,
                            num_embeddings=4, additional_embeddings=4)


SCHED = DDPMScheduler(beta_schedule="squaredcos_cap_v2", prediction_type="sample")


@pytest.fixture(scope="session")
def dlcheck_model():
    return prior()


@pytest.fixture(scope="session")
def dlcheck_noise_scheduler():
    return SCHED


@pytest.fixture(scope="session")
def dlcheck_inference_scheduler():
    return UnCLIPScheduler(variance_type="fixed_small_log", prediction_type="sample", clip_sample=True,
                           clip_sample_range={clip})


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    g = torch.Generator().manual_seed(0)
    # normalised CLIP image embeddings ((e - clip_mean) / clip_std): unit variance
    rows = [{{"image_embeds": e, "text_embeds": t}} for e, t in zip(torch.randn(16, DIM, generator=g),
                                                                    torch.randn(16, DIM, generator=g))]
    return DataLoader(rows, batch_size=4)


@pytest.fixture(scope="session")
def dlcheck_training_inputs():
    def fn(batch):
        latents = batch["image_embeds"]
        noise = torch.randn_like(latents)
        t = torch.randint(0, SCHED.config.num_train_timesteps, (len(latents),))
        return {{"latents": latents, "noise": noise, "timesteps": t,
                "noisy_latents": SCHED.add_noise(latents, noise, t), "target": latents}}
    return fn
"""


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_prior_over_embeddings_is_judged_as_vectors(project):
    project.conftest(CONFTEST.format(clip=10.0))
    run = project.run("--dlcheck=DF3,DF6", "-rA")
    text = _flat(run.text)
    run.assert_outcome("DF3", "skipped")
    run.assert_outcome("DF6", "passed")
    assert "the denoiser PriorTransformer denoises vectors of embedding_dim=8 (image embeddings), not images" in text
    assert "clip_sample clamps the predicted x0 to ±10; the training vectors (dlcheck_training_inputs) have std" in text
    assert "denoises pixels" not in text and "fits [-1, 1] images" not in text


def test_a_clamp_narrower_than_the_vectors_fails(project):
    project.conftest(CONFTEST.format(clip=1.0))
    run = project.run("--dlcheck=DF6")
    run.assert_outcome("DF6", "failed")
    text = _flat(run.section("DF6"))
    assert "clip_sample=True clamps every predicted x0 to ±1" in text
    assert "of their values lie outside ±1" in text
    assert "the clamp is narrower than the vectors the denoiser is trained to produce" in text
