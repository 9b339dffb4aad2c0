"""R4: the user's own save -> load round trip keeps running statistics and the replay buffer."""

import tiny_rl  # noqa: F401  (gymnasium, SB3 imported once, before the in-process runs)
from rl_project import run_configs

PPO_VECNORMALIZE = """
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
            {save_stats}
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_agent():
        def load(d):
            {load_env}
            return PPO.load(d / "model", env=venv, device="cpu")
        return load
"""

CORRECT = dict(
    save_stats='dlcheck_algorithm.get_vec_normalize_env().save(d / "vecnormalize.pkl")',
    load_env='venv = VecNormalize.load(d / "vecnormalize.pkl", make_vec_env("CartPole-v1", n_envs=2))',
)
MODEL_ONLY = dict(save_stats="pass", load_env='venv = VecNormalize(make_vec_env("CartPole-v1", n_envs=2))')

DQN = """
    import pytest, tiny_rl
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        return tiny_rl.trained_dqn()

    @pytest.fixture(scope="session")
    def dlcheck_save_agent(dlcheck_algorithm):
        def save(d):
            dlcheck_algorithm.save(d / "model")
            if {with_buffer}:
                dlcheck_algorithm.save_replay_buffer(d / "replay_buffer.pkl")
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_agent():
        def load(d):
            model = DQN.load(d / "model", device="cpu"{env})
            if {with_buffer}:
                model.load_replay_buffer(d / "replay_buffer.pkl")
            return model
        return load
"""

GYM_WRAPPER = """
    import pickle, pytest
    import gymnasium as gym

    def make_env():
        return gym.wrappers.NormalizeObservation(gym.make("CartPole-v1"))

    @pytest.fixture(scope="session")
    def dlcheck_env():
        env = make_env()
        env.reset(seed=0)
        for _ in range(50):
            if any(env.step(env.action_space.sample())[2:4]):
                env.reset()
        return env

    @pytest.fixture(scope="session")
    def dlcheck_save_agent(dlcheck_env):
        def save(d):
            (d / "agent.txt").write_text("weights")
            if {keep}:
                (d / "obs_rms.pkl").write_bytes(pickle.dumps(dlcheck_env.obs_rms))
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_agent():
        def load(d):
            env = make_env()
            if {keep}:
                env.obs_rms = pickle.loads((d / "obs_rms.pkl").read_bytes())
            return env
        return load
"""


def test_checkpoint_round_trips(project):
    run = run_configs(
        project,
        {
            "ppo_correct": PPO_VECNORMALIZE.format(**CORRECT),
            "ppo_model_only": PPO_VECNORMALIZE.format(**MODEL_ONLY),
            "dqn_with_buffer": DQN.format(with_buffer=True, env=""),
            # a resume (an env to learn on) without the buffer, and SB3's load to predict with (no env)
            "dqn_model_only": DQN.format(with_buffer=False, env=', env=make_vec_env("CartPole-v1", n_envs=1)'),
            "dqn_predict_only": DQN.format(with_buffer=False, env=""),
            "gym_kept": GYM_WRAPPER.format(keep=True),
            "gym_lost": GYM_WRAPPER.format(keep=False),
            "fresh": "import pytest, tiny_rl\n\n@pytest.fixture\ndef dlcheck_algorithm():\n    return tiny_rl.sb3_ppo()\n\n"
            "@pytest.fixture\ndef dlcheck_save_agent():\n    return lambda d: None\n\n"
            "@pytest.fixture\ndef dlcheck_load_agent():\n    return lambda d: None\n",
        },
        "--dlcheck=R4",
        "-rA",
    )
    assert run.passed("ppo_correct", "R4").startswith("save_agent wrote 2 file(s) (model.zip, vecnormalize.pkl)")
    lines = run.text.splitlines()
    assert (
        "save_agent wrote 2 file(s) (model.zip, vecnormalize.pkl); after load_agent all 6 values are as saved (rtol "
        "1e-06): obs_rms (mean, var, count 258), ret_rms (mean, var, count 256)"
    ) in lines, run.text
    assert (
        "save_agent wrote 2 file(s) (model.zip, replay_buffer.pkl); after load_agent all 2 values are as saved (rtol "
        "1e-06): the replay buffer (120 transitions, same content)"
    ) in lines, run.text
    # the env took 50 random steps: its count is 50 plus the observations of its resets
    run.run.fnmatch(
        [
            "save_agent wrote 2 file(s) (agent.txt, obs_rms.pkl); after load_agent all 3 values are as saved (rtol "
            "1e-06): obs_rms (mean, var, count 5?)"
        ]
    )

    run.assert_outcome("ppo_model_only", "R4", "failed")
    text = run.flat("ppo_model_only", "R4")
    assert "saved 1 file(s) (model.zip); after the load:" in text
    assert "obs_rms.count: 258 before the save, 0.0001 after the load" in text
    assert "obs_rms.mean: [" in text and "after the load" in text
    assert "model.save() stores the policy, not VecNormalize's obs_rms/ret_rms" in text
    assert "model.get_vec_normalize_env().save(d / 'vecnormalize.pkl')" in text

    run.assert_outcome("dqn_model_only", "R4", "failed")
    text = run.flat("dqn_model_only", "R4")
    assert "replay_buffer.transitions: 120 before the save, 0 after the load" in text
    assert "model.save_replay_buffer" in text
    run.assert_outcome("dqn_predict_only", "R4", "skipped")
    assert "not applicable: dlcheck_load_agent gives a DQN with no env (DQN.load without env=)" in " ".join(
        run.skips["dqn_predict_only"].split()
    )

    run.assert_outcome("gym_lost", "R4", "failed")
    text = run.flat("gym_lost", "R4")
    assert "saved 1 file(s) (agent.txt)" in text and "before the save, 0.0001 after the load" in text
    assert "save wrapper.obs_rms" in text

    run.assert_outcome("fresh", "R4", "skipped")
    assert "at their initial values" in run.skips["fresh"]
    assert "Traceback" not in run.text


def test_pipelines_without_running_statistics(project):
    """Nothing but the policy to checkpoint: R4 is not applicable (it asks for no save_agent it would not use);
    a factory whose envs normalise names the fixture that would hand over the live statistics."""
    run = run_configs(
        project,
        {
            # SB3 PPO on a plain VecEnv, no save/load fixtures given: nothing R4 could round-trip
            "ppo_plain": "import pytest, tiny_rl\n\n@pytest.fixture\ndef dlcheck_algorithm():\n"
            "    return tiny_rl.sb3_ppo(normalize=False)\n",
            # a CleanRL-style loop: raw CartPole envs from a factory, the agent's weights saved by hand
            "cleanrl": "import pytest, torch, tiny_rl\n\n@pytest.fixture\ndef dlcheck_env():\n    return tiny_rl.make_envs\n\n"
            "@pytest.fixture\ndef dlcheck_save_agent():\n    return lambda d: torch.save(tiny_rl.shared_agent().state_dict(), "
            "d / 'agent.pt')\n\n@pytest.fixture\ndef dlcheck_load_agent():\n    return lambda d: torch.load(d / 'agent.pt')\n",
            "factory_normalised": "import pytest\nimport gymnasium as gym\n\n@pytest.fixture\ndef dlcheck_env():\n"
            "    return lambda: gym.wrappers.NormalizeObservation(gym.make('CartPole-v1'))\n",
        },
        "--dlcheck=R4",
    )
    run.assert_outcome("ppo_plain", "R4", "skipped")
    assert (
        "not applicable: PPO has no VecNormalize and no replay buffer: its checkpoint is the policy alone, with no "
        "running statistics to lose" in run.skips["ppo_plain"]
    )
    run.assert_outcome("cleanrl", "R4", "skipped")
    assert (
        "not applicable: dlcheck_env has no normalising wrapper (NormalizeObservation / NormalizeReward / "
        "VecNormalize): no running statistics for a checkpoint to lose" in run.skips["cleanrl"]
    )
    run.assert_outcome("factory_normalised", "R4", "skipped")
    assert (
        "missing role: define fixture dlcheck_normalizer in conftest.py: dlcheck_env is a factory whose env "
        "normalises (obs_rms), and R4 needs the live statistics your run updated" in run.skips["factory_normalised"]
    )


def test_the_live_statistics_are_left_as_they_were(project):
    """R4 swaps the live statistics out while the user's load runs: they must come back, values and objects."""
    algo = tiny_rl.trained_ppo()
    venv = algo.get_vec_normalize_env()
    rms, mean, count = venv.obs_rms, venv.obs_rms.mean.copy(), venv.obs_rms.count
    run = run_configs(project, {"ppo_model_only": PPO_VECNORMALIZE.format(**MODEL_ONLY)}, "--dlcheck=R4")
    run.assert_outcome("ppo_model_only", "R4", "failed")
    assert venv.obs_rms is rms and (venv.obs_rms.mean == mean).all() and venv.obs_rms.count == count


SUBENVS = """
    import pickle, pytest
    import numpy as np
    import gymnasium as gym

    def make_env():
        # ppo_continuous_action.py's make_env on gymnasium 1.x: NormalizeObservation four wrappers deep
        def thunk():
            env = gym.make("Pendulum-v1")
            env = gym.wrappers.FlattenObservation(env)
            env = gym.wrappers.RecordEpisodeStatistics(env)
            env = gym.wrappers.ClipAction(env)
            env = gym.wrappers.NormalizeObservation(env)
            env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
            env = gym.wrappers.NormalizeReward(env, gamma=0.99)
            env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
            return env
        return thunk

    def make_envs():
        return gym.wrappers.vector.RecordEpisodeStatistics(gym.vector.SyncVectorEnv([make_env() for _ in range(2)]))

    def obs_wrappers(envs):
        found = []
        for e in envs.env.envs:  # each sub-env, down its wrapper chain
            while not isinstance(e, gym.wrappers.NormalizeObservation):
                e = e.env
            found.append(e)
        return found

    @pytest.fixture(scope="session")
    def dlcheck_env():
        envs = make_envs()
        envs.reset(seed=0)
        for _ in range(30):
            envs.step(envs.action_space.sample())
        return envs

    @pytest.fixture(scope="session")
    def dlcheck_save_agent(dlcheck_env):
        def save(d):
            (d / "agent.txt").write_text("weights")
            if "{keep}" != "none":
                (d / "obs_rms.pkl").write_bytes(pickle.dumps([w.obs_rms for w in obs_wrappers(dlcheck_env)]))
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_agent():
        def load(d):
            envs = make_envs()
            if "{keep}" != "none":
                saved = pickle.loads((d / "obs_rms.pkl").read_bytes())
                for i, w in enumerate(obs_wrappers(envs)):
                    # "first": the statistics of sub-env 0 put into every sub-env
                    w.obs_rms = saved[i if "{keep}" == "all" else 0]
                    w.update_running_mean = False
            return envs
        return load
"""


def test_statistics_inside_a_vector_envs_sub_envs(project):
    """CleanRL's fix (the observation statistics of every sub-env saved and put back into the same sub-env's
    wrapper) passes; the reward normaliser's are not carried: they do not reach the policy, noted, not judged.
    The bug (fresh envs, nothing restored) fails saying the load gave fresh statistics; a load that puts sub-env
    0's statistics into every sub-env fails saying it gave other statistics, not fresh ones."""
    run = run_configs(
        project,
        {
            "kept": SUBENVS.format(keep="all"),
            "lost": SUBENVS.format(keep="none"),
            "mixed": SUBENVS.format(keep="first"),
        },
        "--dlcheck=R4",
        "-rA",
    )
    assert run.passed("kept", "R4").startswith("save_agent wrote 2 file(s) (agent.txt, obs_rms.pkl); after load_agent")
    lines = run.text.splitlines()
    assert (
        "save_agent wrote 2 file(s) (agent.txt, obs_rms.pkl); after load_agent all 6 values the policy depends on "
        "are as saved (rtol 1e-06): envs[0].obs_rms (mean, var, count 31), envs[1].obs_rms (mean, var, count 31)"
    ) in lines, run.text
    assert (
        "not carried, not judged: envs[0].ret_rms, envs[1].ret_rms (a reward normaliser's statistics: a resumed "
        "training run would scale its rewards afresh)"
    ) in lines, run.text

    run.assert_outcome("lost", "R4", "failed")
    text = run.flat("lost", "R4")
    assert "saved 1 file(s) (agent.txt); after the load:" in text
    for i in (0, 1):
        assert (
            f"envs[{i}].obs_rms: the load gave fresh statistics (mean 0, var 1, count 0.0001: a normaliser built "
            f"anew), not the saved ones (count 31)" in text
        ), text
        assert f"envs[{i}].obs_rms.count: 31 before the save, 0.0001 after the load" in text
    assert "envs[0].obs_rms.var: [" in text and "[1, 1, 1] after the load" in text
    assert "other statistics" not in text and "ret_rms" not in text
    assert "the loaded run normalises observations with fresh statistics (mean 0, var 1" in text
    assert "model.save()" not in text and "VecNormalize" not in text  # not an SB3 pipeline
    assert "NormalizeObservation inside each sub-env (envs.envs[i], down its wrapper chain through .env)" in text

    run.assert_outcome("mixed", "R4", "failed")
    text = run.flat("mixed", "R4")
    assert "envs[1].obs_rms: the load gave other statistics than the saved ones (mean, var differ: count 31" in text
    assert "envs[0].obs_rms" not in text  # sub-env 0 got its own statistics back
    assert "fresh statistics" not in text
    assert "the load does not put the saved normalisation statistics back where they were" in text
    assert "Traceback" not in run.text


PLAIN_LOOP = """
    import pickle, pytest, torch
    import gymnasium as gym
    import numpy as np
    from torch import nn
    from stable_baselines3.common.buffers import ReplayBuffer

    torch.set_num_threads(1)

    def make_envs():
        return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])

    class QNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            self.network = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

        def forward(self, x):
            return self.network(x)

    @pytest.fixture(scope="session")
    def run():
        # CleanRL's dqn.py / c51.py loop, shrunk: SB3's ReplayBuffer filled by a hand-written loop, Adam on TD targets
        torch.manual_seed(0)
        envs = make_envs()
        q_network = QNetwork()
        optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-3)
        rb = ReplayBuffer(200, envs.single_observation_space, envs.single_action_space, "cpu",
                          handle_timeout_termination=False)
        obs, _ = envs.reset(seed=0)
        for global_step in range(60):
            actions = np.array([envs.single_action_space.sample()])
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            rb.add(obs, next_obs, actions, rewards, terminations, [{{}}])
            obs = next_obs
            if global_step >= 32:
                data = rb.sample(8)
                with torch.no_grad():
                    target = data.rewards.flatten() + 0.99 * q_network(data.next_observations).max(1).values * (
                        1 - data.dones.flatten())
                loss = nn.functional.mse_loss(q_network(data.observations).gather(1, data.actions).squeeze(1), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return dict(q_network=q_network, optimizer=optimizer, rb=rb, envs=envs, global_step=global_step + 1)

    @pytest.fixture(scope="session")
    def dlcheck_replay_buffer(run):
        return run["rb"]

    KIND = "{kind}"

    @pytest.fixture(scope="session")
    def dlcheck_save_agent(run):
        def save(d):
            if KIND.startswith("export"):  # CleanRL's save_model: the weights (and args) for evaluate()
                torch.save({{"model_weights": run["q_network"].state_dict(), "args": {{"gamma": 0.99}}}}, d / "q.cleanrl_model")
                return
            ckpt = {{"q_network": run["q_network"].state_dict(), "optimizer": run["optimizer"].state_dict(),
                    "global_step": run["global_step"]}}
            if KIND == "resume_with_buffer":
                rb = run["rb"]
                ckpt["replay_buffer"] = {{k: getattr(rb, k) for k in
                                         ("observations", "next_observations", "actions", "rewards", "dones", "pos", "full")}}
            torch.save(ckpt, d / "checkpoint.pt")
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_agent(run):
        def load(d):
            q_network = QNetwork()
            if KIND.startswith("export"):  # c51_eval / dqn_eval: a fresh network with the weights, to evaluate
                q_network.load_state_dict(torch.load(d / "q.cleanrl_model", weights_only=False)["model_weights"])
                q_network.eval()
                return q_network if KIND == "export_module" else {{"q_network": q_network, "envs": make_envs()}}
            ckpt = torch.load(d / "checkpoint.pt", weights_only=False)
            q_network.load_state_dict(ckpt["q_network"])
            optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-3)
            optimizer.load_state_dict(ckpt["optimizer"])
            out = {{"q_network": q_network, "optimizer": optimizer, "global_step": ckpt["global_step"]}}
            if KIND == "resume_with_buffer":
                envs = make_envs()
                rb = ReplayBuffer(200, envs.single_observation_space, envs.single_action_space, "cpu",
                                  handle_timeout_termination=False)
                for k, v in ckpt["replay_buffer"].items():
                    setattr(rb, k, v)
                out["rb"] = rb
            return out
        return load
"""


def test_a_plain_loops_export_is_not_a_resume(project):
    """CleanRL's save_model writes the Q-network's weights once, for evaluate(): a load that gives back the network
    alone (or with the envs to play it in) and no optimizer or step counter is an export, and R4 (what a resume
    restores) is not applicable, as for SB3's load without env=. The same loop saving and loading the network,
    the optimizer and the global step (a resume) without the buffer fails, with a plain loop's fix (no SB3 call);
    the resume that carries the buffer's arrays passes."""
    run = run_configs(
        project,
        {
            kind: PLAIN_LOOP.format(kind=kind)
            for kind in ("export_module", "export_with_envs", "resume_no_buffer", "resume_with_buffer")
        },
        "--dlcheck=R4",
        "-rA",
    )
    for kind in ("export_module", "export_with_envs"):
        run.assert_outcome(kind, "R4", "skipped")
    skips = " ".join(run.text.split())
    assert (
        "not applicable: dlcheck_load_agent gives QNetwork (nn.Module): the network alone, with no optimizer, step "
        "counter or replay buffer: an export to evaluate with, not a resume"
    ) in skips, run.text
    assert (
        "not applicable: dlcheck_load_agent gives {q_network: QNetwork (nn.Module), envs: SyncVectorEnv}: the "
        "network alone"
    ) in skips, run.text
    assert "a load that gives back what a resume restores, the optimizer or the step counter, is judged" in skips

    run.assert_outcome("resume_no_buffer", "R4", "failed")
    text = run.flat("resume_no_buffer", "R4")
    assert "saved 1 file(s) (checkpoint.pt); after the load:" in text
    assert "replay_buffer.transitions: 60 before the save, absent from the loaded objects after the load" in text
    assert (
        "the load gives back the optimizer (optimizer: Adam), the step counter (global_step = 60): a resume, "
        "without the replay buffer"
    ) in text
    assert "the load restores the optimizer and the step counter, not the buffer" in text
    assert "save the replay buffer's arrays with the checkpoint (rb.observations, rb.next_observations" in text
    assert "rb.pos, rb.full of your ReplayBuffer" in text
    assert "model.save" not in text and "save_replay_buffer" not in text and "PPO/SAC/DQN" not in text

    assert run.passed("resume_with_buffer", "R4").startswith("save_agent wrote 1 file(s) (checkpoint.pt)")
    assert "the replay buffer (60 transitions, same content)" in run.text
    assert "Traceback" not in run.text
