"""Figure 6: what the watch of a real run costs (pytest_dlcheck.watch, issue 22). A tiny real transformers
``Trainer`` (a Llama built from a config, random token ids) and a hand-written loop on the same model and
data (``Watch.step``) each train the same steps with and without the watch, interleaved A B B A in one process after a warm-up run.

Two numbers per row: the paired ratio of the runs' CPU time (what a user sees, but a 2 % effect is near a
shared machine's noise), and the watch's own share: the CPU time spent inside the watch (its callbacks, its
forward hook, its checks), measured around each call, over the step time of the runs without it. The budget
(≤ 2 % of step time) is judged on the share, which noise does not move; the ratio is printed beside it.

    .venv/bin/python benchmarks/run.py --only watch
    .venv/bin/python benchmarks/watch.py --steps 200 --repeats 5      # the measurement itself, as JSON"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.rows import Row

#: the budget: the watch's own CPU time per step, as a share of the step time without it
WATCH_MAX_SHARE = 0.02


class Clock:
    """CPU time spent inside the wrapped functions."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - start

        return timed


def timed_trainer_watch(clock: Clock, every: int):
    from pytest_dlcheck.watch import TrainerWatch

    callback = TrainerWatch(every=every)
    for name in dir(callback):
        if name.startswith("on_") or name == "_capture":
            setattr(callback, name, clock.wrap(getattr(callback, name)))
    return callback


def tiny_llama():
    """The figure's model: a 2-layer Llama built from a config (~0.2M parameters), and 64 rows of random ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    ids = torch.randint(0, 256, (64, 32), generator=torch.Generator().manual_seed(0))
    return LlamaForCausalLM(cfg), ids


def trainer_run(steps: int, watched: bool, every: int, workdir: Path) -> dict:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    model, ids = tiny_llama()
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = TrainingArguments(
        output_dir=str(workdir),
        report_to="none",
        use_cpu=True,
        max_steps=steps,
        per_device_train_batch_size=8,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=10,
        seed=0,
    )
    clock = Clock()
    callbacks = [timed_trainer_watch(clock, every)] if watched else []
    trainer = Trainer(
        model=model, args=args, train_dataset=data, data_collator=default_data_collator, callbacks=callbacks
    )
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    cpu = time.process_time() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"cpu": cpu, "watch": clock.seconds, "steps": trainer.state.global_step, "losses": losses}


def loop_run(steps: int, watched: bool, every: int) -> dict:
    """The same model and data in a hand-written loop, the watch fed by ``Watch.step``."""
    import torch

    from pytest_dlcheck.watch import Watch

    model, ids = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    clock = Clock()
    watch = Watch(every=every)
    step_fn = clock.wrap(watch.step)
    losses = []
    start = time.process_time()
    for step in range(steps):
        batch = ids[(step * 8) % 64 : (step * 8) % 64 + 8]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        if watched:
            step_fn(loss=loss, model=model, optimizer=opt)
        opt.zero_grad()
        losses.append(loss.detach())
    cpu = time.process_time() - start
    return {"cpu": cpu, "watch": clock.seconds, "steps": steps, "losses": torch.stack(losses).tolist()}


def measure(steps: int, repeats: int, every: int, workdir: Path) -> dict:
    """Both users, interleaved A B B A after one discarded round; per-run CPU times and the watch's own."""
    out = {}
    for user in ("trainer", "loop"):
        runs: dict[str, list[dict]] = {"plain": [], "watched": []}
        for i in range(repeats + 1):
            order = ("plain", "watched") if i % 2 == 0 else ("watched", "plain")
            for variant in order:
                if user == "trainer":
                    r = trainer_run(steps, variant == "watched", every, workdir)
                else:
                    r = loop_run(steps, variant == "watched", every)
                if i:  # the first round warms the caches and is dropped
                    runs[variant].append(r)
        plain_step = statistics.median(r["cpu"] / r["steps"] for r in runs["plain"])
        out[user] = {
            "steps": steps,
            "every": every,
            "plain_step_ms": plain_step * 1e3,
            "ratio": statistics.median(w["cpu"] / p["cpu"] for p, w in zip(runs["plain"], runs["watched"])),
            "share": statistics.median(w["watch"] / w["steps"] for w in runs["watched"]) / plain_step,
            "same_losses": all(p["losses"] == w["losses"] for p, w in zip(runs["plain"], runs["watched"])),
        }
    return out


def bench_watch(ctx, steps: int, repeats: int, every: int = 25) -> None:
    """The benchmark's figure 6 (benchmarks/run.py ``--only watch``): one child process measures both users."""
    import subprocess

    cmd = [ctx.python, str(Path(__file__).resolve())]
    cmd += ["--steps", str(steps), "--repeats", str(repeats), "--every", str(every), "--workdir", str(ctx.workdir)]
    ctx.log("watch: " + " ".join(cmd[1:]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=ctx.env(), cwd=str(Path(__file__).parent.parent))
    if done.returncode:
        raise RuntimeError(f"benchmarks/watch.py failed:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for user, f in figures.items():
        what = "transformers Trainer + TrainerWatch()" if user == "trainer" else "hand loop + Watch.step"
        ctx.rows.append(
            Row(
                section="watch",
                figure=f"{what}, {f['steps']} steps, a check every {f['every']}",
                measured=f"watch {f['share'] * 100:.2f} % of a {f['plain_step_ms']:.1f} ms step "
                f"({f['share'] * f['plain_step_ms'] * 1e3:.0f} µs)",
                reference="the same run without the watch",
                ratio=f"{f['ratio']:.3f} CPU",
                budget=f"≤ {WATCH_MAX_SHARE * 100:.0f} % of step time",
                ok=f["share"] <= WATCH_MAX_SHARE and f["same_losses"],
                note="" if f["same_losses"] else "the losses differ with the watch",
                data=f,
            )
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--workdir", default=".")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    figures = measure(args.steps, args.repeats, args.every, Path(args.workdir) / "watch-run")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
