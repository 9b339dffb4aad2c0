"""S5 on a policy-gradient objective. TRL's GRPOTrainer's loss is the GRPO objective over group-centred
advantages: about 0 by construction and of either sign, no measure of how well the model fits its data. S5 had
passed a GSPO run comparing an eval 'loss' of -2.8e-08 with a train 'loss' of 1.3e-08 ('-2.14 x'), a comparison
that measures nothing (found blind, set 15: trl examples/scripts/gspo.py); S2 already said not applicable for the
same loss. S5 now shares S2's property (the loss takes negative values) and says not applicable with that reason.
The twin: a loss that is a fit measure (cross-entropy, positive) is still judged, and memorisation still fails
(tests/smoke/test_s05_train_eval_gap.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

GRPO = """
    import pytest, tiny
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kw):
        return [-abs(20 - len(c)) / 20 for c in completions]

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("grpo"), GRPOConfig, num_generations=2, max_completion_length=6,
                                 beta=0.0, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                                 loss_type="grpo", importance_sampling_level="sequence")
        data = Dataset.from_dict({"prompt": tiny.PROMPTS})
        return GRPOTrainer(model=tiny.llama(tok), reward_funcs=reward, args=args, processing_class=tok,
                           train_dataset=data, eval_dataset=data)
"""

REINFORCE = (
    tt.loop_project(optimizer="torch.optim.SGD(model.parameters(), lr=0.05)")
    + """
    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return tt.loader(seed=1)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def loss(model, batch):
            # REINFORCE on the blobs: sample a class, reward 1 when it is right, baseline the batch mean
            x, y = batch
            logp = torch.log_softmax(model(x), -1)
            action = torch.multinomial(logp.exp().detach(), 1, generator=torch.Generator().manual_seed(0)).squeeze(1)
            reward = (action == y).float()
            return -(logp.gather(1, action[:, None]).squeeze(1) * (reward - reward.mean())).mean()
        return loss
"""
)

REASON = "not applicable: the loss takes negative values (step "


def test_grpo_objective_is_no_train_eval_gap(project):
    project.conftest(GRPO)
    run = project.run("--dlcheck=S2,S5", "-rA")
    run.assert_outcome("S5", "skipped")
    text = " ".join(run.text.split())
    assert "internal error" not in text, text[-3000:]
    assert REASON in text and "a train/eval ratio or gap of its values measures no fit" in text, text[-3000:]


def test_a_reinforce_loss_is_no_train_eval_gap(project):
    project.conftest(REINFORCE)
    run = project.run("--dlcheck=S5", "-rA")
    run.assert_outcome("S5", "skipped")
    text = " ".join(run.text.split())
    assert REASON in text and "a train/eval ratio or gap of its values measures no fit" in text, text[-3000:]
