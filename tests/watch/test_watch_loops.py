"""The watch in a Lightning fit and in hand-written loops: an fp16 overflow stops a Lightning run with S1; a
hacked reward stops a REINFORCE loop with R1 while the honest reward runs on; labels that belong to other
inputs open S5's gap; the policies (warn, stop, raise), the overrides, the postmortem's schema, one read of
the kept tensors per check, two real ranks that stop together, and an import that loads no framework."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from pytest_dlcheck import detectors
from pytest_dlcheck.report import schema_path
from pytest_dlcheck.watch import LightningWatch, Watch, WatchAlarm, WatchWarning


def caught(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn()
    return out, [" ".join(str(w.message).split()) for w in seen if issubclass(w.category, WatchWarning)]


# --------------------------------------------------------------------------------------------------
# Lightning: an fp16 overflow


class Regressor(pl.LightningModule):
    """A float16 encoder (as a half-precision model computes) and a float32 head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(8, 32).half()
        self.head = nn.Linear(32, 1)
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = torch.relu(self.encoder(x.half())).float()
        loss = nn.functional.mse_loss(self.head(h), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def blobs(corrupt_at: int | None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40 * 32, 8, generator=g)
    y = x.sum(1, keepdim=True)
    if corrupt_at is not None:
        x[corrupt_at * 32] = 1e5  # a corrupt record, beyond float16's largest value (65504)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)


def fit(tmp_path, corrupt_at, callbacks, logger=False):
    module = Regressor()
    trainer = pl.Trainer(
        max_steps=40,
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
    )
    _, messages = caught(lambda: trainer.fit(module, blobs(corrupt_at)))
    return module, trainer, messages


def test_an_fp16_overflow_stops_a_lightning_run(tmp_path):
    module, trainer, messages = fit(tmp_path, corrupt_at=12, callbacks=[LightningWatch(every=5)])
    assert trainer.global_step == 15 and len(module.losses) == 15  # stopped at the check after step 13
    (text,) = messages
    assert text.startswith("S1 NaN/Inf loss, gradients or weights during the run (step 13)")
    assert "step 13: loss nan, gradient norm not logged, lr 0.01; losses before it: 7: 6.095, 8: 5.81," in text
    assert "the forward pass produced a non-finite loss" in text and "train in bfloat16 or float32" in text
    doc = json.loads((tmp_path / "dlcheck-postmortem-S1-step13.json").read_text())
    assert doc["run"]["framework"] == "lightning" and "lightning" in doc["versions"]
    assert doc["history"]["loss"][12] == "nan" and doc["history"]["step"][:13] == list(range(1, 14))
    assert doc["history"]["grad_norm"][4] is not None  # every 5 steps, before clipping


def test_the_finding_goes_to_the_lightning_loggers(tmp_path):
    """The trainer's loggers (here a CSVLogger) record the finding as the metric dlcheck/S1 at its step."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="run")
    _, trainer, messages = fit(tmp_path, corrupt_at=12, callbacks=[LightningWatch(every=5)], logger=logger)
    assert trainer.global_step == 15 and len(messages) == 1
    rows = list(csv.DictReader(open(logger.experiment.metrics_file_path)))
    logged = [r for r in rows if r.get("dlcheck/S1")]
    assert len(logged) == 1 and float(logged[0]["dlcheck/S1"]) == 13.0 and logged[0]["step"] == "15"


def test_a_clean_lightning_run_is_untouched(tmp_path):
    plain, _, _ = fit(tmp_path / "plain", None, [])
    watched, trainer, messages = fit(tmp_path / "watched", None, [LightningWatch(every=5)])
    assert messages == [] and trainer.global_step == 40
    assert plain.losses == watched.losses and len(plain.losses) == 40
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), watched.parameters()))


# --------------------------------------------------------------------------------------------------
# a hand-written REINFORCE loop: a reward with a flaw


def reinforce(hacked: bool, watch: Watch, steps: int = 80) -> int:
    """A policy over answer lengths 0-9 (an empty answer is rare at first), rewarded for answers of 6+
    tokens; the hacked reward also pays 1.0 for an empty answer, as a format check that accepts it would."""
    g = torch.Generator().manual_seed(0)
    logits = torch.zeros(10)
    logits[0] = -4.0
    logits.requires_grad_(True)
    reference = torch.log_softmax(logits.detach().clone(), -1)
    opt = torch.optim.Adam([logits], lr=0.2)
    lengths = torch.arange(10).float()
    for step in range(1, steps + 1):
        logp = torch.log_softmax(logits, -1)
        answers = torch.multinomial(logp.exp().detach(), 64, replacement=True, generator=g)
        reward = 0.1 * torch.clamp(lengths[answers], max=6) / 6 + 0.05 * torch.rand(64, generator=g)
        if hacked:
            reward = torch.where(answers == 0, torch.ones_like(reward), reward)
        loss = -(logp[answers] * (reward - reward.mean())).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        kl = (logp.exp() * (logp - reference)).sum().detach()
        if watch.step(loss=loss, reward=reward.mean(), kl=kl, length=lengths[answers].mean()):
            return step
    return steps


def test_a_hacked_reward_stops_the_loop(tmp_path):
    watch = Watch(every=5, output_dir=tmp_path)
    stopped, messages = caught(lambda: reinforce(True, watch))
    assert stopped == 65
    (text,) = messages
    assert text.startswith("R1 reward hacking or collapse during the run (step 62) [rl]")
    assert "step 62: reward jumps to 0.588 from a median 0.124 (+18.8 spreads) while length 3.38 vs median 7.22" in text
    assert "step 61: reward 0.494, kl 1.92, length 4.2" in text
    assert "the signature of reward hacking" in text and "penalise empty or repeated outputs" in text
    assert watch.postmortems == [tmp_path / "dlcheck-postmortem-R1-step62.json"]
    # the REINFORCE loss is centred on 0: S2 turned itself off instead of judging spikes of it
    assert any(n.startswith("S2 off from step") for n in watch.notes)


def test_an_honest_reward_runs_on(tmp_path):
    watch = Watch(every=5, output_dir=tmp_path)
    stopped, messages = caught(lambda: reinforce(False, watch))
    assert stopped == 80 and messages == [] and watch.findings == []
    assert watch._rewards.largest[0] < 5  # its largest move stays under a jump


# --------------------------------------------------------------------------------------------------
# policies, overrides, ranks, the postmortem's schema


def diverging_loop(watch: Watch, steps: int = 30, lr: float = 1.5):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 8)
    y = x.sum(1, keepdim=True)
    for step in range(1, steps + 1):
        if step == 11:
            opt.param_groups[0]["lr"] = lr  # a schedule that jumps to a rate the model cannot take
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if watch.step(loss=loss, model=model, optimizer=opt):
            return step
    return steps


def least_squares(watch: Watch, lr: float, steps: int = 60, noise: float = 0.0):
    """SGD on y = 2x, x = +-1 (loss (w - 2)^2, curvature 2: stable below lr 1), a batch's targets shifted by
    ``noise``: the loss falls and wobbles below lr 1, and above it grows (1 - 2 lr)^2 x a step, never jumping."""
    torch.manual_seed(0)
    model = nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        x = torch.tensor([1.0, -1.0] * 32)[:, None]
        loss = nn.functional.mse_loss(model(x), 2 * x + noise * torch.randn(64, 1, generator=g))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if watch.step(loss=loss, model=model, optimizer=opt):
            return step
    return steps


def test_a_loss_that_climbs_steadily_is_stopped_against_the_start():
    """lr 1.04: the loss grows 1.08^2 = 1.17x a step, at most 1.6x the running mean; the median of the last five
    (the loss two steps back) passes 3x where the run began once 1.17^(t - 3) > 3, at step 11, and the run stops
    at the check after it."""
    watch = Watch(every=10)
    ran, messages = caught(lambda: least_squares(watch, lr=1.04))
    assert ran == 20 and [(f.id, f.step) for f in watch.findings] == [("S2", 11)]
    finding = watch.findings[0]
    assert finding.data["ratio"] > 3.0 and finding.data["start"] == watch.history[0]["loss"]
    assert "the median loss of the last 5 steps" in messages[0] and "where the run began" in messages[0]
    assert detectors.resolve(None)["S2"]["rise"] == 3.0


def test_a_loss_that_wobbles_as_it_falls_runs_on():
    """lr 0.3 on noisy targets: the loss goes up and down from step to step and settles at the noise level."""
    watch = Watch(every=10)
    ran, messages = caught(lambda: least_squares(watch, lr=0.3, steps=100, noise=0.5))
    losses = [h["loss"] for h in watch.history]
    assert ran == 100 and messages == [] and watch.findings == []
    assert losses[-1] < losses[0] and any(b > a for a, b in zip(losses, losses[1:]))  # it wobbles, and falls


def test_policies(tmp_path):
    with pytest.raises(WatchAlarm) as alarm:
        diverging_loop(Watch(policy="raise", every=5, output_dir=tmp_path))
    assert str(alarm.value).startswith("S2 loss spike during the run (step 12)")
    assert alarm.value.postmortem == tmp_path / "dlcheck-postmortem-S2-step12.json"
    assert alarm.value.finding.data["lr"] == 1.5

    warned = Watch(policy="warn", every=5)
    ran, messages = caught(lambda: diverging_loop(warned))
    assert ran == 30 and [f.id for f in warned.findings] == ["S2", "S3"]  # each detector once; the run goes on
    assert messages[0].startswith("S2 loss spike") and "policy stop" not in messages[0]
    assert messages[1].startswith("S3 gradient norm explodes during the run (step 20)")
    assert warned.postmortems == []  # no output_dir: nothing written

    stopped = Watch(every=5)
    assert caught(lambda: diverging_loop(stopped))[0] == 15 and stopped.should_stop


def test_a_loop_under_filtered_warnings_still_says_it(tmp_path, capsys, caplog):
    """Warnings off (as under python -W ignore): the stderr line and the logging record still come."""
    watch = Watch(every=5, output_dir=tmp_path)
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="pytest_dlcheck.watch"):
        warnings.simplefilter("ignore")
        assert diverging_loop(watch) == 15
    err = capsys.readouterr().err
    path = tmp_path / "dlcheck-postmortem-S2-step12.json"
    assert err.startswith("\npytest-dlcheck watch: S2 loss spike during the run (step 12): the run diverges")
    assert err.endswith(
        f"policy stop: training stops cleanly after step 15 (the check that saw it); postmortem {path}\n"
    )
    assert err.count("\n") == 2  # one line, on a line of its own
    (record,) = [r for r in caplog.records if r.name == "pytest_dlcheck.watch"]
    assert record.levelno == logging.ERROR and record.getMessage().startswith("S2 loss spike during the run (step 12)")
    assert f"postmortem {path}" in " ".join(record.getMessage().split()) and record.dlcheck_finding.step == 12


def test_overrides_move_the_checks_thresholds(tmp_path):
    loose = Watch(every=5, overrides={"S2.factor": 1e9, "S3.factor": "1e9"}, checks=("S2", "S3"))
    ran, messages = caught(lambda: diverging_loop(loose, lr=0.3))
    assert ran == 30 and messages == []
    assert loose.settings["S2"]["factor"] == 1e9 and loose.settings["S3"]["factor"] == 1e9
    assert detectors.resolve(None)["S2"]["factor"] == 3.0  # the checks' own defaults, untouched
    with pytest.raises(
        ValueError, match=r"'S2\.spike': S2 has no setting 'spike' \(it has factor, window, warmup, rise\)"
    ):
        Watch(overrides={"S2.spike": 5})
    with pytest.raises(ValueError, match="no runtime detector 'L2'"):
        Watch(overrides={"L2.factor": 5})
    with pytest.raises(ValueError, match="policy='heal'"):
        Watch(policy="heal")


def test_the_postmortem_follows_its_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")

    watch = Watch(every=5, output_dir=tmp_path)
    caught(lambda: diverging_loop(watch))
    doc = json.loads(watch.postmortems[0].read_text())
    # plain jsonschema, no registry: the schema is self-contained
    jsonschema.validate(doc, json.loads(schema_path().with_name("postmortem.schema.json").read_text()))
    assert doc["run"]["settings"]["S2"] == {"factor": 3.0, "window": 5, "warmup": 3, "rise": 3.0}
    assert len(doc["history"]["loss"]) == 15 and doc["history"]["grad_norm"][4] is not None


def test_importing_the_watch_imports_no_framework():
    code = (
        "import sys, pytest_dlcheck.watch as w; "
        "print(sorted(m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning', 'trl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------------------------------
# S5: labels that do not belong to their inputs can only be memorised


def classify(shuffled: bool, watch: Watch, steps: int = 200) -> int:
    g = torch.Generator().manual_seed(0)
    x, x_eval = torch.randn(96, 16, generator=g), torch.randn(256, 16, generator=g)
    y, y_eval = (x[:, :4].sum(1) > 0).long(), (x_eval[:, :4].sum(1) > 0).long()
    if shuffled:
        y = y[torch.randperm(len(y), generator=g)]  # a misaligned join: each label belongs to another input
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(1, steps + 1):
        batch = torch.randint(0, 96, (32,), generator=g)
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        eval_loss = None
        if step % 25 == 0:
            with torch.no_grad():
                eval_loss = nn.functional.cross_entropy(model(x_eval), y_eval).item()
        if watch.step(loss=loss, model=model, eval_loss=eval_loss):
            return step
    return steps


def test_labels_that_do_not_belong_to_their_inputs_open_a_gap():
    watch = Watch(every=10)
    stopped, messages = caught(lambda: classify(True, watch))
    assert stopped == 30  # the evaluation of step 25 is judged at the next check
    (text,) = messages
    assert text.startswith("S5 train/eval loss gap beyond a threshold during the run (step 25)")
    assert (
        "step 25: eval loss 1.268 vs train loss 0.3254 (mean of the last 10 steps) = 3.90 x, 0.943 nats apart" in text
    )
    assert "the model memorises the training data: its loss fell from 0.6191 to 0.3254" in text
    assert "check that each label belongs to its input" in text


def test_a_model_that_generalises_runs_on():
    """Its train loss falls to ~0.001 and the eval loss stays ~0.11: a large ratio, but not 0.3 nats apart."""
    watch = Watch(every=10)
    stopped, messages = caught(lambda: classify(False, watch))
    assert stopped == 200 and messages == [] and watch.findings == []
    assert [h["eval_loss"] for h in watch.history if h.get("eval_loss") is not None][-1] < 0.3


# --------------------------------------------------------------------------------------------------
# cost: one read of the kept values per check, and nothing in between


READS = {"item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy", "__format__"}


class CountReads(torch.overrides.TorchFunctionMode):
    """Counts the calls that copy a tensor's value to Python (a synchronisation with the GPU)."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_the_watch_reads_the_tensors_once_per_check():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 8)
    y = x.sum(1, keepdim=True)
    watch = Watch(every=5)
    reads = {}
    for step in range(1, 21):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with CountReads() as counter:
            watch.step(loss=loss, model=model, optimizer=opt)
        reads[step] = counter.reads
    assert {s: r for s, r in reads.items() if r} == {5: ["tolist"], 10: ["tolist"], 15: ["tolist"], 20: ["tolist"]}
    assert [h["step"] for h in watch.history] == list(range(1, 21)) and watch.findings == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the synchronisations are CUDA's")
def test_no_cuda_synchronisation_between_checks():
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 8, device="cuda")
    y = x.sum(1, keepdim=True)
    watch = Watch(every=5)
    for step in range(1, 21):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step % 5:
            torch.cuda.set_sync_debug_mode("error")  # a synchronising call raises
        try:
            watch.step(loss=loss, model=model, optimizer=opt)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert len(watch.history) == 20 and watch.history[4]["grad_norm"] is not None


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def fit_classifier(tmp_path, shuffled: bool):
    g = torch.Generator().manual_seed(0)
    x, x_eval = torch.randn(96, 16, generator=g), torch.randn(256, 16, generator=g)
    y, y_eval = (x[:, :4].sum(1) > 0).long(), (x_eval[:, :4].sum(1) > 0).long()
    if shuffled:
        y = y[torch.randperm(len(y), generator=g)]
    loader = torch.utils.data.DataLoader
    trainer = pl.Trainer(
        max_steps=90,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=5,
        default_root_dir=tmp_path,
        callbacks=[LightningWatch(every=5)],
    )
    data = torch.utils.data.TensorDataset(x, y)
    train = loader(data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    _, messages = caught(
        lambda: trainer.fit(Classifier(), train, loader(torch.utils.data.TensorDataset(x_eval, y_eval), batch_size=256))
    )
    return trainer, messages


def test_lightning_validation_opens_a_gap_on_memorised_labels(tmp_path):
    trainer, messages = fit_classifier(tmp_path, shuffled=True)
    (text,) = messages
    assert text.startswith("S5 train/eval loss gap beyond a threshold during the run (step 15)")
    assert trainer.global_step == 15  # stopped right after that validation
    assert "the model memorises the training data" in text


def test_lightning_validation_of_a_model_that_generalises(tmp_path):
    trainer, messages = fit_classifier(tmp_path, shuffled=False)
    assert messages == [] and trainer.global_step == 90


def _rank_loop(rank: int, world: int, store: str, out_dir: str, results) -> None:
    """One rank of a 2-process run: a NaN reaches rank 1's batch at step 7; rank 0's data are clean."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 8)
        watch = Watch(every=5, output_dir=out_dir)
        for step in range(1, 31):
            batch = x.clone()
            if rank == 1 and step == 7:
                batch[0, 0] = float("nan")  # a corrupt record on one rank only
            loss = nn.functional.mse_loss(model(batch), batch.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                stop = watch.step(loss=loss, model=model, optimizer=opt)
            if stop:
                break
        results.put((rank, step, [(f.id, f.step, f.evidence[0]) for f in watch.findings]))
    finally:
        dist.destroy_process_group()


def test_every_rank_stops_at_the_same_step(tmp_path):
    """Two real processes (gloo): the rank that sees the NaN and the rank that does not stop at the same check,
    so that neither waits forever in the next collective."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_loop, args=(r, 2, str(tmp_path / "store"), str(tmp_path), results)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    out = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert out[0][:2] == (0, 10) and out[1][:2] == (1, 10)  # both stop at the check after step 7
    assert out[1][2][0][:2] == ("S1", 7) and out[1][2][0][2].startswith("step 7: loss nan")
    assert out[0][2][0][:2] == ("S1", 10)
    assert "another rank detected S1 by step 10" in out[0][2][0][2]
    assert sorted(p.name for p in tmp_path.glob("dlcheck-postmortem-*")) == [
        "dlcheck-postmortem-S1-step10-rank0.json",
        "dlcheck-postmortem-S1-step7-rank1.json",
    ]


# --------------------------------------------------------------------------------------------------
# S1 in the backward: an overflowed gradient reaches the weights, unless a GradScaler skips the step


def overflow_loop(watch: Watch, scaler: bool) -> int:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if scaler else None
    x = torch.randn(64, 8)
    y = x.sum(1, keepdim=True)
    step_now = [0]
    # the backward of step 8 overflows in the first layer's weight gradient, as float16 gradients beyond 65504 do
    model[0].weight.register_hook(lambda g: g * float("inf") if step_now[0] == 8 else g)
    for step in range(1, 21):
        step_now[0] = step
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        if grad_scaler is not None:
            grad_scaler.scale(loss).backward()
            grad_scaler.unscale_(opt)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            grad_scaler.step(opt)
            grad_scaler.update()
        else:
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            opt.step()
        if watch.step(loss=loss, model=model, optimizer=opt, grad_norm=grad_norm):
            return step
    return 20


def test_an_overflowed_gradient_that_reaches_the_weights():
    watch = Watch(every=5)
    stopped, messages = caught(lambda: overflow_loop(watch, scaler=False))
    assert stopped == 10
    (text,) = messages
    assert text.startswith("S1 NaN/Inf loss, gradients or weights during the run (step 8)")
    assert "step 8: loss 5.847, gradient norm inf, lr 0.01" in text
    assert "the gradients are not and the update carried them into the weights: 0.weight" in text
    assert "the backward pass overflowed" in text and "GradScaler" in text


def test_a_gradscaler_skips_the_overflowed_step():
    """The same overflow under a GradScaler: the step is skipped, the weights stay finite, nothing fires."""
    watch = Watch(every=5)
    stopped, messages = caught(lambda: overflow_loop(watch, scaler=True))
    assert stopped == 20 and messages == [] and watch.findings == []
    assert watch.notes == ["step 8: non-finite gradients, finite weights (a skipped step)"]
