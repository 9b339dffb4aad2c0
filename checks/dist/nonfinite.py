from __future__ import annotations

from ...registry import check
from . import measure
from .replicas import OPTIONAL, ROLES


def _decision(rec: dict | None) -> str:
    if rec is None:
        return "never finished the step (stopped after waiting in a collective)"
    if rec.get("error"):
        text = rec["error"].removeprefix("raised ")
        if measure.collective_failure({"message": text}):
            reason = text.split("] ", 1)[-1].split(". ")[0][:120]
            return f"was left waiting in a collective that another rank never joined ({reason})"
        return f"raised {text[:160]}"
    if rec["changed"]:
        return "stepped" + ("" if rec["finite_params"] else " (its weights are now non-finite)")
    return "skipped the update"


@check(
    "D6",
    domain="dist",
    title="a non-finite gradient on one rank is handled by that rank alone",
    roles=ROLES,
    optional_roles=OPTIONAL,
)
def check_nonfinite_agreement(dlcheck):
    """An overflow on one rank leads every rank to the same decision (skip or step), and the same weights.

    What it does
        At the end of the shared launch (see D1), runs one more micro-step in which the last rank's first layer
        outputs infinities (as an fp16 overflow does) while the other ranks' batches are finite; records on every
        rank whether the optimizer stepped and the weights changed, right after the step. Fails when the ranks
        decide differently, end with different weights, or some ranks never finish the step (a rank that skipped
        its backward leaves the others waiting in the gradient all-reduce: they are stopped a few seconds later).
    Why it is bad
        A skip decided on this rank's own loss or gradient (``if not torch.isfinite(loss): continue``) makes the
        rank with the overflow skip alone: with DDP the others then wait for its all-reduce (a hang, or a
        mismatched collective pairing the wrong gradients); without it the replicas diverge. "If any rank's
        gradient contains inf, all ranks must skip or clip."
    Example
        loss = compute_loss(model, batch)
        if not torch.isfinite(loss):     # this rank's loss only
            continue
    Use instead
        decide on a value every rank shares: the gradient norm after DDP's all-reduce
        (``norm = clip_grad_norm_(...); if torch.isfinite(norm): optimizer.step()``), or all-reduce a found-inf flag
        (``dist.all_reduce(flag, op=MAX)``) before deciding; ``GradScaler`` does this.
    Known problems
        The overflow is injected with a forward hook on the first layer that holds parameters; a model whose loss
        ignores that layer's output is not tested. Replicas that already differ before that step (D1's or D4's
        finding: their gradients are not averaged, so each rank sees its own overflow) are not judged: the check
        skips naming D1 (or D4). Stepping with non-finite gradients on every rank is a shared
        decision (passes here, stated): the smoke domain judges non-finite training. Every rank raising alike
        (``clip_grad_norm_(..., error_if_nonfinite=True)`` after the all-reduce, Lightning Fabric's
        ``clip_gradients`` default) is a shared decision too: the run stops on every rank, with the weights
        compared on every rank. The rank with the overflow raising before its step (NaN logits a distribution
        refuses) while the others raise too or wait for it in a collective is a loud stop of the whole run: passes,
        said so.
    Not applicable
        Training that does not run distributed: a single-process script of the user's own. A plain loop without
        ``dlcheck_dist_wrap`` is asked for it (a missing role: the wrap is what says the script runs distributed);
        an Accelerate user's ``accelerator.prepare`` wraps the model itself.
    """
    run = measure.get_launch(dlcheck)
    train = measure.records(dlcheck, run, "train")
    # replicas that already differ decide on different gradients by construction: the first cause is D1's (or D4's)
    drifted = measure.drift(train)
    if drifted is not None:
        dlcheck.skip(f"{drifted}; the ranks' decisions on an overflow are judged on identical replicas only")
    recs = [r.stages.get("d6") for r in run.ranks]
    if all(r is None for r in recs):
        measure.raise_failure(dlcheck, run, "d6")
    first = next(r for r in recs if r is not None)
    if first.get("layer") is None:
        dlcheck.not_applicable("the model has no layer with parameters to make overflow")
    injected = first["injected_rank"]
    # under gradient accumulation the injected micro-step may take no optimizer step on any rank by the loop's own
    # cadence: "skipped" would then describe a decision no rank took
    stepped = [i for i, st in enumerate(train[0].get("steps") or []) if st.get("opt_steps")]
    trained = len(train[0].get("steps") or [])  # the launch's micro-steps: the injected one comes after them
    if len(stepped) >= 2 and all(r is not None and not r.get("error") and not r["changed"] for r in recs):
        k = stepped[1] - stepped[0]
        if k > 1 and (trained - stepped[0]) % k:
            dlcheck.skip(
                f"the injected micro-step {trained + 1} falls inside an accumulation window (your loop steps its "
                f"optimizer every {k} micro-steps, at micro-steps {', '.join(str(i + 1) for i in stepped[:3])}, ...): "
                "no rank was to step then, so the ranks' decision on an overflow is not seen"
            )
    decisions = [_decision(r) for r in recs]
    # ranks that raised are compared by what they raised (its type and first words), not by a message that may name
    # the rank; a rank left waiting in a collective is another decision
    kinds = [d.split(":")[0] if d.startswith("raised ") else d for d in decisions]
    head = (
        f"micro-step {trained + 1}: rank {injected}'s {first['layer']!r} outputs inf, the other ranks' batches "
        "are finite"
    )
    shown = "; ".join(f"rank {i}: {d}" for i, d in enumerate(decisions))
    injected_rec = recs[injected]
    raised_there = (
        injected_rec is not None
        and injected_rec.get("error")
        and decisions[injected].startswith("raised ")
        and not injected_rec.get("changed")
    )
    if raised_there and len(set(kinds)) > 1 and all(
        i == injected or d.startswith(("raised ", "was left waiting", "never finished"))
        for i, d in enumerate(decisions)
    ):
        # the rank with the overflow raised (NaN logits refused by a distribution, an assert on the loss) and the
        # others raised too or waited for it in a collective until it was gone: the run stops on every rank (a
        # launcher such as torchrun ends them all) - a loud stop, no rank stepping alone
        dlcheck.measured(
            head,
            shown,
            f"rank {injected} raised on the overflow before stepping and no rank stepped: the run stops on every rank "
            "(a launcher such as torchrun ends the others), a loud stop rather than a rank deciding alone",
            decision="raised",
        )
        return
    # every rank's weights right after the step, whether it stepped, skipped or raised (a raise after the optimizer
    # step leaves changed weights too)
    afters = [r["after"] for r in recs if r is not None and "after" in r]
    same_weights = len(afters) == len(recs) and measure.first_difference(afters) is None
    if len(set(kinds)) > 1 or not same_weights:
        evidence = [head, shown]
        local = recs[injected]
        if (
            local is not None
            and not local["changed"]
            and local.get("loss") is not None
            and local["loss"] != local["loss"]
        ):
            evidence.append(f"rank {injected}'s step returned loss {local['loss']} and did not call backward/step")
        if not same_weights and len(set(kinds)) == 1:
            evidence.append("the ranks' weights differ after the step")
        dlcheck.fail(
            evidence,
            f"the skip decision is taken from rank {injected}'s own loss or gradient before the ranks agree: the "
            "rank with the overflow skips alone, and the others step (or wait for its all-reduce)",
            "decide on a value every rank shares: the gradient norm after DDP's all-reduce (norm = "
            "clip_grad_norm_(model.parameters(), max_norm); if torch.isfinite(norm): optimizer.step()), or "
            "dist.all_reduce(found_inf, op=dist.ReduceOp.MAX) before deciding (GradScaler does this)",
        )
    note = (
        " (the weights are now non-finite on every rank: the smoke domain's checks judge that)"
        if not recs[0]["finite_params"]
        else ""
    )
    dlcheck.measured(
        head,
        f"every rank {decisions[0]}, with identical weights afterwards{note}",
        decision=decisions[0],
    )
