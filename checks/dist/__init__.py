"""Checks of distributed data-parallel training (dist): the user's own loop run in N real processes.

The run is a plain loop or an Accelerate loop (``dlcheck_make_training`` + ``dlcheck_train_step``, the train
domain's roles; :mod:`.accelerate` for what an Accelerate user's ranks do) started the way torchrun starts it: N processes (``--dlcheck-world-size``, default 2), ``torch.distributed``
with the ``env://`` rendezvous (MASTER_ADDR / MASTER_PORT on a free port, RANK / WORLD_SIZE / LOCAL_RANK),
the gloo backend on CPU. In every process the user's roles run in the order a training script runs them;
the roles declared here are the distributed parts of the script:

- ``dlcheck_dist_wrap`` (required of a plain loop: it is what says the training runs distributed; an
  Accelerate user's ``accelerator.prepare`` wraps the model itself);
- ``dlcheck_dist_setup``, ``dlcheck_make_dataloader``, ``dlcheck_start_epoch`` (optional);
- ``dlcheck_dist_eval`` and ``dlcheck_make_eval_dataloader``: the evaluation D7 judges.

One launch per session is shared by D1–D6 (:mod:`.launch` runs it, :mod:`.measure` memoizes it); D7 evaluates in a
launch of its own (:mod:`.evaluation` says why)."""

from __future__ import annotations

from ...registry import applicability
from ...roles import a_callable, role
from ..shared.training_users import rl_agent_only

role(
    "dist_wrap",
    "callable (state) -> state: what your script does, in every process, to the fresh objects of "
    "dlcheck_make_training once the process group is up: wrap the model in DistributedDataParallel (and "
    "build the optimizer on it when yours needs the wrapped parameters); return the dict your step takes "
    "(return it unchanged when dlcheck_make_training wraps already; an Accelerate user needs none: "
    "accelerator.prepare wraps the model in every process)",
    expect=a_callable("the wrap of your fresh training objects"),
)
role(
    "dist_setup",
    "callable (rank, world_size): the start of your script in every process, run right after "
    "init_process_group and before dlcheck_make_training (seeding: torch.manual_seed(seed + rank), …); "
    "default: nothing, the random generators are those of a fresh process",
    expect=a_callable("the per-process start of your script"),
)
role(
    "make_dataloader",
    "callable () -> this process's DataLoader, called in every process once the process group is up "
    "(build the DistributedSampler inside: it finds its rank and world size itself); default: "
    "dlcheck_dataloader, the same in every process",
    expect=a_callable("a factory of this rank's DataLoader"),
)
role(
    "start_epoch",
    "callable (state, dataloader, epoch): the top of your epoch loop, as your script runs it before "
    "iterating the dataloader (dataloader.sampler.set_epoch(epoch), …)",
    expect=a_callable("the top of your epoch loop"),
)

role(
    "dist_eval",
    "callable (state, eval_dataloader) -> what your evaluation computes in every process (D7): the predictions "
    "your metric is computed over, gathered across the ranks (a tensor / array with a row per prediction, a tuple "
    "or dict of them, a list), or the metric itself (a number or a dict of numbers); None on the ranks that report "
    "nothing. Run it as your script does: its own model.eval(), gather (accelerator.gather_for_metrics, "
    "dist.all_gather) or reductions (dist.all_reduce), compute_metrics",
    expect=a_callable("your distributed evaluation"),
)
role(
    "make_eval_dataloader",
    "callable () -> this process's eval DataLoader, called in every process once the process group is up "
    "(DistributedSampler(eval_set, shuffle=False) inside, …); an Accelerate user may instead return the prepared "
    "eval DataLoader from dlcheck_make_training under a key naming 'eval'",
    expect=a_callable("a factory of this rank's eval DataLoader"),
)


@applicability("dist")
def concerns_dist(ctx) -> str | None:
    """Not applicable to a reinforcement-learning agent with no supervised training, decided from its objects
    (``checks.shared.training_users.rl_agent_only``); otherwise a missing role stays one."""
    return rl_agent_only(ctx, "dist")
