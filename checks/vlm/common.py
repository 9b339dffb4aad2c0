"""What the vlm checks share: the model's towers, the declared stages and what each stage leaves
trainable (run once per session and reused by X1 and X3)."""

from __future__ import annotations

from typing import Any

from ...errors import MISSING, RoleError
from . import measure as vlm

SETUP_HINT = (
    "define fixture dlcheck_stage_setup (your (model, stage) -> optimizer set-up, run for every stage) or "
    "dlcheck_stage (the stage dlcheck_model is set up for) in conftest.py"
)


def towers(ctx: Any, model: Any) -> vlm.Towers:
    value = ctx.role("towers")
    if value is MISSING:
        ctx.skip(
            f"the towers of {type(model).__name__} were not found: define fixture dlcheck_towers "
            "({'vision': ..., 'projector': ..., 'language_model': [...]}, module paths) in conftest.py"
        )
    if isinstance(value, vlm.Towers):
        return value
    return ctx.memo((model, value), "vlm:declared_towers", lambda: vlm.declared_towers(model, value))


def maybe_towers(ctx: Any, model: Any) -> vlm.Towers | None:
    value = ctx.role("towers")
    if value is MISSING:
        return None
    if isinstance(value, vlm.Towers):
        return value
    return ctx.memo((model, value), "vlm:declared_towers", lambda: vlm.declared_towers(model, value))


def towers_for(model: Any, found: vlm.Towers, raw: Any) -> Any:
    """Towers on the model a stage set-up returns (a PEFT wrapper, a fresh copy): the same object keeps
    its towers; another is searched by name, declared paths matched as suffixes."""

    def resolve(target: Any) -> vlm.Towers:
        if target is model:
            return found
        if isinstance(raw, vlm.Towers) or raw is MISSING:
            auto = vlm.find_towers(target)
            if auto is None:
                raise RoleError(
                    "stage_setup",
                    f"returned a {type(target).__name__} whose vision tower, projector and "
                    "language model are not found by name; define dlcheck_towers",
                )
            return auto
        names = [n for n, _ in target.named_modules()]
        paths = {}
        for tower, items in found.paths.items():
            hits = [n for p in items for n in names if n == p or n.endswith("." + p)]
            if not hits:
                raise RoleError(
                    "stage_setup",
                    f"returned a {type(target).__name__} without the {tower} modules {items} of dlcheck_towers",
                )
            paths[tower] = hits
        return vlm.Towers(paths, found.source)

    return resolve


def stages(ctx: Any, found: vlm.Towers) -> list[vlm.Stage]:
    raw = ctx.role("stages")
    return ctx.memo((raw,), f"vlm:stages:{','.join(found.names)}", lambda: vlm.parse_stages(raw, found.names))


def _capture(make: Any) -> Any:
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - re-raised for each check that asks
        return exc


def stage_states(
    ctx: Any, model: Any, found: vlm.Towers, declared: list[vlm.Stage]
) -> tuple[list[vlm.StageState], str]:
    """What every declared stage leaves trainable (dlcheck_stage_setup), or the one stage the model is
    in now (dlcheck_stage). Returns the states and a phrase saying how they were measured."""
    names = [s.name for s in declared]
    setup = ctx.role("stage_setup")
    if setup is not MISSING:
        if not callable(setup):
            raise RoleError(
                "stage_setup", f"expected a callable (model, stage) -> optimizer, got {type(setup).__name__}"
            )
        resolve = towers_for(model, found, ctx.role("towers"))
        result = ctx.memo(
            (model, setup),
            f"vlm:stage_states:{','.join(names)}",
            lambda: _capture(lambda: [vlm.apply_stage(model, setup, n, resolve) for n in names]),
        )
        if isinstance(result, BaseException):
            raise result
        current = ctx.role("stage")
        optimizer = ctx.role("optimizer")
        if optimizer is not MISSING and current in names:
            for state in result:
                if state.name == current and state.optimizer is None:
                    state.optimizer = optimizer
        return result, "dlcheck_stage_setup run on dlcheck_model for each stage"
    current = ctx.role("stage")
    if current is MISSING:
        ctx.skip(f"which stage is the model in? {SETUP_HINT}")
    if current not in names:
        raise RoleError("stage", f"{current!r} is not a stage of dlcheck_stages ({', '.join(map(repr, names))})")
    state = vlm.count(model, found, current)
    optimizer = ctx.role("optimizer")
    state.optimizer = None if optimizer is MISSING else optimizer
    return [state], f"dlcheck_model as set up for stage {current!r}"


def stage_named(declared: list[vlm.Stage], name: str) -> vlm.Stage:
    return next(s for s in declared if s.name == name)


def params_expression(found: vlm.Towers, tower: str) -> str:
    paths = found.paths[tower]
    if len(paths) == 1:
        return f"model.{paths[0]}.parameters()"
    return "[" + ", ".join(f"*model.{p}.parameters()" for p in paths) + "]"


def projector_module(model: Any, found: vlm.Towers) -> tuple[str, Any]:
    path = found.paths["projector"][0]
    return path, model.get_submodule(path)
