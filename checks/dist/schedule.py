"""D8: the learning-rate schedule on N processes against the single-process plan of the same objects.

A rank of the shared launch (:mod:`.launch`) records, before it trains, its LR scheduler's plan — a copy of the
scheduler (the parameters and the optimizer state shared, only the copy's LRs move) stepped until its end, the LR
of the first parameter group after each scheduler step — and, during the launch's micro-steps, the optimizer's
LR after each of them and how many scheduler steps each optimizer step made. D8 builds the same objects in the
pytest process (one process), probes their plan the same way and compares where the two schedules end."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Mapping
from typing import Any

from ...registry import check
from ...training import SetupError
from ...training.runs import scheduler_copy, unwrap_prepared
from . import measure
from .replicas import OPTIONAL, ROLES

#: scheduler steps a plan is probed for at most (a LambdaLR steps in ~20 µs)
HORIZON = 20_000
#: once the LR has reached 0 after its peak, the probe goes on to this many times that step (a cosine climbs back)
AFTER_ZERO = 3
#: the N-process schedule ends this many times too early (or too late) before the check calls it conclusive
FACTOR = 1.5


def _lr(opt: Any) -> float | None:
    groups = getattr(opt, "param_groups", None) or []
    value = groups[0].get("lr") if groups else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def lr_plan(scheduler: Any, limit: int = HORIZON) -> dict[str, Any] | None:
    """The LR of the first parameter group at the scheduler's current step and after each of the next scheduler
    steps, probed on a copy (the parameters and optimizer-state tensors shared: nothing trains, only the copy's
    optimizer LRs move) until ``limit`` steps, its step raising (OneCycleLR past ``total_steps``: the plan ends
    there), or ``AFTER_ZERO`` times the step at which it first reached 0 after its peak. None when the scheduler
    cannot be probed (no torch LR scheduler, ReduceLROnPlateau, a copy that cannot be made)."""
    sched = unwrap_prepared(scheduler)
    opt = getattr(sched, "optimizer", None)
    if sched is None or opt is None or not hasattr(sched, "last_epoch") or type(sched).__name__ == "ReduceLROnPlateau":
        return None
    probe = scheduler_copy(sched)
    if probe is None:
        return None
    first = _lr(probe.optimizer)
    if first is None or not math.isfinite(first):
        return None
    lrs = [first]
    ended = None
    zero_at = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(1, limit + 1):
            try:
                probe.step()
            except Exception as exc:  # noqa: BLE001 - a schedule raising past its end: the plan ends there
                ended = f"its step {k} raises {type(exc).__name__}"
                break
            lr = _lr(probe.optimizer)
            if lr is None or not math.isfinite(lr):
                ended = f"its LR after step {k} is {lr!r}"
                break
            lrs.append(lr)
            if zero_at is None and lr == 0 and max(lrs) > 0:
                zero_at = k
            if zero_at is not None and k >= AFTER_ZERO * zero_at:
                ended = ended or "probed past its end"
                break
    return {"scheduler": type(sched).__name__, "lrs": lrs, "ended": ended, "limit": limit}


def plan_end(plan: dict[str, Any]) -> tuple[str, int | None]:
    """Where a probed plan ends: ("end", step) — the first step after the peak at which the LR reaches its lowest
    value; ("constant", peak step) — the LR never falls below its peak; ("open", None) — still falling when the
    probe stopped at its limit."""
    lrs = plan["lrs"]
    peak = max(lrs)
    top = lrs.index(peak)
    low = min(lrs[top:])
    if peak <= 0 or low >= peak * (1 - 1e-6):
        return "constant", top
    tol = 1e-9 * peak
    at = next(i for i in range(top, len(lrs)) if lrs[i] <= low + tol)
    if at == len(lrs) - 1 and plan.get("ended") is None:
        return "open", None
    return "end", at


# --------------------------------------------------------------------------------------------------
# in a rank of the launch


def rank_start(state: Mapping[str, Any], loader: Any) -> dict[str, Any] | None:
    """What a rank records before it trains: its scheduler's plan and how it is stepped, its batches per epoch
    and the batches one process makes of the same data. None without ``state['lr_scheduler']``."""
    sched = state.get("lr_scheduler")
    if sched is None:
        return None
    inner = unwrap_prepared(sched)
    kind = type(sched)
    prepared = kind.__module__.startswith("accelerate.") and kind.__name__ == "AcceleratedScheduler"
    rec: dict[str, Any] = {
        "wrapper": kind.__name__,
        "scheduler": type(inner).__name__,
        "prepared": prepared,
        "start": getattr(inner, "last_epoch", None),
        "plan": lr_plan(sched),
        "rank_batches": _len(loader),
        "single_batches": single_batches(loader),
    }
    if prepared:
        rec["split_batches"] = getattr(sched, "split_batches", None)
        rec["step_with_optimizer"] = getattr(sched, "step_with_optimizer", None)
        with contextlib.suppress(Exception):
            from accelerate.state import AcceleratorState

            rec["num_processes"] = AcceleratorState().num_processes
    return rec


def rank_end(rec: dict[str, Any] | None, state: Mapping[str, Any]) -> None:
    """After the launch's micro-steps: how many scheduler steps they made."""
    if rec is None:
        return
    inner = unwrap_prepared(state.get("lr_scheduler"))
    end = getattr(inner, "last_epoch", None)
    rec["taken"] = end - rec["start"] if isinstance(end, int) and isinstance(rec["start"], int) else None


def current_lr(state: Mapping[str, Any]) -> float | None:
    return _lr(unwrap_prepared(state.get("optimizer")))


def _len(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def single_batches(loader: Any) -> int | None:
    """The batches one process makes of this rank's data in an epoch: Accelerate's shard's own batch sampler, a
    DistributedSampler's dataset in batches of the loader's size, else the loader itself (the same on every rank)."""
    for candidate in (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        if type(candidate).__name__ == "BatchSamplerShard":
            return _len(candidate.batch_sampler)
    sampler = getattr(loader, "sampler", None)
    if type(sampler).__name__ == "DistributedSampler":
        n, b = _len(getattr(loader, "dataset", None)), getattr(loader, "batch_size", None)
        if n is None or not b:
            return None
        return n // b if getattr(loader, "drop_last", False) else math.ceil(n / b)
    return _len(loader)


# --------------------------------------------------------------------------------------------------
# the check


def _at(lrs: list[float], i: float) -> float:
    return lrs[min(len(lrs) - 1, max(0, round(i)))]


def _g(x: float) -> str:
    return f"{x:.3g}"


@check(
    "D8",
    domain="dist",
    title="the LR schedule on N processes ends at another point of the run than in one process",
    roles=ROLES,
    optional_roles=OPTIONAL,
)
def check_schedule_on_n_processes(dlcheck):
    """The LR schedule ends where the run ends on N processes, as it does in one process.

    What it does
        In the shared launch (see D1) each rank records its ``state['lr_scheduler']``'s plan before training (a copy
        of the scheduler stepped to its end: the LR of the first parameter group after each scheduler step), the
        optimizer's LR after each micro-step, and how many scheduler steps each optimizer step makes (an
        ``accelerator.prepare``-d scheduler, ``AcceleratedScheduler`` with ``split_batches=False``, steps
        ``num_processes`` times). In the pytest process the same factory builds the objects in one process and their
        plan is probed the same way, stepped once per optimizer step: its end (the LR's lowest point after its peak)
        is the run one process makes, ``T`` optimizer steps = ``T / L1`` epochs of its ``L1`` batches. On N processes
        the same data takes ``T x LN / L1`` optimizer steps (a rank's epoch is ``LN`` batches) — or ``T`` when the run
        is counted in optimizer steps (``max_train_steps``). Fails when the N-process schedule ends before the
        shorter of the two (its LR reaches 0 while the run goes on, and a cosine climbs back to its peak) or after
        the longer, by more than 1.5x. The evidence gives the LR on N processes and the single-process plan at the
        same point of the data.
    Why it is bad
        ``accelerator.prepare(lr_scheduler)`` steps the scheduler once per process at every optimizer step, because
        each optimizer step consumes N batches: a schedule sized in one process's optimizer steps
        (``len(prepared_dataloader) * epochs``) then ends after 1/N of the run. On two ranks a cosine schedule
        reaches 0 half way and climbs back to the peak LR for the second half: nothing raises, the loss curve just
        looks like a bad run.
    Example
        model, opt, loader = accelerator.prepare(model, opt, loader)
        sched = get_cosine_schedule_with_warmup(opt, 100, len(loader) * epochs)   # a rank's optimizer steps
        sched = accelerator.prepare(sched)                                      # steps num_processes times each
    Use instead
        size it as Accelerate's examples do: ``num_training_steps=len(loader) * epochs * accelerator.num_processes``
        (and the warmup times ``num_processes``), or from the DataLoader before ``prepare``; or do not prepare a
        scheduler sized in a rank's optimizer steps (an unprepared one steps once per optimizer step).
    Known problems
        The single-process plan assumes one scheduler step per optimizer step (T6 judges that in one process); a
        scheduler stepped more often than its kind is on N processes (once per optimizer step, ``num_processes``
        times when prepared) is left to T6: D8 skips saying so. A
        run counted in optimizer steps and one counted in epochs differ by N on N processes and the check cannot
        tell which yours is, so it fails only outside both: a scheduler sized ``max_train_steps`` without
        ``num_processes`` and prepared ends after 1/N of a run counted in optimizer steps and passes. The warmup
        is not judged (Accelerate's examples multiply it by ``num_processes``, keeping it in optimizer steps;
        unmultiplied it keeps it in examples: both are used). A schedule that still decays after 20000 scheduler
        steps has no end to compare; only the first parameter group's LR is followed. ReduceLROnPlateau is not
        probed.
    Not applicable
        Training without an LR scheduler in ``dlcheck_make_training``'s dict (``state['lr_scheduler']``).
    """
    setup = measure.the_setup(dlcheck)
    run = measure.get_launch(dlcheck)
    recs = measure.records(dlcheck, run, "train")
    rec = recs[0].get("schedule")
    if rec is None:
        dlcheck.not_applicable(
            "no LR scheduler in dlcheck_make_training's dict (state['lr_scheduler']) whose plan could depend on the "
            "number of processes (an LR your step sets by hand, annealed over a count of its own, is not read by D8)"
        )
    plan_n = rec.get("plan")
    if plan_n is None:
        dlcheck.skip(f"the scheduler ({rec['scheduler']}) cannot be probed (a copy of it cannot be stepped)")
    steps = recs[0]["steps"]
    opt_steps = sum(st["opt_steps"] for st in steps)
    taken = rec.get("taken")
    if not opt_steps or not taken:
        dlcheck.skip(
            f"the launch's {len(steps)} micro-steps made {opt_steps} optimizer steps and {taken} scheduler steps: "
            "no stepping rate to measure"
        )
    rate = taken / opt_steps
    # what stepping it as its examples do gives: once per optimizer step, num_processes times when Accelerate prepared it
    expected = (
        rec.get("num_processes") or run.world
        if rec["prepared"] and rec.get("step_with_optimizer", True) and not rec.get("split_batches")
        else 1
    )
    if not math.isclose(rate, expected):
        dlcheck.skip(
            f"the scheduler ({rec['wrapper']}) makes {rate:g} scheduler steps per optimizer step on {run.world} processes "
            f"({taken} in {opt_steps}; stepped once per optimizer step{' and prepared' if expected > 1 else ''} it makes "
            f"{expected}): a schedule stepped per micro-batch is T6's, judged in one process"
        )
    lrs_n = plan_n["lrs"]
    # the LRs the launch's optimizer held after each micro-step are the probe's, at the measured rate
    done, seen = 0, []
    for st in steps:
        done += st["opt_steps"]
        if st.get("lr") is not None and done:
            seen.append((done, st["lr"]))
    off = [(k, lr) for k, lr in seen if not math.isclose(lr, _at(lrs_n, k * rate), rel_tol=1e-6, abs_tol=1e-15)]
    if off:
        k, lr = off[0]
        dlcheck.skip(
            f"after optimizer step {k} on {run.world} processes the LR is {_g(lr)}, not the {_g(_at(lrs_n, k * rate))} "
            f"its scheduler's plan gives at {rate:g} scheduler steps per optimizer step: the LR is set another way too"
        )
    try:
        with measure_state(setup) as state:
            plan_1 = lr_plan(state.get("lr_scheduler")) if state.get("lr_scheduler") is not None else None
    except SetupError as exc:
        dlcheck.skip(f"the single-process plan: {exc}")
    if plan_1 is None:
        dlcheck.skip("in one process dlcheck_make_training's dict holds no LR scheduler that can be probed")
    lrs_1 = plan_1["lrs"]
    kind_1, end_1 = plan_end(plan_1)
    kind_n, end_n = plan_end(plan_n)
    l1, ln = rec.get("single_batches"), rec.get("rank_batches")
    how = (
        f"{rec['wrapper']} around {rec['scheduler']}" if rec["wrapper"] != rec["scheduler"] else rec["scheduler"]
    ) + f", {rate:g} scheduler step(s) per optimizer step (measured: {taken} in {opt_steps} optimizer steps)"
    shown = ", ".join(_g(lr) for _, lr in seen[:4])
    if kind_1 == "constant" and kind_n == "constant":
        if not math.isclose(max(lrs_1), max(lrs_n), rel_tol=1e-6):
            dlcheck.skip(
                f"a constant LR of {_g(max(lrs_n))} on {run.world} processes and {_g(max(lrs_1))} in one: the peak "
                "LR differs with the number of processes (scaled by hand?), not judged"
            )
        if end_1 or end_n:
            dlcheck.not_judged(
                "warmup",
                f"the warmup ends after {end_1} optimizer steps in one process and {end_n / rate:g} on "
                f"{run.world} processes: counted in optimizer steps or in examples, both are used",
            )
        dlcheck.measured(
            f"a constant LR of {_g(max(lrs_n))}{' after its warmup' if end_1 or end_n else ''} on {run.world} "
            "processes and in the single-process plan: nothing for the number of processes to shift "
            f"({how}; LR after the launch's optimizer steps: "
            f"{shown})"
        )
        return
    if kind_1 != "end":
        dlcheck.skip(
            f"the single-process schedule ({plan_1['scheduler']}) still decays after {len(lrs_1) - 1} steps: no end "
            "to compare"
        )
    if not l1 or not ln:
        dlcheck.skip("the batches of an epoch on one process and on a rank cannot be counted (a loader without len)")
    run_epochs = end_1 * ln / l1  # the same data on N processes, in their optimizer steps
    run_steps = float(end_1)  # a run counted in optimizer steps
    n_end = end_n / rate if kind_n == "end" else None
    # micro-batches per optimizer step in the launch (gradient accumulation): an epoch of l1 batches is l1 / accum
    # optimizer steps; the same data on N processes is end_1 * ln / l1 optimizer steps whatever accum is
    # micro-steps per optimizer step: between the first two steps (a first window of one micro-step, `step % k == 0`
    # from 0, is short), else up to the first
    stepped = [i for i, st in enumerate(steps) if st["opt_steps"]]
    accum = stepped[1] - stepped[0] if len(stepped) >= 2 else (stepped[0] + 1 if stepped else 1)
    epochs = end_1 * accum / l1
    per_step = f", {accum} per optimizer step" if accum > 1 else ""
    plan_words = (
        f"the single-process plan ends after {end_1} optimizer steps ({epochs:.3g} epoch(s) of {l1} batches"
        f"{per_step}); a rank's epoch is {ln} batches, so the same data takes {run_epochs:.3g} optimizer steps on "
        f"{run.world} processes ({end_1} counted in optimizer steps)"
    )
    if n_end is not None and n_end < run_epochs / FACTOR:
        k = math.floor(n_end)
        low = _at(lrs_n, end_n)
        same = k * l1 / ln
        evidence = [
            f"on {run.world} processes the scheduler is {how}; the LR after optimizer steps 1-{len(seen)}: {shown}",
            f"on {run.world} processes the LR reaches {_g(low)} (its end) after optimizer step {k} of the "
            f"{math.ceil(run_epochs)} the run takes there: {plan_words}",
            f"after optimizer step {k} the single-process plan, at the same point of the data (its step "
            f"{round(same)} of {end_1}), says {_g(_at(lrs_1, same))}",
        ]
        back = max(_at(lrs_n, i * rate) for i in range(k, math.ceil(run_epochs) + 1))
        if back > low + 0.1 * (max(lrs_n) - low):
            at = next(i for i in range(k, math.ceil(run_epochs) + 1) if _at(lrs_n, i * rate) == back)
            evidence.append(f"then it climbs back to {_g(back)} by optimizer step {at} (the schedule restarts)")
        share = n_end / run_epochs
        if rec["prepared"] and not rec.get("split_batches") and rate > 1:
            cause = (
                f"accelerator.prepare(lr_scheduler) steps the scheduler num_processes={round(rate)} times per optimizer "
                f"step (AcceleratedScheduler, split_batches=False), and it was sized in a rank's optimizer steps (it ends "
                f"after {end_n} scheduler steps, {n_end:g} optimizer steps): the schedule ends after {share:.0%} of the "
                "run"
            )
        else:
            cause = (
                f"the schedule is {rate:g} scheduler step(s) per optimizer step and {end_n} scheduler steps long on "
                f"{run.world} processes: it ends after {share:.0%} of the run"
            )
        fix = (
            "size the scheduler as Accelerate's examples do: num_training_steps=len(train_dataloader) * num_epochs * "
            "accelerator.num_processes (num_warmup_steps times accelerator.num_processes too), or from the DataLoader "
            "before accelerator.prepare; or leave a scheduler sized in a rank's optimizer steps out of prepare"
        )
        dlcheck.fail(evidence, cause, fix, optimizer_step=k, run_steps=math.ceil(run_epochs), rate=rate)
    horizon_n = (len(lrs_n) - 1) / rate
    if (n_end if n_end is not None else horizon_n) > FACTOR * run_steps and (n_end is not None or kind_n == "open"):
        at_end = _at(lrs_n, run_steps * rate)
        evidence = [
            f"on {run.world} processes the scheduler is {how}; the LR after optimizer steps 1-{len(seen)}: {shown}",
            (
                f"on {run.world} processes the schedule ends after {n_end:.3g} optimizer steps"
                if n_end is not None
                else f"on {run.world} processes the schedule has not ended after {horizon_n:.3g} optimizer steps"
            )
            + f"; {plan_words}",
            f"at optimizer step {round(run_steps)} the LR is still {_g(at_end)}; the single-process plan ends at "
            f"{_g(_at(lrs_1, end_1))}",
        ]
        cause = (
            f"the schedule on {run.world} processes is longer in optimizer steps than in one process: sized with "
            "num_processes while the scheduler steps once per optimizer step (not prepared, or split_batches=True)"
        )
        fix = (
            "multiply the schedule's length by accelerator.num_processes only for a scheduler passed to "
            "accelerator.prepare (which steps it num_processes times per optimizer step)"
        )
        dlcheck.fail(evidence, cause, fix, rate=rate)
    if n_end is None:
        dlcheck.skip(f"the schedule on {run.world} processes has not ended after {len(lrs_n) - 1} scheduler steps")
    dlcheck.measured(
        f"on {run.world} processes the LR reaches its end ({_g(_at(lrs_n, end_n))}) after {n_end:.3g} optimizer steps, "
        f"within the run there: {plan_words}",
        f"the scheduler: {how}; the LR after the launch's optimizer steps: {shown}",
        "where the warmup ends is not compared (counted in optimizer steps or in examples: both are used)",
        world=run.world,
        rate=rate,
        end_steps=n_end,
        single_end=end_1,
    )


@contextlib.contextmanager
def measure_state(setup: Any):
    """Fresh objects from the user's factory in this (one) process, let go afterwards; the random generators as
    they were."""
    from ...guard import preserved_rng

    with preserved_rng():
        state = setup.state()
        try:
            yield state
        finally:
            del state
