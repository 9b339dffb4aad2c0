"""Clean RL pipelines pass the whole rl domain, and leave no trace on the user's objects: a CleanRL-style
PPO on CartPole, an SB3 PPO with VecNormalize saved the right way, a tiny GRPO run with a KL term."""

import numpy as np
import tiny_rl
import torch
from rl_project import run_configs

CLEANRL = """
    import pytest, torch, tiny_rl
    from pytest_dlcheck.rl import advantage_fn

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tiny_rl.shared_agent()

    @pytest.fixture(scope="session")
    def dlcheck_env():
        return tiny_rl.make_envs            # a factory: the checks roll out fresh envs

    @pytest.fixture(scope="session")
    def dlcheck_advantage_fn():
        return advantage_fn(tiny_rl.compute_gae, arrays="torch")

    @pytest.fixture(scope="session")
    def dlcheck_advantage_minibatches(dlcheck_model):
        return tiny_rl.ppo_minibatches(dlcheck_model, tiny_rl.make_envs())

    @pytest.fixture(scope="session")
    def dlcheck_save_agent(dlcheck_model):
        return lambda d: torch.save(dlcheck_model.state_dict(), d / "agent.pt")

    @pytest.fixture(scope="session")
    def dlcheck_load_agent():
        def load(d):
            agent = tiny_rl.Agent()
            agent.load_state_dict(torch.load(d / "agent.pt"))
            return agent
        return load
"""

SB3 = """
    import pytest, tiny_rl
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        return tiny_rl.trained_ppo()

    @pytest.fixture(scope="session")
    def dlcheck_save_agent(dlcheck_algorithm):
        def save(d):
            dlcheck_algorithm.save(d / "model")
            dlcheck_algorithm.get_vec_normalize_env().save(d / "vecnormalize.pkl")
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_agent():
        def load(d):
            venv = VecNormalize.load(d / "vecnormalize.pkl", make_vec_env("CartPole-v1", n_envs=2))
            return PPO.load(d / "model", env=venv, device="cpu")
        return load
"""

GRPO = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_trainer():
        return tiny_rl.trained_grpo({tmp!r})
"""


def _snapshot():
    agent, ppo = tiny_rl.shared_agent(), tiny_rl.trained_ppo()
    venv = ppo.get_vec_normalize_env()
    return {
        "agent": {k: v.clone() for k, v in agent.state_dict().items()},
        "agent_training": agent.training,
        "ppo_policy": {k: v.clone() for k, v in ppo.policy.state_dict().items()},
        "ppo_training": ppo.policy.training,
        "ppo_counters": (ppo.num_timesteps, ppo._n_updates),
        "ppo_obs_rms": (venv.obs_rms.mean.copy(), venv.obs_rms.var.copy(), venv.obs_rms.count),
        "ppo_buffer": (np.array(ppo.rollout_buffer.advantages), np.array(ppo.rollout_buffer.observations)),
        "ppo_last_obs": np.array(ppo._last_obs),
        "env_state": [np.array(e.unwrapped.state) for e in venv.venv.envs],
        "rng": (torch.random.get_rng_state(), np.random.get_state()[1].copy()),
    }


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def test_clean_pipelines_pass_the_rl_domain_and_leave_no_trace(project, tmp_path_factory):
    grpo_dir = str(tmp_path_factory.mktemp("grpo"))
    grpo = tiny_rl.trained_grpo(grpo_dir)
    before = _snapshot()
    grpo_before = (
        {k: v.clone() for k, v in grpo.model.state_dict().items()},
        grpo.state.global_step,
        len(grpo.state.log_history),
        grpo.model.training,
    )
    run = run_configs(project, {"cleanrl": CLEANRL, "sb3": SB3, "grpo": GRPO.format(tmp=grpo_dir)}, "--dlcheck=rl")
    failed = [k for k, o in run.outcomes.items() if o in ("failed", "error")]
    assert not failed, run.text
    # what each pipeline actually exercises, with the evidence of what it measured (the rest skips: not
    # applicable, or naming the role it lacks)
    for d, cid in [
        ("cleanrl", "R3"),
        ("cleanrl", "R7"),
        ("cleanrl", "R8"),
        ("sb3", "R3"),
        ("sb3", "R4"),
        ("sb3", "R7"),
        ("sb3", "R8"),
        ("grpo", "R1"),
        ("grpo", "R2"),
        ("grpo", "R3"),
    ]:
        assert run.passed(d, cid)
    assert run.passed("grpo", "R1").startswith("6 logged steps of dlcheck_train_log: reward ")
    assert run.passed("sb3", "R4").startswith("save_agent wrote 2 file(s) (model.zip, vecnormalize.pkl)")
    # PPO has no KL reference, and the CleanRL loop's raw envs no running statistics
    assert "not applicable: a classic RL pipeline (dlcheck_env, dlcheck_advantage_fn" in run.skips["cleanrl"]
    assert "not applicable: dlcheck_env has no normalising wrapper" in run.skips["cleanrl"]
    assert "not applicable: PPO (Stable-Baselines3) has no reference model" in run.skips["sb3"]
    assert "not applicable: dlcheck_trainer is a GRPOTrainer: it has no value function" in run.skips["grpo"]
    assert _same(before, _snapshot())
    after = (
        {k: v.clone() for k, v in grpo.model.state_dict().items()},
        grpo.state.global_step,
        len(grpo.state.log_history),
        grpo.model.training,
    )
    assert _same(grpo_before, after)


def test_rolling_out_an_untrained_algorithm_leaves_its_env_alone(project):
    """R3 and R8 collect 256 steps of an SB3 policy whose buffer is empty: on a copy of its VecNormalize
    chain, never stepping, normalising or resetting the user's env."""
    algo = tiny_rl.untrained_ppo()
    venv = algo.get_vec_normalize_env()
    venv.reset()
    before = (
        [np.array(e.unwrapped.state) for e in venv.venv.envs],
        venv.obs_rms.mean.copy(),
        venv.obs_rms.count,
        {k: v.clone() for k, v in algo.policy.state_dict().items()},
        algo.policy.training,
        algo.num_timesteps,
    )
    run = run_configs(
        project,
        {
            "sb3": "import pytest, tiny_rl\n\n@pytest.fixture\ndef dlcheck_algorithm():\n"
            "    return tiny_rl.untrained_ppo()\n"
        },
        "--dlcheck=R3,R8",
    )
    assert run.passed("sb3", "R3").startswith("PPO.train()'s minibatches of 32 from 256 steps of PPO's policy")
    assert run.passed("sb3", "R8").startswith("256 steps of PPO's policy on a copy of its env; 4 dimension(s)")
    after = (
        [np.array(e.unwrapped.state) for e in venv.venv.envs],
        venv.obs_rms.mean.copy(),
        venv.obs_rms.count,
        {k: v.clone() for k, v in algo.policy.state_dict().items()},
        algo.policy.training,
        algo.num_timesteps,
    )
    assert _same(before, after)


ACTOR_CRITIC = """
import gymnasium as gym, pytest, torch
from torch.utils.data import DataLoader


@pytest.fixture(scope="session")
def dlcheck_env():
    return lambda: gym.make("CartPole-v1")


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    # pytorch/examples' actor-critic: no dataset, one item per episode (tensors, not mappings of token fields)
    return DataLoader(list(range(16)), batch_size=1)
"""


def test_an_rl_loop_s_dataloader_is_not_read_as_token_batches(project):
    # blind set 11's actor-critic: L4, L5 and L7 read its dataloader before deciding that the llm checks concern
    # no language model here, and blamed it for yielding tensors ("your role raised")
    project.conftest(ACTOR_CRITIC)
    run = project.run("--dlcheck=llm", "-rA")
    assert "raised" not in run.text, run.text
    for cid in ("L1", "L4", "L5", "L7", "L11"):
        run.assert_outcome(cid, "skipped")
    assert "the pipeline is a reinforcement-learning agent (dlcheck_env" in " ".join(run.text.split())
