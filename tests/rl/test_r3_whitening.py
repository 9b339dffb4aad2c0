"""R3: PPO minibatch whitening, GRPO group normalisation and reward functions with no signal."""

import numpy as np
import tiny_rl  # noqa: F401  (gymnasium, SB3 imported once, before the in-process runs)
from rl_project import run_configs

from pytest_dlcheck.checks.rl import measure as rl

CLEANRL = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_env():
        return tiny_rl.make_envs

    @pytest.fixture(scope="session")
    def dlcheck_advantage_minibatches():
        return tiny_rl.ppo_minibatches(tiny_rl.Agent(), tiny_rl.make_envs(), norm_adv="{norm}")
"""

SB3 = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        return tiny_rl.sb3_ppo(normalize_advantage={flag})
"""

GROUPS = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_group_advantages():
        return tiny_rl.{name}
"""

GRPO = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        return tiny_rl.grpo_trainer(tmp_path_factory.mktemp("grpo"), [{funcs}])
"""


def test_ppo_minibatch_whitening(project):
    run = run_configs(
        project,
        {
            "cleanrl_minibatch": CLEANRL.format(norm="minibatch"),
            "cleanrl_none": CLEANRL.format(norm="none"),
            "cleanrl_buffer": CLEANRL.format(norm="buffer"),
            "sb3_default": SB3.format(flag=True),
            "sb3_off": SB3.format(flag=False),
            "sb3_a2c": "import pytest\nfrom stable_baselines3 import A2C\n\n@pytest.fixture\ndef dlcheck_algorithm():\n"
            "    return A2C('MlpPolicy', 'CartPole-v1', n_steps=8, device='cpu', seed=0)\n",
        },
        "--dlcheck=R3",
        "-rA",
    )
    assert run.passed("cleanrl_minibatch", "R3").startswith("dlcheck_advantage_minibatches: 4 minibatches of 32")
    assert run.passed("sb3_default", "R3").startswith("PPO.train()'s minibatches of 32 from 256 steps of PPO's")
    run.run.fnmatch(
        [
            "dlcheck_advantage_minibatches: 4 minibatches of 32 advantages, whitened at the level 'minibatch' (R3.level "
            "'any': per minibatch or once over the rollout, both valid recipes): minibatch means within ±*, stds 1.000 "
            "to 1.000; all 128 together: mean *, std 0.988 (tolerance 0.02)",
        ]
    )
    run.run.fnmatch(
        [
            "PPO.train()'s minibatches of 32 from 256 steps of PPO's policy on a copy of its env, "
            "normalize_advantage=True: 8 minibatches of 32 advantages, whitened at the level 'minibatch' as the "
            "recipe says ('minibatch'): *",
        ]
    )

    run.assert_outcome("cleanrl_none", "R3", "failed")
    text = run.flat("cleanrl_none", "R3")
    assert "advantages whitened at the level 'none', the recipe whitens them (R3.level 'any')" in text
    assert "minibatch 0: 32 advantages, mean" in text and "all 4 minibatches together: 128 advantages" in text
    assert "reach the loss unnormalised" in text and "mb_adv.std() + 1e-8" in text

    # once over the rollout is a valid recipe (SpinningUp, CleanRL's PPG: blind set 11's false alarm): it passes by
    # default, saying the level; a recipe that says per minibatch (R3.level) still fails it (the test below)
    assert "whitened at the level 'buffer'" in run.passed("cleanrl_buffer", "R3")

    run.assert_outcome("sb3_off", "R3", "failed")
    text = run.flat("sb3_off", "R3")
    assert (
        "PPO.train()'s minibatches of 32 from 256 steps of PPO's policy on a copy of its env, normalize_advantage=False"
        in text
    )
    assert "normalize_advantage=True" in text

    # A2C's recipe does not whiten: nothing to hold it to
    run.assert_outcome("sb3_a2c", "R3", "skipped")
    assert "not applicable: A2C's recipe does not whiten advantages (normalize_advantage=False)" in run.skips["sb3_a2c"]


OFF_POLICY = """
    import pytest
    from stable_baselines3 import {algo}

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        return {algo}("MlpPolicy", "{env}", buffer_size=1000, learning_starts=10, device="cpu", seed=0,
                      policy_kwargs=dict(net_arch=[16]))
"""


def test_a_recipe_that_whitens_per_minibatch_fails_whitening_over_the_rollout(project):
    project.conftest(CLEANRL.format(norm="buffer"))
    run = project.run("--dlcheck=R3", "--dlcheck-set", "R3.level=minibatch")
    run.assert_outcome("R3", "failed")
    text = " ".join(run.text.split())
    assert "whitened at the level 'buffer', the recipe says 'minibatch'" in text
    assert "whitened once over the whole rollout" in text


def test_off_policy_algorithms_and_supervised_trainers_are_not_applicable(project):
    """SAC and DQN learn from TD targets, an SFTTrainer from labels: no advantages, no reward groups. R3 says so
    instead of asking for dlcheck_algorithm, which the user already defined."""
    run = run_configs(
        project,
        {
            "sac": OFF_POLICY.format(algo="SAC", env="Pendulum-v1"),
            "dqn": OFF_POLICY.format(algo="DQN", env="CartPole-v1"),
            "sft": """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
        args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
""",
            # a hand-written off-policy loop (CleanRL's sac/ddpg/dqn) hands over its TD target, no advantages
            "cleanrl_td": """
    import pytest
    from pytest_dlcheck.rl import td_target_fn

    @pytest.fixture(scope="session")
    def dlcheck_td_target_fn():
        def td_target(rewards, terminations, next_values, gamma):
            return rewards + gamma * next_values * (1 - terminations)
        return td_target_fn(td_target, arrays="torch")
""",
            # the same loop with a GAE function too is on-policy: its minibatch advantages are still asked for
            "cleanrl_gae": """
    import pytest, torch
    from pytest_dlcheck.rl import advantage_fn, td_target_fn

    @pytest.fixture(scope="session")
    def dlcheck_td_target_fn():
        return td_target_fn(lambda rewards, terminations, next_values, gamma: rewards, arrays="torch")

    @pytest.fixture(scope="session")
    def dlcheck_advantage_fn():
        return advantage_fn(lambda rewards: torch.zeros_like(rewards), arrays="torch")
""",
        },
        "--dlcheck=R3,R7,R2",
    )
    # R2: no reference model, said as an off-policy agent's (not PPO's clipping, which C51 was told blind)
    assert (
        "not applicable: a classic RL pipeline (dlcheck_td_target_fn) with no dlcheck_ref_model or dlcheck_kl_coef: it "
        "trains with no KL penalty to a frozen reference model (a value-based or off-policy agent learns from TD "
        "targets)" in run.skips["cleanrl_td"]
    ), run.skips["cleanrl_td"]
    run.assert_outcome("cleanrl_td", "R3", "skipped")
    assert (
        "not applicable: an off-policy loop (dlcheck_td_target_fn given, no advantage function): it learns from TD "
        "targets" in run.skips["cleanrl_td"]
    ), run.skips["cleanrl_td"]
    run.assert_outcome("cleanrl_gae", "R3", "skipped")
    assert "missing role: define fixture dlcheck_advantage_minibatches" in run.skips["cleanrl_gae"]
    for d in ("sac", "dqn", "sft"):
        run.assert_outcome(d, "R3", "skipped")
        assert "missing role" not in run.skips[d], run.skips[d]
    # R7 judges off-policy TD targets through the replay buffer (SB3's default keeps time-limit truncations
    # bootstrapped); a supervised trainer has none
    for d in ("sac", "dqn"):
        run.assert_outcome(d, "R7", "passed")
    run.assert_outcome("sft", "R7", "skipped")
    assert (
        "not applicable: SAC is off-policy: it learns from TD targets on its replay buffer, so it has no advantages to "
        "whiten and no reward groups" in run.skips["sac"]
    )
    assert "not applicable: DQN is off-policy" in run.skips["dqn"]
    assert (
        "not applicable: dlcheck_trainer is a SFTTrainer: it trains without rewards, so it has no advantages to "
        "whiten and no reward groups" in run.skips["sft"]
    )
    assert "not applicable: dlcheck_trainer is a SFTTrainer: it has no value function, so no GAE" in run.skips["sft"]


def test_grpo_group_normalisation_and_reward_functions(project):
    run = run_configs(
        project,
        {
            "trl_formula": GROUPS.format(name="group_advantages_trl"),
            "no_eps": GROUPS.format(name="group_advantages_no_eps"),
            "whole_batch": GROUPS.format(name="group_advantages_whole_batch"),
            "grpo_ok": GRPO.format(funcs="tiny_rl.reward_brevity, tiny_rl.reward_matches_solution"),
            "grpo_prompt_only": GRPO.format(funcs="tiny_rl.reward_brevity, tiny_rl.reward_prompt_length"),
        },
        "--dlcheck=R3",
        "-rA",
    )
    assert run.passed("trl_formula", "R3").startswith("dlcheck_group_advantages on 100 Hypothesis-generated")
    run.run.fnmatch(
        [
            "dlcheck_group_advantages on 100 Hypothesis-generated batches of reward groups (group sizes 2-6, * flat "
            "groups among them): finite advantages averaging 0 within every group"
        ]
    )
    assert run.passed("grpo_ok", "R3").startswith("reward_funcs[0] reward_brevity: the rewards of a prompt's")
    for line in (
        "reward_funcs[0] reward_brevity: the rewards of a prompt's completions differ on 4 of 4 sampled prompts "
        "(9 probe completions each; largest within-prompt std 1.47)",
        "reward_funcs[1] reward_matches_solution: the rewards of a prompt's completions differ on 4 of 4 sampled "
        "prompts (9 probe completions each; largest within-prompt std 0.314)",
    ):
        assert line in run.text.splitlines(), run.text

    run.assert_outcome("no_eps", "R3", "failed")
    text = run.flat("no_eps", "R3")
    assert "group 0: rewards [0, 0] -> advantages [nan, nan]" in text
    assert "std is 0" in text and "(std + 1e-4)" in text

    run.assert_outcome("whole_batch", "R3", "failed")
    assert "whitened over the whole batch instead of within each prompt's group" in run.section("whole_batch", "R3")

    run.assert_outcome("grpo_prompt_only", "R3", "failed")
    text = run.flat("grpo_prompt_only", "R3")
    assert "reward_funcs[1] reward_prompt_length gave every completion of a prompt the same reward" in text
    assert "prompt 'what is 2+2?': rewards [0.6, 0.6, 0.6, 0.6, …]" in text
    assert "its group-normalised advantage (r − mean_group) is 0" in text
    assert "Traceback" not in run.text


def test_flat_groups_in_every_logged_step_fail(project):
    run = run_configs(
        project,
        {
            "flat": "import pytest\n\n@pytest.fixture\ndef dlcheck_train_log():\n"
            "    return [{'reward': 0.0, 'frac_reward_zero_std': 1.0, 'step': s} for s in range(1, 5)]\n",
            "some_signal": "import pytest\n\n@pytest.fixture\ndef dlcheck_train_log():\n"
            "    return [{'reward': 0.1, 'frac_reward_zero_std': 0.5, 'step': s} for s in range(1, 5)]\n",
        },
        "--dlcheck=R3",
    )
    run.assert_outcome("flat", "R3", "failed")
    assert "frac_reward_zero_std = [1, 1, 1, 1] over 4 logged steps" in run.section("flat", "R3")
    assert run.passed("some_signal", "R3").startswith("dlcheck_train_log: frac_reward_zero_std averages 0.5 over 4")


def test_whitening_levels():
    rng = np.random.default_rng(0)
    adv = rng.normal(3, 5, 128)
    mbs = np.split(adv, 4)
    assert not any(rl.whitened(mb, 0.02) for mb in mbs)
    white = [(mb - mb.mean()) / mb.std(ddof=1) for mb in mbs]
    assert all(rl.whitened(mb, 0.02) for mb in white)
    biased = [(mb - mb.mean()) / mb.std() for mb in mbs]  # numpy's default ddof=0
    assert all(rl.whitened(mb, 0.02) for mb in biased)
    whole = (adv - adv.mean()) / adv.std()
    assert rl.whitened(whole, 0.02) and not all(rl.whitened(mb, 0.02) for mb in np.split(whole, 4))
