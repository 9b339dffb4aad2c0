"""R7: the user's GAE/returns function against the reference on Hypothesis-generated rollouts."""

import re

import numpy as np
import pytest
import tiny_rl  # noqa: F401  (gymnasium, SB3 imported once, before the in-process runs)
import torch
from helpers import flat
from rl_project import run_configs

from pytest_dlcheck.checks.rl import measure as rl

HAND_GAE = """
    import pytest, tiny_rl
    from pytest_dlcheck.rl import advantage_fn

    @pytest.fixture(scope="session")
    def dlcheck_advantage_fn():
        return advantage_fn(tiny_rl.{name}, arrays="torch")
"""

HARD_CODED_GAMMA = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_advantage_fn():
        def gae(rollout):
            r = rollout.as_torch()
            return tiny_rl.compute_gae(r.rewards, r.values, r.terminated, r.truncated, r.next_values, 0.9, 0.95)
        return gae
"""

AMBIGUOUS_DONES = """
    import pytest

    @pytest.fixture(scope="session")
    def dlcheck_advantage_fn():
        def gae(rewards, values, dones, next_value):
            return rewards
        return gae
"""


def test_hand_written_gae_functions(project):
    run = run_configs(
        project,
        {
            "correct": HAND_GAE.format(name="compute_gae"),
            "done_bootstrap": HAND_GAE.format(name="compute_gae_done_bootstrap"),
            "ignores_dones": HAND_GAE.format(name="compute_gae_ignoring_dones"),
            "hard_coded_gamma": HARD_CODED_GAMMA,
            "dones_param": AMBIGUOUS_DONES,
            "grpo": "import pytest, tiny_rl\n\n@pytest.fixture\ndef dlcheck_trainer(tmp_path_factory):\n"
            "    return tiny_rl.grpo_trainer(tmp_path_factory.mktemp('g'), [tiny_rl.reward_brevity])\n",
        },
        "--dlcheck=R7",
        "-rA",
    )
    assert run.passed("correct", "R7").startswith("dlcheck_advantage_fn agrees with the float64 reference GAE on")
    run.run.fnmatch(
        [
            "dlcheck_advantage_fn agrees with the float64 reference GAE on 200 Hypothesis-generated rollouts (1-8 "
            "steps × 1-2 envs, * terminated and * truncated steps among them) within rtol 0.0001 / atol 0.0001",
            "gamma 0.99, gae_lambda 0.95, same_step autoreset",
        ]
    )
    # GRPO has no value function: no GAE to check, and no dlcheck_advantage_fn to ask for
    run.assert_outcome("grpo", "R7", "skipped")
    assert (
        "not applicable: dlcheck_trainer is a GRPOTrainer: it has no value function, so no GAE (GRPO's advantages "
        "are group-normalised rewards, which R3 checks)" in run.skips["grpo"]
    )

    # done = terminated or truncated: the shrunk rollout is one truncated step, the final value dropped
    run.assert_outcome("done_bootstrap", "R7", "failed")
    text = run.section("done_bootstrap", "R7")
    assert "disagrees with the reference GAE at a truncated step" in text
    assert "rollout of 1 step × 1 env, gamma 0.99, gae_lambda 0.95, same_step autoreset" in text, text
    for row in ("end             trunc", "next value          1", "adv. yours          0", "adv. reference   0.99"):
        assert row in text, text
    assert "done = terminated or truncated used for bootstrapping" in text
    assert "on 40 more varied rollouts your advantages equal exactly what this mistake computes" in text
    assert "(1 − terminated_t)" in text  # the fix

    run.assert_outcome("ignores_dones", "R7", "failed")
    text = run.section("ignores_dones", "R7")
    assert "disagrees with the reference GAE at a terminated step" in text
    assert "end              term" in text and "adv. yours       0.99" in text
    assert "the GAE ignores episode ends" in text

    run.assert_outcome("hard_coded_gamma", "R7", "failed")
    assert "the discounting itself differs" in run.section("hard_coded_gamma", "R7")

    run.assert_outcome("dones_param", "R7", "failed")
    assert "named 'dones', which is ambiguous" in run.section("dones_param", "R7")
    assert "Traceback" not in run.text


SB3_CUSTOM_BUFFER = """
    import numpy as np, pytest, tiny_rl
    from stable_baselines3.common.buffers import RolloutBuffer

    class MyBuffer(RolloutBuffer):
        def compute_returns_and_advantage(self, last_values, dones):
            last_values = last_values.clone().cpu().numpy().flatten()
            last_gae_lam = 0
            for step in reversed(range(self.buffer_size)):
                if step == self.buffer_size - 1:
                    next_non_terminal, next_values = 1.0 - dones.astype(np.float32), last_values
                else:  # off by one: episode_starts[step] is the start of this step's own episode
                    next_non_terminal, next_values = 1.0 - self.episode_starts[step], self.values[step + 1]
                delta = self.rewards[step] + self.gamma * next_values * next_non_terminal - self.values[step]
                last_gae_lam = delta + self.gamma * self.gae_lambda * next_non_terminal * last_gae_lam
                self.advantages[step] = last_gae_lam
            self.returns = self.advantages + self.values

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        return tiny_rl.sb3_ppo(rollout_buffer_class=MyBuffer)
"""

NEXT_STEP_ENV = """
    import pytest, tiny_rl
    from pytest_dlcheck.rl import advantage_fn

    @pytest.fixture(scope="session")
    def dlcheck_env():
        return lambda: tiny_rl.make_envs(autoreset="next_step")   # gymnasium 1.x's default autoreset

    @pytest.fixture(scope="session")
    def dlcheck_advantage_fn():
        return advantage_fn(tiny_rl.{name}, arrays="torch")
"""


def test_sb3_rollout_buffers_and_next_step_rollouts(project):
    run = run_configs(
        project,
        {
            "sb3_ppo": "import pytest, tiny_rl\n\n@pytest.fixture(scope='session')\n"
            "def dlcheck_algorithm():\n    return tiny_rl.sb3_ppo()\n",
            "sb3_custom_buffer": SB3_CUSTOM_BUFFER,
            # a GAE that reads the final observation's value from next_values handles reset steps too
            "next_step_ok": NEXT_STEP_ENV.format(name="compute_gae"),
            "next_step_bad": NEXT_STEP_ENV.format(name="compute_gae_ignoring_dones"),
        },
        "--dlcheck=R7",
        "-rA",
    )
    assert run.passed("sb3_ppo", "R7").startswith("PPO's RolloutBuffer.compute_returns_and_advantage agrees with")
    run.run.fnmatch(["gamma 0.99, gae_lambda 0.95, next_step autoreset"])
    run.assert_outcome("sb3_custom_buffer", "R7", "failed")
    text = run.section("sb3_custom_buffer", "R7")
    assert "PPO's MyBuffer.compute_returns_and_advantage disagrees with the reference GAE" in text
    assert "the episode-end flags are off by one step" in run.flat("sb3_custom_buffer", "R7")
    assert run.passed("next_step_ok", "R7").startswith("dlcheck_advantage_fn agrees with the float64 reference GAE")
    run.assert_outcome("next_step_bad", "R7", "failed")
    assert "next_step autoreset" in run.section("next_step_bad", "R7")


# ---- the reference itself ------------------------------------------------------------------------


def test_reference_matches_sb3_rollout_buffer_on_generated_rollouts():
    algo = tiny_rl.sb3_ppo(normalize=False)
    fn = rl.sb3_advantage_fn(algo)
    for r in rl.sample_rollouts(60, seed=3, gamma=algo.gamma, gae_lambda=algo.gae_lambda):
        adv, ret = rl.parse_advantage_output(fn(r), (r.num_steps, r.num_envs))
        assert rl.compare(r, adv, ret, 1e-5, 1e-5).agrees


def test_reference_matches_hand_computed_values():
    f = np.float32
    r = rl.Rollout(
        rewards=np.array([[1.0], [1.0], [1.0]], f),
        values=np.array([[0.5], [0.5], [2.0]], f),
        terminated=np.array([[False], [True], [False]]),
        truncated=np.array([[False], [False], [True]]),
        next_values=np.array([[0.5], [9.0], [3.0]], f),
        episode_starts=np.zeros((3, 1), bool),
        reset_steps=np.zeros((3, 1), bool),
        gamma=0.5,
        gae_lambda=0.5,
    )
    adv, ret = rl.reference_gae(r)
    # t=2 truncated: 1 + 0.5*3 - 2 = 0.5; t=1 terminated: 1 - 0.5 = 0.5 (9.0 unused);
    # t=0: delta = 1 + 0.5*0.5 - 0.5 = 0.75, plus 0.25 * 0.5
    assert np.allclose(adv[:, 0], [0.875, 0.5, 0.5])
    assert np.allclose(ret, adv + r.values)


def test_every_known_mistake_is_told_apart_by_the_identification_rollouts():
    samples = rl.sample_rollouts(40)
    for name in rl.VARIANTS:
        outputs = [(r, *rl.reference_gae(r, name)) for r in samples]
        assert rl.identify_mistake(outputs, 1e-4, 1e-4) == name


def test_generated_rollouts_cover_every_end_at_every_position():
    seen = set()
    for r in rl.sample_rollouts(200, max_steps=4):
        for t in range(r.num_steps):
            for n in range(r.num_envs):
                seen.add((rl.end_label(r, t, n), t == r.num_steps - 1))
    assert {("term", True), ("trunc", True), ("both", True), ("term", False), ("trunc", False), ("-", True)} <= seen


def test_torch_view_keeps_flags_as_floats():
    r = rl.sample_rollouts(1)[0].as_torch()
    assert r.terminated.dtype == torch.float32 and r.rewards.dtype == torch.float32
    assert pytest.approx(float((1.0 - r.terminated).min())) in (0.0, 1.0)


CLEANRL_DQN = """
    import numpy as np, pytest, torch
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer
    from pytest_dlcheck.rl import td_target_fn

    OBS, ACT = spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(2)

    @pytest.fixture(scope="session")
    def dlcheck_td_target_fn():
        # CleanRL's dqn.py: an SB3 ReplayBuffer with handle_timeout_termination=False, the loop's flags stored as
        # its dones, the target r + γ·max_a Q_target(s', a)·(1 − done) (next_values stands for target_max)
        def td_target(rewards, terminations, truncations, next_values, gamma):
            rb = ReplayBuffer(len(rewards), OBS, ACT, "cpu", handle_timeout_termination=False)
            for i in range(len(rewards)):
                done = {stored}
                rb.add(np.zeros((1, 2)), np.zeros((1, 2)), np.zeros((1, 1)), rewards[i : i + 1].numpy(),
                       np.array([done.item()]), [{{}}])
            data = rb._get_samples(np.arange(len(rewards)))
            return data.rewards.flatten() + gamma * next_values * (1 - data.dones.flatten())
        return td_target_fn(td_target, arrays="torch")
"""

SB3_DQN = """
    import pytest, tiny_rl
    from stable_baselines3 import DQN

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        {make}
"""

MEMORY_DQN = """algo = DQN("MlpPolicy", "CartPole-v1", buffer_size=500, learning_starts=50, optimize_memory_usage=True,
                   replay_buffer_kwargs=dict(handle_timeout_termination=False), device="cpu", seed=0)
        return algo.learn(120)"""


def test_off_policy_td_targets(project):
    """Off-policy: a loop that stores done = terminated or truncated fails (its targets drop Q(s') at time-limit
    truncations), storing terminations passes; SB3's DQN is judged by its replay buffer's
    handle_timeout_termination (its default passes, the memory-saving configuration that turns it off fails)."""
    run = run_configs(
        project,
        {
            "cleanrl_bug": CLEANRL_DQN.format(stored="terminations[i] + truncations[i] > 0"),
            "cleanrl": CLEANRL_DQN.format(stored="terminations[i]"),
            "sb3_memory": SB3_DQN.format(make=MEMORY_DQN),
            "sb3_default": SB3_DQN.format(make="return tiny_rl.trained_dqn()"),
            "buffer_only": "import pytest, tiny_rl\n\n@pytest.fixture\ndef dlcheck_replay_buffer():\n"
            "    return tiny_rl.trained_dqn().replay_buffer\n",
        },
        "--dlcheck=R7",
        "-rA",
    )
    run.assert_outcome("cleanrl_bug", "R7", "failed")
    text = run.flat("cleanrl_bug", "R7")
    assert (
        "dlcheck_td_target_fn disagrees with r + γ·(1 − terminated)·next_value (γ 0.99) at the truncated "
        "transitions of " in text
    ), text
    assert "truncated: reward 1.5, next_value 4 -> yours 1.5, reference 5.46 (r + γ·next_value) <-" in text
    assert "terminated: reward 1, next_value 3 -> yours 1, reference 1 (r)" in text
    assert "running: reward 0.5, next_value 2 -> yours 2.48, reference 2.48" in text
    assert "on all 25 batches your targets equal exactly what this mistake computes" in text
    assert "done = terminated or truncated is stored and used as (1 − done) in the target" in text
    assert "rb.add(obs, real_next_obs, actions, rewards, terminations, infos)" in text

    assert run.passed("cleanrl", "R7").startswith("dlcheck_td_target_fn agrees with r + γ·(1 − terminated)·next_val")
    assert "time-limit truncations are bootstrapped, terminations are not" in run.text

    run.assert_outcome("sb3_memory", "R7", "failed")
    text = run.flat("sb3_memory", "R7")
    assert (
        "DQN.replay_buffer (ReplayBuffer) has handle_timeout_termination=False (optimize_memory_usage=True, which SB3 "
        "cannot combine with it): it samples the done DQN stores, terminated or truncated, so its env's "
        "truncations (time limit 500 steps) enter r + γ·(1 − done)·Q(s') as terminations" in text
    ), text
    assert "samples a truncation with done 1 and a termination with done 1" in text
    assert "its env truncates episodes: a TimeLimit of 500 steps is in its wrapper chain" in text
    assert "replay_buffer_kwargs=dict(handle_timeout_termination=True)) with optimize_memory_usage=False" in text

    assert run.passed("sb3_default", "R7").startswith(
        "DQN.replay_buffer (ReplayBuffer) has handle_timeout_termination=True"
    )
    assert "samples a truncation with done 0 and a termination with done 1" in run.text

    run.assert_outcome("buffer_only", "R7", "skipped")
    assert "missing role: define fixture dlcheck_td_target_fn" in run.skips["buffer_only"], run.text
    assert "Traceback" not in run.text


HER_DQN = """
    import pytest
    from stable_baselines3 import DQN, HerReplayBuffer
    from stable_baselines3.common.envs import BitFlippingEnv

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        # SB3's HER example: BitFlippingEnv truncates its episodes itself (max_steps), no TimeLimit wrapper
        algo = DQN("MultiInputPolicy", BitFlippingEnv(n_bits=4, max_steps=4), replay_buffer_class=HerReplayBuffer,
                   replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"{kwargs}),
                   buffer_size=200, learning_starts=1000, policy_kwargs=dict(net_arch=[8]), device="cpu", seed=0)
        return algo.learn({steps})
"""

NEVER_TRUNCATES = """
    import gymnasium as gym, numpy as np, pytest
    from stable_baselines3 import DQN

    class Corridor(gym.Env):  # ends only by termination, after 3 steps; no TimeLimit, no max_steps
        observation_space = gym.spaces.Box(0.0, 3.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(1, np.float32), {}

        def step(self, action):
            self.t += 1
            return np.full(1, self.t, np.float32), 1.0, self.t >= 3, False, {}

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        algo = DQN("MlpPolicy", Corridor(), buffer_size=100, learning_starts=1000, optimize_memory_usage=True,
                   replay_buffer_kwargs=dict(handle_timeout_termination=False), policy_kwargs=dict(net_arch=[8]),
                   device="cpu", seed=0)
        return algo.learn(30)
"""


def test_off_policy_env_that_truncates_itself(project):
    """An env that truncates its episodes itself (SB3's BitFlippingEnv: truncated=True at max_steps, no TimeLimit,
    spec None) is seen truncating from the timeouts its replay buffer stored, or, with
    handle_timeout_termination=False (which stores none), from a probe of a copy of it: HER with SB3's default
    passes naming those timeouts, HER with the flag off fails; a buffer that would mistreat truncations on an
    env in which nothing shows one skips saying so, never "no episode is truncated"."""
    run = run_configs(
        project,
        {
            "her": HER_DQN.format(kwargs="", steps=40),
            "her_bug": HER_DQN.format(kwargs=", handle_timeout_termination=False", steps=0),
            "no_truncation": NEVER_TRUNCATES,
        },
        "--dlcheck=R7",
        "-rA",
    )
    assert run.passed("her", "R7").startswith("DQN.replay_buffer (HerReplayBuffer) has handle_timeout_termination")
    text = flat(run.text)
    stored = re.search(
        r"its env truncates episodes: (\d+) of the (\d+) episode ends stored in DQN.replay_buffer are "
        r"truncations \(its timeouts: the env returned truncated=True;",
        text,
    )
    assert stored and 0 < int(stored.group(1)) <= int(stored.group(2)), text
    assert "no TimeLimit in its env's wrapper chain, spec.max_episode_steps None" in text
    assert "a fresh HerReplayBuffer with DQN's arguments" in text
    assert "samples a truncation with done 0 and a termination with done 1" in text
    assert "no episode is truncated" not in text

    run.assert_outcome("her_bug", "R7", "failed")
    bug = run.flat("her_bug", "R7")
    assert "DQN.replay_buffer (HerReplayBuffer) has handle_timeout_termination=False" in bug, bug
    assert (
        "its env truncates episodes: a deep copy of its env (Monitor → BitFlippingEnv) returned truncated=True" in bug
    )
    assert "samples a truncation with done 1 and a termination with done 1" in bug
    assert "replay_buffer_kwargs=dict(handle_timeout_termination=True)" in bug

    run.assert_outcome("no_truncation", "R7", "skipped")
    why = flat(run.skips["no_truncation"])
    assert "has handle_timeout_termination=False: it would sample a truncation as a termination, but R7 saw none" in why
    assert (
        "a deep copy of its env (Monitor → Corridor) ended 66 episode(s) in 200 random-action steps, 66 by "
        "termination, none by truncation" in why
    ), why
    assert "not judged" in why and "not applicable" not in why, why
