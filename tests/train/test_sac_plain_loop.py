"""A SAC-style plain loop (found blind, set 13: CleanRL's sac_continuous_action): a training dict with two optimizers
(the critics' at every call, the actor's at every other call, stepped twice there: the delayed update repeated),
twin target critics averaged by tau and in no optimizer. What the checks say of it must be true: T10 sees no
gradient accumulation (each actor step applies its own call's gradients), T6 counts the actor's optimizer steps and
says which optimizer it read, T3 names the target networks, S2 does not judge a TD loss against target networks.
A twin that carries the actor's gradients over calls into the call that steps twice is not called "not applicable"
(T10 skips it: a window that ends inside a call is not judged)."""

import re

import torch  # noqa: F401

SAC = """
import copy, pytest, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
OBS, ACT = 3, 1
N = 256
DATA = TensorDataset(torch.randn(N, OBS), torch.rand(N, ACT) * 2 - 1, torch.randn(N), torch.randn(N, OBS))


def critic():
    return nn.Sequential(nn.Linear(OBS + ACT, 16), nn.ReLU(), nn.Linear(16, 1))


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return DataLoader(DATA, batch_size=16, shuffle=True)


@pytest.fixture(scope="session")
def dlcheck_make_training():
    def make():
        actor = nn.Sequential(nn.Linear(OBS, 16), nn.ReLU(), nn.Linear(16, ACT), nn.Tanh())
        qf1, qf2 = critic(), critic()
        state = {{"model": actor, "qf1": qf1, "qf2": qf2,
                  "qf1_target": copy.deepcopy(qf1), "qf2_target": copy.deepcopy(qf2)}}
        state["optimizer"] = torch.optim.Adam(actor.parameters(), lr=3e-4)
        state["q_optimizer"] = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=1e-3)
        return state
    return make


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def step(state, batch, index):
        obs, act, rew, nobs = batch
        actor, qf1, qf2 = state["model"], state["qf1"], state["qf2"]
        with torch.no_grad():
            na = actor(nobs)
            nq = torch.min(state["qf1_target"](torch.cat([nobs, na], 1)), state["qf2_target"](torch.cat([nobs, na], 1)))
            target = rew + 0.99 * nq.view(-1)
        sa = torch.cat([obs, act], 1)
        qf_loss = nn.functional.mse_loss(qf1(sa).view(-1), target) + nn.functional.mse_loss(qf2(sa).view(-1), target)
        state["q_optimizer"].zero_grad()
        qf_loss.backward()
        state["q_optimizer"].step()
        {before}
        if (index + 1) % 2 == 0:  # delayed policy update, repeated policy_frequency times
            for _ in range(2):
                pi = actor(obs)
                actor_loss = -torch.min(qf1(torch.cat([obs, pi], 1)), qf2(torch.cat([obs, pi], 1))).mean()
                {actor_update}
        for net, tgt in ((qf1, state["qf1_target"]), (qf2, state["qf2_target"])):
            for p, tp in zip(net.parameters(), tgt.parameters()):
                tp.data.copy_(0.005 * p.data + 0.995 * tp.data)
        return qf_loss
    return step
"""

CLEAN = "state['optimizer'].zero_grad(); actor_loss.backward(); state['optimizer'].step()"
# the buggy twin: the actor's loss is backwarded at every call and its gradients carried into the call that steps
# (no zero_grad): an accumulation over calls, which T10 must not call "not applicable"
ACCUMULATING = "actor_loss.backward(); state['optimizer'].step()"
CARRY = "(-qf1(torch.cat([obs, actor(obs)], 1)).mean()).backward()"


def sac(actor_update: str = CLEAN, before: str = "pass") -> str:
    return SAC.format(actor_update=actor_update, before=before)


def _line(run, cid: str) -> str:
    m = re.search(rf"^(?:PASSED|SKIPPED) .*{cid}_\w+.*$", run.text, re.M)
    assert m, f"no summary line for {cid}:\n{run.text}"
    return " ".join(m.group(0).split())


def test_t10_sees_no_accumulation_in_a_delayed_repeated_actor_update(project):
    project.conftest(sac())
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "skipped")
    line = _line(run, "T10")
    assert (
        "not applicable: no gradient accumulation: the optimizer (state['optimizer']) took 2 optimizer steps within call 2"
        in line
    ), line
    assert "carried no gradient when that call began" in line, line
    assert "gives no gradient" not in line


def test_t10_twin_carrying_gradients_into_the_call_is_not_called_clean(project):
    # the actor's parameters carry gradients from the call before (never zeroed): no "not applicable"
    project.conftest(sac(ACCUMULATING, before=CARRY))
    run = project.run("--dlcheck=T10", "-rA")
    assert "not applicable" not in _line(run, "T10"), run.text
    assert "carried gradients from earlier calls" in _line(run, "T10"), run.text


def test_t6_counts_the_actor_optimizer_steps_and_names_the_one_read(project):
    project.conftest(sac())
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", "passed")
    text = " ".join(run.text.split())
    # the actor's optimizer steps twice in every other call: 20 optimizer steps read at the 10 calls that step
    assert re.search(
        r"the learning rate of state\['optimizer'\] at the (\d+) steps where it stepped \((\d+) optimizer steps", text
    ), text
    calls, steps = map(int, re.search(r"at the (\d+) steps where it stepped \((\d+) optimizer steps", text).groups())
    assert steps == 2 * calls, text
    assert "partly judged: the learning rate of q_optimizer not judged" in text, text


def test_t3_names_the_target_networks(project):
    project.conftest(sac())
    run = project.run("--dlcheck=T3", "-rA")
    run.assert_outcome("T3", "passed")
    text = " ".join(run.text.split())
    for copy, original in (("qf1_target", "qf1"), ("qf2_target", "qf2")):
        assert f"{copy}.* gets no gradient and is in no optimizer: a copy of {original}" in text, text


def test_s2_does_not_judge_a_td_loss_against_target_networks(project):
    project.conftest(sac())
    run = project.run("--dlcheck=S2", "-rA")
    run.assert_outcome("S2", "skipped")
    text = " ".join(run.text.split())
    assert "not applicable: the model keeps a target network: qf1_target has the very parameters of qf1" in text, text
