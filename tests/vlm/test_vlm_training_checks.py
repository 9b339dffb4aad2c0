"""The train and ckpt checks on a real LLaVA trainer. T3 exempts the vision layers above
vision_feature_layer (they run but feed nothing, by design) and still catches a detached projector. C1
catches transformers 5's resume that restores no LLaVA weight — save_pretrained writes the original
(converted-back) names and Trainer._load_from_checkpoint loads them with strict=False — and passes a
trainer that loads its checkpoints through from_pretrained."""

import tinyvlm  # noqa: F401  (the libraries, imported outside the in-process runs)
from helpers import flat

TRAINER = """
    import pytest, tiny, tinyvlm
    from trl import SFTConfig, SFTTrainer

    class ResumableSFTTrainer(SFTTrainer):
        def _load_from_checkpoint(self, checkpoint, model=None):
            model = model or self.model
            model.load_state_dict(type(model).from_pretrained(checkpoint, dtype=model.dtype).state_dict())

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        proc = tinyvlm.processor()
        model = tinyvlm.llava(proc.tokenizer)
        if {detach}:  # the projector's output cut from the graph: projector and vision tower train for nothing
            model.model.multi_modal_projector.register_forward_hook(lambda module, args, out: out.detach())
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, max_length=None)
        return {cls}(model=model, args=args, processing_class=proc, train_dataset=tinyvlm.dataset(8))
"""


def test_resume_of_a_llava_trainer_restores_no_weight(project):
    project.conftest(TRAINER.format(cls="SFTTrainer", detach=False))
    run = project.run("--dlcheck=C1,T3")
    run.assert_outcome("C1", "failed")
    run.assert_outcome("T3", "passed")  # the vision layer above vision_feature_layer=-2 is unused by design
    text = flat(run.section("C1"))
    assert "putting back model from the uninterrupted run after the load makes the resumed run identical" in text
    assert (
        "64 of the 64 tensor names in checkpoint-2's weights file are not the model's: e.g. "
        "'language_model.lm_head.weight' where the model has 'lm_head.weight'"
    ) in text
    assert "load_state_dict(strict=False), which skips every name it does not know" in text
    assert "def _load_from_checkpoint(self, checkpoint, model=None)" in text


def test_resume_through_from_pretrained_passes(project):
    project.conftest(TRAINER.format(cls="ResumableSFTTrainer", detach=False))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "passed")


def test_a_detached_projector_still_fails_t3(project):
    project.conftest(TRAINER.format(cls="ResumableSFTTrainer", detach=True))
    run = project.run("--dlcheck=T3")
    run.assert_outcome("T3", "failed")
    text = flat(run.section("T3"))
    # the projector (4 tensors) and everything upstream of it: embeddings (3), pre-norm (2), the used vision
    # layer 0 (16); layer 1 and the post-norm, unused by design (vision_feature_layer=-2), are not counted
    assert "25 of 64 trainable parameter tensors get no gradient from the loss on batch 0" in text
    assert "module(s) that run but pass no gradient back: model.multi_modal_projector.linear_1" in text
    assert "the last of them to run is model.multi_modal_projector.linear_2: the graph is cut at its output" in text
    assert "model.vision_tower.encoder.layers.0.self_attn.k_proj.weight" in text
