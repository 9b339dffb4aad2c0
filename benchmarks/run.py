"""pytest-dlcheck's performance benchmark: what the plugin costs, against what a person's own test of
the same project costs anyway, on this machine. One command:

    .venv/bin/python benchmarks/run.py                 # every figure, 5 interleaved repeats each
    .venv/bin/python benchmarks/run.py --only inactive,scale --repeats 9
    .venv/bin/python benchmarks/run.py --quick         # a reduced run (the test suite runs it)
    python benchmarks/run.py --device cuda             # the GPU figure, in under 8 minutes on one large GPU

Prints a table of medians over repeated runs and the ratios taken in the same run, checks the budgets,
and exits 1 when one fails. See benchmarks/README.md for what each figure measures.

--device cuda runs, on CUDA, the rows that show what the plugin costs on a real GPU: the memory row (peak
RSS and CUDA memory of --dlcheck=llm on the 104M Llama under SFTTrainer), the realistic rows (--dlcheck=
train,ckpt,smoke on that Llama under SFTTrainer and in a hand loop, vision,train,ckpt,smoke on a ResNet-50),
the inactive row and the scale rows; one run of each side (5 for the inactive row), no warm-up. Every
generated project puts its model on cuda (its batches go there through the pipeline's own path) and loads a
device guard (benchmarks/inject/dlbench_guard.py) that fails the run when, after a check, a model's
parameter or buffer is off its device, or when pytest-dlcheck's code copies a model's weights or gradients
to the CPU. The whole run is bounded: 8 minutes (480 s), each pytest run at most 150 s; past the bound it
aborts with a message and exit code 3. It writes the README's GPU figure (the section between
<!-- gpu-figure --> and <!-- /gpu-figure -->) and, with --figure PATH, the same text to PATH. Without
CUDA it says so in one line and exits 2 before building anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import corpus, measure, projects, watch
from benchmarks.measure import Measurement, Summary
from benchmarks.realistic import (
    bench_realistic,
    bench_realistic_loop,
    bench_realistic_memory,
    bench_realistic_vision,
    domain_budget_row,
)
from benchmarks.rows import (
    Row,
    broken,
    fmt_outcomes,
    fmt_ratios,
    fmt_time,
    median_run,
    not_measured,
    outcomes,
    passes,
    phases,
    slowest,
    table,
    time_split,
    work_by_check,
    work_by_domain,
)

SECTIONS = (
    "inactive",
    "active",
    "scale",
    "memory",
    "gpu",
    "watch",
    "realistic",
    "realistic-loop",
    "realistic-vision",
    "realistic-memory",
    "corpus",
)

#: the budgets (issue 10): inactive ≤ 3 % over -p no:dlcheck; active ≤ 2× the floor; 1,000,000 examples
#: ≤ 10 % over 1,000; peak RSS ≤ the floor's plus one copy of the trainable state
INACTIVE_MAX = 1.03
ACTIVE_MAX = 2.0
SCALE_MAX = 1.10
MEMORY_MAX_COPIES = 1.0

#: --device cuda: the sections it runs, its bound over the whole run and each pytest run's (seconds)
CUDA_SECTIONS = ("inactive", "scale", "gpu", "realistic", "realistic-loop", "realistic-vision")
CUDA_BOUND_S = 480.0
CUDA_COMMAND_S = 150.0
NO_CUDA = "no CUDA device: torch.cuda.is_available() is False; run this on a GPU machine"
#: the README section the --device cuda run fills
FIGURE_START, FIGURE_END = "<!-- gpu-figure -->", "<!-- /gpu-figure -->"


class BoundExceeded(Exception):
    """The --device cuda run passed its bound."""


#: quick mode's model for the memory figure: the same architecture, ~2M parameters
SMALL = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}


@dataclass
class Context:
    python: str
    workdir: Path
    repeats: int
    warmup: int
    threads: int
    metric: str
    verbose: bool
    rows: list[Row] = field(default_factory=list)
    #: where the benchmarked projects put their models; on a GPU each run loads the device guard
    device: str = "cpu"
    #: time.time() past which no run starts (and a running one is killed): the --device cuda bound
    deadline: float | None = None
    command_limit: float = 900.0
    #: what the device guard recorded, one entry per run: {"where": ..., "violations": [...], "transfers": [...]}
    guard: list[dict] = field(default_factory=list)

    def log(self, text: str) -> None:
        if self.verbose:
            print(f"  [{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def env(self, **extra: str) -> dict[str, str]:
        """The benchmarked runs' environment: offline, a fixed thread count, the probe importable, and
        nothing from the caller's shell that switches the plugin on or adds pytest options. Bytecode is
        cached as Python does by default (PYTHONDONTWRITEBYTECODE would make every run recompile, and
        assertion-rewrite, the plugin's modules: a cost no installed plugin has); the warm-up writes it."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "PYTEST_DLCHECK",
                "PYTEST_ADDOPTS",
                "PYTEST_PLUGINS",
                "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
                "PYTHONDONTWRITEBYTECODE",
            )
        }
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            HF_DATASETS_DISABLE_PROGRESS_BARS="1",
            TOKENIZERS_PARALLELISM="false",
            OMP_NUM_THREADS=str(self.threads),
            MKL_NUM_THREADS=str(self.threads),
            PYTHONPATH=os.pathsep.join([str(projects.INJECT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])),
        )
        if self.device != "cpu":
            env["DLBENCH_DEVICE"] = self.device
        env.update(extra)
        return env

    def pytest(
        self, project_root: Path, args: list[str], env: dict[str, str], ok_codes=(0,), floor: bool = False
    ) -> Callable[[], Measurement]:
        """A closure running ``pytest args`` in ``project_root`` with the probe, returning the measurement
        with the probe's (and the floor's) JSON in ``info``."""
        counter = [0]

        def go() -> Measurement:
            counter[0] += 1
            probe = self.workdir / f"probe-{os.getpid()}-{id(go)}-{counter[0]}.json"
            floor_out = self.workdir / f"floor-{os.getpid()}-{id(go)}-{counter[0]}.json"
            guard = self.workdir / f"guard-{os.getpid()}-{id(go)}-{counter[0]}.json"
            run_env = dict(env, DLBENCH_PROBE_OUT=str(probe), DLBENCH_FLOOR_OUT=str(floor_out))
            cmd = [self.python, "-m", "pytest", "-q", "-p", "dlbench_probe", *args]
            if self.device != "cpu":  # on both sides of every ratio
                cmd[4:4] = ["-p", "dlbench_guard"]
                run_env.update(DLBENCH_GUARD_OUT=str(guard), DLBENCH_GUARD_DEVICE=self.device)
            timeout = self.command_limit
            if self.deadline is not None:
                timeout = min(timeout, self.deadline - time.time())
                if timeout <= 0:
                    raise BoundExceeded(f"before {project_root.name}: {' '.join(args)}")
            try:
                m = measure.run_command(cmd, cwd=project_root, env=run_env, ok_codes=ok_codes, timeout=timeout)
            finally:
                if guard.exists():
                    self.guard.append(
                        {"where": f"{project_root.name}: {' '.join(args)}", **json.loads(guard.read_text())}
                    )
                    guard.unlink()
                if self.deadline is not None and time.time() >= self.deadline:
                    raise BoundExceeded(f"during {project_root.name}: {' '.join(args)}")
            if probe.exists():
                m.info["probe"] = json.loads(probe.read_text())
                probe.unlink()
            if floor_out.exists():
                m.info["floor"] = json.loads(floor_out.read_text())
                floor_out.unlink()
            if floor and "floor" not in m.info:
                raise measure.CommandFailed(cmd, m)
            return m

        return go

    def measure(
        self, variants: dict[str, Callable[[], Measurement]], repeats: int | None = None
    ) -> dict[str, list[Measurement]]:
        return measure.interleaved(variants, self.repeats if repeats is None else repeats, self.warmup, self.log)


# ---- 1. inactive -------------------------------------------------------------------------------------


def bench_inactive(ctx: Context, n_tests: int, repeats: int) -> None:
    suite = projects.plain_suite(ctx.workdir / "plain", n_tests)
    env = ctx.env()
    runs = ctx.measure(
        {
            "installed": ctx.pytest(suite, ["."], env),
            "no:dlcheck": ctx.pytest(suite, ["-p", "no:dlcheck", "."], env),
        },
        repeats,
    )
    a, b = Summary.of(runs["installed"]), Summary.of(runs["no:dlcheck"])
    text, chosen = fmt_ratios(runs["installed"], runs["no:dlcheck"], ctx.metric)
    heavy_a = sorted({m for r in runs["installed"] for m in r.info["probe"]["heavy_modules"]})
    heavy_b = sorted({m for r in runs["no:dlcheck"] for m in r.info["probe"]["heavy_modules"]})
    registered = all(r.info["probe"]["dlcheck_registered"] for r in runs["installed"])
    disabled = not any(r.info["probe"]["dlcheck_registered"] for r in runs["no:dlcheck"])
    passed = [outcomes(r).get("passed", 0) for r in runs["installed"] + runs["no:dlcheck"]]
    # importing the plugin by itself, in a fresh interpreter
    code = (
        "import sys, pytest_dlcheck, pytest_dlcheck.plugin\n"
        f"print(','.join(m for m in {measure_heavy()!r} if m in sys.modules))"
    )
    alone = subprocess.run([ctx.python, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)
    imported_alone = [m for m in alone.stdout.strip().split(",") if m]
    extra = sorted(set(heavy_a) - set(heavy_b))
    no_torch = alone.returncode == 0 and "torch" not in imported_alone and "torch" not in heavy_a and not extra
    ok = chosen <= INACTIVE_MAX and registered and disabled and no_torch and all(p == n_tests for p in passed)
    note = (
        f"plugin registered: {registered} (and absent with -p no:dlcheck: {disabled}); heavy modules imported "
        f"by the installed run: {', '.join(heavy_a) or 'none'} (with -p no:dlcheck: {', '.join(heavy_b) or 'none'}); "
        f"`import pytest_dlcheck.plugin` alone imports: {', '.join(imported_alone) or 'none of torch/transformers/…'}"
    )
    ctx.rows.append(
        Row(
            "inactive",
            f"plain {n_tests}-test suite: installed, not enabled / -p no:dlcheck",
            fmt_time(a),
            fmt_time(b),
            text,
            f"≤ {INACTIVE_MAX:.2f}, no torch import",
            ok,
            note,
            {
                "installed": asdict(a),
                "no:dlcheck": asdict(b),
                "ratio": chosen,
                "heavy_installed": heavy_a,
                "heavy_disabled": heavy_b,
                "imported_alone": imported_alone,
            },
        )
    )


def measure_heavy() -> tuple[str, ...]:
    return ("torch", "numpy", "transformers", "trl", "datasets", "accelerate", "torchvision", "timm", "diffusers")


# ---- 2. active against the floor ---------------------------------------------------------------------


def bench_active(ctx: Context, domain: str) -> None:
    try:
        project = projects.example_project(domain, ctx.workdir / "examples")
    except KeyError as exc:
        ctx.rows.append(
            Row(
                "active",
                f"--dlcheck={domain} on examples/{domain}/clean / floor",
                "-",
                "-",
                "-",
                f"≤ {ACTIVE_MAX:.1f}×",
                None,
                f"not measured: {exc.args[0]}",
            )
        )
        return
    env = ctx.env()
    try:
        runs = ctx.measure(
            {
                "active": ctx.pytest(project.root, project.active_args(), env, ok_codes=(0, 1)),
                "floor": ctx.pytest(project.root, project.floor_args(), env, floor=True),
            }
        )
    except measure.CommandFailed as exc:
        ctx.rows.append(
            Row(
                "active",
                f"--dlcheck={domain} on examples/{domain}/clean / floor",
                "-",
                "-",
                "-",
                f"≤ {ACTIVE_MAX:.1f}×",
                False,
                "could not measure: " + " ".join(str(exc).split())[-600:],
            )
        )
        return
    a, b = Summary.of(runs["active"]), Summary.of(runs["floor"])
    text, chosen = fmt_ratios(runs["active"], runs["floor"], ctx.metric)
    mid = median_run(runs["active"], ctx.metric)
    counts = outcomes(mid)
    problem = next((broken(m) for m in runs["active"] if broken(m)), "")
    ph, ph_floor = phases(mid), phases(median_run(runs["floor"], ctx.metric))
    work = passes(mid)
    note = (
        f"checks: {fmt_outcomes(counts)}; work: {work['forward']} forward, {work['backward']} backward passes, "
        f"{work['optimizer_steps']} optimizer steps; active run: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in ph.items())
        + "; floor: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in ph_floor.items())
        + "; slowest items: "
        + ", ".join(f"{n} {s:.1f}+{c:.1f} s" for n, s, c in slowest(mid))
    )
    split = time_split(mid)  # the checks' time: the user's work and the plugin's own (its share)
    if split["checks"]:
        note += (
            f"; the plugin's share of the checks' {split['checks']:.1f} s: {split['share']:.0%} "
            f"(user {split['user']:.1f} s, plugin {split['plugin']:.1f} s)"
        )
    if problem:
        note = f"NOT CLEAN: {problem}; " + note
    ctx.rows.append(
        Row(
            "active",
            f"--dlcheck={domain} on examples/{domain}/clean / floor",
            fmt_time(a),
            fmt_time(b),
            text,
            f"≤ {ACTIVE_MAX:.1f}×",
            chosen <= ACTIVE_MAX and not problem,
            note,
            {
                "active": asdict(a),
                "floor": asdict(b),
                "ratio": chosen,
                "outcomes": counts,
                "passes": work,
                "domain": domain,
                "forward_by_domain": {d: w["forward"] for d, w in work_by_domain(mid).items()},
                "routine_by_domain": {d: w["in_user_routines"] for d, w in work_by_domain(mid).items()},
                "work_by_check": work_by_check(mid),
                "phases": ph,
                "floor_phases": ph_floor,
            },
        )
    )


# ---- 3. scale ----------------------------------------------------------------------------------------


def bench_scale(ctx: Context, variant: str, small: int, large: int) -> None:
    project = projects.scale_project(ctx.workdir, variant)
    runs = ctx.measure(
        {
            f"{small:,}": ctx.pytest(
                project.root, project.active_args(), ctx.env(DLBENCH_N=str(small)), ok_codes=(0, 1)
            ),
            f"{large:,}": ctx.pytest(
                project.root, project.active_args(), ctx.env(DLBENCH_N=str(large)), ok_codes=(0, 1)
            ),
        }
    )
    a, b = Summary.of(runs[f"{large:,}"]), Summary.of(runs[f"{small:,}"])
    text, chosen = fmt_ratios(runs[f"{large:,}"], runs[f"{small:,}"], ctx.metric)
    items_a = measure.median([phases(m).get("items", 0.0) for m in runs[f"{large:,}"]])
    items_b = measure.median([phases(m).get("items", 0.0) for m in runs[f"{small:,}"]])
    ca, cb = outcomes(median_run(runs[f"{large:,}"], ctx.metric)), outcomes(median_run(runs[f"{small:,}"], ctx.metric))
    same = ca == cb
    problem = next((broken(m) for ms in runs.values() for m in ms if broken(m)), "")
    note = (
        ("NOT CLEAN: " + problem + "; " if problem else "")
        + f"checks at {large:,}: {fmt_outcomes(ca)}; at {small:,}: {fmt_outcomes(cb)}"
        + ("" if same else " (the outcomes differ with the dataset's size)")
        + f"; fixtures+checks {items_a:.2f} s vs {items_b:.2f} s"
    )
    ctx.rows.append(
        Row(
            "scale",
            f"{variant}: {large:,} / {small:,} lazily produced examples",
            fmt_time(a),
            fmt_time(b),
            text,
            f"≤ {SCALE_MAX:.2f}",
            chosen <= SCALE_MAX and same and not problem,
            note,
            {
                "large": asdict(a),
                "small": asdict(b),
                "ratio": chosen,
                "items_large": items_a,
                "items_small": items_b,
                "outcomes_large": ca,
                "outcomes_small": cb,
            },
        )
    )


# ---- 4. memory ---------------------------------------------------------------------------------------


def bench_memory(ctx: Context, size: dict, repeats: int, device: str = "cpu") -> Row:
    project = projects.memory_project(ctx.workdir / device, size)
    env = ctx.env(DLBENCH_DEVICE=device, DLBENCH_RSS="1")
    runs = ctx.measure(
        {
            "active": ctx.pytest(project.root, project.active_args(), env, ok_codes=(0, 1)),
            "floor": ctx.pytest(project.root, project.floor_args(), env, floor=True),
        },
        repeats,
    )
    a, b = Summary.of(runs["active"]), Summary.of(runs["floor"])
    trainable = runs["floor"][0].info["floor"]["trainable_bytes"] / 2**20
    n_params = projects.llama_parameters(320, **size)
    extra = a.max_rss_mb - b.max_rss_mb
    copies = extra / trainable if trainable else float("inf")
    text, chosen = fmt_ratios(runs["active"], runs["floor"], ctx.metric)
    mid = median_run(runs["active"], ctx.metric)
    problem = next((broken(m) for m in runs["active"] if broken(m)), "")
    own = measure.median([own_peak(m) for m in runs["active"]])
    step = measure.median([own_peak(m) for m in runs["floor"]])
    note = (
        f"model: Llama from a config, {n_params / 1e6:.0f}M parameters, trainable state {trainable:.0f} MiB; "
        f"checks: {fmt_outcomes(outcomes(mid))}; over the RSS once the fixtures are built, the checks' own peak "
        f"is {own:+.0f} MiB and the floor's forward+backward {step:+.0f} MiB; "
        f"time {fmt_time(a)} vs floor {fmt_time(b)} ({text})"
    )
    if problem:
        note = f"NOT CLEAN: {problem}; " + note
    row = Row(
        "memory" if device == "cpu" else "gpu",
        f"peak RSS, --dlcheck=llm on a {n_params / 1e6:.0f}M model / floor"
        + ("" if device == "cpu" else f" ({device})"),
        f"{a.max_rss_mb:.0f} MiB",
        f"{b.max_rss_mb:.0f} MiB",
        f"{extra:+.0f} MiB = {copies:+.2f} copies",
        f"≤ +{MEMORY_MAX_COPIES:g} copy ({trainable * MEMORY_MAX_COPIES:.0f} MiB)",
        copies <= MEMORY_MAX_COPIES and not problem,
        note,
        {
            "active": asdict(a),
            "floor": asdict(b),
            "trainable_mib": trainable,
            "extra_mib": extra,
            "checks_own_peak_mib": own,
            "floor_step_peak_mib": step,
            "copies": copies,
            "parameters": n_params,
            "time_ratio": chosen,
        },
    )
    row.data["runs"] = runs
    return row


def own_peak(m: Measurement) -> float:
    """Peak RSS (VmHWM) at the end over the RSS once the fixtures were built: after the first check's setup
    (which builds the session fixtures) in an active run, just before the step in the floor."""
    probe, floor = m.info.get("probe") or {}, m.info.get("floor")
    start = (floor or {}).get("memory_before_step") if floor else probe.get("memory_after_first_setup")
    end = probe.get("memory_at_end") or {}
    if not start or "vmrss" not in start or "vmhwm" not in end:
        return float("nan")
    return end["vmhwm"] - start["vmrss"]


# ---- 5. GPU ------------------------------------------------------------------------------------------


def cuda_available(ctx: Context) -> bool:
    code = "import torch; print(torch.cuda.is_available())"
    out = subprocess.run(
        [ctx.python, "-c", code], capture_output=True, text=True, env=ctx.env(), timeout=300, check=False
    )
    return out.stdout.strip() == "True"


def device_findings(active: list[Measurement], floor: list[Measurement], device: str = "cuda") -> dict[str, Any]:
    """From the probe: what moved a watched model to the CPU during the checks, which of its tensors are off
    ``device`` at the end, and the median peak memory allocated on the device, active and floor."""
    moved = sorted({x for m in active for x in (m.info.get("probe") or {}).get("moved_to_cpu", [])})
    off = {}
    for m in active:
        for name, kinds in ((m.info.get("probe") or {}).get("devices") or {}).items():
            if set(kinds) - {device}:
                off[name] = kinds
    peak = lambda ms: measure.median([(m.info.get("probe") or {}).get("cuda_peak_mb") or 0.0 for m in ms])
    return {"moved": moved, "off_device": off, "peak_active": peak(active), "peak_floor": peak(floor)}


def bench_gpu(ctx: Context, size: dict, repeats: int) -> None:
    if not cuda_available(ctx):
        ctx.rows.append(
            Row(
                "gpu",
                "the same figures with the model on CUDA",
                "-",
                "-",
                "-",
                "same budgets; nothing moved to CPU",
                None,
                "not taken: torch.cuda.is_available() is False on this machine",
            )
        )
        return
    row = bench_memory(ctx, size, repeats, device="cuda")
    runs = row.data.pop("runs")
    a, b = Summary.of(runs["active"]), Summary.of(runs["floor"])
    found = device_findings(runs["active"], runs["floor"], "cuda")
    text, chosen = fmt_ratios(runs["active"], runs["floor"], ctx.metric)
    trainable = row.data["trainable_mib"]
    ok_time = chosen <= ACTIVE_MAX
    ok_gpu_mem = found["peak_active"] - found["peak_floor"] <= trainable * MEMORY_MAX_COPIES
    row.ok = bool(row.ok and ok_time and ok_gpu_mem and not found["moved"] and not found["off_device"])
    row.note += (
        f"; CUDA peak allocated {found['peak_active']:.0f} MiB vs floor {found['peak_floor']:.0f} MiB "
        f"(budget: + at most {trainable * MEMORY_MAX_COPIES:.0f} MiB); moved to CPU during the checks: "
        f"{', '.join(found['moved']) or 'nothing'}; tensors off the GPU at the end: {found['off_device'] or 'none'}"
    )
    row.data.update(time_ratio=chosen, **found)
    ctx.rows.append(row)
    ctx.rows.append(
        Row(
            "gpu",
            "--dlcheck=llm on CUDA / floor on CUDA (time)",
            fmt_time(a),
            fmt_time(b),
            text,
            f"≤ {ACTIVE_MAX:.1f}×",
            ok_time,
            "",
        )
    )


# ---- a profile, to find where the plugin's time goes ------------------------------------------------


def profile(ctx: Context, domain: str, top: int = 25) -> str:
    """Run ``--dlcheck=<domain>`` on its example once under cProfile; the plugin's functions by cumulative
    time (which includes the user's code they call: fixtures, forward passes) and its own time in total."""
    import pstats

    project = projects.example_project(domain, ctx.workdir / "profile")
    out = ctx.workdir / f"{domain}.prof"
    cmd = [
        ctx.python,
        "-m",
        "cProfile",
        "-o",
        str(out),
        "-m",
        "pytest",
        "-q",
        "-p",
        "dlbench_probe",
        *project.active_args(),
    ]
    measure.run_command(cmd, cwd=project.root, env=ctx.env(), ok_codes=(0, 1))
    stats = pstats.Stats(str(out)).stats
    package = str(Path(projects.REPO, "pytest_dlcheck"))
    rows = [
        (ct, tt, nc, f"{f.removeprefix(package + '/')}:{line} {name}")
        for (f, line, name), (_, nc, tt, ct, _) in stats.items()
        if f.startswith(package)
    ]
    total = sum(tt for _, tt, _, _ in rows)
    whole = sum(v[2] for v in stats.values())
    lines = [
        (
            f"cProfile of --dlcheck={domain} on examples/{domain}/clean: the plugin's own time {total:.3f} s "
            f"(profiled; the whole run {whole:.1f} s)"
        ),
        "   cumulative      own    calls  function",
    ]
    lines += [f"{ct:11.3f} {tt:8.3f} {nc:8d}  {where}" for ct, tt, nc, where in sorted(rows, reverse=True)[:top]]
    return "\n".join(lines)


# ---- the command ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--only", default=",".join(SECTIONS), help=f"sections to run, comma-separated: {', '.join(SECTIONS)}"
    )
    ap.add_argument(
        "--repeats", type=int, default=5, help="interleaved runs per variant (medians are taken), default 5"
    )
    ap.add_argument("--warmup", type=int, default=1, help="discarded rounds before measuring, default 1")
    ap.add_argument("--tests", type=int, default=300, help="tests in the plain suite, default 300")
    ap.add_argument(
        "--inactive-repeats",
        type=int,
        default=21,
        help="runs per variant for the inactive figure, default 21 (a ~1%% effect under a shared machine's noise)",
    )
    ap.add_argument(
        "--domains", default="", help="domains for the active figure (default: every examples/<domain>/clean)"
    )
    ap.add_argument("--sizes", default="1000,1000000", help="dataset sizes for the scale figure, default 1000,1000000")
    ap.add_argument("--scale-variants", default=",".join(projects.SCALE_VARIANTS), help="projects for the scale figure")
    ap.add_argument("--memory-repeats", type=int, default=3, help="runs per variant for the memory figure, default 3")
    ap.add_argument(
        "--small-model",
        action="store_true",
        help="memory/GPU/realistic figures on a ~1M Llama and a 3.5M ResNet instead of 104M and ResNet-50",
    )
    ap.add_argument("--threads", type=int, default=1, help="OMP/MKL threads of every benchmarked run, default 1")
    ap.add_argument(
        "--metric",
        choices=("cpu", "wall"),
        default="cpu",
        help="which time the budgets judge: CPU (user+system, robust on a shared machine; the default) or wall",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="reduced sizes for a smoke run: 20 tests, 1 repeat, no warm-up, llm only, sizes 10,10000, the "
        "collator+map-style project, a ~2M model",
    )
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the environment to benchmark")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--json", default=None, help="also write every figure as JSON here")
    ap.add_argument(
        "--corpus-reports",
        default=None,
        help="corpus: read the projects' --dlcheck=all JSON reports from this directory (a corpus test run with "
        "DLCHECK_CORPUS_REPORTS=DIR keeps them) instead of running the corpus (tests/realcode/projects) once here",
    )
    ap.add_argument("--corpus-projects", default="", help="corpus: a pytest -k expression selecting projects")
    ap.add_argument(
        "--profile",
        default=None,
        metavar="DOMAIN",
        help="instead of the figures: profile --dlcheck=DOMAIN on its example once (cProfile) and print "
        "the plugin's functions by cumulative time",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the GPU figure in one command, bounded to 8 minutes (480 s, each pytest run ≤ 150 s; "
        "past it the run aborts, exit 3): the memory row, the realistic rows (104M Llama under SFTTrainer and "
        "a hand loop, ResNet-50), the inactive and scale rows, models on CUDA, a device guard after every "
        "check (exit 1 on a model off its device or its weights copied to the CPU by the plugin); writes the "
        "README's GPU figure. Without CUDA: one line, exit 2",
    )
    ap.add_argument("--figure", default=None, help="--device cuda: also write the GPU figure's text here")
    ap.add_argument(
        "--readme",
        default=str(projects.REPO / "README.md"),
        help="--device cuda: the README whose GPU figure section it fills (empty: none)",
    )
    ap.add_argument("--no-check", action="store_true", help="exit 0 even when a budget fails")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    if args.quick:
        args.tests, args.repeats, args.warmup, args.memory_repeats, args.inactive_repeats = 20, 1, 0, 1, 1
        args.domains = args.domains or "llm"
        args.sizes = "10,10000"
        args.scale_variants = "collator+map-style"
        args.small_model = True
        if args.only == ",".join(SECTIONS):  # the corpus runs every real-code project once: not a quick figure
            args.only = ",".join(s for s in SECTIONS if s != "corpus")
    if args.device == "cuda":  # one run of each side: what fits the 8-minute bound
        if args.only == ",".join(SECTIONS):
            args.only = ",".join(CUDA_SECTIONS)
        args.repeats, args.warmup, args.memory_repeats = 1, 0, 1
        args.inactive_repeats = min(args.inactive_repeats, 5)
    return args


def cuda_here(python: str) -> str | None:
    """The name of the first CUDA device ``python``'s torch sees, or None when it sees none."""
    code = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    name = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    return name[0] if name and name[0] else None


def guard_row(ctx: Context) -> Row:
    """The device guard over every run of a --device run: violations fail it; the plugin's other copies to
    the CPU (values its checks computed and read) are counted in the note."""
    violations = [f"{g['where']}: {v}" for g in ctx.guard for v in g.get("violations", [])]
    transfers = [t for g in ctx.guard for t in g.get("transfers", []) if not t.get("model")]
    sites = sorted({t["site"] for t in transfers})
    note = (
        f"{len(ctx.guard)} runs guarded; violations: {'; '.join(violations) or 'none'}; other copies of "
        f"{ctx.device} tensors to the CPU by the plugin (values a check computed and reads): "
        f"{sum(t['calls'] for t in transfers)} calls, {sum(t['bytes'] for t in transfers) / 2**20:.1f} MiB, "
        f"at {', '.join(sites[:12]) or 'nowhere'}{' …' if len(sites) > 12 else ''}"
    )
    return Row(
        "gpu",
        f"device guard: every check's model stays on {ctx.device}; no check moves it or copies its weights to the CPU",
        f"{len(violations)} violations",
        "-",
        "-",
        "0",
        not violations if ctx.guard else None,
        note,
        {"violations": violations, "transfers": transfers},
    )


def write_figure(readme: Path, text: str) -> bool:
    """Replace the README's GPU figure section (between :data:`FIGURE_START` and :data:`FIGURE_END`) with
    ``text``; False when the README has no such section."""
    if not readme.is_file():
        return False
    body = readme.read_text()
    start, end = body.find(FIGURE_START), body.find(FIGURE_END)
    if start < 0 or end < start:
        return False
    readme.write_text(body[: start + len(FIGURE_START)] + "\n" + text.strip() + "\n" + body[end:])
    return True


@contextmanager
def _stop_on_bound(stopped: list[BoundExceeded]) -> Iterator[None]:
    """Stop the figures when the bound is passed, keeping the rows taken (the exception in ``stopped``)."""
    try:
        yield
    except BoundExceeded as exc:
        stopped.append(exc)


def main(argv: list[str] | None = None) -> int:
    begun = time.time()
    args = parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--only: unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    gpu_name = None
    if args.device == "cuda":
        gpu_name = cuda_here(args.python)
        if gpu_name is None:
            print(NO_CUDA)
            return 2
    small, large = (int(x) for x in args.sizes.split(","))
    size = SMALL if args.small_model else projects.BIG
    stopped: list[BoundExceeded] = []
    with tempfile.TemporaryDirectory(prefix="dlbench-", dir=args.workdir) as tmp, _stop_on_bound(stopped):
        ctx = Context(args.python, Path(tmp), args.repeats, args.warmup, args.threads, args.metric, not args.quiet)
        if args.device == "cuda":
            ctx.device, ctx.deadline, ctx.command_limit = "cuda", begun + CUDA_BOUND_S, CUDA_COMMAND_S
        if args.profile:
            print(profile(ctx, args.profile))
            return 0
        machine = measure.Machine.here(args.python)
        load_before = measure.load_average()
        started = time.time()
        if "inactive" in only:
            ctx.log("inactive cost")
            bench_inactive(ctx, args.tests, args.inactive_repeats)
        if "active" in only:
            for domain in [d for d in args.domains.split(",") if d] or projects.example_domains():
                ctx.log(f"active cost: {domain}")
                bench_active(ctx, domain)
            budget_row = domain_budget_row(ctx.rows)  # the data domains' forward passes, ≤ 10 each
            if budget_row is not None:
                ctx.rows.append(budget_row)
        if "scale" in only:
            for variant in [v for v in args.scale_variants.split(",") if v]:
                ctx.log(f"scale: {variant}")
                bench_scale(ctx, variant, small, large)
        if "memory" in only:
            ctx.log("memory")
            row = bench_memory(ctx, size, args.memory_repeats)
            row.data.pop("runs")
            ctx.rows.append(row)
        if "gpu" in only:
            ctx.log("gpu")
            bench_gpu(ctx, size, args.memory_repeats)
        if "realistic" in only:
            ctx.log("realistic: train,ckpt,smoke on the memory figure's model")
            ctx.rows.append(bench_realistic(ctx, size, args.memory_repeats))
        if "realistic-loop" in only:
            ctx.log("realistic: train,ckpt,smoke on the same model in a hand-written loop")
            ctx.rows.append(bench_realistic_loop(ctx, size, args.memory_repeats))
        if "realistic-vision" in only:
            ctx.log("realistic: vision,train,ckpt,smoke on a ResNet-50")
            vision_size = projects.RESNET_SMALL if args.small_model else projects.RESNET50
            ctx.rows.append(bench_realistic_vision(ctx, vision_size, args.memory_repeats))
        if "realistic-memory" in only:
            ctx.log("realistic: train,ckpt,smoke on an MLP, peak RSS in training states over the floor")
            mlp_size = projects.MLP_SMALL if args.small_model else projects.MLP_BIG
            ctx.rows.append(bench_realistic_memory(ctx, mlp_size, args.memory_repeats))
        if "corpus" in only:
            ctx.log("corpus: --dlcheck=all on every project of tests/realcode/projects, one run each")
            try:
                ctx.rows.extend(corpus.bench_corpus(ctx, args.corpus_reports, args.corpus_projects))
            except RuntimeError as exc:
                ctx.rows.append(not_measured("corpus", "--dlcheck=all on the real-code corpus", "-", exc))
        if "watch" in only:
            ctx.log("watch")
            watch.bench_watch(ctx, steps=30 if args.quick else 200, repeats=args.repeats)
        load_after = measure.load_average()
    if stopped:
        print(
            f"aborted: the --device cuda run passed its {CUDA_BOUND_S / 60:.0f}-minute bound "
            f"({CUDA_BOUND_S:.0f} s) {stopped[0]}; the rows taken before it:"
        )
        print(table(ctx.rows + [guard_row(ctx)]))
        return 3
    if args.device != "cpu":
        ctx.rows.append(guard_row(ctx))
    header = (
        f"pytest-dlcheck benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {time.time() - started:.0f} s\n"
        f"machine: {machine.describe()}\n"
        f"load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load_before)}, "
        f"after {'/'.join(f'{x:.2f}' for x in load_after)}\n"
        f"medians of {args.repeats} interleaved runs ({args.inactive_repeats} for the inactive figure, "
        f"{args.memory_repeats} for memory/GPU) after {args.warmup} warm-up; ratios are medians of paired runs; "
        f"{args.threads} OMP thread(s); budgets judged on {'CPU' if args.metric == 'cpu' else 'wall'} time\n"
    )
    print(header)
    print(table(ctx.rows))
    failed = [r for r in ctx.rows if r.ok is False]
    print(f"\n{len(failed)} budget(s) failed" if failed else "\nall budgets hold")
    if args.device == "cuda":
        violations = next(r for r in reversed(ctx.rows) if r.figure.startswith("device guard")).data["violations"]
        if violations:
            print("\ndevice guard violations:\n" + "\n".join(f"  {v}" for v in violations))
        figure = (
            f"Taken {time.strftime('%Y-%m-%d')} by `python benchmarks/run.py --device cuda` in "
            f"{time.time() - begun:.0f} s (bound {CUDA_BOUND_S:.0f} s) on {gpu_name}; {machine.describe()}; one "
            f"run of each side ({args.inactive_repeats} for the inactive row), CPU time, {args.threads} thread(s):"
            f"\n\n{table(ctx.rows)}"
        )
        if args.figure:
            Path(args.figure).write_text(figure + "\n")
        if args.readme and not write_figure(Path(args.readme), figure):
            print(f"{args.readme}: no {FIGURE_START} … {FIGURE_END} section; the figure was not written there")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": asdict(machine),
                    "load_before": load_before,
                    "load_after": load_after,
                    "args": vars(args),
                    "rows": [asdict(r) | {"verdict": r.verdict} for r in ctx.rows],
                },
                indent=2,
                default=str,
            )
        )
    return 1 if failed and not args.no_check else 0


if __name__ == "__main__":
    sys.exit(main())
