"""R1: a reward jump together with a KL spike or a length collapse in the log of a short run; R5, R6
information items."""

import re

import tiny_rl  # noqa: F401  (gymnasium, SB3 imported once, before the in-process runs)
from rl_project import run_configs

#: a GRPO log_history (TRL's keys) shaped like a run on a brevity-rewarding reward with beta=0.04:
#: at step 6 the policy finds that near-empty answers score, the reward jumps, outputs collapse, KL spikes
HACKED = [
    {"step": 1, "reward": 0.11, "kl": 0.0, "completions/mean_length": 61.0},
    {"step": 2, "reward": 0.13, "kl": 0.002, "completions/mean_length": 58.5},
    {"step": 3, "reward": 0.12, "kl": 0.004, "completions/mean_length": 60.2},
    {"step": 4, "reward": 0.14, "kl": 0.005, "completions/mean_length": 57.0},
    {"step": 5, "reward": 0.15, "kl": 0.006, "completions/mean_length": 55.1},
    {"step": 6, "reward": 0.91, "kl": 0.84, "completions/mean_length": 3.2},
    {"step": 7, "reward": 0.93, "kl": 1.10, "completions/mean_length": 2.9},
]

#: the same hacked run as a hand-written loop logs it, one tag per row the way CleanRL's
#: writer.add_scalar(tag, value, global_step) writes it (charts/episodic_return, losses/approx_kl)
HACKED_TAGS = [
    row
    for e in HACKED
    for row in (
        {"global_step": e["step"] * 100, "charts/episodic_return": e["reward"]},
        {"global_step": e["step"] * 100, "losses/approx_kl": e["kl"], "losses/old_approx_kl": 0.0},
    )
]
#: a CleanRL SAC run's tags: an episodic return, twin critics' losses, no KL and no completion length
SAC_TAGS = [
    {"global_step": 100 * s, "charts/episodic_return": -1200.0 + 40 * s, "charts/episodic_length": 200}
    for s in range(1, 8)
] + [
    {"global_step": 100 * s + 50, "losses/qf1_loss": 2.0 * s, "losses/qf_loss": 1.5 * s, "losses/actor_loss": -s}
    for s in range(1, 8)
]

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

LOG = """
    import pytest, tiny_rl

    @pytest.fixture(scope="session")
    def dlcheck_train_log(tmp_path_factory):
        return {log}
"""


def test_reward_hacking_signature_in_a_run_log(project, tmp_path_factory):
    run = run_configs(
        project,
        {
            "hacked": LOG.format(log=repr(HACKED)),
            "real_noisy_run": LOG.format(
                log=f"list(tiny_rl.grpo_noisy_run_log({str(tmp_path_factory.mktemp('g'))!r}))"
            ),
            "too_short": LOG.format(log=repr(HACKED[:3])),
            # a log with rewards alone: a jump cannot be told from hacking
            "reward_only": LOG.format(log=repr([{"step": e["step"], "reward": e["reward"]} for e in HACKED])),
            # the log_history of a supervised run: nothing R1 reads
            "sft_log": LOG.format(
                log=repr(
                    [{"step": s, "loss": 5.7 - s / 10, "grad_norm": 1.2, "learning_rate": 1e-3} for s in range(1, 8)]
                )
            ),
            "sft_trainer": SFT,
            "hacked_tags": LOG.format(log=repr(HACKED_TAGS)),
            "sac_tags": LOG.format(log=repr(SAC_TAGS)),
        },
        "--dlcheck=R1,R5",
        "-rA",
    )
    run.assert_outcome("hacked", "R1", "failed")
    text = run.flat("hacked", "R1")
    assert "step 6: reward jumps to 0.91 from a median 0.13" in text
    assert "kl 0.84 vs median 0.004 before (210×)" in text
    assert "completions/mean_length 3.2 vs median 58.5 before" in text
    assert "step 5: reward 0.15, kl 0.006, completions/mean_length 55.1" in text
    assert "signature of reward hacking" in text and "beta=0.04" in text

    # a real 10-step GRPO run at lr 0.05: KL jumps 0 -> 1.95 and the reward moves, but never together
    assert run.passed("real_noisy_run", "R1").startswith("10 logged steps of dlcheck_train_log: reward ")
    run.run.fnmatch(
        [
            "10 logged steps of dlcheck_train_log: reward * -> *; largest one-step move * spreads (step *; a jump "
            "is ±5), none together with a KL spike or a length collapse",
            "kl: at most *× its baseline before (step *: * against the *; a spike is 10×)",
            "completions/mean_length: at least *× its median before (step *; a collapse is below 0.5×)",
        ]
    )
    run.assert_outcome("too_short", "R1", "skipped")
    assert "R1 needs 5" in run.skips["too_short"]
    run.assert_outcome("reward_only", "R1", "skipped")
    assert "logs reward but neither a KL nor a completion/episode length" in run.skips["reward_only"]
    run.assert_outcome("sft_log", "R1", "skipped")
    assert "not applicable: dlcheck_train_log logs no reward" in run.skips["sft_log"]
    run.assert_outcome("sft_trainer", "R1", "skipped")
    assert (
        "not applicable: dlcheck_trainer is a SFTTrainer: it trains without rewards, so its log has no reward"
        in run.skips["sft_trainer"]
    )
    run.assert_outcome("hacked", "R5", "skipped")
    # R5 reads a critic loss: a GRPO log has none
    run.assert_outcome("real_noisy_run", "R5", "skipped")
    assert "not applicable: dlcheck_train_log logs no value loss under a tag R5 knows" in run.skips["real_noisy_run"]
    assert "a value-based agent's loss under a plain tag such as losses/loss is not told from another loss" in " ".join(
        run.skips["real_noisy_run"].split()
    )

    # a hand-written loop's tags are read by their words, each row at its global_step
    run.assert_outcome("hacked_tags", "R1", "failed")
    text = run.flat("hacked_tags", "R1")
    assert "step 600: charts/episodic_return jumps to 0.91 from a median 0.13" in text, text
    assert "losses/approx_kl 0.84 vs median 0.004 before" in text, text
    # an off-policy run logs per-episode returns and lengths and critic losses, no KL: a single episode's length is
    # too noisy to pair with a return, so R1 says it cannot judge; R5 reads the critic
    run.assert_outcome("sac_tags", "R1", "skipped")
    assert "logs charts/episodic_return but neither a KL nor a completion/episode length" in run.skips["sac_tags"]
    assert "charts/episodic_length is not read" in run.skips["sac_tags"]
    run.assert_outcome("sac_tags", "R5", "skipped")
    assert (
        "info: losses/qf_loss went from 1.5 (step 150) to 10.5 (step 750); charts/episodic_return from -1.16e+03"
        in (run.skips["sac_tags"])
    ), run.skips["sac_tags"]


def test_information_items(project):
    run = run_configs(
        project,
        {
            "sb3": "import pytest, tiny_rl\n\n@pytest.fixture\ndef dlcheck_algorithm():\n    return tiny_rl.sb3_ppo()\n\n"
            "@pytest.fixture\ndef dlcheck_train_log():\n    return [{'train/value_loss': 0.8, 'rollout/ep_rew_mean': 21.0, "
            "'step': 2048}, {'train/value_loss': 45.0, 'rollout/ep_rew_mean': 480.0, 'step': 100000}]\n",
        },
        "--dlcheck=R5,R6",
        "-rs",
    )
    run.assert_outcome("sb3", "R5", "skipped")
    run.assert_outcome("sb3", "R6", "skipped")
    assert "train/value_loss went from 0.8 (step 2048) to 45 (step 100000)" in run.text
    assert "dlcheck_algorithm was built with seed=0" in run.text


SB3_RUN = """
    import pytest, torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import configure

    @pytest.fixture(scope="session")
    def dlcheck_algorithm(tmp_path_factory):
        torch.set_num_threads(1)
        model = PPO(
            "MlpPolicy", "CartPole-v1", learning_rate={schedule}, n_steps=512, batch_size=64, n_epochs=4,
            stats_window_size=50, seed={seed}, device="cpu", verbose={verbose},
        )
        if {csv}:
            model.set_logger(configure(str(tmp_path_factory.mktemp("ppo_log")), ["csv"]))
        model.learn(512 * {rollouts})
        return model
"""

#: a decay for the last quarter of the run (SB3 calls the schedule with the progress remaining, 1 -> 0) written
#: with - where * was meant: the rate turns negative, -0.03, so PPO climbs its own loss at 1000x its step and
#: drives the policy to its worst actions: CartPole's episodes fall to their ~9-step minimum within one rollout,
#: whatever the seed. Before it the slow rate keeps the episode statistics flat (a mean over 50 episodes), so the
#: drop is 10-12 spreads on every seed tried (a step up to 0.3, by contrast, collapses one seed's run and not
#: another's, and a run still learning before the step has a spread too wide to call any move a jump)
STEP_NEGATIVE = "lambda p: 3e-5 if p > 0.25 else 3e-5 - 0.03"
STEP_DOWN = "lambda p: 3e-5 if p > 0.25 else 3e-5 * 0.03"
SEEDS = (0, 1)


def test_an_sb3_run_is_read_from_its_logger(project):
    """A Stable-Baselines3 user gives only dlcheck_algorithm: R1 reads its csv logger's progress.csv after
    model.learn(); the collapse after the schedule's step fails, the step down passes (each run under two
    seeds: the verdict, not one trajectory), and a logger that keeps no history (stdout) skips naming the csv
    output."""
    configs = {}
    for seed in SEEDS:
        configs[f"collapse{seed}"] = SB3_RUN.format(schedule=STEP_NEGATIVE, seed=seed, verbose=0, csv=True, rollouts=12)
        configs[f"decay{seed}"] = SB3_RUN.format(schedule=STEP_DOWN, seed=seed, verbose=0, csv=True, rollouts=12)
    # a logger without history skips whatever the run's length: one rollout (and its update) shows it
    configs["stdout"] = SB3_RUN.format(schedule=STEP_DOWN, seed=0, verbose=1, csv=False, rollouts=1)
    run = run_configs(project, configs, "--dlcheck=R1,R5", "-rA")
    for seed in SEEDS:
        run.assert_outcome(f"collapse{seed}", "R1", "failed")
        text = run.flat(f"collapse{seed}", "R1")
        assert "PPO's logger (progress.csv in " in text
        drop = re.search(
            r"step (\d+): rollout/ep_rew_mean drops to ([\d.]+) from a median ([\d.]+) \(-([\d.]+) spreads\) while ",
            text,
        )
        assert drop, text
        step, low, median, spreads = int(drop[1]), float(drop[2]), float(drop[3]), float(drop[4])
        assert step > 512 * 9 and low < 0.5 * median and spreads >= 5, text  # after the step; a jump is ±5
        assert re.search(rf"rollout/ep_len_mean {low:g} vs median {median:g}", text), text  # the length collapsed
        assert re.search(r"train/learning_rate: 3e-05 at step \d+ -> -0\.03 at step 6144", text), text
        assert "the reward collapsed together with the outputs" in text
        assert "lower learning_rate or fix its schedule" in text and "GRPOConfig" not in text

        assert run.passed(f"decay{seed}", "R1").startswith("12 logged steps of PPO's logger")
    assert "none together with a KL spike or a length collapse" in run.text
    # the same log gives R5 the critic's loss
    assert "train/value_loss went from " in run.text

    run.assert_outcome("stdout", "R1", "skipped")
    assert (
        "missing role: define fixture dlcheck_train_log in conftest.py, or: PPO's logger writes no history R1 can "
        "read (outputs: human; name_to_value holds only the 10 value(s) recorded since its last dump): give it a csv "
        "output" in run.skips["stdout"]
    ), run.text


def test_a_kl_below_the_floor_is_said_against_the_floor_not_its_median():
    """CleanRL's approx_kl of 1e-7: the baseline is the floor 1e-3 (a KL that small is no spike), and the evidence
    says so instead of calling the ratio to the floor a ratio to the median (found blind: '0.000123x its median')."""
    from pytest_dlcheck import detectors

    watch = detectors.RewardWatch(reward_jump=5.0, kl_spike=10.0, length_collapse=0.5)
    for step in range(8):
        watch.add(step, 1.0 + 0.01 * step, kl=1e-7 * (step + 1))
    ratio, step, kl, baseline = watch.kl_most
    assert baseline == 1e-3 and kl < 1e-5 and ratio < 0.01
