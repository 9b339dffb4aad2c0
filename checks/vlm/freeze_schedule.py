from __future__ import annotations

from ...registry import check
from . import common
from . import measure as vlm


def _path_note(c: vlm.TowerCount) -> str:
    if len(c.by_path) < 2:
        return ""
    return "  (" + "; ".join(f"model.{p}: {vlm.fmt_int(t)} / {vlm.fmt_int(n)}" for p, (t, n) in c.by_path.items()) + ")"


def _kind(stage: vlm.Stage, tower: str, c: vlm.TowerCount) -> str:
    if stage.trained(tower):
        return "none"
    live = [p for p, (t, _) in c.by_path.items() if t]
    dead = [p for p, (t, _) in c.by_path.items() if not t]
    if dead and live and all(p.split(".")[-1] == "lm_head" for p in live):
        return "lm_head"
    return "all" if c.trainable == c.total else "partial"


def _calls(paths: list[str], flag: bool) -> str:
    """``model.a.requires_grad_(False)`` for each path (a module or a parameter)."""
    return "; ".join(f"model.{p}.requires_grad_({flag})" for p in paths)


def _stages_text(names: list[str]) -> str:
    quoted = [repr(n) for n in names]
    return ("stage " if len(quoted) == 1 else "stages ") + (
        " and ".join(quoted) if len(quoted) < 3 else ", ".join(quoted)
    )


def _diagnose(found: vlm.Towers, states: list[vlm.StageState], tower: str, kind: str) -> tuple[str, str]:
    c = states[0].counts[tower]
    where = _stages_text([s.name for s in states])
    setup = (
        "the "
        + _stages_text([s.name for s in states]).split(" ", 1)[1]
        + (" set-up" if len(states) == 1 else " set-ups")
    )
    live = [p for p, (t, _) in c.by_path.items() if t] or found.paths[tower]
    frozen = [p for p, (t, _) in c.by_path.items() if not t] or found.paths[tower]
    what = vlm.DISPLAY.get(tower, tower)
    if kind == "none":
        return (
            f"{where} declare{'s' if len(states) == 1 else ''} the {what} trained, but all {vlm.fmt_int(c.total)} of its "
            f"parameters have requires_grad=False, so it does not train",
            f"unfreeze it in {setup}: {_calls(frozen, True)}",
        )
    if kind == "lm_head":
        head = " and ".join(f"model.{p}" for p in live)
        body = " and ".join(f"model.{p}" for p in frozen)
        n = sum(c.by_path[p][0] for p in live)
        return (
            f"{body} is frozen but {head} is not: in transformers 5 Llava-family models lm_head sits outside "
            f"model.model.language_model, so language_model.requires_grad_(False) leaves its {vlm.fmt_int(n)} "
            f"parameters trainable and {where} train{'s' if len(states) == 1 else ''} the language model's output layer",
            f"in {setup} also call {_calls(live, False)}, or freeze the whole model first "
            f"(model.requires_grad_(False)) and unfreeze only the towers the stage declares",
        )
    if kind == "all":
        return (
            f"nothing freezes the {what} in {where}: a model from from_pretrained/from_config has every parameter "
            f"trainable, so its {vlm.fmt_int(c.total)} parameters train",
            f"in {setup} call {_calls(live, False)} (or model.requires_grad_(False), then unfreeze only the "
            f"declared towers)",
        )
    return (
        f"{vlm.fmt_int(c.trainable)} of the {what}'s {vlm.fmt_int(c.total)} parameters are still trainable in {where} "
        f"(e.g. {', '.join(c.trainable_names)})",
        f"in {setup} call {_calls(live, False)} after the code that unfreezes them",
    )


@check(
    "X1",
    domain="vlm",
    title="wrong freeze schedule across stages",
    optional_roles=("model", "stages", "stage_setup", "stage", "towers", "optimizer"),
)
def check_freeze_schedule(dlcheck):
    """Each training stage trains exactly the towers its declaration names.

    What it does
        Finds the vision tower, the projector and the language model (lm_head included) on
        transformers' Llava-family models, or by ``dlcheck_towers`` module paths. With
        ``dlcheck_stage_setup`` it runs your stage set-up on the model for every stage of
        ``dlcheck_stages`` (requires_grad and train/eval flags put back afterwards); with
        ``dlcheck_stage`` it reads the model as it is now. Per stage and tower it prints the trainable
        parameter count beside what the declaration says, and fails when a tower declared frozen has
        a trainable parameter, or a tower declared trained has none.
    Why it is bad
        The LLaVA recipe trains only the projector in stage 1 (feature alignment) and the projector
        plus the LM in stage 2; the vision tower stays frozen unless declared. A tower left trainable
        in stage 1 is updated by a randomly initialised projector's gradients and forgets its
        pretraining; a tower left frozen in stage 2 never learns the instructions. Nothing errors:
        the loss goes down either way. In transformers 5 ``lm_head`` sits outside
        ``model.model.language_model``, so freezing the language model module still trains the
        output layer.
    Example
        stages = {"align": {"projector": 1e-3}, "instruct": {"projector": 2e-5, "language_model": 2e-5}}
        stage 'align' set-up: model.model.language_model.requires_grad_(False) — the vision tower is
        never frozen, and lm_head (outside language_model in transformers 5) stays trainable.
    Use instead
        Freeze everything first, then unfreeze exactly the declared towers: model.requires_grad_(False);
        model.model.multi_modal_projector.requires_grad_(True); in stage 2 also
        model.model.language_model.requires_grad_(True) and model.lm_head.requires_grad_(True).
    Known problems
        A tower counts as trained when any of its parameters is trainable (LoRA adapters on a frozen
        LM count). Each stage is set up from the model as dlcheck_model gives it (not from the
        previous stage's state): give the model as your stage script loads it. A set-up that wraps
        the model (PEFT) should return the wrapped model; modules it replaces on the given model
        cannot be put back. Skips without dlcheck_stage_setup or dlcheck_stage.
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
    states, how = common.stage_states(dlcheck, model, found, declared)

    table, bad, other_lines, agree = [], [], [], []
    width = max(len(repr(s.name)) for s in states) + 1
    for state in states:
        stage = common.stage_named(declared, state.name)
        for tower in found.names:
            c = state.counts[tower]
            trained = stage.trained(tower)
            ok = c.trainable > 0 if trained else c.trainable == 0
            lr = stage.lrs.get(tower)
            want = f"trained (lr {vlm.fmt_lr(lr)})" if trained and lr else "trained" if trained else "frozen"
            table.append(
                f"{state.name!r:<{width}} {tower:<15} {vlm.fmt_int(c.trainable):>11} / {vlm.fmt_int(c.total):<11} "
                f"{want}" + ("" if ok else "  ✗" + _path_note(c))
            )
            if not ok:
                bad.append((state, stage, tower))
            else:
                agree.append(f"{tower} {vlm.fmt_int(c.trainable)}/{vlm.fmt_int(c.total)} {want.split(' ')[0]}")
        other = state.counts["other"]
        if other.trainable:
            other_lines.append(
                f"stage {state.name!r}: {vlm.fmt_int(other.trainable)} trainable parameters outside the towers "
                f"(e.g. {', '.join(other.trainable_names)})"
            )
    if not bad:
        pairs = len(states) * len(found.names)
        dlcheck.measured(
            f"{pairs} tower/stage pairs agree with dlcheck_stages: "
            + "; ".join(
                f"{s.name!r}: " + ", ".join(a for a in agree[i * len(found.names) : (i + 1) * len(found.names)])
                for i, s in enumerate(states)
            ),
            f"{how}; towers {found.source}",
            f"{'stage':<{width}} {'tower':<15} {'trainable / total':>25} declared",
            *table,
            *other_lines,
            stages=len(states),
            towers=len(found.names),
            trainable={s.name: {t: s.counts[t].trainable for t in found.names} for s in states},
        )
        return
    evidence = (
        [
            f"{len(bad)} tower/stage pair{'s disagree' if len(bad) != 1 else ' disagrees'} with dlcheck_stages ({how}; towers "
            f"{found.source}):",
            f"{'stage':<{width}} {'tower':<15} {'trainable / total':>25} declared",
        ]
        + table
        + other_lines
    )
    grouped: dict[tuple[str, str], list[vlm.StageState]] = {}
    for state, stage, tower in bad:
        grouped.setdefault((tower, _kind(stage, tower, state.counts[tower])), []).append(state)
    diagnoses = [_diagnose(found, group, tower, kind) for (tower, kind), group in grouped.items()]
    cause = "; ".join(d[0] for d in diagnoses[:3])
    fix = "; ".join(dict.fromkeys(d[1] for d in diagnoses[:3]))
    dlcheck.fail(evidence, cause, fix)
