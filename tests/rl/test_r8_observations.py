"""R8: observations reach the policy on unit-like scales."""

import numpy as np
import pytest
import tiny_rl  # noqa: F401  (gymnasium, SB3 imported once, before the in-process runs)
from rl_project import run_configs

from pytest_dlcheck.checks.rl import measure as rl

FACTORY = """
    import pytest
    import gymnasium as gym

    @pytest.fixture(scope="session")
    def dlcheck_env():
        return lambda: {make}
"""

SB3 = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        return tiny_rl.sb3_ppo("MountainCar-v0", normalize={normalize})
"""

PIXEL_ENV = """
    import numpy as np, pytest
    import gymnasium as gym

    class PointOnScreen(gym.Env):
        \"\"\"A point steered on a 640x480 screen; observations in pixels and pixels per step.\"\"\"
        observation_space = gym.spaces.Box(np.array([0, 0, -20, -20], np.float32), np.array([640, 480, 20, 20], np.float32))
        action_space = gym.spaces.Discrete(4)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.state = np.array([*self.np_random.uniform((0, 0), (640, 480)), 0, 0], np.float32)
            return self.state.copy(), {{}}

        def step(self, action):
            dv = [(1, 0), (-1, 0), (0, 1), (0, -1)][int(action)]
            self.state[2:] = np.clip(self.state[2:] + dv, -20, 20)
            self.state[:2] = np.clip(self.state[:2] + self.state[2:], 0, (640, 480))
            return self.state.copy(), -float(np.abs(self.state[:2] - (320, 240)).sum()) / 100, False, False, {{}}

    @pytest.fixture(scope="session")
    def dlcheck_env():
        return PointOnScreen
    {preprocess}
"""

SCALED = """
    @pytest.fixture(scope="session")
    def dlcheck_preprocess_obs():
        return lambda obs: obs / np.array([640, 480, 20, 20], np.float32)   # what the agent does first
"""


CLEANRL_ROLLOUT = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_rollout():
        envs = tiny_rl.make_envs(env_id="MountainCar-v0")
        return tiny_rl.collect_rollout(tiny_rl.Agent(obs_dim=2, n_actions=3), envs)   # its 'obs' buffer: (64, 2, 2)
    {preprocess}
"""

RUNNING_NORM = """
    @pytest.fixture(scope="session")
    def dlcheck_preprocess_obs(dlcheck_rollout):
        obs = dlcheck_rollout["obs"].reshape(-1, 2)
        mean, std = obs.mean(0), obs.std(0)
        return lambda o: (o - mean.numpy()) / (std.numpy() + 1e-8)   # the agent's running normalisation
"""


def test_observation_scales(project):
    run = run_configs(
        project,
        {
            "cartpole_raw": FACTORY.format(make='gym.make("CartPole-v1")'),
            "mountaincar_raw": FACTORY.format(make='gym.make("MountainCar-v0")'),
            "mountaincar_wrapped": FACTORY.format(make='gym.wrappers.NormalizeObservation(gym.make("MountainCar-v0"))'),
            "sb3_raw": SB3.format(normalize=False),
            "sb3_vecnormalize": SB3.format(normalize=True),
            "pixels": PIXEL_ENV.format(preprocess=""),
            "pixels_scaled": PIXEL_ENV.format(preprocess=SCALED),
            "rollout_raw": CLEANRL_ROLLOUT.format(preprocess=""),
            "rollout_normalised": CLEANRL_ROLLOUT.format(preprocess=RUNNING_NORM),
            "discrete": FACTORY.format(make='gym.make("FrozenLake-v1")'),
            "sb3_discrete": "import pytest\nfrom stable_baselines3 import DQN\n\n@pytest.fixture\ndef dlcheck_algorithm():\n"
            "    return DQN('MlpPolicy', 'FrozenLake-v1', buffer_size=100, device='cpu', seed=0)\n",
            "grpo": "import pytest, tiny_rl\n\n@pytest.fixture\ndef dlcheck_trainer(tmp_path_factory):\n"
            "    return tiny_rl.grpo_trainer(tmp_path_factory.mktemp('g'), [tiny_rl.reward_brevity])\n",
        },
        "--dlcheck=R8",
        "-rA",
    )
    for ok in ("cartpole_raw", "mountaincar_wrapped", "sb3_vecnormalize", "pixels_scaled", "rollout_normalised"):
        run.assert_outcome(ok, "R8", "passed")
    assert run.passed("cartpole_raw", "R8").startswith("256 observations of a fresh env from dlcheck_env (CartPole-v1)")
    # raw CartPole stays within the limits: its largest dimension about 1.5, its scales about 12x apart
    run.run.fnmatch(
        [
            "256 observations of a fresh env from dlcheck_env (CartPole-v1), random actions; 4 dimension(s): largest "
            "scale (90% of |x|) * at dim * ≤ R8.max_scale 10; dims * and * are *× apart ≤ R8.max_scale_ratio 30",
        ]
    )
    assert run.passed("pixels_scaled", "R8").startswith(
        "256 observations of a fresh env from dlcheck_env (PointOnScreen)"
    )
    assert run.passed("sb3_vecnormalize", "R8").startswith(
        "256 steps of PPO's policy on a copy of its env; 2 dimension(s)"
    )

    run.assert_outcome("mountaincar_raw", "R8", "failed")
    text = run.flat("mountaincar_raw", "R8")
    assert "256 observations of a fresh env from dlcheck_env (MountainCar-v0), random actions" in text
    assert "dim 1: 90% of |x| ≤ 0.0" in text
    assert "dim 0 is " in text and "× dim 1 > R8.max_scale_ratio 30" in text
    assert "barely moves the first layer's weighted sums" in text
    assert "NormalizeObservation" in text and "VecNormalize(env)" in text

    run.assert_outcome("sb3_raw", "R8", "failed")
    text = run.flat("sb3_raw", "R8")
    assert "256 steps of PPO's policy on a copy of its env" in text
    assert "× dim 1 > R8.max_scale_ratio" in text

    run.assert_outcome("pixels", "R8", "failed")
    text = run.flat("pixels", "R8")
    assert "dimension(s) 0, 1 reach |x| ≈" in text and "> R8.max_scale 10" in text
    assert "tanh units saturate" in text

    run.assert_outcome("rollout_raw", "R8", "failed")
    text = run.flat("rollout_raw", "R8")
    assert "dlcheck_rollout; scale of each of 2 dimension(s)" in text and "× dim 1 > R8.max_scale_ratio" in text

    run.assert_outcome("discrete", "R8", "skipped")
    assert "not applicable: R8 measures Box observation spaces; FrozenLake-v1 has Discrete" in run.skips["discrete"]
    run.assert_outcome("sb3_discrete", "R8", "skipped")
    assert "not applicable: R8 measures Box observation spaces; DQN has Discrete" in run.skips["sb3_discrete"]
    run.assert_outcome("grpo", "R8", "skipped")
    assert (
        "not applicable: dlcheck_trainer is a GRPOTrainer: its policy reads token ids, not vector observations"
        in run.skips["grpo"]
    )
    assert "Traceback" not in run.text


def test_scale_is_robust_to_rare_outliers_and_ignores_constant_dimensions():
    obs = np.zeros((200, 3))
    obs[:, 0] = np.linspace(-1, 1, 200)
    obs[5, 1] = 1000.0  # one outlier in 200
    scales = rl.observation_scales(obs)
    assert scales[0].scale == np.percentile(np.abs(obs[:, 0]), 90)
    assert scales[1].scale == 0 and scales[2].scale == 0


FRAMES = """
    import numpy as np, pytest

    @pytest.fixture(scope="session")
    def dlcheck_rollout():
        # Atari-style grayscale frames as a hand-written agent buffers them: (steps, 84, 84)
        r = np.random.RandomState(0)
        frames = r.randint(0, 256, size=(64, 84, 84)).astype(np.uint8)
        return {{"obs": frames{scale}}}
"""


def test_image_observations_are_judged_over_every_axis(project):
    project.conftest(FRAMES.format(scale=""))
    run = project.run("--dlcheck=R8")
    run.assert_outcome("R8", "failed")
    text = " ".join(run.section("R8").split())
    assert "image observations of shape (84, 84)" in text and "raw pixel values (0-255)" in text
    assert "divide the frames by 255" in text


def test_image_observations_divided_by_255_pass(project):
    project.conftest(FRAMES.format(scale=" / 255.0"))
    run = project.run("--dlcheck=R8", "-rA")
    run.assert_outcome("R8", "passed")
    run.fnmatch(["*image observations of shape (84, 84): 90% of the nonzero pixel values over every axis are*"])


SPARSE = """
import numpy as np, pytest

@pytest.fixture(scope="session")
def dlcheck_rollout():
    # a catch game's frames: one lit pixel on black, as an agent buffers them (steps, 36, 36)
    frames = np.zeros((64, 36, 36), dtype=np.uint8)
    r = np.random.RandomState(0)
    frames[np.arange(64), r.randint(0, 36, 64), r.randint(0, 36, 64)] = 255
    return {{"obs": frames{scale}}}
"""


@pytest.mark.parametrize(("scale", "outcome"), [("", "failed"), (" / 255.0", "passed")])
def test_sparse_frames_are_judged_on_their_lit_pixels(project, scale, outcome):
    # almost every pixel is 0: pooled, the 90th percentile is 0 and R8 had skipped ("every dimension is 0"), so
    # unscaled 0-255 sparse frames went unseen (blind set 10's CleanRL SAC)
    project.conftest(SPARSE.format(scale=scale))
    run = project.run("--dlcheck=R8")
    run.assert_outcome("R8", outcome)
