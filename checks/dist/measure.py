"""The dist domain's shared measurement: one launch of the user's loop per session (memoized), what a
rank's failure means for a check, and the single-process reference step of D2."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from typing import Any

from ...errors import MISSING, RoleError
from ...training import SetupError, get_setup, memo_or_skip
from ...training.setup import root_cause
from .launch import Job, Launch, launch

#: micro-steps every rank trains before the checkpoint and the non-finite step
STEPS = 3
LAUNCH_LIMIT = 120.0
HANG_LIMIT = 8.0
#: the shortest process-group timeout: the ranks of a launch start together (forked), their first collectives
#: (DDP's broadcast of a small model) take well under a second
MIN_COLLECTIVE_TIMEOUT = 5.0

RUN_ROLES = (
    "make_training",
    "dist_wrap",
    "dist_setup",
    "make_dataloader",
    "start_epoch",
    "train_step",
    "compute_loss",
    "loss_fn",
    "dataloader",
    "save_checkpoint",
    "load_checkpoint",
    "trainer",
)

#: why the other checks do not judge a transformers / TRL Trainer's launch yet (D1 does; D5 asks for its roles)
TRAINER_NOT_YET = {
    "D2": "the single-process reference step needs the first distributed step's batches and gradients, which the "
    "Trainer's own train() loop does not hand out: D2 is not measured for a Trainer yet",
    "D3": "the Trainer builds its sharded DataLoader inside train(): its shards are not listed for a Trainer yet",
    "D5": "the Trainer saves and loads its checkpoints inside train() (_save_checkpoint on the main process, "
    "resume_from_checkpoint): the ranks' writes and loads are not recorded for a Trainer yet",
    "D6": "the injected non-finite micro-step runs outside the Trainer's train() loop: not measured for a Trainer yet",
    "D8": "the Trainer builds and steps its LR scheduler inside train() (sized from each process's own DataLoader, "
    "stepped once per optimizer step): its schedule on N processes is not recorded for a Trainer yet",
}


def world_size(dlcheck: Any) -> int:
    value = dlcheck.request.config.getoption("dlcheck_world_size", None)
    return int(value) if value else 2


def _value(v: Any) -> Any:
    return None if v is MISSING else v


def the_setup(dlcheck: Any, *loop_roles: str) -> Any:
    """The user's plain loop, Accelerate loop or transformers Trainer (the kinds the dist domain launches). A plain
    loop must say how it runs distributed (``dlcheck_dist_wrap``, and ``loop_roles``); an Accelerate user's
    ``accelerator.prepare`` wraps the model and shards the loader itself; a Trainer's ``train()`` does both (its
    launch serves D1 only yet: the other checks skip, saying why)."""
    if not dlcheck.has("make_training"):
        if dlcheck.has("lightning_module"):
            dlcheck.skip(
                "the dist domain launches plain loops, Accelerate loops and transformers / TRL Trainers only yet; "
                "a LightningModule is not launched in several processes"
            )
        if not dlcheck.has("trainer"):
            dlcheck.require("make_training")
    setup = get_setup(dlcheck)
    if setup.kind == "trainer":
        if dlcheck.check.id in TRAINER_NOT_YET:
            dlcheck.skip(TRAINER_NOT_YET[dlcheck.check.id])
        if setup.grpo or setup.preference:
            dlcheck.skip(
                f"your {setup.name} generates or pairs its batches inside its step: the dist domain launches "
                "supervised Trainers (transformers Trainer, SFTTrainer) only yet"
            )
        return setup
    if setup.kind == "loop":
        dlcheck.require("dist_wrap", *loop_roles)
    elif setup.kind != "accelerate":
        dlcheck.skip(
            "the dist domain launches plain loops, Accelerate loops (dlcheck_make_training) and transformers / TRL "
            "Trainers (dlcheck_trainer) only yet"
        )
    return setup


def _rank_setup(dlcheck: Any) -> Any:
    """The user's setup as the ranks get it: written under the launch's directory only (a spawn pickles it),
    without the parent's first kept state (an Accelerator in it is the parent's, not a rank's)."""
    original = the_setup(dlcheck)
    setup = copy.copy(original)
    # copy.copy goes through __getstate__, which leaves dlcheck_resume_dataloader out for a spawned rank (pickled):
    # forked ranks share this process's objects, and the user's epoch loop after a resume goes with them
    if "resume_loader" in vars(original):
        setup.resume_loader = original.resume_loader
    if "start_epoch" in vars(original):
        setup.start_epoch = original.start_epoch
    setup.tmp = None
    setup.__dict__.pop("_kept", None)
    if "make_room" in vars(setup):  # the session's (a bound method of its state): nothing of it goes to a rank
        setup.make_room = _no_room
    return setup


def _no_room() -> None:
    """A rank's ``make_room``: the session's spares live in the pytest process, not in the rank."""


def bounds(dlcheck: Any) -> tuple[float, float]:
    """(the launch's wall-clock limit, the process group's timeout), from the check's own time bound
    (``--dlcheck-timeout``): a collective that never completes raises in its rank within a quarter of the launch's
    limit (gloo's default, 60 s, would outlast a short bound), and the launch ends well within the check's bound."""
    from ...session import session_state

    bound = session_state(dlcheck.request.config).timeout or 0
    limit = min(LAUNCH_LIMIT, 0.75 * bound) if bound else LAUNCH_LIMIT
    return limit, min(60.0, max(MIN_COLLECTIVE_TIMEOUT, limit / 4))


def _job(roles: dict[str, Any], setup: Any, world: int, out: str, **extra: Any) -> Job:
    """What every rank of a launch runs: the user's roles (None where not given) and the setup."""
    return Job(
        world=world,
        out=out,
        steps=STEPS,
        make_training=roles["make_training"],
        setup=setup,
        loader=_value(roles["dataloader"]),
        save=_value(roles["save_checkpoint"]),
        load=_value(roles["load_checkpoint"]),
        wrap=_value(roles["dist_wrap"]),
        dist_setup=_value(roles["dist_setup"]),
        make_dataloader=_value(roles["make_dataloader"]),
        start_epoch=_value(roles["start_epoch"]),
        **extra,
    )


def get_launch(dlcheck: Any) -> Launch:
    """The session's launch of the user's loop at ``--dlcheck-world-size`` (shared by D1–D6)."""
    setup = _rank_setup(dlcheck)
    roles = {name: dlcheck.role(name) for name in RUN_ROLES}
    world = world_size(dlcheck)
    tmp = dlcheck.request.getfixturevalue("tmp_path_factory")

    limit, pg_timeout = bounds(dlcheck)

    def run() -> Launch:
        job = _job(roles, setup, world, str(tmp.mktemp("dlcheck-dist")), pg_timeout=pg_timeout)
        return launch(job, limit=limit, hang=HANG_LIMIT)

    return memo_or_skip(dlcheck, tuple(roles.values()), f"dist:launch:{world}", run)


def save_at(dlcheck: Any, base: Launch, world: int) -> Launch:
    """A launch at world size ``world`` that trains, saves with dlcheck_save_checkpoint and loads it back, with
    no non-finite step (D5: the checkpoint to load at the session's world size)."""
    setup = _rank_setup(dlcheck)
    roles = {name: dlcheck.role(name) for name in RUN_ROLES}
    tmp = dlcheck.request.getfixturevalue("tmp_path_factory")

    limit, pg_timeout = bounds(dlcheck)

    def run() -> Launch:
        job = _job(
            roles, setup, world, str(tmp.mktemp(f"dlcheck-dist-save{world}")), mode="save", pg_timeout=pg_timeout
        )
        return launch(job, limit=limit, hang=HANG_LIMIT)

    return memo_or_skip(dlcheck, (*roles.values(), base), f"dist:save:{world}", run)


def reload_at(dlcheck: Any, base: Launch, world: int, path: str) -> Launch:
    """A launch at world size ``world`` that only loads ``path`` (D5: a sharded checkpoint saved at another
    world size, ``base`` the launch that wrote it)."""
    roles = {name: dlcheck.role(name) for name in RUN_ROLES}
    tmp = dlcheck.request.getfixturevalue("tmp_path_factory")
    limit, pg_timeout = bounds(dlcheck)

    def run() -> Launch:
        job = Job(
            world=world,
            out=str(tmp.mktemp("dlcheck-dist-reload")),
            pg_timeout=pg_timeout,
            steps=0,
            make_training=roles["make_training"],
            load=_value(roles["load_checkpoint"]),
            wrap=_value(roles["dist_wrap"]),
            dist_setup=_value(roles["dist_setup"]),
            mode="load",
            load_path=path,
        )
        return launch(job, limit=limit, hang=HANG_LIMIT)

    return memo_or_skip(dlcheck, (*roles.values(), base), f"dist:reload:{base.world}to{world}", run)


def records(dlcheck: Any, run: Launch, stage: str) -> list[Any]:
    """Every rank's record of ``stage``; when a rank did not get there, the reason is raised: the user's
    role that raised (naming the rank), a hang (where each rank was), or a setup problem (a skip)."""
    got = run.stage(stage)
    if got is not None:
        return got
    raise_failure(dlcheck, run, stage)


def collective_failure(err: dict[str, Any]) -> bool:
    """The error of a rank whose collective failed because another rank went away or never came."""
    text = str(err.get("message", ""))
    return any(k in text for k in ("gloo", "Connection reset", "Connection closed", "NCCL", "imed out", "Timeout"))


def _position(r: Any) -> tuple[str, str]:
    """(the part of the script a rank was in, the user's frame it stood at) from its progress and its error."""
    last = r.last
    if last.startswith("in dlcheck_"):
        part = last.removeprefix("in ")
    elif last.startswith("step "):
        part = f"dlcheck_train_step (micro-step {int(last.split()[1]) + 1})"
    elif last.startswith("non-finite step"):
        part = "dlcheck_train_step (D6's non-finite micro-step)"
    else:
        part = last
    found = re.search(r"\(in (\S+) at ([^()]+)\)\s*$", str((r.error or {}).get("message", "")))
    return part, (f"{found.group(1)} at {found.group(2)}" if found else "")


def unmatched_collective(dlcheck: Any, run: Launch) -> None:
    """A collective that never completed because the ranks were not running the same one: a rank timed out
    waiting in it while another rank stood elsewhere in the script. D1 fails naming both; the other checks skip
    naming D1. Returns when the ranks' failures are not that."""
    timed = [r for r in run.ranks if r.error and "imed out" in str(r.error.get("message", ""))]
    if not timed or any(r.error and not collective_failure(r.error) for r in run.ranks):
        return
    positions = {r.rank: _position(r) for r in run.ranks}
    waiter = timed[0]
    here = positions[waiter.rank]
    away = [r for r in run.ranks if positions[r.rank] != here]
    if not away:
        return
    if dlcheck.check.id != "D1":
        dlcheck.skip(
            f"the ranks did not run the same collectives (rank {waiter.rank} waited in {here[0]} for rank "
            f"{away[0].rank}): D1 reports it"
        )

    def at(r: Any) -> str:
        part, frame = positions[r.rank]
        return part + (f" ({frame})" if frame else "")

    reason = str(waiter.error.get("message", "")).split("] ", 1)[-1].split(" (in ", 1)[0][:120]
    others = ", ".join(str(r.rank) for r in away)
    evidence = [
        f"rank {waiter.rank} of {run.world} waited in a collective in {at(waiter)} until the process group's timeout "
        f"({run.pg_timeout:g} s, set from the check's time bound): {reason}",
        *(
            f"rank {r.rank} was in {at(r)} meanwhile: it never called that collective"
            + (" (it then lost its peer)" if r.error else " (stopped by the launch)")
            for r in away
        ),
    ]
    dlcheck.fail(
        evidence,
        f"the ranks do not run the same collectives in the same order: rank{'s' if len(away) > 1 else ''} {others} "
        f"never joined the one rank {waiter.rank} waits in — a DistributedDataParallel wrap, a dist.barrier() or a "
        "collective run on some ranks only (under `if rank == 0:`, a main-process-only block)",
        "run DistributedDataParallel(model), dist.barrier() and every collective on every rank, in the same order; "
        "keep under `if dist.get_rank() == 0:` only what needs no other rank (logging, writing a file)",
        waiting_rank=waiter.rank,
        absent_ranks=[r.rank for r in away],
    )


def raise_failure(dlcheck: Any, run: Launch, stage: str) -> Any:
    where = "; ".join(f"rank {r.rank}: {r.last}" for r in run.ranks)
    unmatched_collective(dlcheck, run)
    # the first rank that raised on its own, before those whose collective broke because it had gone
    for r in sorted(run.errors, key=lambda r: (collective_failure(r.error or {}), (r.error or {}).get("time", 0))):
        err = r.error or {}
        # root cause first: an error another check explains (image tokens cut by truncation: X4) is a skip
        # naming that check, as in the single-process training checks
        reason = root_cause(RuntimeError(str(err.get("message", ""))))
        if reason:
            dlcheck.skip(f"rank {r.rank}: {reason}")
        if err.get("role"):
            raise RoleError(err["role"], f"on rank {r.rank} of {run.world}: {err['message']}")
        if err.get("type") == "SetupError":
            dlcheck.skip(f"rank {r.rank}: {err['message'].split(': ', 1)[-1]}")
    if run.errors:
        r = run.errors[0]
        raise RuntimeError(f"rank {r.rank} of the dist launch failed: {(r.error or {}).get('traceback', '')}")
    stuck = [r for r in run.ranks if r.killed]
    if stuck:
        role = "train_step"
        last = stuck[0].last
        if last.startswith("in dlcheck_"):
            role = last.removeprefix("in dlcheck_")
        raise RoleError(
            role,
            f"the {run.world} ranks did not get through the {stage!r} stage within {run.wall:.0f} s (stopped there: "
            f"{where}): a rank waits in a collective (all_reduce, barrier) that another rank never calls",
        )
    dlcheck.skip(f"the ranks wrote no {stage!r} record ({where})")


# --------------------------------------------------------------------------------------------------
# comparisons


def first_difference(per_rank: list[dict[str, str]]) -> tuple[str, int] | None:
    """(tensor name, rank) of the first tensor whose digest differs from rank 0's."""
    base = per_rank[0]
    for name in base:
        for r, other in enumerate(per_rank[1:], start=1):
            if other.get(name) != base[name]:
                return name, r
    for r, other in enumerate(per_rank[1:], start=1):
        extra = set(other) - set(base)
        if extra:
            return sorted(extra)[0], r
    return None


def largest_differences(per_rank: list[dict[str, Any] | None]) -> list[tuple[str, int, float]]:
    """(tensor name, rank, max |diff| from rank 0's) of every tensor that differs, the largest first; empty when
    the tensors were not sent back (a large model: its digests say which differ, not by how much)."""
    if not per_rank or any(t is None for t in per_rank):
        return []
    base = per_rank[0]
    found = []
    for name in base:
        sizes = [(max_diff(base[name], other.get(name)), r) for r, other in enumerate(per_rank[1:], start=1)]
        sizes = [(d, r) for d, r in sizes if d is not None and d != 0]
        if sizes:
            d, r = max(sizes)
            found.append((name, r, d))
    return sorted(found, key=lambda f: -f[2])


def drift(recs: list[dict[str, Any]]) -> str | None:
    """Why the replicas already differ before the checkpoint and the non-finite step, naming the check that
    reports it (D4: the initialisation, D1: a step), or None when they are identical after every step."""
    init = first_difference([r["init"] for r in recs])
    if init is not None:
        return (
            f"the replicas already differ before the first step (parameter {short(init[0])!r}, rank {init[1]}): "
            "D4 reports the initialisation"
        )
    for s in range(min(len(r["steps"]) for r in recs)):
        for kind in ("params", "opt"):
            diff = first_difference([r["steps"][s][kind] for r in recs])
            if diff is not None:
                return (
                    f"the replicas already differ after micro-step {s + 1} ({short(diff[0])!r}, rank {diff[1]}): "
                    + (
                        f"your loop averages the replicas every {recs[0]['local_sgd'].get('steps')} steps with "
                        "accelerate's LocalSGD, so they differ in between by design (D1 says so)"
                        if recs[0].get("local_sgd")
                        else "D1 reports the lost synchronisation"
                    )
                )
    return None


def max_diff(a: Any, b: Any) -> float | None:
    if a is None or b is None:
        return None
    try:
        return float((a.double() - b.double()).abs().max())
    except Exception:  # noqa: BLE001 - shapes differ: no number for the evidence
        return None


def short(name: str) -> str:
    return name if len(name) <= 60 else "…" + name[-59:]


# --------------------------------------------------------------------------------------------------
# D2: the single-process step on the concatenated batch


def _pad_value(key: str) -> int:
    return -100 if "label" in key else 0


def concat(batches: list[Any], key: str = "") -> Any:
    import torch
    import torch.nn.functional as F

    first = batches[0]
    if isinstance(first, torch.Tensor):
        if first.dim() >= 2 and len({b.shape[1] for b in batches}) > 1:
            width = max(b.shape[1] for b in batches)
            batches = [
                F.pad(b, (0, 0) * (b.dim() - 2) + (0, width - b.shape[1]), value=_pad_value(key)) for b in batches
            ]
        return torch.cat(batches, 0)
    if isinstance(first, Mapping):
        return {k: concat([b[k] for b in batches], str(k)) for k in first}
    if isinstance(first, (list, tuple)):
        if first and all(isinstance(x, torch.Tensor) for x in first):
            return type(first)(concat([b[i] for b in batches], key) for i in range(len(first)))
        return [x for b in batches for x in b]
    raise SetupError(f"cannot concatenate batches of type {type(first).__name__}")


def supervised_tokens(batch: Any) -> int | None:
    import torch

    labels = batch.get("labels") if isinstance(batch, Mapping) else None
    if not isinstance(labels, torch.Tensor) or labels.dim() < 2:
        return None
    return int((labels != -100).sum())


def reference_grads(setup: Any, init: dict[str, Any], batch: Any) -> dict[str, Any]:
    """The gradient of the user's loss (dlcheck_compute_loss, or the model's own) on ``batch`` in one
    process, from the weights every rank started with (fresh objects from the factory, dropout off)."""
    import torch

    from ...guard import preserved_rng
    from .launch import unwrap

    with preserved_rng():
        state = setup.state()
        model = state["model"]
        # named as the ranks name them: the module inside a wrapper the factory applies (Lightning Fabric's
        # fabric.setup returns a _FabricModule, whose own names carry _forward_module.)
        inner = unwrap(model)
        with torch.no_grad():
            for n, p in inner.named_parameters():
                if n in init:
                    p.copy_(init[n].to(p.device))
        from ..shared.dropout import quiet_dropout

        quiet_dropout(model)  # layers and the float attention-dropout attributes (fresh objects: nothing to put back)
        model.train()
        loss = setup.loss_of(model, batch)
        named = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: g.detach().cpu() for (n, _), g in zip(named, grads) if g is not None}


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float, float] | None:
    """(relative difference |a-b|/|b|, cosine, norm ratio |a|/|b|) over the tensors both have."""
    names = [n for n in a if n in b and a[n].shape == b[n].shape]
    if not names:
        return None
    dot = na = nb = nd = 0.0
    for n in names:
        x, y = a[n].double(), b[n].double()
        dot += float((x * y).sum())
        na += float((x * x).sum())
        nb += float((y * y).sum())
        nd += float(((x - y) ** 2).sum())
    if nb == 0 or na == 0 or not all(map(math.isfinite, (dot, na, nb, nd))):
        return None
    return math.sqrt(nd / nb), dot / math.sqrt(na * nb), math.sqrt(na / nb)


def batch_rows(batch: Any) -> int | None:
    from ...training import batch_len

    try:
        return batch_len(batch)
    except Exception:  # noqa: BLE001 - only for the evidence's wording
        return None
