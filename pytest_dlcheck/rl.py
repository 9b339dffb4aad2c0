"""The rl domain's public API, for a user's conftest.py and their own Hypothesis tests: declare how R7
calls a hand-written advantage function (or an off-policy loop's TD target: td_target_fn, Transitions), and generate rollouts / GRPO reward groups.

    from pytest_dlcheck.rl import advantage_fn

    @pytest.fixture(scope="session")
    def dlcheck_advantage_fn():
        return advantage_fn(compute_gae, arrays="torch")

The implementation lives with the rl checks (``pytest_dlcheck.checks.rl.measure``); this module is the
one place the core names a check module (the import contracts allow exactly this import)."""

from .checks.rl.measure import (
    AUTORESET_MODES,
    NEXT_STEP,
    SAME_STEP,
    AdvantageFn,
    Rollout,
    TDTargetFn,
    Transitions,
    advantage_fn,
    reward_groups,
    rollouts,
    td_target_fn,
)

__all__ = [
    "AUTORESET_MODES",
    "NEXT_STEP",
    "SAME_STEP",
    "AdvantageFn",
    "Rollout",
    "TDTargetFn",
    "Transitions",
    "advantage_fn",
    "reward_groups",
    "rollouts",
    "td_target_fn",
]
