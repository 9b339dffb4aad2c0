from __future__ import annotations

import math
from typing import Any

from ...registry import Setting, check
from ...training import get_setup, smoke_run


class _Plan:
    """The optimizer steps a Trainer's arguments plan, and the warmup it asks for."""

    def __init__(self, trainer):
        args = trainer.args
        self.args = args
        self.batch = max(1, args.per_device_train_batch_size)
        try:
            n = len(trainer.train_dataset)
            self.per_epoch = n // self.batch if args.dataloader_drop_last else math.ceil(n / self.batch)
        except TypeError:  # an iterable dataset: its length is unknown, max_steps is the plan
            self.per_epoch = 0
        self.accum = max(1, args.gradient_accumulation_steps)
        self.epochs = math.ceil(args.num_train_epochs)
        self.max_steps = args.max_steps if args.max_steps and args.max_steps > 0 else 0
        #: the optimizer steps the epochs plan, whether or not max_steps stops the Trainer sooner
        self.by_epochs = math.ceil(self.per_epoch / self.accum) * self.epochs if self.per_epoch else 0
        #: max_steps stops the handed-over Trainer before its epochs end (a Trainer shortened for the tests)
        self.shortened = bool(self.max_steps and self.by_epochs > self.max_steps)
        #: the judged run: at first the handed-over Trainer's own (max_steps wins, as in Trainer.train())
        self.total = self.max_steps or self.by_epochs
        self.warmup = self.warmup_of(self.total)

    def warmup_of(self, total: int) -> int:
        return int(self.args.get_warmup_steps(total)) if total else 0

    def micro_batches(self) -> int:
        """The micro-batches of the judged run."""
        if self.per_epoch and self.total == self.by_epochs:
            return self.per_epoch * self.epochs
        return self.total * self.accum


def _trainer_schedule(trainer) -> _Plan | None:
    plan = _Plan(trainer)
    return plan if plan.total else None


def _warmup_cause(plan: _Plan) -> str:
    """What the evidence shows about a warmup longer than the run (the cause names only what the numbers fit)."""
    micro = plan.micro_batches()
    if plan.accum > 1 and plan.warmup <= micro:
        return (
            f"the warmup is longer than the run and fits in its {micro} micro-batches: warmup counted in "
            "micro-batches instead of optimizer steps (each optimizer step is gradient_accumulation_steps="
            f"{plan.accum} micro-batches)"
        )
    if plan.warmup <= micro * plan.batch:
        return (
            f"the warmup is longer than the run and fits in its {micro * plan.batch} samples: warmup counted in "
            "samples instead of optimizer steps (each optimizer step is per_device_train_batch_size x "
            "gradient_accumulation_steps samples)"
        )
    return (
        f"the warmup is longer than the run: warmup_steps asks for {plan.warmup} optimizer steps and the run has "
        f"{plan.total} (a warmup taken from a longer run's configuration)"
    )


def _horizon(scheduler: Any) -> tuple[int, str] | None:
    """(the optimizer steps a scheduler is sized for, the argument that says so), or None when it does not say:
    transformers' get_*_schedule_with_warmup (num_training_steps, in the LambdaLR's partial), OneCycleLR
    (total_steps), CosineAnnealingLR (T_max)."""
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate's AcceleratedScheduler
    name = type(inner).__name__
    if name == "OneCycleLR" and isinstance(getattr(inner, "total_steps", None), int):
        return inner.total_steps, "OneCycleLR(total_steps)"
    if name == "CosineAnnealingLR" and isinstance(getattr(inner, "T_max", None), int):
        return inner.T_max, "CosineAnnealingLR(T_max)"
    for fn in getattr(inner, "lr_lambdas", None) or []:
        total = (getattr(fn, "keywords", None) or {}).get("num_training_steps")
        if isinstance(total, int) and total > 0:
            return total, f"num_training_steps={total} ({getattr(getattr(fn, 'func', None), '__name__', 'LambdaLR')})"
    return None


def _sized_for_the_run(dlcheck: Any, setup: Any, scheduler: Any, micro: int, opt_steps: int) -> str | None:
    """A loop that says its epochs (dlcheck_num_epochs): fails when its scheduler is sized for another number of
    optimizer steps than the run takes (len(loader) x epochs / the micro-batches per optimizer step of the smoke
    run), by more than 1.5x either way; what was compared, or None when it cannot be told."""
    epochs = dlcheck.role("num_epochs")
    horizon = _horizon(scheduler)
    loader = getattr(setup, "loader", None)
    try:
        per_epoch = len(loader)
    except TypeError:
        return None
    if not isinstance(epochs, (int, float)) or epochs <= 0 or horizon is None or not per_epoch or not opt_steps:
        return None
    accum = max(1, round(micro / opt_steps))
    planned = max(1, int(per_epoch * epochs) // accum)
    total, said = horizon
    line = (
        f"the scheduler is sized for {total} optimizer steps ({said}); the run takes {planned} "
        f"({per_epoch} batches an epoch x dlcheck_num_epochs={epochs:g}"
        + (f", one optimizer step every {accum} micro-batches" if accum > 1 else "")
        + ")"
    )
    ratio = total / planned
    if 1 / 1.5 <= ratio <= 1.5:
        return line
    if ratio > 1.5:
        cause = (
            f"the schedule is sized for {ratio:.1f}x the optimizer steps the run takes"
            + (
                f" (counted in micro-batches, len(loader) x epochs, while the optimizer steps every {accum})"
                if accum > 1 and abs(ratio - accum) < 0.5
                else ""
            )
            + f": the run ends {planned / total:.0%} of the way through its warmup and decay"
        )
    else:
        cause = (
            f"the schedule is sized for {total} optimizer steps, {1 / ratio:.1f}x fewer than the run takes: it ends "
            "early and the rest of the run trains at its final learning rate"
        )
    dlcheck.fail(
        [line],
        cause,
        "size the schedule in optimizer steps: num_training_steps = len(train_dataloader) // "
        "gradient_accumulation_steps * num_epochs (Accelerate: math.ceil(len(train_dataloader) / "
        "gradient_accumulation_steps) * num_epochs)",
        horizon=total,
        planned=planned,
    )
    return None


@check(
    "T6",
    domain="train",
    title="LR schedule counted in the wrong units (micro-batches), or the LR never ramps",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "train_step", "dataloader", "num_epochs"),
    settings=(
        Setting(
            "max_sched_per_opt",
            1.5,
            "lr_scheduler.step() calls per optimizer.step() above which the schedule "
            "advances in micro-batches; a per-step schedule makes exactly 1",
        ),
    ),
)
def check_lr_schedule(dlcheck):
    """The LR schedule advances once per optimizer step, warms up within the run, and the LR is not stuck at 0.

    What it does
        On the shared smoke run (see S1) of a plain loop, an Accelerate loop or a LightningModule (automatic or
        manual optimization, the schedulers of ``configure_optimizers`` and those kept in the module's
        attributes and stepped by hand), counts ``optimizer.step()`` and
        ``lr_scheduler.step()`` calls (a GradScaler-skipped step counts as taken): more scheduler steps than
        optimizer steps means the schedule is counted in micro-batches. For a Trainer, compares the warmup
        (``warmup_steps`` / ``warmup_ratio``) with the optimizer steps of the run (max_steps, or epochs x
        micro-batches / gradient_accumulation_steps). A handed-over Trainer whose ``max_steps`` stops it before
        its epochs end (``max_steps=10`` to keep the tests short) plans a shorter run than the one launched: its
        warmup is judged against the run its epochs plan, and the pass says so. The cause names what the numbers
        fit: a warmup within the run's micro-batches (with accumulation) or samples, else a warmup longer than
        the run. A plain or Accelerate loop that says its epochs (``dlcheck_num_epochs``) has its scheduler's
        size (transformers' ``num_training_steps``, OneCycleLR's ``total_steps``, CosineAnnealingLR's ``T_max``)
        compared with the optimizer steps the run takes (batches an epoch x epochs / the micro-batches per
        optimizer step of the smoke run): more than 1.5x apart either way fails. For every kind, fails when the
        learning rate is 0 at every optimizer step of the smoke run.
    Why it is bad
        With gradient accumulation of k, a scheduler stepped every micro-batch runs k times too fast: a
        1000-step warmup ends after 1000/k updates and the decay reaches its floor at 1/k of the run.
        Counting warmup in micro-batches or samples (``len(dataloader) * epochs``) makes it k times too long:
        the LR may never reach its peak. A warmup scheduler that is never stepped keeps the LR at 0.
    Example
        loss.backward()
        if (i + 1) % accum == 0: optimizer.step(); optimizer.zero_grad()
        scheduler.step()                       # every micro-batch
        # Lightning, automatic_optimization = False: opt.step() every N batches, self.lr_schedulers().step()
        # every batch
    Use instead
        step the scheduler right after optimizer.step(), inside the accumulation branch (under Lightning's
        manual optimization: sch.step() right after opt.step()); compute
        warmup/total steps in optimizer steps: len(dataloader) // accum * epochs.
    Known problems
        A scheduler stepped per epoch in your own epoch loop is not seen by the short run (it is not
        reported). ReduceLROnPlateau is not judged. A Trainer shortened with ``max_steps`` is judged on the run its
        epochs plan: a run really launched with that ``max_steps`` and a longer warmup is not reported (which of
        the two you launch cannot be told from the Trainer); with an iterable dataset ``max_steps`` is the run.
    Not applicable
        None among runs that take optimizer steps: each has a learning rate to follow.
    """
    setup = get_setup(dlcheck)
    evidence, cause, fix = [], "", ""
    judged: list[str] = []
    plan = None
    if setup.kind == "trainer":
        plan = _trainer_schedule(setup.trainer)
        if plan is not None:
            short = ""
            if plan.shortened and plan.warmup > plan.max_steps:
                # a test's short Trainer (max_steps=10 on a run its epochs plan longer): the warmup is judged
                # against the run the user launches without max_steps, the one its epochs plan
                plan.total, plan.warmup = plan.by_epochs, plan.warmup_of(plan.by_epochs)
                short = (
                    f"the handed-over Trainer plans a shorter run than its epochs: max_steps={plan.max_steps} stops "
                    f"it before its warmup of {plan.warmup_of(plan.max_steps)} optimizer steps ends; judged against "
                    f"the {plan.total} optimizer steps its {plan.epochs} epochs plan (the run without max_steps)"
                )
            if plan.warmup > plan.total:
                micro = (
                    f", {plan.per_epoch} micro-batches per epoch with gradient_accumulation_steps={plan.accum}"
                    if plan.per_epoch
                    else ""
                )
                evidence = [
                    f"warmup of {plan.warmup} optimizer steps for a run of {plan.total} optimizer steps{micro}",
                    f"the LR ends the run at {min(1.0, plan.total / plan.warmup):.0%} of learning_rate="
                    f"{setup.trainer.args.learning_rate:g}: it never reaches its peak",
                ]
                if short:
                    evidence.append(short)
                cause = _warmup_cause(plan)
                fix = (
                    "set warmup_steps in optimizer steps (len(train_dataloader) // gradient_accumulation_steps x "
                    "epochs x ratio), or use warmup_ratio"
                )
                dlcheck.fail(evidence, cause, fix)
            if short:
                judged.append(short)
            judged.append(
                f"the Trainer's warmup of {plan.warmup} optimizer steps fits in its run of {plan.total} optimizer steps"
                + (f" (gradient_accumulation_steps={plan.accum})" if plan.accum > 1 else "")
            )
    run = smoke_run(dlcheck)
    traj = run.trajectory
    opt_steps, sched_steps = traj.calls.count("opt"), traj.calls.count("sched")
    lrs = [r.lr for r in traj.steps if r.lr is not None]
    if lrs:
        declared = (plan.total, plan.warmup) if plan is not None else None  # the judged run
        dlcheck.attach(
            "series",
            title="T6: the learning rate at each step of the smoke run",
            series={"learning rate": lrs},
            marks=[{"x": declared[1], "label": f"declared warmup ends ({declared[1]} optimizer steps)"}]
            if declared and declared[1]
            else [],
            xlabel="step of the smoke run",
            ylabel="learning rate",
            caption="the schedule as the optimizer saw it"
            + (f"; the Trainer's run is {declared[0]} optimizer steps" if declared else ""),
        )
    scheduler = traj.notes.get("scheduler")
    if setup.kind in ("loop", "accelerate", "lightning") and scheduler is not None and opt_steps > 0:
        ratio = sched_steps / opt_steps
        manual = setup.kind == "lightning" and traj.notes.get("manual_optimization")
        where = (
            f"batches of {setup.name}.training_step ({'manual' if manual else 'automatic'} optimization)"
            if setup.kind == "lightning"
            else "micro-batches of your step"
        )
        if ratio > dlcheck.setting("max_sched_per_opt"):
            micro = len(traj.steps)
            evidence = [
                f"in {micro} {where}: optimizer.step() ran {opt_steps} times, "
                f"lr_scheduler.step() {sched_steps} times ({ratio:.1f} scheduler steps per optimizer step); "
                f"scheduler: {type(scheduler).__name__}",
                f"learning rates at the optimizer steps: {', '.join(f'{v:.3g}' for v in lrs[:8])}",
            ]
            cause = (
                f"the scheduler is stepped every micro-batch while the optimizer steps every {round(ratio)}: "
                f"warmup and decay run {ratio:.0f}x too fast (a 1000-step warmup ends after {1000 / ratio:.0f} updates)"
            )
            fix = "call lr_scheduler.step() right after optimizer.step(), inside the gradient-accumulation branch"
            if manual:
                fix = (
                    "in training_step, call sch.step() (sch = self.lr_schedulers()) right after opt.step(), inside "
                    "the branch that steps the optimizer every N batches: if (batch_idx + 1) % N == 0: opt.step(); "
                    "opt.zero_grad(); sch.step()"
                )
            elif setup.kind == "lightning":
                fix = (
                    "do not step the scheduler yourself: return it from configure_optimizers as "
                    '{"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}} and Lightning '
                    "steps it once per optimizer step (accumulate_grad_batches included)"
                )
            dlcheck.fail(evidence, cause, fix)
        judged.append(
            f"in {len(traj.steps)} {where}: optimizer.step() ran {opt_steps} times, "
            f"lr_scheduler.step() {sched_steps} times ({ratio:.2g} per optimizer step; more than "
            f"{dlcheck.setting('max_sched_per_opt'):g} counts micro-batches)"
        )
        if setup.kind in ("loop", "accelerate"):
            sized = _sized_for_the_run(dlcheck, setup, scheduler, len(traj.steps), opt_steps)
            if sized is not None:
                judged.append(sized)
    if lrs and all(v == 0 for v in lrs):
        evidence = [
            f"the learning rate is 0 at all {len(lrs)} optimizer steps of the smoke run",
            f"scheduler: {type(scheduler).__name__ if scheduler is not None else 'none'}; "
            f"lr_scheduler.step() calls: {sched_steps}",
        ]
        if scheduler is not None and sched_steps == 0:
            cause = "the LR scheduler starts at 0 (a warmup) and is never stepped, so the LR stays 0 and nothing trains"
            fix = "call lr_scheduler.step() after every optimizer.step()"
        else:
            cause = "the learning rate is 0: the model never changes"
            fix = "set a non-zero learning rate (and a warmup that starts above 0 or is stepped)"
        dlcheck.fail(evidence, cause, fix)
    if not lrs:
        dlcheck.skip("the smoke run recorded no learning rate (no optimizer step was seen)")
    shown = ", ".join(f"{v:.3g}" for v in lrs[:4]) + (f", …, {lrs[-1]:.3g}" if len(lrs) > 4 else "")
    dlcheck.measured(
        f"smoke run of {run.steps} steps: the learning rate at its {len(lrs)} optimizer steps is {shown} "
        f"(not 0 throughout; scheduler: {type(scheduler).__name__ if scheduler is not None else 'none seen'})",
        *judged,
        *([f"the smoke run {run.trajectory.notes['plan_end']}"] if run.trajectory.notes.get("plan_end") else []),
        optimizer_steps=opt_steps if opt_steps else len(lrs),
        scheduler_steps=sched_steps,
        first_lr=lrs[0],
        last_lr=lrs[-1],
        max_lr=max(lrs),
    )
