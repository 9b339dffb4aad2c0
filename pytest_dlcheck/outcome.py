"""What a check says when it fails, and how it is printed: ID and title, evidence, cause, fix, see."""

from __future__ import annotations

import sys
import textwrap
import traceback
from dataclasses import dataclass, field

from .errors import MISSING, CheckFailed, RoleError
from .session import in_plugin, synthetic_input

WIDTH = 100


@dataclass(eq=False)
class Rendered:
    """A failure in the house format. pytest calls ``toterminal`` (colour where the terminal supports it);
    ``str()`` gives the plain text (xdist ships that)."""

    check_id: str
    title: str
    domain: str
    rows: list[tuple[str, list[str]]] = field(default_factory=list)

    def lines(self) -> list[tuple[str, str]]:
        """(label, text) pairs; the first is the header line."""
        head = f"{self.check_id} {self.title}"
        tag = f"[{self.domain}]"
        out = [("", head + " " * max(2, WIDTH - len(head) - len(tag)) + tag)]
        for label, texts in self.rows:
            first = True
            for text in texts:
                for piece in textwrap.wrap(
                    text, WIDTH - 12, break_long_words=False, break_on_hyphens=False, replace_whitespace=False
                ) or [""]:
                    out.append((label if first else "", piece))
                    first = False
        return out

    def toterminal(self, tw) -> None:
        markup = {"evidence": {"yellow": True}, "cause": {"red": True}, "fix": {"green": True}, "error": {"red": True}}
        for i, (label, text) in enumerate(self.lines()):
            if i == 0:
                tw.line(text, bold=True, red=True)
                continue
            tw.write(f"  {label:<9} ", **markup.get(label, {}), bold=bool(label))
            tw.line(text)

    def __str__(self) -> str:
        return "\n".join(text if i == 0 else f"  {label:<9} {text}" for i, (label, text) in enumerate(self.lines()))


def render_failure(check, exc: CheckFailed) -> Rendered:
    r = Rendered(check.id, check.title, check.domain)
    r.rows.append(("evidence", list(exc.evidence)))
    r.rows.append(("cause", [exc.cause]))
    r.rows.append(("fix", [exc.fix]))
    r.rows.append(("see", [f"pytest --dlcheck-list {check.id}"]))
    return r


def render_role_error(check, exc: RoleError) -> Rendered:
    r = Rendered(check.id, check.title, check.domain)
    r.rows.append(("error", [exc.message]))
    r.rows.append(("role", [f"dlcheck_{exc.role} (the fixture that provides it, or the object it was derived from)"]))
    r.rows.append(("see", [f"pytest --dlcheck-list {check.id}"]))
    return r


# --------------------------------------------------------------------------------------------------
# what escaped a check: a user's object that raised, an object no check can use, or a plugin bug


ID_FIELDS = ("input_ids", "labels", "attention_mask", "position_ids", "token_type_ids")
#: batch fields that are tensors of one shape per batch in every pipeline we know
TENSOR_FIELDS = ID_FIELDS + (
    "pixel_values",
    "latents",
    "noise",
    "noisy_latents",
    "timesteps",
    "target",
    "encoder_hidden_states",
    "images",
)


def _tb_frames(exc: BaseException) -> list:
    return [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]


def _torch():
    return sys.modules.get("torch")


def _is_module(value: object) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.nn.Module)


def _owner_role(frame, roles: dict) -> str | None:
    """The role whose object is running in ``frame`` (its ``self``, a submodule of it, or its code)."""
    owner = frame.f_locals.get("self")
    code = frame.f_code
    # a torch DataLoader's iterator (it re-raises what a worker's fetch raised) runs the loader it was made from,
    # over that loader's dataset: the role whose loader (or dataset) it is
    dataset = getattr(owner, "_dataset", None) if type(owner).__name__.endswith("DataLoaderIter") else None
    for name, value in roles.items():
        if owner is not None and value is owner:
            return name
        if dataset is not None and (value is dataset or getattr(value, "dataset", None) is dataset):
            return name
        func = getattr(value, "__func__", value)
        if getattr(func, "__code__", None) is code or getattr(value, "gi_code", None) is code:
            return name
        if owner is not None and _is_module(value) and _is_module(owner) and any(m is owner for m in value.modules()):
            return name
        if owner is not None and _copy_of(owner, value):
            return name
    return None


def _copy_of(owner: object, value: object) -> bool:
    """``owner`` is a copy the check made of the user's object (same class, or a subclass the check
    derived from it) — a Trainer cloned to train on fresh weights runs the user's configuration — or a
    module of a copy of the user's model (the role's own, or its ``.model``)."""
    if _is_module(owner):
        for model in (value, getattr(value, "model", None)):
            if (
                _is_module(model)
                and type(owner) in {type(m) for m in model.modules()}
                and not type(owner).__module__.startswith("torch.")
            ):
                return True
        return False
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    if module.startswith(("builtins", "torch", "numpy", "collections", "functools")) or kind in (type, object):
        return False
    return owner is not value and isinstance(owner, kind)


def _roles_of(ctx) -> dict:
    if ctx is None:
        return {}
    return {n: v for n, v in getattr(ctx, "_roles", {}).items() if v is not MISSING and v is not None}


def _frame_text(frame) -> str:
    import os

    try:
        path = os.path.relpath(frame.f_code.co_filename)
    except ValueError:
        path = frame.f_code.co_filename
    return f"{frame.f_code.co_name} at {path}:{frame.f_lineno}"


def _object_problem(value: object) -> str | None:
    if _is_module(value):
        for name, t in list(value.named_parameters()) + list(value.named_buffers()):
            if t.is_meta:
                return (
                    f"has tensors on the meta device (e.g. {name}): it holds no weights to run; materialise it "
                    "(to_empty() and load the weights, or from_pretrained without device_map='meta')"
                )
    return None


def _lengths(value) -> list[int] | None:
    lengths = []
    for row in value:
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__"):
            return None
        lengths.append(len(row))
    return lengths


def _field_problem(key: str, value, raw: bool = False) -> str | None:
    """What makes one batch field unusable by any computation: a meta tensor, float token ids, ragged rows.
    (A NaN or a None is no such thing: a check that crashes on it is the plugin's bug.) ``raw``: a field of an
    example before collation, whose lists are ragged by nature (the collator pads them; a multiple-choice example
    holds one list per choice)."""
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_meta:
            return "is a tensor on the meta device (it holds no values)"
        if key in ID_FIELDS and key != "attention_mask" and (value.is_floating_point() or value.is_complex()):
            return f"has dtype {value.dtype}, expected integer token ids"
        return None
    if type(value).__name__ == "ndarray" and str(getattr(value, "dtype", "")) == "object":
        return "is a numpy array of dtype object (ragged rows?)"
    if isinstance(value, (list, tuple)) and key in TENSOR_FIELDS and value:
        lengths = _lengths(value)
        if lengths and len(set(lengths)) > 1 and not raw:
            return (
                f"is a ragged {type(value).__name__} (rows of {min(lengths)} to {max(lengths)} items), expected "
                "rows padded to one length (a tensor)"
            )
        if key in ID_FIELDS and any(isinstance(v, float) for v in value):
            return f"is a {type(value).__name__} of floats, expected integer token ids"
    if isinstance(value, str) and key in ID_FIELDS:
        return "is a string, expected token ids"
    return None


def _mapping_problem(b, exc: BaseException, raw: bool = False) -> str | None:
    torch = _torch()
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) and exc.args[0] not in b:
        return f"has no field {exc.args[0]!r} (fields: {', '.join(map(str, b)) or 'none'})"
    for key, value in b.items():
        problem = _field_problem(str(key), value, raw)
        if problem:
            return f"field {key!r} {problem}"
    if torch is not None:
        shapes = {k: tuple(v.shape) for k, v in b.items() if k in ID_FIELDS and isinstance(v, torch.Tensor)}
        if len(set(shapes.values())) > 1:
            return "fields of different shapes: " + ", ".join(f"{k} {v}" for k, v in shapes.items())
    return None


#: the attributes of a Sample that hold examples before collation (their lists are ragged by nature)
RAW_ATTRS = ("rows", "raw_rows")


def _find(value, exc: BaseException, depth: int = 3, budget: list | None = None, raw: bool = False) -> str | None:
    """The first problem in a batch, a list of batches, a Sample (its batches and rows), a tensor or a
    dict/list around them; bounded. ``raw``: examples before collation."""
    from collections.abc import Mapping

    budget = [300] if budget is None else budget
    budget[0] -= 1
    if depth < 0 or budget[0] < 0:
        return None
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return "is a tensor on the meta device (it holds no values)" if value.is_meta else None
    if isinstance(value, Mapping):
        found = _mapping_problem(value, exc, raw)
        if found:
            return found
        for k, v in list(value.items())[:32]:
            if isinstance(v, (Mapping, list, tuple)):
                inner = _find(v, exc, depth - 1, budget, raw)
                if inner:
                    return f"[{k!r}] {inner}"
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:16]):
            inner = _find(v, exc, depth - 1, budget, raw)
            if inner:
                return f"item {i}: {inner}"
        return None
    fields = getattr(value, "__dict__", None)  # a Sample, a draw, an item: the plugin's own records
    if isinstance(fields, dict) and not _is_module(value) and not isinstance(value, type):
        for attr, inner in list(fields.items())[:16]:
            if isinstance(inner, (list, tuple, Mapping)) or (torch is not None and isinstance(inner, torch.Tensor)):
                found = _find(inner, exc, depth - 1, budget, raw or attr in RAW_ATTRS)
                if found:
                    return f"{attr} {found}"
    return None


def _role_for(sources, roles: dict, prefer: tuple[str, ...]) -> str | None:
    objs = sources if isinstance(sources, tuple) else (sources,)
    names = [n for n, v in roles.items() if any(v is o for o in objs)]
    for name in prefer:
        if name in names:
            return name
    return names[0] if names else None


DATA_ROLES = ("collator", "dataloader", "dataset", "eval_dataloader", "eval_dataset", "raw_dataset")
#: the roles that hold examples before collation (their lists are ragged by nature: the collator pads them)
RAW_ROLES = ("dataset", "eval_dataset", "raw_dataset")


def _mentions(exc: BaseException, value: object) -> bool:
    """The exception's message names the object's type or shows its value: int(dict) → "not 'dict'"."""
    text = _exc_text(exc, 2000)
    kind = type(value).__name__
    if f"'{kind}'" in text or f"{kind} object" in text:
        return True
    try:
        shown = repr(value)
    except Exception:  # noqa: BLE001
        return False
    return len(shown) >= 3 and shown in text


def explain(ctx, exc: BaseException) -> RoleError | None:
    """A RoleError naming the role behind ``exc`` and what is wrong with it, or None (a plugin bug).

    None when the user's code raised ``exc`` on an input the check made up (``user_call(..., synthetic=)``):
    that is the plugin's error. Else, in order: a value one of the user's objects returned or the data
    sample holds that no computation can use (a tensor on the meta device, float token ids, ragged rows, a
    field the check needs missing); an object no check can run (a model on the meta device); the user's
    object whose code raised; such unusable data in the check's frames; a role whose type or value the error
    names (int() of a dict). Values that are merely unusual (a NaN, a None) blame nobody: an exception the
    check's own code raised on them is the plugin's."""
    if synthetic_input(exc) is not None:
        return None
    roles = _roles_of(ctx)
    frames = _tb_frames(exc)
    inside = [i for i, f in enumerate(frames) if in_plugin(f.f_code.co_filename)]
    text = f"{type(exc).__name__}: {_exc_text(exc)}"
    check = getattr(getattr(ctx, "check", None), "id", "the check")
    stopped = f"{check} stopped on {text}"
    returned = list(reversed(getattr(ctx, "returned", []) if ctx is not None else []))
    used = list(reversed(getattr(ctx, "used", []) if ctx is not None else []))

    def data_problem() -> RoleError | None:
        """In what the user's objects returned and the shared samples the check used."""
        for role, value in returned:
            problem = _find(value, exc, raw=role in RAW_ROLES)
            if problem:
                return RoleError(role, f"returned a value whose {problem} ({stopped})")
        for sources, _key, value in used:
            if isinstance(value, BaseException):
                continue
            name = _role_for(sources, roles, DATA_ROLES)
            problem = _find(value, exc, raw=name in RAW_ROLES) if name is not None else None
            if problem:
                return RoleError(name, f"gave data whose {problem} ({stopped})")
        return None

    def frame_problem() -> RoleError | None:
        """A failure while the shared data was being read: the partial data is in the plugin's frames, the
        objects it was read from in the memo() frame it happened under."""
        memos = [
            f
            for f in frames
            if f.f_code.co_name == "memo" and in_plugin(f.f_code.co_filename) and "sources" in f.f_locals
        ]
        sources = memos[-1].f_locals.get("sources") if memos else None
        name = (_role_for(sources, roles, DATA_ROLES) if sources is not None else None) or next(
            (r for r in DATA_ROLES if r in roles), None
        )
        if name is None:
            return None
        for frame in reversed(frames):
            if not in_plugin(frame.f_code.co_filename) or frame.f_code.co_name in ("memo", "explain"):
                continue
            for local in list(frame.f_locals.values())[:32]:
                # a role itself, or the check's context (its records of what the check used are data_problem's)
                if local is ctx or any(local is v for v in roles.values()):
                    continue
                problem = _find(local, exc, depth=2, raw=name in RAW_ROLES)
                if problem:
                    return RoleError(name, f"gave data whose {problem} ({stopped} in {_frame_text(frame)})")
        return None

    found = data_problem()
    if found is not None:
        return found
    for name, value in roles.items():
        problem = _object_problem(value)
        if problem:
            return RoleError(name, f"{problem} ({stopped})")
    if inside and inside[-1] < len(frames) - 1:  # raised in code the check called: whose object?
        for frame in reversed(frames[inside[-1] + 1 :]):
            name = _owner_role(frame, roles)
            if name is not None:
                return RoleError(name, f"raised {text} (in {_frame_text(frames[-1])})")
    found = frame_problem()
    if found is not None:
        return found
    named = [n for n, v in roles.items() if _mentions(exc, v)]
    if len(named) == 1:
        value = roles[named[0]]
        return RoleError(named[0], f"is {_kind(value)}, which {check} cannot use ({text})")
    return None


def _kind(value: object) -> str:
    try:
        shown = repr(value)
    except Exception:  # noqa: BLE001
        shown = "?"
    return f"a {type(value).__name__} ({shown if len(shown) <= 40 else shown[:37] + '...'})"


def _exc_text(exc: BaseException, limit: int = 300) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        text = f"<{type(exc).__name__} whose str() failed>"
    if text.startswith("Caught ") and "Original Traceback" in text:
        # a DataLoader worker's error, re-raised with the worker's whole traceback: what the worker raised is the
        # traceback's last line
        last = [line for line in text.splitlines() if line.strip()][-1].strip()
        text = f"{text.split('.', 1)[0]}: {last}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _role_types(roles: dict) -> str:
    return ", ".join(f"dlcheck_{n} = {type(v).__name__}" for n, v in roles.items()) or "none resolved"


def internal_note(check, ctx, exc: BaseException) -> str:
    """What an internal error of the plugin says: that it is pytest-dlcheck's bug, what was raised, the plugin's
    frame it was raised in (or, for the user's code handed an input the check made up, the plugin's frame that
    made the call and what the input was), the roles the check ``check`` had resolved (its context ``ctx``),
    and a request to report it."""
    frames = [f for f in _tb_frames(exc) if in_plugin(f.f_code.co_filename)]
    where = _frame_text(frames[-1]) if frames else "an unknown place in pytest-dlcheck"
    made_up = synthetic_input(exc)
    what = f"{type(exc).__name__}: {_exc_text(exc)}" + (
        f" ({made_up}, not on your pipeline's own data)" if made_up else ""
    )
    roles = _roles_of(ctx)
    return (
        f"internal error of pytest-dlcheck (this is a bug of pytest-dlcheck, not of your pipeline): {what} at "
        f"{where}; please report it with this output. {check.id} had the roles {_role_types(roles)}."
    )


def timeout_rendered(check, ctx, exc: BaseException) -> Rendered:
    """A check stopped by its time bound, in the house format: where it was, and whose object did not return."""
    roles = _roles_of(ctx)
    frames = _tb_frames(exc)[:-1]  # the last one is the alarm handler
    inside = [i for i, f in enumerate(frames) if in_plugin(f.f_code.co_filename)]
    role = where = None
    start = inside[-1] + 1 if inside else 0
    for frame in frames[start:]:
        role = role or _owner_role(frame, roles)
    if frames and start < len(frames):
        where = f"in {_frame_text(frames[-1])}" + (f" (dlcheck_{role})" if role else "")
    elif frames:
        where = f"in pytest-dlcheck's own code, {_frame_text(frames[-1])}"
    r = Rendered(check.id, check.title, check.domain)
    r.rows.append(
        (
            "error",
            [
                f"did not finish within {getattr(exc, 'seconds', 0):g} s (--dlcheck-timeout); it was "
                f"stopped {where or 'running'}"
            ],
        )
    )
    if role:
        r.rows.append(("role", [f"dlcheck_{role}: it did not return (an endless iterator or loop, a hung worker?)"]))
    r.rows.append(
        (
            "fix",
            [
                "make the object return promptly on a few examples, or raise the bound: "
                "--dlcheck-timeout=SECONDS (ini dlcheck_timeout; 0 turns it off)"
            ],
        )
    )
    r.rows.append(("see", [f"pytest --dlcheck-list {check.id}"]))
    return r
