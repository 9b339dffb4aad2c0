from __future__ import annotations

from ...registry import Setting, check
from ...session import made_up
from ...training import SetupError
from . import measure
from .replicas import OPTIONAL, ROLES, _grads_differ


def _needs_process_group(exc: BaseException) -> bool:
    """What torch.distributed raises when a collective runs with no process group (a loss that all-reduces
    its token count): the single-process step cannot be evaluated, a known limit, not an error."""
    import torch

    text = str(exc)
    return (
        not torch.distributed.is_initialized()
        and isinstance(exc, (RuntimeError, ValueError))
        and ("process group" in text or "init_process_group" in text)
    )


def _random_loss(setup, init, batch, rtol):
    """The relative difference between two single-process gradients on the same batch and weights under two
    torch seeds, when it is above ``rtol`` (the loss draws its own random numbers: diffusion noise and timesteps,
    functional dropout, sampling), else None. The generators are put back afterwards."""
    import torch

    from ...guard import preserved_rng

    try:
        with preserved_rng():
            torch.manual_seed(0)
            a = measure.reference_grads(setup, init, batch)
            torch.manual_seed(1)
            b = measure.reference_grads(setup, init, batch)
    except Exception:  # noqa: BLE001 - the first evaluation went through: only for naming the cause
        return None
    got = measure.compare(a, b)
    return got[0] if got is not None and got[0] > rtol else None


@check(
    "D2",
    domain="dist",
    title="one distributed step is not the single-process step on the whole batch",
    roles=ROLES,
    optional_roles=OPTIONAL,
    settings=(Setting("rtol", 1e-3, "relative gradient difference left by float sums in another order (~1e-6 seen)"),),
)
def check_step_equals_single_process(dlcheck):
    """The gradient of one distributed step equals the gradient on all ranks' batches in one process.

    What it does
        In the shared launch (see D1), takes the gradient every rank's optimizer steps on at its first
        optimizer step (after DDP's all-reduce, before the update; ``nn.Dropout`` switched off for that step),
        and the batches every rank trained on until then. In this process, builds fresh objects from
        ``dlcheck_make_training`` with the ranks' starting weights, and computes the gradient of your loss
        (``dlcheck_compute_loss``, or the model's own) on all those batches concatenated. Fails when the two
        differ (in direction, or in length when no gradient clipping ran in that step); when the distributed
        gradient is the average of each rank's own mean loss, says so with the supervised token counts of each
        rank; when it is 1/N of the single-process gradient, names the loss averaged over the ranks once more.
    Why it is bad
        DDP averages the ranks' gradients. A loss that is a mean over this rank's tokens makes each rank's
        tokens weigh 1/(N·tokens_on_rank): with variable-length sequences a token on a rank with few tokens
        counts several times more than one on a busy rank, and the effective objective changes with the world
        size and the batch composition. A loss summed where it should be averaged scales the learning rate by
        the world size.
    Example
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)   # this rank's mean
        loss.backward()                                                                     # DDP averages means
    Use instead
        sum the token losses and divide by the global number of supervised tokens, times the world size (DDP
        divides by it again): ``n = (labels != -100).sum(); dist.all_reduce(n); loss = loss_sum * world / n``.
    Known problems
        Gradient clipping scales the stepped gradient: a gradient in the same direction but shorter passes, stated,
        when ``clip_grad_norm_`` (torch's, however imported, or Accelerate's, which calls it) clipped in that step;
        without clipping the length is judged (a loss averaged over the ranks once more makes the step 1/N as long).
        A clipping of your own (scaling ``p.grad`` by hand) is not seen: the shorter gradient then fails. Needs the first optimizer step's batches to concatenate (padded on the right when their lengths
        differ: labels with -100, the rest with 0). A loss that calls collectives itself cannot be evaluated
        in one process: the check says so and skips. The concatenated batch is the check's own: your loss
        raising on it is reported as an internal error of pytest-dlcheck naming that batch, not as yours. A
        loss that draws its own random numbers beyond nn.Dropout (diffusion noise and timesteps, functional
        dropout, sampling) cannot be compared: when the two differ, the single-process gradient is evaluated again under another seed, and the check skips saying how much it moves.
    Not applicable
        Training that does not run distributed: a single-process script of the user's own. A plain loop without
        ``dlcheck_dist_wrap`` is asked for it (a missing role: the wrap is what says the script runs distributed);
        an Accelerate user's ``accelerator.prepare`` wraps the model itself.
    """
    run = measure.get_launch(dlcheck)
    recs = measure.records(dlcheck, run, "train")
    grads = [r.get("grads") for r in recs]
    if any(g is None for g in grads):
        dlcheck.skip(
            "no optimizer step was seen in the ranks' first micro-steps (is state['optimizer'] the one stepped?)"
        )
    if _grads_differ(grads):
        dlcheck.skip(
            "the ranks' gradients differ at the first optimizer step: "
            + (
                "your loop trains with accelerate's LocalSGD, which leaves them unaveraged by design (it averages "
                "the weights every few steps): no single-process step to compare with"
                if recs[0].get("local_sgd")
                else "D1 reports the lost synchronisation"
            )
        )
    if not recs[0]["small"] or recs[0]["init_tensors"] is None:
        dlcheck.skip("the model is too large to send its weights back from the ranks")
    setup = measure.the_setup(dlcheck)
    batches = [b for r in recs for b in r["d2_batches"]]
    micro = recs[0].get("d2_micro_steps", 1)
    whole = measure.concat(batches)
    try:
        # the ranks' batches concatenated are made up by the check: the user's loss raising on them is
        # pytest-dlcheck's error (an internal error naming that batch), never the user's, never a quiet skip
        with made_up(f"the {len(batches)} batches of the ranks' first optimizer step concatenated into one"):
            ref = dlcheck.call("compute_loss", lambda: measure.reference_grads(setup, recs[0]["init_tensors"], whole))
    except SetupError as exc:
        dlcheck.skip(f"cannot compute the single-process step: {exc}")
    except Exception as exc:
        if not _needs_process_group(exc):
            raise
        dlcheck.skip(
            "cannot compute the single-process step: your loss calls torch.distributed collectives, which need the "
            f"process group of a launch ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        )
    got = measure.compare(grads[0], ref)
    if got is None:
        common = [n for n in grads[0] if n in ref and grads[0][n].shape == ref[n].shape]
        dlcheck.skip(
            "the gradients are zero or not finite: nothing to compare"
            if common
            else f"no parameter of the ranks' gradients ({', '.join(list(grads[0])[:3])}, …) is one of the "
            f"single-process model's ({', '.join(list(ref)[:3]) or 'none'}, …) by name and shape: nothing to compare"
        )
    rel, cos, ratio = got
    rtol = dlcheck.setting("rtol")
    rows = sum(measure.batch_rows(b) or 0 for b in batches)
    what = (
        f"{len(batches)} batches ({rows} examples) of {run.world} ranks"
        + (f" over {micro} micro-steps" if micro > 1 else "")
        + " concatenated"
    )
    if rel <= rtol:
        dlcheck.measured(
            f"the averaged gradient of the first distributed step equals the single-process gradient on the {what} "
            f"(relative difference {rel:.2g})",
            relative_difference=rel,
        )
        return
    if _per_rank_batchnorm(dlcheck, setup, recs, batches, grads[0], micro, run.world, what, rel, rtol):
        return
    clips = [r.get("clips") for r in recs]
    if cos >= 1 - 1e-4 and ratio < 1:
        clipped = [c for cs in clips for c in cs or () if c["total_norm"] > c["max_norm"]]
        if clipped or any(cs is None for cs in clips):
            how = (
                f"clip_grad_norm_ clipped the norm {clipped[0]['total_norm']:.3g} to max_norm {clipped[0]['max_norm']:g} "
                "in that step"
                if clipped
                else "clipping not observed in the ranks"
            )
            dlcheck.measured(
                f"the averaged gradient of the first distributed step points the same way as the single-process "
                f"gradient on the {what} (cosine {cos:.6f}), {ratio:.3g}x as long ({how}: the length is not judged)",
                relative_difference=rel,
                cosine=cos,
                norm_ratio=ratio,
            )
            return
        # no clipping in the step: the stepped gradient's length is the loss's own scale
        seen = [c for cs in clips for c in cs or ()]
        evidence = [
            f"first optimizer step on {run.world} ranks vs one process on the {what}: the gradient points the same "
            f"way (cosine {cos:.6f}) but is {ratio:.3g}x as long (relative difference {rel:.3g})",
            "no gradient clipping in that step"
            + (
                f" (clip_grad_norm_ with max_norm {seen[0]['max_norm']:g} above the norm {seen[0]['total_norm']:.3g})"
                if seen
                else " (clip_grad_norm_ not called before the optimizer step)"
            ),
        ]
        # a first window shorter than the next (the optimizer stepped after `micro` micro-steps, then after k: a
        # counter tested as step % k == 0 from 0) is scaled micro/k by the step itself, in one process as on N ranks
        stepped = [i for i, st in enumerate(recs[0].get("steps") or []) if st.get("opt_steps")]
        k_next = stepped[1] - stepped[0] if len(stepped) >= 2 else None
        if k_next is not None and micro < k_next and abs(ratio * k_next / micro - 1) < 0.05:
            dlcheck.not_judged(
                "the first step's length",
                f"the first optimizer step came after {micro} micro-step(s) and the next after {k_next}: the first "
                f"window is shorter than the others, and its gradient is {ratio:.3g}x the single-process gradient of "
                f"its batches, {micro}/{k_next} as the step scales a window of {micro} by 1/{k_next} in one process too "
                "(T10 judges that window): no factor of the ranks is left",
            )
            dlcheck.measured(
                f"the averaged gradient of the first distributed step points the same way as the single-process "
                f"gradient on the {what} (cosine {cos:.6f}); its length, {ratio:.3g}x, is the short first window's "
                f"{micro}/{k_next}, not the ranks'",
                relative_difference=rel,
                cosine=cos,
                norm_ratio=ratio,
            )
            return
        if abs(ratio * run.world - 1) < 0.05:
            dlcheck.fail(
                evidence,
                f"the loss is averaged over the ranks once more: DDP already averages the ranks' gradients, so the "
                f"step is 1/{run.world} (1/world size) of the single-process step (a loss or a token count divided by "
                "the world size again, the ranks' losses averaged before backward, or a summed loss, which DDP's "
                "average turns into 1/world size of the whole batch's sum)",
                "let DDP's average be the only one over the ranks: with a global token count, loss = loss_sum * "
                "dist.get_world_size() / n_global (n_global all-reduced); with a per-rank mean, no division by the "
                "world size; a summed loss times the world size",
                relative_difference=rel,
                cosine=cos,
                norm_ratio=ratio,
            )
        dlcheck.fail(
            evidence,
            f"the loss is scaled down uniformly by {ratio:.3g} against the loss of the whole batch: a factor one "
            "process would not apply (a division by the number of ranks or of accumulation steps too many), which "
            "shrinks the effective learning rate",
            "normalise the loss by global quantities only (loss_sum * world size / all-reduced token count, or a "
            "per-rank mean), so that DDP's average of the ranks' gradients is the gradient of the global-batch loss",
            relative_difference=rel,
            cosine=cos,
            norm_ratio=ratio,
        )
    noise = _random_loss(setup, recs[0]["init_tensors"], whole, rtol)
    if noise is not None:
        dlcheck.skip(
            "your loss draws its own random numbers (noise, timesteps, functional dropout, sampling): two "
            f"single-process gradients on the {what} from the same weights differ by {noise:.2g} (relative) under two "
            f"seeds, so the distributed step's difference from one of them ({rel:.2g}) says nothing"
        )
    evidence = [
        f"first optimizer step on {run.world} ranks vs one process on the {what}: gradient relative difference "
        f"{rel:.3g}, cosine {cos:.4f}, norm ratio {ratio:.3g}",
    ]
    tokens = [measure.supervised_tokens(b) for b in batches]
    if micro == 1 and all(t is not None for t in tokens):
        try:
            per_rank = [measure.reference_grads(setup, recs[0]["init_tensors"], b) for b in batches]
        except Exception:  # noqa: BLE001 - only for naming the cause
            per_rank = None
        if per_rank is not None:
            mean = {n: sum(g[n] for g in per_rank) / len(per_rank) for n in per_rank[0]}
            alt = measure.compare(grads[0], mean)
            if alt is not None and alt[0] <= max(rtol, 1e-3) or (alt is not None and alt[1] >= 1 - 1e-5):
                evidence.append(
                    "supervised tokens per rank: "
                    + ", ".join(f"rank {i}: {t}" for i, t in enumerate(tokens))
                    + f"; the distributed gradient is the average of each rank's own mean loss (relative difference "
                    f"{alt[0]:.2g}, cosine {alt[1]:.6f})"
                )
                dlcheck.fail(
                    evidence,
                    "the loss is a per-rank mean over a variable number of tokens and DDP averages the ranks: each "
                    "token weighs 1/(world size x tokens on its rank), not 1/(tokens in the global batch)",
                    "sum the token losses and divide by the global token count times the world size: "
                    "n = (labels != -100).sum(); dist.all_reduce(n); loss = loss_sum * dist.get_world_size() / n",
                    relative_difference=rel,
                    cosine=cos,
                )
    if cos >= 1 - 1e-4 and abs(ratio - run.world) < 0.05 * run.world:
        dlcheck.fail(
            evidence,
            f"the gradients are summed over the ranks, not averaged: the step is {run.world}x the single-process step",
            "let DDP average (do not all_reduce the gradients yourself with SUM), or divide the summed gradient by "
            "the world size",
            norm_ratio=ratio,
        )
    dlcheck.fail(
        evidence,
        "the loss the ranks minimise, averaged by DDP, is not the loss of the whole batch: a per-rank "
        "normalisation or weighting that a single process would not apply",
        "normalise the loss by global quantities (all-reduced token or example counts) so that DDP's average of the "
        "ranks' gradients is the gradient of the global-batch loss",
        relative_difference=rel,
        cosine=cos,
        norm_ratio=ratio,
    )


def _per_rank_batchnorm(dlcheck, setup, recs, batches, stepped, micro, world, what, rel, rtol) -> bool:
    """A model with BatchNorm layers (not SyncBatchNorm) in train mode normalises each rank's batch with that
    rank's statistics, which one process's step on the whole batch does not: the reference is then the whole batch's
    loss with each rank's statistics, computed rank by rank in this process (each rank's gradient of your loss on its
    batch, weighted by its share of the supervised tokens, or of the examples). Passes when the distributed step
    equals it (True: judged); fails a per-rank mean over unequal token counts, or a sum over the ranks; else False
    (the caller judges against the whole batch)."""
    import torch

    if micro != 1 or len(batches) != world:
        return False
    state = setup.state()
    bn = [
        n
        for n, m in state["model"].named_modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm)
    ]
    del state
    if not bn:
        return False
    try:
        per_rank = [measure.reference_grads(setup, recs[0]["init_tensors"], b) for b in batches]
    except Exception:  # noqa: BLE001 - the rank-by-rank reference is only for BatchNorm's statistics
        return False
    tokens = [measure.supervised_tokens(b) for b in batches]
    units = tokens if all(t is not None for t in tokens) else [measure.batch_rows(b) or 0 for b in batches]
    total = sum(units) or 1
    names = per_rank[0]
    weighted = {n: sum(g[n] * (u / total) for g, u in zip(per_rank, units)) for n in names}
    mean = {n: sum(g[n] for g in per_rank) / len(per_rank) for n in names}
    layers = f"{len(bn)} BatchNorm layers ({', '.join(bn[:3])}{' …' if len(bn) > 3 else ''})"
    good = measure.compare(stepped, weighted)
    clipped = [c for r in recs for c in r.get("clips") or () if c["total_norm"] > c["max_norm"]]
    if good is not None and good[0] > rtol and good[1] >= 1 - 1e-4 and good[2] < 1 and clipped:
        good = (0.0, good[1], good[2])  # the same direction, shortened by the clipping seen in that step
        rel_text = f"the same direction (cosine {good[1]:.6f}), clip_grad_norm_ shortening it"
    else:
        rel_text = f"relative difference {good[0]:.2g}" if good is not None else ""
    if good is not None and good[0] <= rtol:
        dlcheck.measured(
            f"the model's {layers} normalise each rank's batch with that rank's own statistics: the first "
            f"distributed step equals the gradient of the whole batch's loss with each rank's statistics, computed "
            f"rank by rank in this process ({rel_text}); one process's step on the {what}, "
            f"with the whole batch's statistics, differs by {rel:.3g} from it, as BatchNorm makes it",
            relative_difference=good[0],
            batchnorm_layers=len(bn),
        )
        return True
    alt = measure.compare(stepped, mean)
    if alt is not None and alt[0] <= max(rtol, 1e-3) and len(set(units)) > 1:
        dlcheck.fail(
            [
                f"first optimizer step on {world} ranks vs the ranks' own steps in this process (each rank's "
                f"BatchNorm statistics): it is the plain average of each rank's own mean loss (relative difference "
                f"{alt[0]:.2g}), with "
                + ", ".join(f"rank {i}: {u}" for i, u in enumerate(units))
                + (" supervised tokens" if units is tokens else " examples")
            ],
            "the loss is a per-rank mean over a variable number of tokens and DDP averages the ranks: each token "
            "weighs 1/(world size x tokens on its rank), not 1/(tokens in the global batch)",
            "sum the token losses and divide by the global token count times the world size: "
            "n = (labels != -100).sum(); dist.all_reduce(n); loss = loss_sum * dist.get_world_size() / n",
            relative_difference=alt[0],
        )
    if good is not None and good[1] >= 1 - 1e-4 and abs(good[2] - world) < 0.05 * world:
        dlcheck.fail(
            [
                f"first optimizer step on {world} ranks vs the whole batch's gradient with each rank's BatchNorm "
                f"statistics: cosine {good[1]:.6f}, norm ratio {good[2]:.3g}"
            ],
            f"the gradients are summed over the ranks, not averaged: the step is {world}x the whole batch's",
            "let DDP average (do not all_reduce the gradients yourself with SUM), or divide the summed gradient by "
            "the world size",
            norm_ratio=good[2],
        )
    return False
