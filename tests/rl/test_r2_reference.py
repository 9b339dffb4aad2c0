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

SAC = """
    import pytest
    from stable_baselines3 import SAC

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        return SAC("MlpPolicy", "Pendulum-v1", buffer_size=1000, learning_starts=10, device="cpu", seed=0,
                   policy_kwargs=dict(net_arch=[16]))
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
        "-rA",
    )
    assert run.passed("deepcopy", "R2").startswith("dlcheck_ref_model (LlamaForCausalLM, 20 parameter tensors)")
    run.run.fnmatch(
        [
            "dlcheck_ref_model (LlamaForCausalLM, 20 parameter tensors) shares no storage with the policy's 20 "
            "trainable parameter tensors",
            "none of its parameters is in the AdamW's 1 param group(s)",
            "none carries a non-zero .grad; KL coefficient 0.04",
        ]
    )
    assert run.passed("grpo_beta", "R2").startswith("dlcheck_ref_model (LlamaForCausalLM, 20 parameter tensors)")
    # the frozen layers are shared on purpose: they never move
    run.run.fnmatch(
        [
            "dlcheck_ref_model (LlamaForCausalLM, 20 parameter tensors) shares no storage with the policy's 2 "
            "trainable parameter tensors; 18 share a frozen policy tensor (allowed: it never moves)",
            "no dlcheck_optimizer: whether the optimizer holds reference parameters is not judged",
            "none carries a non-zero .grad; no dlcheck_kl_coef: the coefficient is not judged",
        ]
    )
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
    assert (
        "not applicable: no reference model and the KL coefficient is 0 (GRPO's default beta=0.0): the loss has no "
        "KL term" in run.skips["grpo_no_kl"]
    )
    assert "Traceback" not in run.text


CLEANRL = """
    import pytest, tiny_rl
    from pytest_dlcheck.rl import advantage_fn

    @pytest.fixture(scope="session")
    def dlcheck_env():
        return tiny_rl.make_envs

    @pytest.fixture(scope="session")
    def dlcheck_advantage_fn():
        return advantage_fn(tiny_rl.compute_gae, arrays="torch")
"""

SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
        args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
"""


def test_pipelines_without_a_kl_reference_are_not_applicable(project):
    """PPO (SB3, or CleanRL-style without a dlcheck_model), SAC and supervised fine-tuning have no KL reference:
    R2 says so instead of asking for dlcheck_model or dlcheck_ref_model."""
    run = run_configs(
        project,
        {
            "sb3_ppo": "import pytest, tiny_rl\n\n@pytest.fixture\ndef dlcheck_algorithm():\n    return tiny_rl.sb3_ppo()\n",
            "sb3_sac": SAC,
            "cleanrl": CLEANRL,
            "sft": SFT,
            # a hand-written KL penalty whose reference the user did not hand over: the fixture makes R2 run
            "kl_without_reference": "import pytest, tiny\n\n@pytest.fixture\ndef dlcheck_model():\n"
            "    return tiny.llama(tiny.tokenizer())\n\n@pytest.fixture\ndef dlcheck_kl_coef():\n    return 0.1\n",
        },
        "--dlcheck=R2",
    )
    for d in ("sb3_ppo", "sb3_sac", "cleanrl", "sft", "kl_without_reference"):
        run.assert_outcome(d, "R2", "skipped")
    assert (
        "not applicable: PPO (Stable-Baselines3) has no reference model: PPO/A2C anchor each update to the rollout "
        "policy (clipping, target_kl), not to a frozen reference" in run.skips["sb3_ppo"]
    )
    assert (
        "not applicable: SAC (Stable-Baselines3) has no reference model: it learns from TD targets"
        in run.skips["sb3_sac"]
    )
    assert (
        "not applicable: a classic RL pipeline (dlcheck_env, dlcheck_advantage_fn) with no dlcheck_ref_model or "
        "dlcheck_kl_coef" in run.skips["cleanrl"]
    )
    assert "not applicable: dlcheck_trainer is a SFTTrainer: it trains with no reference model" in run.skips["sft"]
    assert "missing role: define fixture dlcheck_ref_model (or dlcheck_trainer" in run.skips["kl_without_reference"]
    assert "dlcheck_model" not in "".join(run.skips[d] for d in ("sb3_ppo", "cleanrl"))
