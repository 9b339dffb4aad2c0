from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...registry import Setting, check
from ...training import get_setup, smoke_run
from ...training.runs import scheduler_copy, unwrap_prepared

#: scheduler positions a loop's schedule is read at most (a LambdaLR's lambda is read in ~1 µs, a copy steps in ~20 µs)
HORIZON = 50_000


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


def _first_lr(opt: Any) -> float | None:
    groups = getattr(opt, "param_groups", None) or []
    try:
        value = float(groups[0]["lr"]) if groups else None
    except (TypeError, ValueError, KeyError):
        return None
    return value if value is not None and math.isfinite(value) else None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def _rises(a: float, b: float) -> bool:
    return b > a and b - a > 1e-9 * abs(b)


def _declared_warmup(inner: Any) -> int | None:
    """The warmup a transformers schedule declares (``num_warmup_steps`` in its LambdaLR's partial), or None."""
    for fn in getattr(inner, "lr_lambdas", None) or []:
        value = (getattr(fn, "keywords", None) or {}).get("num_warmup_steps")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _schedule_reader(
    scheduler: Any, optimizer: Any, recorded: list[float]
) -> tuple[Callable[[int], float | None] | None, str]:
    """``at(p)``: the LR of the first parameter group at position ``p`` of the smoke run's scheduler (after ``p``
    scheduler steps: the LR of optimizer step ``p + 1``), read without stepping that scheduler, and ``""``; or
    None and why it cannot be read. A LambdaLR's lambda is evaluated (base LR x lr_lambda(p)) once it agrees with
    the LRs the smoke run recorded at its optimizer steps; any other scheduler continues on a copy (the parameters
    and optimizer state shared, only the copy's LRs move) from where the smoke run left it, the recorded LRs
    before that. Either way the positions are optimizer steps only when the scheduler stepped once per optimizer
    step of the smoke run."""
    inner = unwrap_prepared(scheduler)
    pos = getattr(inner, "last_epoch", None)
    if (
        not isinstance(pos, int)
        or type(inner).__name__ == "ReduceLROnPlateau"
        or getattr(inner, "optimizer", None) is None
    ):
        return None, f"{type(inner).__name__} is no torch LR scheduler whose plan can be read"
    if pos != len(recorded):
        return None, (
            f"the scheduler stands at step {pos} after {len(recorded)} optimizer steps: its steps are not optimizer steps"
        )
    current = _first_lr(inner.optimizer)
    lambdas, bases = getattr(inner, "lr_lambdas", None), getattr(inner, "base_lrs", None)
    if type(inner).__name__ == "LambdaLR" and lambdas and bases:
        fn, base = lambdas[0], bases[0]

        def closed(p: int) -> float | None:
            try:
                value = float(base * fn(p))
            except Exception:  # noqa: BLE001 - a lambda undefined there: the plan ends
                return None
            return value if math.isfinite(value) else None

        seen = [*recorded, current]
        if all(v is not None and closed(i) is not None and _close(closed(i), v) for i, v in enumerate(seen)):
            return closed, ""
    if unwrap_prepared(optimizer) is not inner.optimizer or current is None:
        return None, "the scheduler steps another optimizer than the one whose LR the smoke run recorded"
    probe = scheduler_copy(inner)
    if probe is None:
        return None, f"{type(inner).__name__} cannot be copied"
    values: list[float] = [*recorded, current]
    ended = [False]

    def stepped(p: int) -> float | None:
        while len(values) <= p and not ended[0] and len(values) <= HORIZON:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    probe.step()
                except Exception:  # noqa: BLE001 - a schedule raising past its end (OneCycleLR): the plan ends there
                    ended[0] = True
                    break
            value = _first_lr(probe.optimizer)
            if value is None:
                ended[0] = True
                break
            values.append(value)
        return values[p] if p < len(values) else None

    return stepped, ""


@dataclass
class _Warmup:
    """The schedule's LR over a run of ``n`` optimizer steps (positions 0 .. n - 1) and just past it."""

    n: int
    first: float  # the LR at the first optimizer step
    last: float  # the LR at the last optimizer step
    run_max: float  # the highest LR within the run
    first_peak: int  # the position where the LR first stops rising (n: it rises through the run)
    rising_end: bool  # the LR after the run's last step is higher than at it
    peak: float  # the highest LR the schedule reaches (past the run when it is still rising there)
    peak_at: int  # its position
    still_rising: bool  # still rising at the probe's horizon
    declared: int | None  # num_warmup_steps, when the schedule declares it

    @property
    def inside(self) -> bool:
        """The whole run sits inside the warmup: the LR still rises at its last step and never reaches its peak."""
        return self.rising_end and self.run_max < self.peak * (1 - 1e-6)

    @property
    def length(self) -> int:
        """The warmup in optimizer steps: the declared one, else where the LR stops rising."""
        if self.declared is not None:
            return self.declared
        return self.peak_at if self.inside else self.first_peak

    def warmup_text(self) -> str:
        decl = f" (num_warmup_steps={self.declared})" if self.declared is not None else " (the LR rises until then)"
        return f"a warmup of {self.length} optimizer steps{decl}"


def _warmup_over(at: Callable[[int], float | None], n: int, declared: int | None) -> tuple[_Warmup | None, str]:
    """The schedule read at the positions of a run of ``n`` optimizer steps, and past its end while it still
    rises (up to ``HORIZON``); None and why when it cannot be."""
    if n < 1:
        return None, "the run takes no optimizer step"
    if n > HORIZON:
        return None, f"a run of {n} optimizer steps is longer than the {HORIZON} scheduler steps read"
    vals: list[float] = []
    for p in range(n + 1):
        v = at(p)
        if v is None:
            if p < n:
                return None, f"the schedule ends after {p} scheduler steps, before the run's {n} (its step raises)"
            break
        vals.append(v)
    first_peak = next((p for p in range(min(n, len(vals) - 1)) if not _rises(vals[p], vals[p + 1])), n)
    rising_end = len(vals) > n and _rises(vals[n - 1], vals[n])
    run_max = max(vals[:n])
    peak, peak_at, still = run_max, vals.index(run_max), False
    if rising_end:
        p, cur = n, vals[n]
        while True:
            if p >= HORIZON:
                still = True
                break
            nxt = at(p + 1)
            if nxt is None or not _rises(cur, nxt):
                break
            p, cur = p + 1, nxt
        if cur > peak:
            peak, peak_at = cur, p
    return _Warmup(n, vals[0], vals[n - 1], run_max, first_peak, rising_end, peak, peak_at, still, declared), ""


def _inside_line(w: _Warmup, run: str) -> str:
    return (
        f"the LR is still rising at the run's last optimizer step ({w.n}): {w.last:.3g}, {w.last / w.peak:.0%} of the "
        f"{w.peak:.3g} it rises to by optimizer step {w.peak_at + 1}"
        + (" (still rising there)" if w.still_rising else "")
        + f"; {w.warmup_text()}, {run}"
    )


def _inside_cause(w: _Warmup, accum: int = 1) -> str:
    micro = (
        f"; it fits in the run's {w.n * accum} micro-batches: warmup counted in micro-batches instead of optimizer "
        f"steps (one optimizer step every {accum} micro-batches)"
        if accum > 1 and w.n < w.length <= w.n * accum
        else ""
    )
    return (
        f"the whole run of {w.n} optimizer steps sits inside the warmup of {w.length}: the LR never reaches its peak "
        f"(it ends at {w.last / w.peak:.0%} of it) and never decays{micro}"
    )


@dataclass
class _LoopRun:
    """The optimizer steps a loop that says its epochs (dlcheck_num_epochs) takes."""

    per_epoch: int
    epochs: float
    accum: int
    planned: int

    def said(self) -> str:
        return f"{self.per_epoch} batches an epoch x dlcheck_num_epochs={self.epochs:g}" + (
            f", one optimizer step every {self.accum} micro-batches" if self.accum > 1 else ""
        )


def _loop_run(dlcheck: Any, setup: Any, micro: int, opt_steps: int) -> _LoopRun | None:
    """The run's optimizer steps: len(loader) x epochs / the micro-batches per optimizer step of the smoke run (an
    epoch's last, partial accumulation steps too, as Accelerate's does); None when the loop does not say its
    epochs or its loader has no length."""
    epochs = dlcheck.role("num_epochs")
    loader = getattr(setup, "loader", None)
    try:
        per_epoch = len(loader)
    except TypeError:
        return None
    if (
        not isinstance(epochs, (int, float))
        or isinstance(epochs, bool)
        or epochs <= 0
        or not per_epoch
        or not opt_steps
    ):
        return None
    accum = max(1, round(micro / opt_steps))
    return _LoopRun(per_epoch, epochs, accum, max(1, math.ceil(math.ceil(per_epoch / accum) * epochs)))


def _where_it_ends(w: _Warmup | None, planned: int, total: int) -> str:
    """Where a run of ``planned`` optimizer steps ends in a schedule sized for ``total``."""
    if w is None:
        return f"the run ends {planned / total:.0%} of the way through its schedule"
    if w.inside:
        return _inside_cause(w)
    if w.length > 0 and total > w.length:
        return (
            f"the run ends {max(0, planned - w.length) / (total - w.length):.0%} of the way through the decay that "
            f"follows its warmup of {w.length} optimizer steps"
        )
    return f"the run ends {planned / total:.0%} of the way through its decay (no warmup)"


def _sized_for_the_run(dlcheck: Any, scheduler: Any, run: _LoopRun | None, w: _Warmup | None) -> str | None:
    """A loop that says its epochs (dlcheck_num_epochs): fails when its scheduler is sized for another number of
    optimizer steps than the run takes, by more than 1.5x either way; what was compared, or None when it cannot
    be told. ``w``: the schedule read over the run, which says where the run ends in it."""
    horizon = _horizon(scheduler)
    if run is None or horizon is None:
        return None
    planned = run.planned
    total, said = horizon
    line = f"the scheduler is sized for {total} optimizer steps ({said}); the run takes {planned} ({run.said()})"
    ratio = total / planned
    if 1 / 1.5 <= ratio <= 1.5:
        return line
    evidence = [line]
    fix = (
        "size the schedule in optimizer steps: num_training_steps = len(train_dataloader) // "
        "gradient_accumulation_steps * num_epochs (Accelerate: math.ceil(len(train_dataloader) / "
        "gradient_accumulation_steps) * num_epochs)"
    )
    if ratio > 1.5:
        cause = (
            f"the schedule is sized for {ratio:.1f}x the optimizer steps the run takes"
            + (
                f" (counted in micro-batches, len(loader) x epochs, while the optimizer steps every {run.accum})"
                if run.accum > 1 and abs(ratio - run.accum) < 0.5
                else ""
            )
            + f": {_where_it_ends(w, planned, total)}"
        )
        if w is not None and w.inside:
            evidence.append(_inside_line(w, f"the run takes {planned}"))
            fix += f", and a warmup shorter than the run (a part of it, e.g. 0.1 x its {planned} optimizer steps)"
    else:
        cause = (
            f"the schedule is sized for {total} optimizer steps, {1 / ratio:.1f}x fewer than the run takes: it ends "
            "early and the rest of the run trains at its final learning rate"
        )
    dlcheck.fail(evidence, cause, fix, horizon=total, planned=planned)
    return None


def _warmup_alone(at: Callable[[int], float | None], declared: int | None, limit: int = 1000) -> str:
    """What the schedule's start shows when the run's length is not known: where its warmup ends (read up to
    ``limit`` optimizer steps), which is not compared with anything."""
    unknown = "the run's length in optimizer steps is not known (define dlcheck_num_epochs)"
    prev = at(0)
    if prev is None:
        return unknown
    for p in range(1, limit + 1):
        v = at(p)
        if v is None or not _rises(prev, v):
            if p == 1:
                return "no warmup: the LR does not rise after the first optimizer step"
            decl = f" (num_warmup_steps={declared})" if declared is not None else ""
            return (
                f"the LR peaks at {prev:.3g} after a warmup of {p - 1} optimizer steps{decl}; whether the run holds it "
                f"is not judged: {unknown}"
            )
        prev = v
    return f"the warmup is not judged: the LR still rises after {limit} optimizer steps and {unknown}"


def _judge_loop_warmup(dlcheck: Any, w: _Warmup, run: _LoopRun | None, own: str | None) -> str:
    """Fails when the run sits inside its warmup; else what was measured. The run is the loop's (``run``:
    dlcheck_num_epochs said its length), else the schedule's own length (``own``)."""
    if run is not None:
        takes, within = f"the run takes {w.n} optimizer steps ({run.said()})", f"the run's {w.n} optimizer steps"
    else:
        within = f"the schedule's own run of {w.n} optimizer steps ({own})"
        takes = f"{within}; the loop's own length is not known (no dlcheck_num_epochs)"
    if w.inside:
        dlcheck.fail(
            [_inside_line(w, takes)],
            ("the warmup is longer than the run: " if run is not None else "the warmup is longer than the schedule: ")
            + _inside_cause(w, run.accum if run is not None else 1),
            "count the warmup in optimizer steps and keep it inside the run: num_warmup_steps = a part (e.g. 0.1) of "
            "len(train_dataloader) // gradient_accumulation_steps * num_epochs",
            warmup=w.length,
            run_optimizer_steps=w.n,
            last_lr=w.last,
            peak_lr=w.peak,
        )
    if w.length > 0 and w.first_peak > 0:
        return f"the LR peaks at {w.run_max:.3g} after {w.warmup_text()}, within {within}" + (
            f" ({run.said()})" if run is not None else ""
        )
    return (
        f"no warmup: the LR does not rise from the first of {within}"
        + (f" ({run.said()})" if run is not None else "")
        + ", and is not rising at the last"
    )


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
        optimizer step of the smoke run): more than 1.5x apart either way fails, and the cause says where the run
        ends in the schedule (inside its warmup, or how far through the decay after it). The warmup of a plain
        or Accelerate loop's scheduler is judged too: its LR is read at every optimizer step of the run (a LambdaLR's own
        lambda, base LR x lr_lambda(step), once it agrees with the LRs the smoke run recorded; any other torch
        scheduler on a copy stepped on from where the smoke run left it, the parameters and optimizer state
        shared: nothing of the run's objects moves), for the run's optimizer steps (batches an epoch x epochs,
        an epoch's partial accumulation counted as a step), or, without ``dlcheck_num_epochs``, for the
        schedule's own ``num_training_steps``. A run whose LR is still rising at its last optimizer step and
        never reached the LR the schedule rises to fails (the whole run sits inside the warmup: the LR never
        reaches its peak and never decays), with the LR at the last step against that peak and the warmup's
        length (``num_warmup_steps``, or where the LR stops rising) against the run's. A schedule that has
        reached its peak earlier and rises again (cyclic) passes. For every kind, fails when the learning rate
        is 0 at every optimizer step of the smoke run.
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
        reported). A scheduler your loop tells its position (timm's: ``step(epoch)`` at an epoch's end,
        ``step_update(num_updates)`` after an update; it keeps no step counter) stepped inside a plain loop's step
        has its calls counted, with the epochs and update counts passed, and the pass is partly judged: its units and
        warmup are not read. The warmup of a loop's scheduler that is not read over the run (below) makes a partly
        judged pass too. ReduceLROnPlateau is not judged. A Trainer shortened with ``max_steps`` is judged on the run its
        epochs plan: a run really launched with that ``max_steps`` and a longer warmup is not reported (which of
        the two you launch cannot be told from the Trainer); with an iterable dataset ``max_steps`` is the run.
        A loop's warmup is not judged when its run's length is unknown (no ``dlcheck_num_epochs`` and no
        ``num_training_steps`` in its scheduler: the pass then says where the warmup ends), when its scheduler
        does not step once per optimizer step of the smoke run (stepped per epoch), or is a ReduceLROnPlateau,
        or cannot be copied; a run longer than 50,000 optimizer steps is not read. A LightningModule's warmup is
        not judged. A learning rate that changes with no LR scheduler object (a schedule the step writes into the
        param groups by hand) is judged only for being non-zero: its units and warmup are not judged (a partly
        judged pass); a constant one with no scheduler has no schedule to judge. A loop whose step updates the
        weights itself (no optimizer object) is not judged: there is no optimizer LR and no scheduler object to
        read (a learning rate the loop keeps in a number is not read).
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
    told = traj.notes.get("told_scheduler")
    if told is not None and opt_steps > 0:
        # a scheduler the loop tells its position (timm's step(epoch) / step_update(num_updates)): its calls are
        # counted, its plan is not read
        judged.append(
            f"in {len(traj.steps)} micro-batches of your step: optimizer.step() ran {opt_steps} times; {told.describe()}"
        )
        dlcheck.not_judged(
            "the schedule's units and warmup",
            f"{type(told.scheduler).__name__} is told its epoch or update count by your loop and keeps no plan T6 "
            "reads: whether the positions your loop tells it count epochs, optimizer steps or micro-batches, and where "
            "its warmup ends against the run, are not read",
        )
    elif setup.kind in ("loop", "accelerate", "lightning") and scheduler is not None and opt_steps > 0:
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
            loop_run = _loop_run(dlcheck, setup, len(traj.steps), opt_steps)
            horizon = _horizon(scheduler)
            # the warmup, read from the scheduler over the run's optimizer steps (dlcheck_num_epochs), else over the
            # schedule's own length
            at, why = _schedule_reader(scheduler, traj.notes.get("optimizer"), lrs)
            length = loop_run.planned if loop_run is not None else horizon[0] if horizon is not None else None
            declared = _declared_warmup(unwrap_prepared(scheduler))
            warm: _Warmup | None = None
            if at is not None and length is not None:
                warm, why = _warmup_over(at, length, declared)
            warm_line = (
                _warmup_alone(at, declared) if at is not None and length is None else f"the warmup is not judged: {why}"
            )
            sized = _sized_for_the_run(dlcheck, scheduler, loop_run, warm)
            if sized is not None:
                judged.append(sized)
            if warm is not None:
                warm_line = _judge_loop_warmup(dlcheck, warm, loop_run, horizon[1] if horizon else None)
            elif not warm_line.startswith("no warmup"):
                # the warmup was not read over the run: a partly judged pass, not a full one
                dlcheck.not_judged("the warmup", warm_line.removeprefix("the warmup is not judged: "))
            judged.append(warm_line)
    if lrs and all(v == 0 for v in lrs):
        evidence = [
            f"the learning rate is 0 at all {len(lrs)} optimizer steps of the smoke run",
            f"scheduler: {type(scheduler).__name__ if scheduler is not None else 'none'}; "
            f"lr_scheduler.step() calls: {sched_steps}",
        ]
        if told is not None:
            evidence[1] = told.describe()
        if told is not None and not any(told.calls.values()):
            cause = "the LR scheduler starts at 0 (a warmup) and is never stepped, so the LR stays 0 and nothing trains"
            fix = (
                "tell the scheduler where the run is: lr_scheduler.step(epoch) at each epoch's end (a schedule in "
                "epochs), or lr_scheduler.step_update(num_updates) after each optimizer step (a schedule in updates)"
            )
        elif told is None and scheduler is not None and sched_steps == 0:
            cause = "the LR scheduler starts at 0 (a warmup) and is never stepped, so the LR stays 0 and nothing trains"
            fix = "call lr_scheduler.step() after every optimizer.step()"
        else:
            cause = "the learning rate is 0: the model never changes"
            fix = "set a non-zero learning rate (and a warmup that starts above 0 or is stepped)"
        dlcheck.fail(evidence, cause, fix)
    if not lrs and traj.notes.get("own_updates"):
        dlcheck.skip(
            f"not judged: dlcheck_train_step updates the weights itself ({opt_steps} updates in the smoke run; no "
            "optimizer object in dlcheck_make_training's dict): T6 reads the learning rate from an optimizer's "
            "param_groups and its schedule from an LR scheduler object, and there is neither, so a learning rate "
            "your loop keeps and anneals itself (a number in the state) is not read"
        )
    if not lrs:
        dlcheck.skip("the smoke run recorded no learning rate (no optimizer step was seen)")
    shown = ", ".join(f"{v:.3g}" for v in lrs[:4]) + (f", …, {lrs[-1]:.3g}" if len(lrs) > 4 else "")
    others = traj.notes.get("other_optimizers") or []
    if others:
        # the smoke run reads the LR of state['optimizer'] only: the other optimizers' schedules are not read
        dlcheck.not_judged(
            f"the learning rate of {', '.join(others)}",
            "the smoke run reads the training dict's 'optimizer' only",
        )
    at = (
        f"at its {len(lrs)} optimizer steps"
        if opt_steps <= len(lrs)
        else f"at the {len(lrs)} steps where it stepped ({opt_steps} optimizer steps, several in a step: one LR read "
        "per step)"
    )
    if others:
        at = f"of state['optimizer'] {at}"
    if scheduler is None and plan is None and setup.kind in ("loop", "accelerate", "lightning") and len(set(lrs)) > 1:
        # the LR moves with no scheduler object: the step sets it by hand (a warmup and decay computed from the step
        # counter), and neither its units nor its warmup are read from anything; only that it is not 0 was judged
        dlcheck.not_judged(
            "the schedule's units and warmup",
            f"the learning rate changes over the smoke run ({lrs[0]:.3g} -> {lrs[-1]:.3g}) with no LR scheduler object "
            "in the training (state['lr_scheduler'] / configure_optimizers): a schedule your step sets by hand is not "
            "read, so whether it counts optimizer steps or micro-batches and where its warmup ends are not known",
        )
    dlcheck.measured(
        f"smoke run of {run.steps} steps: the learning rate {at} is {shown} "
        f"(not 0 throughout; scheduler: {type(scheduler).__name__ if scheduler is not None else 'none seen'})",
        *judged,
        *([f"the smoke run {run.trajectory.notes['plan_end']}"] if run.trajectory.notes.get("plan_end") else []),
        optimizer_steps=opt_steps if opt_steps else len(lrs),
        scheduler_steps=sched_steps,
        first_lr=lrs[0],
        last_lr=lrs[-1],
        max_lr=max(lrs),
    )
