"""Measuring subprocesses: wall time, CPU time (user + system, the process and the children it waited
for) and peak resident memory, from the kernel's own accounting (``os.wait4``); medians over
interleaved repeats; the machine the figures came from."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Measurement:
    """One run of one command."""

    wall: float  # seconds
    cpu: float  # user + system seconds, the process and its waited-for children
    max_rss_mb: float  # peak resident set size of the largest process of the tree, MiB
    rc: int
    output: str = ""
    #: when it started (epoch seconds), to place the probe's phase marks
    started_at: float = 0.0
    #: what the run reported about itself (the probe's JSON, the floor's JSON)
    info: dict = field(default_factory=dict)

    def value(self, metric: str) -> float:
        return {"wall": self.wall, "cpu": self.cpu, "rss": self.max_rss_mb}[metric]


class CommandFailed(RuntimeError):
    def __init__(self, cmd: Sequence[str], m: Measurement):
        tail = "\n".join(m.output.splitlines()[-40:])
        super().__init__(f"command failed (exit {m.rc}): {' '.join(map(str, cmd))}\n{tail}")
        self.measurement = m


def run_command(
    cmd: Sequence[str],
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 900.0,
    ok_codes: Sequence[int] = (0,),
) -> Measurement:
    """Run ``cmd`` to its end and measure it. The output goes to a file (no pipe to drain while timing)."""
    with tempfile.TemporaryFile(mode="w+b") as out:
        started_at = time.time()
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(map(str, cmd)), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    # ru_maxrss is in KiB on Linux, in bytes on macOS
    rss = usage.ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    m = Measurement(wall, usage.ru_utime + usage.ru_stime, rss, proc.returncode, text, started_at)
    if proc.returncode not in ok_codes:
        raise CommandFailed(cmd, m)
    return m


def abba(names: Sequence[str], repeats: int) -> list[str]:
    """The order in which to run the variants: each repeat runs every variant once, alternately forwards
    and backwards (A B, B A, A B, …) so a drift in the machine's load weighs on all of them alike."""
    order: list[str] = []
    for i in range(repeats):
        order += list(names) if i % 2 == 0 else list(reversed(names))
    return order


def interleaved(
    variants: dict[str, Callable[[], Measurement]],
    repeats: int,
    warmup: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, list[Measurement]]:
    """Run every variant ``repeats`` times, interleaved (see :func:`abba`), after ``warmup`` discarded
    rounds (page cache, bytecode caches)."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    out: dict[str, list[Measurement]] = {n: [] for n in names}
    for i, name in enumerate(abba(names, repeats)):
        m = variants[name]()
        out[name].append(m)
        if progress:
            progress(
                f"{name} {i // len(names) + 1}/{repeats}: wall {m.wall:.2f}s cpu {m.cpu:.2f}s rss {m.max_rss_mb:.0f}MiB"
            )
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> float:
    """Median absolute deviation relative to the median: the noise of a figure."""
    if len(values) < 2:
        return 0.0
    med = median(values)
    return median([abs(v - med) for v in values]) / med if med else 0.0


@dataclass
class Summary:
    """Medians of a set of measurements."""

    n: int
    wall: float
    cpu: float
    max_rss_mb: float
    wall_spread: float
    cpu_spread: float

    @classmethod
    def of(cls, ms: Sequence[Measurement]) -> Summary:
        walls, cpus = [m.wall for m in ms], [m.cpu for m in ms]
        return cls(
            len(ms), median(walls), median(cpus), median([m.max_rss_mb for m in ms]), spread(walls), spread(cpus)
        )

    def value(self, metric: str) -> float:
        return {"wall": self.wall, "cpu": self.cpu, "rss": self.max_rss_mb}[metric]


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def paired_ratio(a: Sequence[Measurement], b: Sequence[Measurement], metric: str) -> float:
    """The median over repeats of a[i] / b[i]: the i-th runs of two variants ran next to each other (see
    :func:`abba`), under the same load, so their ratio cancels most of a shared machine's drift."""
    return median([ratio(x.value(metric), y.value(metric)) for x, y in zip(a, b)])


# ---- the machine -------------------------------------------------------------------------------------


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


@dataclass
class Machine:
    cpu: str
    cores: int
    memory_gib: float
    system: str
    python: str
    versions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def here(cls, python: str) -> Machine:
        versions = {}
        code = (
            "import importlib.metadata as m\n"
            "for p in ('pytest','torch','transformers','trl','datasets','torchvision','diffusers'):\n"
            "    try: print(p, m.version(p))\n"
            "    except Exception: pass\n"
        )
        try:
            out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False).stdout
            versions = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        except (OSError, subprocess.SubprocessError):
            pass
        return cls(
            cpu_model(),
            os.cpu_count() or 0,
            memory_total_gib(),
            f"{platform.system()} {platform.release()}",
            platform.python_version(),
            versions,
        )

    def describe(self) -> str:
        libs = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        return (
            f"{self.cpu}, {self.cores} cores, {self.memory_gib:.0f} GiB RAM, {self.system}, "
            f"Python {self.python}; {libs}"
        )
