"""Runtime detectors on a short real run of the user's training (a Trainer clone's ``train()``, a
Lightning ``fit``, or the user's own step on fresh objects). One run is shared by S1-S5; its length is
the setting ``S1.steps`` (``--dlcheck-set S1.steps=50``)."""

from __future__ import annotations

from ...registry import applicability
from ..shared.training_users import rl_agent_only


@applicability("smoke")
def concerns_smoke(ctx) -> str | None:
    """Not applicable to a reinforcement-learning agent with no supervised training, decided from its objects
    (``checks.shared.training_users.rl_agent_only``); otherwise a missing role stays one."""
    return rl_agent_only(ctx, "smoke")
