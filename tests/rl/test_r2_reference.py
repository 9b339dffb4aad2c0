"""R2: the KL reference is a separate, frozen model and the KL coefficient is on."""

import tiny_rl  # noqa: F401  (gymnasium, SB3 imported once, before the in-process runs)
from rl_project import run_configs

HAND = """
    import copy, pytest, tiny, torch

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tiny.llama(tiny.tokenizer())

    @pytest.fixture(scope="session")
    def dlcheck_ref_model(dlcheck_model):
        return {ref}

    @pytest.fixture(scope="session")
    def dlcheck_kl_coef():
        return {kl}

    @pytest.fixture(scope="session")
    def dlcheck_optimizer(dlcheck_model, dlcheck_ref_model):
        return torch.optim.AdamW({params}, lr=1e-5)
"""

FROZEN = "copy.deepcopy(dlcheck_model).eval().requires_grad_(False)"
POLICY_ONLY = "dlcheck_model.parameters()"

FROZEN_BODY_SHARED = """
    import copy, pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_model():
        model = tiny.llama(tiny.tokenizer())
        model.model.layers.requires_grad_(False)   # only embeddings / head train: the layers never move
        return model

    @pytest.fixture(scope="session")
    def dlcheck_ref_model(dlcheck_model):
        ref = copy.deepcopy(dlcheck_model).requires_grad_(False)
        ref.model.layers = dlcheck_model.model.layers   # share the frozen layers to save memory
        return ref
"""

GRPO = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        return {make}
"""


def test_reference_models(project):
    run = run_configs(
        project,
        {
            "deepcopy": HAND.format(ref=FROZEN, kl=0.04, params=POLICY_ONLY),
            "shallow_copy": HAND.format(ref="copy.copy(dlcheck_model)", kl=0.04, params=POLICY_ONLY),
            "in_optimizer": HAND.format(
                ref="copy.deepcopy(dlcheck_model)",
                kl=0.04,
                params="[*dlcheck_model.parameters(), *dlcheck_ref_model.parameters()]",
            ),
            "kl_off": HAND.format(ref=FROZEN, kl=0.0, params=POLICY_ONLY),
            "frozen_body_shared": FROZEN_BODY_SHARED,
            "grpo_beta": GRPO.format(make='tiny_rl.grpo_trainer_with_reference(tmp_path_factory.mktemp("g"))'),
            "grpo_no_kl": GRPO.format(
                make='tiny_rl.grpo_trainer(tmp_path_factory.mktemp("g"), [tiny_rl.reward_brevity])'
            ),
        },
        "--dlcheck=R2",
    )
    run.assert_outcome("deepcopy", "R2", "passed")
    run.assert_outcome("grpo_beta", "R2", "passed")
    run.assert_outcome("frozen_body_shared", "R2", "passed")

    run.assert_outcome("shallow_copy", "R2", "failed")
    text = run.flat("shallow_copy", "R2")
    assert (
        "dlcheck_ref_model is a LlamaForCausalLM that shares tensors: 20 of 20 reference parameter tensors have "
        "the same storage as a trainable policy parameter"
    ) in text
    assert "reference model.embed_tokens.weight is policy model.embed_tokens.weight" in text
    assert "KL(policy || reference) stays 0" in text and "copy.deepcopy(model)" in text

    run.assert_outcome("in_optimizer", "R2", "failed")
    assert "reference parameters are in the optimizer's param groups" in run.flat("in_optimizer", "R2")

    run.assert_outcome("kl_off", "R2", "failed")
    assert "the KL coefficient is 0" in run.flat("kl_off", "R2")

    run.assert_outcome("grpo_no_kl", "R2", "skipped")
    assert "KL coefficient is 0 (GRPO's default beta=0.0)" in run.skips["grpo_no_kl"]
    assert "Traceback" not in run.text
