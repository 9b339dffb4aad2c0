"""Schedulers told their position by the loop: timm's (``step(epoch)`` at an epoch's end, ``step_update(num_updates)``
after an optimizer update) keep no step counter of their own, unlike a torch LR scheduler (``last_epoch``,
``_step_count``). Their calls during a run are counted by wrapping the two methods on the scheduler's class for the
run's length, counting only that scheduler's calls; nothing is set on the instance (its ``state_dict`` is its
``__dict__``, which a save during the run pickles), and the class is put back as it was when the run ends."""

from __future__ import annotations

from typing import Any

#: the methods a told scheduler is stepped with, and the argument that tells it its position
METHODS = (("step", "epoch"), ("step_update", "num_updates"))


def told_scheduler(scheduler: Any) -> bool:
    """Whether ``scheduler`` (unwrapped) is told its position by the loop: it has ``step`` and ``step_update``, an
    optimizer, and no counter of its own (no ``last_epoch`` / ``_step_count``, which a torch LR scheduler keeps)."""
    if scheduler is None or isinstance(scheduler, type):
        return False
    return (
        getattr(scheduler, "optimizer", None) is not None
        and callable(getattr(scheduler, "step", None))
        and callable(getattr(scheduler, "step_update", None))
        and not hasattr(scheduler, "last_epoch")
        and not hasattr(scheduler, "_step_count")
    )


class ToldCalls:
    """Counts a told scheduler's ``step`` / ``step_update`` calls from construction to :meth:`stop`, with the positions
    the loop passed (``calls["step"]``: the epochs, ``calls["step_update"]``: the update counts). For any other
    scheduler it counts nothing (``active`` False)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.active = told_scheduler(scheduler)
        self.calls: dict[str, list[Any]] = {name: [] for name, _ in METHODS}
        self._saved: list[tuple[type, str, bool, Any]] = []
        if not self.active:
            return
        cls = type(scheduler)
        for name, arg in METHODS:
            original = getattr(cls, name)
            self._saved.append((cls, name, name in vars(cls), vars(cls).get(name)))
            setattr(cls, name, self._wrap(original, name, arg))

    def _wrap(self, original: Any, name: str, arg: str) -> Any:
        target, seen = self.scheduler, self.calls[name]

        def counted(sched, *args, **kwargs):
            if sched is target:
                seen.append(args[0] if args else kwargs.get(arg))
            return original(sched, *args, **kwargs)

        counted.__name__ = getattr(original, "__name__", name)
        counted.__doc__ = getattr(original, "__doc__", None)
        counted.__wrapped__ = original
        return counted

    def stop(self) -> None:
        """Put the class back as it was (idempotent)."""
        while self._saved:
            cls, name, own, value = self._saved.pop()
            if own:
                setattr(cls, name, value)
            else:
                delattr(cls, name)

    def describe(self) -> str:
        """``CosineLRScheduler (told its position by your loop): step(epoch) 2 times (epochs 1, 2),
        step_update(num_updates) 0 times``."""
        parts = []
        for name, arg in METHODS:
            seen = self.calls[name]
            shown = ", ".join(str(v) for v in seen[:6]) + (", …" if len(seen) > 6 else "")
            what = "epochs" if name == "step" else "updates"
            parts.append(
                f"{name}({arg}) {len(seen)} time{'' if len(seen) == 1 else 's'}"
                + (f" ({what} {shown})" if seen else "")
            )
        return f"{type(self.scheduler).__name__} (told its position by your loop): " + ", ".join(parts)
