"""The smoke detectors during the real run: the same S1-S5 and R1 that judge a short run inside pytest,
watching the user's own training, where the GPU time is spent.

    from pytest_dlcheck.watch import TrainerWatch
    trainer.add_callback(TrainerWatch())                     # transformers / TRL Trainer

    from pytest_dlcheck.watch import LightningWatch
    L.Trainer(callbacks=[LightningWatch()])                  # Lightning

    from pytest_dlcheck.watch import Watch
    watch = Watch(output_dir="runs/7")                       # a hand-written or Accelerate loop
    for batch in loader:
        loss = model(**batch).loss; loss.backward(); optimizer.step()
        if watch.step(loss=loss, model=model, optimizer=optimizer):
            break                                            # a detector fired (policy "stop")
        optimizer.zero_grad()

Every step costs a few Python operations: the loss is kept as a tensor (no ``.item()``); every ``every``
steps the kept values are read at once (one synchronisation with the GPU), the gradient norm is taken
(before clipping: the Trainer's logged ``grad_norm``, Lightning's ``on_before_optimizer_step``; ``Watch.step``
reads the gradients as they are when called, so a loop that clips passes ``grad_norm=clip_grad_norm_(...)``),
the detectors judge each step since the last check (S2 against the run's start too, not only its recent steps),
and under ``torch.distributed`` the ranks agree (one ``all_reduce``) so every rank stops at the same step.

On a detection the message reads like a failing check (ID, evidence with the step and the numbers,
cause, fix), a postmortem JSON is written beside the run's output (the last ``history`` steps' losses,
learning rates and gradient norms, the evidence, the library versions: ``postmortem.schema.json``, whose
results are ``--dlcheck-json`` results), and the policy decides: ``"warn"`` (a :class:`WatchWarning`,
training goes on), ``"stop"`` (the default: the Trainer's ``control.should_training_stop``, Lightning's
``trainer.should_stop``, ``Watch.step`` returns True) or ``"raise"`` (:class:`WatchAlarm`).

It is said where the user looks, whatever the warning filters (``python -W ignore`` hides only the
:class:`WatchWarning`): a ``logging`` record on the logger ``pytest_dlcheck.watch`` (the whole message; ERROR,
WARNING under "warn"), one line on stderr that starts on a line of its own (not glued to a progress bar)
naming the finding, its cause, what the policy does and the postmortem's path; the Trainer's own ``log()``
(``state.log_history`` and every ``report_to`` tracker), Lightning's loggers, and an alert on the active W&B
run (``wandb.run.alert``; wandb is never imported by the watch).

Nothing is healed: the watch never lowers a learning rate, skips a batch or restores weights. A run that
silently repairs itself hides the bug that made it fail; the postmortem is there so that it is fixed.

Importing this module imports neither torch, transformers nor lightning: :class:`TrainerWatch` and
:class:`LightningWatch` are built on first use."""

from __future__ import annotations

import json
import logging
import math
import platform
import sys
import time
import warnings
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__, detectors
from .outcome import Rendered
from .report import SCHEMA_VERSION, Result, jsonable, library_versions

POLICIES = ("warn", "stop", "raise")
#: the detectors in the order they are judged at a step (and their code in the ranks' all_reduce)
ORDER = ("S1", "S2", "S3", "S4", "S5", "R1")
DOMAIN = {"R1": "rl"}
#: what every row of a check holds; anything more is a metric (eval_loss, reward, rewards/accuracies, ...)
BASE_ROW = ("step", "loss", "grad_norm", "lr")


class WatchWarning(UserWarning):
    """A detector fired during the run (every policy says so with this warning, except ``"raise"``)."""


class WatchAlarm(RuntimeError):
    """A detector fired under ``policy="raise"``; ``finding`` and ``postmortem`` say which and where."""

    def __init__(self, finding: Finding, postmortem: Path | None):
        super().__init__(finding.text)
        self.finding = finding
        self.postmortem = postmortem


@dataclass
class Finding:
    id: str
    step: int
    evidence: list[str]
    cause: str
    fix: str
    data: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def title(self) -> str:
        return f"{detectors.TITLES[self.id]} during the run (step {self.step})"

    def render(self, postmortem: Path | None) -> Rendered:
        r = Rendered(self.id, self.title, DOMAIN.get(self.id, "smoke"))
        r.rows.append(("evidence", list(self.evidence)))
        r.rows.append(("cause", [self.cause]))
        r.rows.append(("fix", [self.fix]))
        see = [f"postmortem {postmortem}"] if postmortem is not None else []
        r.rows.append(("see", see + [f"pytest --dlcheck-list {self.id}"]))
        return r


@dataclass
class _Step:
    step: int
    losses: list[Any] = field(default_factory=list)  # tensors (kept, not read) or floats
    grad_norm: Any = None
    lr: Any = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, kept: tuple) -> _Step:
        """A step that :meth:`Watch.step` kept as (step, loss, lr)."""
        step, loss, lr = kept
        return cls(step, [] if loss is None else [loss], None, lr)


def _num(value: float | None, spec: str = ".4g") -> str:
    return "not logged" if value is None else format(value, spec)


class Watch:
    """The detectors over a running training; the framework callbacks feed one of these.

    ``policy``: "warn", "stop" or "raise". ``every``: steps between checks (one read of the kept values,
    one gradient norm, one all_reduce under torch.distributed). ``history``: how many last steps the
    postmortem keeps. ``overrides``: ``{"S2.factor": 5}``, the ``--dlcheck-set`` names. ``checks``: the
    detectors to run (default all; each acts only when its inputs come). ``preference``: the loss is a DPO
    loss (S4; the Trainer callback tells from the run's log). ``output_dir``: where the postmortem goes."""

    def __init__(
        self,
        *,
        policy: str = "stop",
        every: int = 25,
        history: int = 200,
        overrides: dict[str, Any] | None = None,
        checks: tuple[str, ...] | list[str] | None = None,
        preference: bool = False,
        output_dir: str | Path | None = None,
        framework: str = "loop",
    ):
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r}: choose from {', '.join(POLICIES)}")
        if int(every) < 1:
            raise ValueError(f"every={every!r}: a number of steps, at least 1")
        unknown = set(checks or ()) - set(ORDER)
        if unknown:
            raise ValueError(
                f"checks: unknown detector(s) {', '.join(sorted(unknown))}; choose from {', '.join(ORDER)}"
            )
        self.policy, self.every, self.framework = policy, int(every), framework
        self.settings = detectors.resolve(overrides)
        self.overrides = dict(overrides or {})
        self.active = set(checks or ORDER)
        self.preference = preference
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.history: deque[dict[str, Any]] = deque(maxlen=history)
        self.findings: list[Finding] = []
        self.postmortems: list[Path] = []
        self.should_stop = False
        self.notes: list[str] = []
        #: called with (finding, postmortem path, the stderr line) at a detection: the framework callbacks log there
        self.reporters: list[Any] = []
        self._pending: list[_Step | tuple] = []  # the steps since the last check, not read yet
        self._count = 0  # steps seen (the step number when the caller gives none)
        self._last_check = 0
        s = self.settings
        self._spikes = detectors.SpikeWatch(s["S2"]["factor"], s["S2"]["window"], s["S2"]["warmup"])
        # S2 against the run's start too: a running mean follows a run that diverged early and stays there
        self._rises = detectors.RiseWatch(s["S2"]["rise"], s["S2"]["window"], s["S2"]["warmup"])
        self._grads = detectors.GradWatch(s["S3"]["factor"], s["S3"]["baseline"])
        self._rewards = detectors.RewardWatch(
            s["R1"]["reward_jump"], s["R1"]["kl_spike"], s["R1"]["length_collapse"], horizon=max(history, 50)
        )
        self._finite: deque[float] = deque(maxlen=history)  # finite losses, for S1's "rose before" and S5
        self._first_losses: list[float] = []  # the run's first finite losses (S5: did the training loss fall?)
        self._pref: list[tuple[int, float]] = []  # S4's first logged losses
        self._accs: list[float] = []
        self._evaluated = False  # S5: an evaluation was judged before
        self._keys: dict[str, str] = {}
        #: (policy, reference model) of a preference run, when known: S4 then names a shared reference
        self.reference: tuple[Any, Any] | None = None

    # ----------------------------------------------------------------------------------------------
    # feeding

    def step(
        self,
        loss: Any = None,
        *,
        model: Any = None,
        optimizer: Any = None,
        lr: float | None = None,
        grad_norm: Any = None,
        eval_loss: float | None = None,
        step: int | None = None,
        **metrics: Any,
    ) -> bool:
        """One optimizer step of a hand-written loop; call it after ``optimizer.step()`` and before
        ``optimizer.zero_grad()`` (the gradient norm is taken from ``model``'s gradients every ``every``
        steps, unless ``grad_norm`` is given, e.g. what ``clip_grad_norm_`` returned). ``loss`` may be the
        loss tensor itself: it is read only at the check. ``metrics``: ``reward``, ``kl``, ``length`` (R1;
        TRL and SB3 log names work too), ``accuracy`` (the preference accuracy, S4, with ``preference=True``).
        ``eval_loss`` is judged (S5) at the next check. Under torch.distributed, call it on every rank at
        every step: the ranks agree at the checks. Returns True when the run should stop (a detector fired
        under policy "stop"); under "raise" it raises :class:`WatchAlarm`."""
        if step is None:
            step = self._count + 1
        if optimizer is not None and lr is None:
            lr = optimizer.param_groups[0].get("lr")
        due = step - self._last_check >= self.every
        if not due and grad_norm is None and eval_loss is None and not metrics:
            # the common step: keep the loss (a tensor stays a tensor) and the learning rate, nothing more
            self._pending.append((step, loss.detach() if hasattr(loss, "detach") else loss, lr))
            self._count = step
            return self.should_stop
        if grad_norm is None and model is not None and due:
            grad_norm = gradient_norm(model)
        self.observe(step, loss=loss, lr=lr, grad_norm=grad_norm, eval_loss=eval_loss, **metrics)
        if due:  # on step numbers alone, so that every rank of a distributed run checks at the same steps
            self.check(model)
        return self.should_stop

    def observe(self, step: int, loss: Any = None, lr: Any = None, grad_norm: Any = None, **metrics: Any) -> None:
        """Keep a step's values without reading them (tensors stay tensors until the check)."""
        last = self._pending[-1] if self._pending else None
        if isinstance(last, tuple):  # kept by step()'s common path
            last = self._pending[-1] = _Step.of(last)
        if last is None or last.step != step:
            last = _Step(step)
            self._pending.append(last)
            self._count = max(self._count, step)
        rec = last
        if loss is not None:
            rec.losses.append(loss.detach() if hasattr(loss, "detach") else loss)
        if lr is not None:
            rec.lr = lr
        if grad_norm is not None:
            rec.grad_norm = grad_norm.detach() if hasattr(grad_norm, "detach") else grad_norm
        rec.metrics.update({k: v for k, v in metrics.items() if v is not None})

    def due(self, step: int) -> bool:
        return step - self._last_check >= self.every

    # ----------------------------------------------------------------------------------------------
    # judging

    def check(self, model: Any = None) -> Finding | None:
        """Read the kept steps (one synchronisation), judge them in order, agree across ranks, apply the
        policy. Returns the finding acted on, if any."""
        pending, self._pending = self._pending, []
        if pending:
            self._last_check = pending[-1][0] if isinstance(pending[-1], tuple) else pending[-1].step
        rows = _read(pending)
        found = None
        for row in rows:
            self._remember(row)
            hit = self._judge(row, model)
            if hit is not None and found is None:
                found = hit
        at = rows[-1]["step"] if rows else self._count
        found = self._agree(found, at)
        if found is not None:
            self._act(found, at)
        return found

    def _remember(self, row: dict[str, Any]) -> None:
        if self.history and self.history[-1]["step"] == row["step"]:
            self.history[-1].update({k: v for k, v in row.items() if v is not None})
        else:
            self.history.append(dict(row))

    def _on(self, cid: str) -> bool:
        """Whether ``cid`` still judges (each detector fires once per run, and some turn off)."""
        return cid in self.active

    def _judge(self, row: dict[str, Any], model: Any) -> Finding | None:
        step, loss, norm, lr = row["step"], row["loss"], row["grad_norm"], row["lr"]
        found: list[Finding] = []
        if self._on("S1"):
            hit = self._nonfinite(step, loss, norm, lr, model)
            if hit:
                found.append(hit)
        if loss is not None and math.isfinite(loss):
            self._finite.append(loss)
            if len(self._first_losses) < 10:
                self._first_losses.append(loss)
            if self._on("S2"):
                if loss < 0:
                    self.active.discard("S2")
                    self.notes.append(
                        f"S2 off from step {step}: the loss takes negative values ({loss:.4g}; a policy-gradient "
                        "objective): a spike as a multiple of its running mean means nothing"
                    )
                elif loss > 0:
                    spike = self._spikes.add(step, loss)
                    rise = self._rises.add(step, loss)
                    if spike is not None:
                        found.append(self._spike(spike, norm, lr))
                    elif rise is not None:
                        found.append(self._rise(rise, norm, lr))
        if norm is not None and math.isfinite(norm) and self._on("S3"):
            boom = self._grads.add(step, norm)
            if boom is not None:
                found.append(self._explosion(boom, lr))
        if len(row) > len(BASE_ROW):  # a row with metrics beyond the loss, lr and gradient norm
            if self._on("S4"):
                hit = self._pinned(row)
                if hit:
                    found.append(hit)
            if row.get("eval_loss") is not None and self._on("S5"):
                hit = self._gap(step, row["eval_loss"])
                if hit:
                    found.append(hit)
            if self._on("R1"):
                hit = self._reward(row)
                if hit:
                    found.append(hit)
        elif self.preference and self._on("S4"):
            hit = self._pinned(row)
            if hit:
                found.append(hit)
        for hit in found:
            self.active.discard(hit.id)
        return found[0] if found else None

    def _recent(self, upto: int, last: int = 6) -> str:
        points = [(h["step"], h["loss"]) for h in self.history if h["step"] <= upto and h.get("loss") is not None]
        return ", ".join(f"{s}: {v:.4g}" for s, v in points[-last:]) or "none"

    def _nonfinite(self, step, loss, norm, lr, model) -> Finding | None:
        loss_bad = loss is not None and not math.isfinite(loss)
        grads_bad = norm is not None and not math.isfinite(norm)
        if not (loss_bad or grads_bad):
            return None
        evidence = [
            f"step {step}: loss {_num(loss)}, gradient norm {_num(norm)}, lr {_num(lr)}; losses before it: "
            f"{self._recent(step - 1)}"
        ]
        if not loss_bad:
            weights = nonfinite_weights(model)
            if not weights:
                # a GradScaler skips such a step and lowers its scale: expected, the weights stay finite
                self.notes.append(f"step {step}: non-finite gradients, finite weights (a skipped step)")
                return None
            evidence.append(
                f"the loss was finite, but the gradients are not and the update carried them into the weights: "
                f"{', '.join(weights[:5])}"
            )
            cause, fix = detectors.NONFINITE["backward"]
        elif detectors.diverged_before(list(self._finite)):
            finite = list(self._finite)
            evidence.append(f"the loss rose from {finite[0]:.4g} to {finite[-1]:.4g} before turning non-finite")
            cause, fix = detectors.NONFINITE["diverging"]
            cause = cause.format(lr=_num(lr, "g"))
        else:
            cause, fix = detectors.NONFINITE["forward"]
        return Finding("S1", step, evidence, cause, fix, {"loss": loss, "grad_norm": norm, "lr": lr})

    def _spike(self, spike: detectors.Spike, norm, lr) -> Finding:
        s = self.settings["S2"]
        evidence = [
            f"step {spike.step}: loss {spike.loss:.4g} = {spike.ratio:.1f} x the mean {spike.mean:.4g} of the "
            f"{len(spike.previous)} steps before it (limit {s['factor']} x)",
            f"losses: {self._recent(spike.step, s['window'] + 1)}; {detectors.lr_text(lr)}",
        ]
        if norm is not None:
            evidence.append(f"gradient norm at step {spike.step}: {norm:.4g}")
        data = {"loss": spike.loss, "mean": spike.mean, "ratio": spike.ratio, "lr": lr}
        return Finding(
            "S2", spike.step, evidence, detectors.spike_cause(detectors.lr_text(lr)), detectors.SPIKE_FIX, data
        )

    def _rise(self, rise: detectors.Rise, norm, lr) -> Finding:
        s = self.settings["S2"]
        evidence = [
            f"step {rise.step}: the median loss of the last {len(rise.last)} steps, {rise.level:.4g}, is "
            f"{rise.ratio:.1f} x where the run began ({rise.start:.4g} at step {rise.start_step}, the lowest of the "
            f"first {s['warmup']}; limit {s['rise']} x)",
            f"losses: {', '.join(f'{st}: {v:.4g}' for st, v in rise.last)}; {detectors.lr_text(lr)}",
        ]
        if norm is not None:
            evidence.append(f"gradient norm at step {rise.step}: {norm:.4g}")
        data = {"level": rise.level, "start": rise.start, "ratio": rise.ratio, "lr": lr}
        return Finding(
            "S2", rise.step, evidence, detectors.spike_cause(detectors.lr_text(lr)), detectors.SPIKE_FIX, data
        )

    def _explosion(self, boom: detectors.Explosion, lr) -> Finding:
        s = self.settings["S3"]
        norms = [(h["step"], h["grad_norm"]) for h in self.history if h.get("grad_norm") is not None]
        evidence = [
            f"step {boom.step}: gradient norm {boom.norm:.4g} = {boom.ratio:.0f} x the median {boom.reference:.4g} "
            f"of the first {s['baseline']} measured (limit {s['factor']} x)",
            "gradient norms: " + ", ".join(f"{st}: {n:.3g}" for st, n in norms[-8:]),
            f"losses: {self._recent(boom.step)}; {detectors.lr_text(lr)}",
        ]
        data = {"grad_norm": boom.norm, "reference": boom.reference, "ratio": boom.ratio, "lr": lr}
        return Finding("S3", boom.step, evidence, detectors.grad_cause(detectors.lr_text(lr)), detectors.GRAD_FIX, data)

    def _pinned(self, row: dict[str, Any]) -> Finding | None:
        acc = row.get("rewards/accuracies")  # logged by TRL's preference trainers only
        if acc is not None:
            self.preference = True
        elif self.preference:
            acc = row.get("accuracy")
        if acc is not None:
            self._accs.append(acc)
        loss, step = row["loss"], row["step"]
        if not self.preference or loss is None or not math.isfinite(loss):
            return None
        self._pref.append((step, loss))
        need = self.settings["S1"]["steps"]
        if len(self._pref) < need:
            return None
        self.active.discard("S4")  # judged once, on the first S1.steps logged losses (the smoke run's length)
        tol = self.settings["S4"]["tol"]
        if detectors.off_ln2(self._pref, tol) or detectors.ahead_of_reference(self._accs):
            return None
        shown = ", ".join(f"{s}: {v:.5f}" for s, v in self._pref[:6])
        evidence = [
            f"the first {len(self._pref)} logged steps (to step {step}): loss within {tol:g} of ln 2 = "
            f"{detectors.LN2:.4f} ({shown}{' …' if len(self._pref) > 6 else ''})"
        ]
        if self._accs:
            evidence.append(f"rewards/accuracies: max {max(self._accs):.2f} (chance is 0.5)")
        cause, fix = detectors.PINNED_CAUSE, detectors.PINNED_FIX
        if self.reference is not None:
            shared = detectors.shared_parameters(self.reference[0], self.reference[1])
            if shared:
                evidence.append(
                    f"{len(shared)} reference parameters share storage with the policy's (e.g. {shared[0]})"
                )
                cause, fix = detectors.SHARED_REF_CAUSE, detectors.SHARED_REF_FIX
        if cause == detectors.PINNED_CAUSE:
            fix += " (pytest --dlcheck=S4,L9 names which)"
        return Finding(
            "S4", step, evidence, cause, fix, {"losses": self._pref, "max_accuracy": max(self._accs, default=None)}
        )

    def _gap(self, step: int, eval_loss: float) -> Finding | None:
        s = self.settings["S5"]
        window = list(self._finite)[-max(self.every, int(self.settings["S2"]["window"])) :]
        if not window or not math.isfinite(eval_loss):
            return None
        train = sum(window) / len(window)
        exceeded, ratio = detectors.gap_exceeded(train, eval_loss, s["max_ratio"], s["min_gap"])
        first, self._evaluated = not self._evaluated, True
        start = sum(self._first_losses) / len(self._first_losses)
        if not exceeded or not train < start:
            return None  # a gap while the training loss did not fall is no memorisation (S2/S3 judge a divergence)
        evidence = [
            f"step {step}: eval loss {eval_loss:.4g} vs train loss {train:.4g} (mean of the last {len(window)} steps) "
            f"= {ratio:.2f} x, {eval_loss - train:.3g} nats apart (limit {s['max_ratio']} x and {s['min_gap']} nats)",
            f"the training loss fell from {start:.4g} (mean of the first {len(self._first_losses)} steps)",
        ]
        cause = (
            f"the model memorises the training data: its loss fell from {start:.4g} to {train:.4g} while the eval "
            f"loss is {eval_loss:.4g} (labels that do not belong to their inputs can only be memorised; so can a "
            "tiny or duplicated training set)"
        )
        fix = detectors.MEMORISE_FIX
        if first:
            cause += (
                "; or, since the gap is there at the first evaluation, the eval data is preprocessed differently "
                "from the training data (pytest --dlcheck=S5 tells them apart: it also compares before training)"
            )
        data = {"train_loss": train, "eval_loss": eval_loss, "ratio": ratio, "first_evaluation": first}
        return Finding("S5", step, evidence, cause, fix, data)

    def _reward(self, row: dict[str, Any]) -> Finding | None:
        values = {}
        for what, keys in detectors.LOG_KEYS.items():
            for key in (what,) + keys:
                if row.get(key) is not None and math.isfinite(row[key]):
                    values[what] = row[key]
                    self._keys.setdefault(what, key)
                    break
        if "reward" not in values:
            return None
        names = (self._keys.get("kl", "kl"), self._keys.get("length", "length"))
        hit = self._rewards.add(row["step"], values["reward"], values.get("kl"), values.get("length"), names=names)
        if hit is None:
            return None
        key = self._keys["reward"]
        evidence = [
            f"step {hit.step}: {key} {'jumps' if hit.z > 0 else 'drops'} to {hit.reward:.3g} from a median "
            f"{hit.median:.3g} ({hit.z:+.3g} spreads) while " + " and ".join(hit.signs)
        ]
        for h in [h for h in self.history if h["step"] <= hit.step][-4:]:
            parts = [f"{k} {h[k]:.3g}" for k in (key, *names) if h.get(k) is not None]
            if parts:
                evidence.append(f"step {h['step']}: " + ", ".join(parts))
        data = {"reward": hit.reward, "median": hit.median, "z": hit.z}
        return Finding("R1", hit.step, evidence, detectors.reward_cause(hit.z), detectors.REWARD_FIX, data)

    # ----------------------------------------------------------------------------------------------
    # acting

    def _agree(self, found: Finding | None, step: int) -> Finding | None:
        """Under torch.distributed, every rank takes the decision of the first rank that detected."""
        dist = _dist()
        if dist is None:
            return found
        torch = sys.modules["torch"]
        code = ORDER.index(found.id) + 1 if found is not None else 0
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([code], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.item())
        if found is not None or agreed == 0:
            return found
        cid = ORDER[agreed - 1]
        self.active.discard(cid)
        return Finding(
            cid,
            step,
            [f"another rank detected {cid} by step {step}; this rank's own values stayed within the thresholds"],
            "every rank stops with the rank that detected it, so that none waits forever in a collective",
            "read the message and the postmortem of the rank that detected it",
            {"by_other_rank": True},
        )

    def _act(self, found: Finding, at: int) -> None:
        self.findings.append(found)
        path = self._postmortem(found)
        found.text = str(found.render(path))
        if self.policy == "raise":
            action = f"policy raise: training ends with WatchAlarm after step {at}"
        elif self.policy == "stop":
            action = f"policy stop: training stops cleanly after step {at} (the check that saw it)"
            found.text += f"\n  policy    {action}"
        else:
            action = "policy warn: training goes on"
        self.should_stop = self.policy != "warn"
        self._announce(found, path, action)
        if self.policy == "raise":
            raise WatchAlarm(found, path)
        warnings.warn(WatchWarning(found.text), stacklevel=3)

    def headline(self, found: Finding, path: Path | None, action: str) -> str:
        """The one line said on stderr (and sent as an alert): what fired, what happens now, where to read."""
        where = f"postmortem {path}" if path is not None else "no postmortem (no output_dir)"
        return f"pytest-dlcheck watch: {found.id} {found.title}: {found.cause} -- {action}; {where}"

    def _announce(self, found: Finding, path: Path | None, action: str) -> None:
        """Say it where the user looks, whatever the warning filters: a ``logging`` record with the whole
        message, one line on stderr that starts on its own line (not glued to a progress bar), a W&B alert when
        a W&B run is active, and each framework's own log (the ``reporters`` the callbacks add). Under
        torch.distributed the rank that detected it and rank 0 speak; the others only stop."""
        dist = _dist()
        speaks = dist is None or dist.get_rank() == 0 or not found.data.get("by_other_rank")
        level = logging.WARNING if self.policy == "warn" else logging.ERROR
        LOG.log(level, "%s", found.text, extra={"dlcheck_finding": found, "dlcheck_postmortem": path})
        if not speaks:
            return
        line = self.headline(found, path, action)
        stream = sys.stderr
        if stream is not None:
            stream.write("\n" + line + "\n")
            stream.flush()
        _wandb_alert(found, line)
        for report in self.reporters:
            report(found, path, line)

    def _postmortem(self, found: Finding) -> Path | None:
        if self.output_dir is None:
            return None
        dist = _dist()
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist is not None else (0, 1)
        suffix = f"-rank{rank}" if world > 1 else ""
        path = self.output_dir / f"dlcheck-postmortem-{found.id}-step{found.step}{suffix}.json"
        rows = list(self.history)
        metric_keys = sorted({k for h in rows for k in h} - {"step", "loss", "lr", "grad_norm"})
        doc = {
            "schema_version": SCHEMA_VERSION,
            "kind": "postmortem",
            "dlcheck_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "versions": library_versions(),
            "run": {
                "framework": self.framework,
                "step": found.step,
                "policy": self.policy,
                "every": self.every,
                "rank": rank,
                "world_size": world,
                "overrides": {k: jsonable(v) for k, v in self.overrides.items()},
                "settings": self.settings,
                "notes": list(self.notes),
            },
            "results": [
                Result(
                    nodeid=f"watch::{found.id}@step{found.step}",
                    id=found.id,
                    domain=DOMAIN.get(found.id, "smoke"),
                    title=found.title,
                    roles=[],
                    outcome="failed",
                    pytest_outcome="failed",
                    evidence=list(found.evidence),
                    cause=found.cause,
                    fix=found.fix,
                    data=jsonable({k: _json_float(v) for k, v in found.data.items()}),
                    artifacts=[
                        {
                            "kind": "series",
                            "title": f"the last {len(rows)} steps before {found.id} at step {found.step}",
                            "series": {k: [_json_float(h.get(k)) for h in rows] for k in ("loss", "grad_norm", "lr")},
                        }
                    ],
                ).to_json()
            ],
            "history": {
                "step": [h["step"] for h in rows],
                "loss": [_json_float(h.get("loss")) for h in rows],
                "lr": [_json_float(h.get("lr")) for h in rows],
                "grad_norm": [_json_float(h.get("grad_norm")) for h in rows],
                "metrics": {k: [_json_float(h.get(k)) for h in rows] for k in metric_keys},
            },
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1))
        self.postmortems.append(path)
        return path


LOG = logging.getLogger("pytest_dlcheck.watch")
# a library's logger: silent until the application configures logging (the stderr line speaks meanwhile)
LOG.addHandler(logging.NullHandler())


def _wandb_alert(found: Finding, line: str) -> None:
    """An alert on the active W&B run, if any. wandb is never imported here: a run is active only where the
    user imported it."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    if run is None:
        return
    try:
        level = getattr(getattr(wandb, "AlertLevel", None), "ERROR", "ERROR")
        run.alert(title=f"dlcheck {found.id}: {found.title}", text=line, level=level)
    except Exception as exc:  # an alert that cannot be sent must not end the user's training
        LOG.warning("pytest-dlcheck watch: the W&B alert for %s was not sent: %r", found.id, exc)


def _json_float(value: Any) -> Any:
    """JSON has no NaN/Inf: they are written as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _dist():
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    return torch.distributed


def _read(pending: list) -> list[dict[str, Any]]:
    """The kept steps as floats, read with one transfer: every tensor among them is stacked and read at once."""
    steps = [rec if isinstance(rec, _Step) else _Step.of(rec) for rec in pending]
    torch = sys.modules.get("torch")
    tensor = torch.Tensor if torch is not None else ()
    kept = []
    for rec in steps:
        kept += [v for v in rec.losses if isinstance(v, tensor)]
        kept += [v for v in (rec.grad_norm, rec.lr, *rec.metrics.values()) if isinstance(v, tensor)]
    if kept:
        device = kept[0].device
        scalars = [t if t.dim() == 0 and t.device == device else t.detach().float().mean().to(device) for t in kept]
        values = iter(torch.stack(scalars).tolist())
    else:
        values = iter(())

    def value(v: Any) -> float | None:  # in the order the tensors were kept above
        return next(values) if isinstance(v, tensor) else (None if v is None else float(v))

    rows = []
    for rec in steps:
        losses = [value(v) for v in rec.losses]
        row = {"step": rec.step, "loss": sum(losses) / len(losses) if losses else None}
        row["grad_norm"], row["lr"] = value(rec.grad_norm), value(rec.lr)
        row.update({k: value(v) for k, v in rec.metrics.items()})
        rows.append(row)
    return rows


#: model -> its parameters: listed once, not at every check (weakly: a model that goes is forgotten)
_PARAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def gradient_norm(model: Any) -> Any:
    """The total gradient 2-norm of ``model``'s parameters, as a tensor (not read: no synchronisation)."""
    import torch

    params = _PARAMS.get(model)
    if params is None:
        params = _PARAMS[model] = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)


def nonfinite_weights(model: Any) -> list[str]:
    """Names of ``model``'s parameters that hold NaN/Inf (read once; only asked after a non-finite gradient)."""
    if model is None:
        return []
    import torch

    named = list(model.named_parameters())
    if not named:
        return []
    ok = torch.stack([torch.isfinite(p.detach()).all().to(named[0][1].device) for _, p in named]).tolist()
    return [n for (n, _), good in zip(named, ok) if not good]


# --------------------------------------------------------------------------------------------------
# the framework callbacks, built on first use so that importing this module imports no framework


#: the argument classes of the trainers whose loss is the one the model returns
MODEL_LOSS_ARGS = ("TrainingArguments", "Seq2SeqTrainingArguments", "SFTConfig")


def _trainer_watch_class():
    from transformers import TrainerCallback

    class TrainerWatch(TrainerCallback):
        """A transformers/TRL ``TrainerCallback`` running the detectors: ``trainer.add_callback(TrainerWatch())``.

        The loss of every step is taken from the model's output for a ``Trainer`` or ``SFTTrainer`` (whose
        loss is the one the model computes from its labels); other trainers (DPO, GRPO, ...) are judged on
        their logged loss, every ``logging_steps``; the
        gradient norm, the learning rate, DPO's ``rewards/accuracies``, GRPO's reward, KL and completion
        length and ``eval_loss`` from the Trainer's own logs (``logging_steps`` sets how often). The
        postmortem goes to ``args.output_dir``. A finding is logged through the Trainer's own ``log()``
        (``transformers.Trainer.log``: into ``state.log_history`` and every callback's ``on_log``, so the
        ``report_to`` trackers show it) as ``dlcheck/<ID>`` (the step) and ``dlcheck/finding`` (the line).
        Keywords are :class:`Watch`'s."""

        def __init__(self, trainer: Any = None, **kwargs: Any):
            kwargs.setdefault("framework", "transformers")
            self.watch = Watch(**kwargs)
            self.trainer = trainer
            self._hook = None
            self._model = None
            self._losses: list[Any] = []
            self._lr = None
            self._hooked = False  # the model's output gave a loss: the logged loss is not used
            self._logging = False  # inside our own Trainer.log call: our on_log ignores that record
            self.watch.reporters.append(self._log_finding)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if self.trainer is None:
                self.trainer = _calling_trainer(self)
            self._state = state
            if self.watch.output_dir is None:
                self.watch.output_dir = Path(args.output_dir or ".")
            self._model = model
            # the model's own loss is the trainer's only where the trainer's loss is the model's (Trainer, SFT);
            # DPO, GRPO and the like compute theirs from the outputs: they are judged on the logged loss
            if model is not None and self._hook is None and type(args).__name__ in MODEL_LOSS_ARGS:
                self._hook = model.register_forward_hook(self._capture)
            if "DPO" in type(args).__name__:
                self.watch.preference = True
                ref = getattr(self.trainer, "ref_model", None)
                if ref is not None:
                    self.watch.reference = (self.trainer.model, ref)

        def _capture(self, module, inputs, output):
            if not module.training or not _grad_enabled():
                return
            loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
            if loss is not None and hasattr(loss, "detach") and loss.numel() == 1:
                self._losses.append(loss.detach())
                self._hooked = True

        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            self._losses = []
            # the learning rate of this step's update (the scheduler steps before on_step_end)
            self._lr = optimizer.param_groups[0].get("lr") if optimizer is not None else None

        def on_step_end(self, args, state, control, **kwargs):
            for loss in self._losses or [None]:
                self.watch.observe(state.global_step, loss=loss, lr=self._lr)
            self._losses = []
            if self.watch.due(state.global_step) and not (control.should_log or control.should_evaluate):
                self._check(control)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self._logging:
                return
            logs = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            loss = logs.pop("loss", None)
            self.watch.observe(
                state.global_step,
                loss=None if self._hooked else loss,
                grad_norm=logs.pop("grad_norm", None),
                lr=logs.pop("learning_rate", None),
                **logs,
            )
            if self.watch.due(state.global_step) or "eval_loss" in logs:
                self._check(control)

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            if metrics and metrics.get("eval_loss") is not None:
                self.watch.observe(state.global_step, eval_loss=float(metrics["eval_loss"]))

        def on_train_end(self, args, state, control, **kwargs):
            try:
                if self.watch._pending:
                    self._check(control)
            finally:
                self._unhook()

        def _unhook(self):
            if self._hook is not None:
                self._hook.remove()
                self._hook = None

        def _log_finding(self, found, path, line):
            """The finding in the Trainer's log: the base ``Trainer.log`` (a TRL trainer's own ``log`` would
            fold its pending metrics into this record), so log_history and every callback's on_log see it."""
            logs = {f"dlcheck/{found.id}": float(found.step), "dlcheck/finding": line}
            self._logging = True
            try:
                if self.trainer is not None:
                    from transformers import Trainer

                    Trainer.log(self.trainer, logs)
                elif getattr(self, "_state", None) is not None:  # no Trainer found: its history at least
                    self._state.log_history.append({**logs, "step": self._state.global_step})
            finally:
                self._logging = False

        def _check(self, control):
            try:
                self.watch.check(self._model)
            except WatchAlarm:
                self._unhook()  # train() ends with the exception: on_train_end will not come
                raise
            if self.watch.should_stop:
                control.should_training_stop = True

    return TrainerWatch


def _lightning_watch_class():
    try:
        from lightning.pytorch import Callback
    except ImportError:  # the older package name
        from pytorch_lightning import Callback

    class LightningWatch(Callback):
        """A Lightning ``Callback`` running the detectors: ``L.Trainer(callbacks=[LightningWatch()])``.

        The loss of every step is the one ``training_step`` returns; the gradient norm is taken before
        clipping (``on_before_optimizer_step``) every ``every`` steps, the learning rate from the optimizer;
        S5 reads ``trainer.callback_metrics[eval_key]`` after each validation (default ``"val_loss"``). The
        postmortem goes to ``trainer.default_root_dir``. A finding goes to every logger of the trainer
        (``trainer.loggers``: CSV, TensorBoard, W&B, ...) as the metric ``dlcheck/<ID>`` (the step), and as text
        where the logger takes text (TensorBoard). Other keywords are :class:`Watch`'s."""

        def __init__(self, eval_key: str = "val_loss", **kwargs: Any):
            kwargs.setdefault("framework", "lightning")
            self.watch = Watch(**kwargs)
            self.eval_key = eval_key
            self._stepped = False
            self._trainer = None
            self.watch.reporters.append(self._log_finding)

        def on_train_start(self, trainer, pl_module):
            self._trainer = trainer
            if self.watch.output_dir is None:
                self.watch.output_dir = Path(trainer.default_root_dir or ".")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            step = trainer.global_step + 1
            lr = optimizer.param_groups[0].get("lr")
            norm = gradient_norm(pl_module) if self.watch.due(step) else None
            self.watch.observe(step, lr=lr, grad_norm=norm)
            self._stepped = True

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            # a batch that closed an optimizer step comes after it (global_step counts it); one that
            # accumulates belongs to the step to come
            stepped, self._stepped = self._stepped, False
            step = trainer.global_step if stepped else trainer.global_step + 1
            self.watch.observe(step, loss=loss)
            if stepped and self.watch.due(step):
                self._check(trainer, pl_module)

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking:
                return
            value = trainer.callback_metrics.get(self.eval_key)
            if value is not None:
                self.watch.observe(trainer.global_step, eval_loss=float(value))
                self._check(trainer, pl_module)

        def on_train_end(self, trainer, pl_module):
            if self.watch._pending:
                self._check(trainer, pl_module)

        def _log_finding(self, found, path, line):
            trainer = self._trainer
            if trainer is None:
                return
            for logger in trainer.loggers:
                logger.log_metrics({f"dlcheck/{found.id}": float(found.step)}, step=trainer.global_step)
                if "TensorBoard" in type(logger).__name__:
                    logger.experiment.add_text(f"dlcheck/{found.id}", found.text, trainer.global_step)
                logger.save()

        def _check(self, trainer, pl_module):
            self.watch.check(pl_module)
            if self.watch.should_stop:
                trainer.should_stop = True

    return LightningWatch


def _calling_trainer(callback: Any) -> Any:
    """The transformers Trainer whose callback handler is calling ``callback`` (found up the call stack, in
    ``on_train_begin``): a callback is handed the Trainer's state, not the Trainer, and its ``log`` is the
    path to ``log_history`` and the trackers."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if handler is not None and callback in getattr(handler, "callbacks", ()):
            return owner
        frame = frame.f_back
    return None


def _grad_enabled() -> bool:
    return sys.modules["torch"].is_grad_enabled()


_BUILT: dict[str, type] = {}
_BUILDERS = {"TrainerWatch": _trainer_watch_class, "LightningWatch": _lightning_watch_class}


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        if name not in _BUILT:
            _BUILT[name] = _BUILDERS[name]()
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# TrainerWatch and LightningWatch are built by __getattr__ on first use
__all__ = ["POLICIES", "LightningWatch", "TrainerWatch", "Watch", "WatchAlarm", "WatchWarning"]  # noqa: F822
