"""The training domains (train, ckpt, smoke, dist), the llm domain and a reinforcement-learning agent: an SB3 algorithm has no
supervised training step and no dataset, so their checks are not applicable to it (not a request for
dlcheck_make_training or a dataloader, fixtures that would not make them judge it); a supervised loop missing its
dataloader is still asked for it."""

import json

import stable_baselines3  # noqa: F401 - SB3 (and gymnasium) imported once, before the in-process runs
import tiny_train  # noqa: F401

DOMAINS = ("llm", "train", "ckpt", "smoke", "dist")

SB3_DQN = """
    import pytest
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    @pytest.fixture(scope="session")
    def dlcheck_algorithm():
        return DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=0), buffer_size=200, learning_starts=10,
                   device="cpu", policy_kwargs=dict(net_arch=[16]), seed=0)

    @pytest.fixture(scope="session")
    def dlcheck_save_agent(dlcheck_algorithm):
        return lambda directory: dlcheck_algorithm.save(directory / "model")

    @pytest.fixture(scope="session")
    def dlcheck_load_agent():
        return lambda directory: DQN.load(directory / "model", device="cpu")
"""

LOOP_WITHOUT_DATA = """
    import pytest, torch, tiny_train as tt

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}
        return make
"""


def _results(project, tmp_path) -> list[dict]:
    out = tmp_path / "report.json"
    project.run(f"--dlcheck={','.join(DOMAINS)}", f"--dlcheck-json={out}")
    return [r for r in json.loads(out.read_text())["results"] if r["domain"] in DOMAINS]


def test_an_sb3_algorithm_is_not_asked_for_a_supervised_training(project, tmp_path):
    project.conftest(SB3_DQN)
    results = _results(project, tmp_path)
    assert results
    missing = [f"{r['id']}: {r['reason']}" for r in results if r["outcome"] == "missing_role"]
    assert not missing, missing
    agent = [r for r in results if "reinforcement-learning agent" in r["reason"]]
    assert {r["domain"] for r in agent} == set(DOMAINS), results
    for r in agent:
        assert r["outcome"] == "not_applicable", r
        assert "(dlcheck_algorithm: DQN (stable_baselines3)" in r["reason"], r
        assert "no supervised training" in r["reason"] and f"the {r['domain']} checks" in r["reason"], r


def test_a_supervised_loop_missing_its_dataloader_is_asked_for_it(project, tmp_path):
    project.conftest(LOOP_WITHOUT_DATA)
    results = {r["id"]: r for r in _results(project, tmp_path)}
    for cid, fixture in (("T7", "dlcheck_dataloader"), ("C1", "dlcheck_save_checkpoint"), ("D1", "dlcheck_dist_wrap")):
        assert results[cid]["outcome"] == "missing_role", results[cid]
        assert fixture in results[cid]["reason"], results[cid]
    assert not any("reinforcement-learning" in r["reason"] for r in results.values())


#: a CleanRL off-policy loop (ddpg_continuous_action.py as a user hands it): its env and TD target for the rl
#: checks, and its update as a plain loop (factory + step) for the training domains; no tokenizer, no Trainer
CLEANRL_UPDATE = """
    import gymnasium as gym
    import pytest, torch, tiny_train as tt
    from pytest_dlcheck.rl import td_target_fn

    @pytest.fixture(scope="session")
    def dlcheck_env():
        return lambda: gym.make_vec("Pendulum-v1", num_envs=1)

    @pytest.fixture(scope="session")
    def dlcheck_td_target_fn():
        return td_target_fn(lambda rewards, terminations, next_values, gamma: rewards + gamma * next_values
                            * (1 - terminations), arrays="torch")

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}
        return make
""" + LOOP_WITHOUT_DATA.split("return make", 1)[1]


def test_an_rl_agent_with_a_plain_loop_update_is_not_asked_for_a_tokenizer(project, tmp_path):
    """The update given as a plain loop keeps the training domains (a supervised-looking step), but the llm checks
    concern language models: not applicable, not 'missing role: define dlcheck_tokenizer' (found blind on CleanRL's
    DDPG: 10 llm checks asked for a tokenizer). A supervised loop without a tokenizer is still not told it is an
    agent (above)."""
    project.conftest(CLEANRL_UPDATE)
    out = tmp_path / "report.json"
    project.run("--dlcheck=llm", f"--dlcheck-json={out}")
    llm = [r for r in json.loads(out.read_text())["results"] if r["domain"] == "llm"]
    assert llm and not [r for r in llm if r["outcome"] == "missing_role"], [(r["id"], r["reason"]) for r in llm]
    # the llm checks that would ask for a tokenizer say why they do not concern the agent (L9 has its own "no DPO
    # training"; L5 reads the model's config first, and skips on a model without one)
    agent = [r for r in llm if "reinforcement-learning agent (dlcheck_env" in r["reason"]]
    assert len(agent) >= 10, [(r["id"], r["outcome"], r["reason"]) for r in llm]
    for r in agent:
        assert r["outcome"] == "not_applicable" and "no tokenizer and no Trainer" in r["reason"], r
