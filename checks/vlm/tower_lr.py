from __future__ import annotations

from collections import Counter

from ...registry import Setting, check
from . import common
from . import measure as vlm


@check(
    "X3",
    domain="vlm",
    title="one learning rate for all towers",
    optional_roles=("model", "stages", "stage_setup", "stage", "optimizer", "towers"),
    settings=(
        Setting(
            "rtol",
            1e-3,
            "relative difference between a param group's LR and the declared one that still counts "
            "as the same LR; declared LRs are written by hand (1e-3, 2e-5), so anything beyond rounding is a "
            "different number",
        ),
    ),
)
def check_tower_lr(dlcheck):
    """Every trained tower's parameters sit in an optimizer param group with the LR the recipe declares.

    What it does
        For each stage with an optimizer (the one ``dlcheck_stage_setup`` returns for the stage, or
        ``dlcheck_optimizer`` for ``dlcheck_stage``), looks up the param group of every trainable
        parameter of each tower the stage trains and compares the group's LR (its ``initial_lr``
        when a scheduler has rewritten ``lr``) with the LR declared in ``dlcheck_stages``. Fails on a
        different LR, or on trainable parameters that are in no param group.
    Why it is bad
        VLM recipes give the towers different LRs: a fresh projector 1e-3 in alignment, the LLM 2e-5,
        an unfrozen vision tower 2e-6 (ten times lower, or it forgets its pretraining within a few
        hundred steps). ``AdamW(model.parameters(), lr=2e-5)`` — the default of every Trainer —
        trains all of them at one LR, silently. Parameters unfrozen after the optimizer was built
        are in no param group and never move.
    Example
        stages = {"instruct": {"vision": 2e-6, "projector": 2e-5, "language_model": 2e-5}}
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5)
    Use instead
        One param group per tower at its declared LR: torch.optim.AdamW([{"params":
        model.model.vision_tower.parameters(), "lr": 2e-6}, {"params":
        model.model.multi_modal_projector.parameters(), "lr": 2e-5}, {"params":
        [*model.model.language_model.parameters(), *model.lm_head.parameters()], "lr": 2e-5}]).
        With a transformers Trainer: pass ``optimizers=(optimizer, None)`` or override
        ``create_optimizer``.
    Known problems
        Needs declared LRs ({tower: lr}); skips on a declaration without any, and on stages without an
        optimizer. LR multipliers applied inside a custom optimizer's step are not visible.
    Not applicable
        Models without a vision tower: text-only language models (GPT-2, Llama…), torchvision or timm image
        models, diffusion denoisers. Pipelines with neither text nor images (no processor, batches without token ids or images: a graph
        network's node features, tabular rows).
    """
    model = dlcheck.role("model")
    common.require_vlm(dlcheck, model)
    dlcheck.require("model")
    found = common.towers(dlcheck, model)
    dlcheck.require("stages")
    declared = common.stages(dlcheck, found)
    if not any(lr is not None for s in declared for lr in s.lrs.values()):
        dlcheck.skip("X3 cannot decide: dlcheck_stages declares no learning rates; write them as {stage: {tower: lr}}")
    states, how = common.stage_states(dlcheck, model, found, declared)
    with_opt = [s for s in states if s.optimizer is not None]
    if not with_opt:
        dlcheck.skip(
            "missing role: define fixture dlcheck_optimizer (or dlcheck_trainer with its optimizer created) for "
            "dlcheck_stage in conftest.py, or return the optimizer from dlcheck_stage_setup: no optimizer to check"
        )
    rtol = dlcheck.setting("rtol")

    lines, wrong, missing, stage_lrs = [], [], [], {}
    for state in with_opt:
        stage = common.stage_named(declared, state.name)
        lrs = vlm.param_lrs(state.optimizer)
        n_groups = len(state.optimizer.param_groups)
        seen = stage_lrs.setdefault(state.name, set())
        for tower_params in state.trainable.values():
            for _, p in tower_params:
                seen.update(lrs.get(id(p), []))
        lines.append(
            f"stage {state.name!r}: {n_groups} param group{'s' if n_groups != 1 else ''} at lr "
            + ", ".join(sorted({vlm.fmt_lr(g.get("initial_lr", g.get("lr"))) for g in state.optimizer.param_groups}))
        )
        for tower in found.names:
            want = stage.lrs.get(tower)
            params = state.trainable.get(tower, [])
            if want is None or not params:
                continue
            got = Counter()
            absent = 0
            for _, p in params:
                values = lrs.get(id(p))
                if values is None:
                    absent += p.numel()
                    continue
                for v in set(values):
                    got[v] += p.numel()
            parts = [f"{vlm.fmt_int(n)} at lr {vlm.fmt_lr(v)}" for v, n in got.most_common()]
            if absent:
                parts.append(f"{vlm.fmt_int(absent)} in no param group")
            bad = [v for v in got if not vlm.same_lr(v, want, rtol)]
            mark = "  ✗" if bad or absent else ""
            lines.append(f"  {tower:<15} {', '.join(parts):<28} declared {vlm.fmt_lr(want)}{mark}")
            for v in bad:
                wrong.append((state, stage, tower, v, want))
            if absent:
                missing.append((state, stage, tower, absent))
    if not wrong and not missing:
        checked = sum(
            1
            for state in with_opt
            for tower in found.names
            if common.stage_named(declared, state.name).lrs.get(tower) is not None and state.trainable.get(tower)
        )
        if not checked:
            dlcheck.skip(
                "X3 cannot decide: no tower with a declared LR has trainable parameters in the stages with an "
                "optimizer (X1 judges the freezing)"
            )
        dlcheck.measured(
            f"{checked} trained tower(s) in {len(with_opt)} stage(s) sit in param groups at their declared LR "
            f"(rtol {rtol:g}), no trainable parameter outside a param group",
            f"param-group learning rates of each tower's trainable parameters ({how}):",
            *lines,
            stages=len(with_opt),
            towers_checked=checked,
        )
        return
    evidence = [f"param-group learning rates of each tower's trainable parameters ({how}):"] + lines
    if wrong:
        state, stage, tower, got, want = wrong[0]
        what = vlm.DISPLAY.get(tower, tower)
        ratio = got / want
        times = f"{ratio:.3g}× higher" if ratio > 1 else f"{1 / ratio:.3g}× lower"
        if len(stage_lrs[state.name]) == 1:
            cause = (
                f"one learning rate for every tower: the optimizer of stage {stage.name!r} trains all its parameters at lr "
                f"{vlm.fmt_lr(got)}, so the {what} trains at {vlm.fmt_lr(got)} instead of its declared "
                f"{vlm.fmt_lr(want)} ({times})"
            )
        else:
            cause = (
                f"the param groups do not follow the declaration: in stage {stage.name!r} the {what} trains at "
                f"{vlm.fmt_lr(got)} instead of {vlm.fmt_lr(want)} ({times})"
            )
        if missing:
            cause += (
                f"; and {vlm.fmt_int(missing[0][3])} trainable parameters of the "
                f"{vlm.DISPLAY.get(missing[0][2], missing[0][2])} are in no param group"
            )
    else:
        state, stage, tower, absent = missing[0]
        cause = (
            f"{vlm.fmt_int(absent)} trainable parameters of the {vlm.DISPLAY.get(tower, tower)} are in no param group of "
            f"the optimizer of stage {stage.name!r}, so they never update: the optimizer was built before the tower was "
            f"unfrozen, or from a filtered parameter list"
        )
    groups = ", ".join(
        f"{{'params': {common.params_expression(found, t)}, 'lr': {vlm.fmt_lr(lr)}}}"
        for t, lr in stage.lrs.items()
        if lr is not None and t in found.paths
    )
    fix = (
        f"build the {stage.name!r} optimizer with one param group per tower at its declared LR, after unfreezing: "
        f"torch.optim.AdamW([{groups}]); with a transformers Trainer pass optimizers=(optimizer, None) or override "
        f"create_optimizer"
    )
    dlcheck.fail(evidence, cause, fix)
