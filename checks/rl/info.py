"""R5 and R6: information items. They never pass: they skip with a note, because neither has a verdict
worth shipping (a rising critic loss and a single seed are normal in themselves)."""

from __future__ import annotations

from ...errors import MISSING
from ...registry import check
from . import measure as rl

#: roles that mark a project as reinforcement learning (an SB3 algorithm, an environment, a GAE or advantage
#: function, rollouts, a GRPO trainer's reward functions): without one, the notes do not concern it
RL_ROLES = ("algorithm", "env", "advantage_fn", "rollout", "reward_funcs", "train_log")


def _require_rl(dlcheck) -> None:
    if not any(dlcheck.role(name) is not MISSING for name in RL_ROLES):
        dlcheck.not_applicable(
            "no reinforcement learning in the given fixtures (no dlcheck_algorithm, dlcheck_env, "
            "dlcheck_advantage_fn, dlcheck_rollout, GRPO trainer or dlcheck_train_log): an RL note does not "
            "concern this pipeline"
        )


@check(
    "R5",
    domain="rl",
    title="non-stationary critic loss read as a bug (info: reports its trend)",
    optional_roles=("train_log",),
)
def check_critic_loss_trend(dlcheck):
    """Information: the critic (value) loss of a run, next to its return, so a rise is read right.

    What it does
        Nothing is judged. With dlcheck_train_log holding a value loss (train/value_loss, value_loss,
        loss/value, vf_loss, or a tag naming a critic's loss: losses/qf_loss, losses/td_loss,
        losses/critic_loss), the item skips with its first and last values and those of the reward;
        without one, with the general note.
    Why it is bad
        In RL the critic regresses onto returns that change as the policy improves: its loss usually
        rises while the policy gets better (longer episodes, larger returns), unlike a supervised loss.
        Read as divergence, it leads to lowering the learning rate of a run that was fine.
    Example
        PPO on CartPole: value_loss 0.8 -> 45 over 100k steps while ep_rew_mean 20 -> 500.
    Use instead
        Judge the critic by explained variance (SB3 logs train/explained_variance; near 1 is good) and
        the policy by its return; normalise rewards (VecNormalize(norm_reward=True)) to keep the value
        targets on a stable scale.
    Known problems
        Not a test: it skips with the report by design.
    Not applicable
        Runs without a critic (GRPO and other critic-free methods): a dlcheck_train_log without a value
        loss; pipelines that are not reinforcement learning (no RL role given).
    """
    log = dlcheck.role("train_log")
    if log is MISSING:
        _require_rl(dlcheck)
        dlcheck.skip(
            "info: a rising critic (value) loss is normal in RL while returns grow; judge the critic by "
            "explained variance (SB3 train/explained_variance), not by its loss"
        )
    key, values = rl.log_series(log, "value_loss")
    reward_key, rewards = rl.log_series(log, "reward")
    if not values:
        dlcheck.not_applicable(
            "dlcheck_train_log logs no value loss under a tag R5 knows (train/value_loss, value_loss, loss/value, "
            "vf_loss, or a tag such as losses/qf_loss, losses/td_loss): no critic loss to read (a run without a critic, "
            "GRPO, logs none; a value-based agent's loss under a plain tag such as losses/loss is not told from "
            "another loss)"
        )
    parts = [
        f"info: {key} went from {values[0][1]:.3g} (step {values[0][0]}) to {values[-1][1]:.3g} (step {values[-1][0]})"
    ]
    if rewards:
        parts.append(f"{reward_key} from {rewards[0][1]:.3g} to {rewards[-1][1]:.3g}")
    parts.append(
        "a critic loss that rises with the returns is the critic tracking larger targets, not divergence; "
        "check explained variance"
    )
    dlcheck.skip("; ".join(parts))


@check(
    "R6", domain="rl", title="one seed read as a result (info: reports the seeds seen)", optional_roles=("algorithm",)
)
def check_single_seed(dlcheck):
    """Information: RL results need several seeds; this item says what a single run can and cannot show.

    What it does
        Nothing is judged. The item skips with a note naming the seed of dlcheck_algorithm when there is
        one, and what a comparison between runs needs.
    Why it is bad
        RL returns vary widely across seeds: the same algorithm and hyperparameters can land on curves
        that look like different methods (Henderson et al. 2018, Agarwal et al. 2021). A single seed
        that "beats the baseline" is an anecdote.
    Example
        PPO("MlpPolicy", env, seed=0) vs. a baseline run once: "+15% return".
    Use instead
        Run 5-10 seeds per configuration and report the interquartile mean with bootstrap confidence
        intervals (rliable), or at least mean ± standard error over seeds.
    Known problems
        Not a test: it skips with the note by design; the checks cannot see runs outside this session.
    Not applicable
        Pipelines that are not reinforcement learning (no RL role given); the note concerns every RL
        result.
    """
    algo = dlcheck.role("algorithm")
    if algo is MISSING:
        _require_rl(dlcheck)
    seed = getattr(algo, "seed", None) if algo is not MISSING else None
    seen = f"dlcheck_algorithm was built with seed={seed}; " if seed is not None else ""
    dlcheck.skip(
        f"info: {seen}one seed is an anecdote: compare configurations over 5-10 seeds with the interquartile "
        "mean and bootstrap confidence intervals (rliable)"
    )
