"""Putting a stand-in for a module's ``forward`` on the instance itself, and taking it off again.

``module.forward = fn`` goes through the wrapper's own ``__setattr__``: Lightning Fabric's ``_FabricModule``
forwards attribute writes to the module it wraps, so the stand-in landed on the inner module, whose forward the
wrapper then called through the stand-in, which called the wrapper again (a RecursionError blamed on the user's
loss). Writing to the instance's own ``__dict__`` keeps the stand-in where it was put, for any module."""

from __future__ import annotations

from typing import Any

#: what :func:`own_forward` returns for an instance without a forward of its own
ABSENT = object()


def own_forward(module: Any) -> Any:
    """The forward the instance holds itself (not its class's), or :data:`ABSENT`."""
    return vars(module).get("forward", ABSENT)


def put_forward(module: Any, fn: Any) -> None:
    object.__setattr__(module, "forward", fn)


def restore_forward(module: Any, own: Any) -> None:
    """Put back what :func:`own_forward` read (``None`` is read as absent too)."""
    if own is ABSENT or own is None:
        vars(module).pop("forward", None)
    else:
        object.__setattr__(module, "forward", own)
