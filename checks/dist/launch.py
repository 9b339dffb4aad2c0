"""Launching the user's loop in N real processes, the way torchrun / ``torch.multiprocessing`` start them,
and what each rank reports back.

The parent (the pytest process) picks a free port, starts N processes (``fork`` where it is safe — no CUDA
initialised in the parent — else ``spawn``), each with MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE /
LOCAL_RANK set and ``init_process_group(init_method="env://")`` on gloo (which carries CPU and CUDA tensors; each
rank is given its own GPU when there is one per rank). Every rank runs the script's parts in order — ``dlcheck_dist_setup``, ``dlcheck_make_training``,
``dlcheck_dist_wrap``, ``dlcheck_make_dataloader``, then per epoch ``dlcheck_start_epoch`` and
``dlcheck_train_step`` — and writes what the checks need to files under the launch's directory, stage by
stage (``train``, ``ckpt``, ``d6``), so a rank that raises or hangs still leaves the stages it finished.
The parent always ends every process it started: a wall-clock limit, a short grace when a rank raised
(the others are then usually stuck in a collective), a short limit for the injected non-finite step."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import random
import socket
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ...sampling import indexable
from ...training.runs import unwrap_prepared
from ..shared.digest import nested_digest, tensor_digest
from ..shared.dropout import quiet_dropout, restore_dropout

#: torch's default seed: the state of the global generator in a fresh process that seeds nothing (before torch
#: 2.14, which seeds every fresh process from the OS instead: see :func:`fresh_process_seed`)
TORCH_DEFAULT_SEED = 67280421310721
_FRESH_SEED: list[int | None] = []


def rank_seed(rank: int) -> int:
    """A rank's stand-in for the seed torch 2.14 draws from the OS in a fresh process: different on every rank,
    the same on every launch (64 bits of a hash of the rank)."""
    return int.from_bytes(hashlib.sha256(f"dlcheck-rank-{rank}".encode()).digest()[:8], "little") >> 1


def fresh_process_seed() -> int | None:
    """The seed a fresh process of this torch starts its global generator with: a constant (torch's default
    seed, the same in every process) or None when each fresh process is seeded from the OS (torch 2.14). The
    ranks are forked from this process, whose generator the user's fixtures have seeded: they are given a fresh
    process's. Measured once per session in a new interpreter (a new ``torch.Generator()`` keeps the constant
    either way, so it cannot be read here)."""
    if not _FRESH_SEED:
        import subprocess

        seeds = []
        try:
            for _ in range(2):
                out = subprocess.run(
                    [sys.executable, "-c", "import torch; print(torch.initial_seed())"],
                    capture_output=True,
                    text=True,
                    timeout=180,
                    env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                )
                seeds.append(int(out.stdout.strip().splitlines()[-1]))
                if seeds[0] != TORCH_DEFAULT_SEED:
                    break  # not the constant: seeded from the OS
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            seeds = [TORCH_DEFAULT_SEED]
        _FRESH_SEED.append(seeds[0] if len(set(seeds)) == 1 and seeds[0] == TORCH_DEFAULT_SEED else None)
    return _FRESH_SEED[0]


#: models up to this many elements have their tensors sent back (max |diff| in the evidence), else digests
SMALL_MODEL = 4_000_000
STAGES = ("train", "ckpt", "position", "d6", "load", "eval")
#: the most micro-steps the launch trains to reach a gradient-accumulating loop's first optimizer step (and the
#: window after it): past the launch's own micro-steps only when no rank has stepped its optimizer in them
ACCUMULATION_BOUND = 16
#: D5's data position: the micro-steps of the run saved half way and resumed (at most; a rank's epoch if shorter)
POSITION_STEPS = 8


@dataclass
class Job:
    """What every rank runs. Role values are None when the user gave none (picklable for ``spawn``)."""

    world: int
    out: str
    steps: int
    make_training: Any
    #: the plain-loop setup of pytest_dlcheck.training (its ``step`` runs dlcheck_train_step or the default step)
    setup: Any = None
    loader: Any = None
    save: Any = None
    load: Any = None
    wrap: Any = None
    dist_setup: Any = None
    make_dataloader: Any = None
    start_epoch: Any = None
    #: "train": the run of D1–D6; "save": train, save and load back, no non-finite step (D5's checkpoint written at
    #: another world size); "load": load ``load_path`` at this world size (D5's sharded checkpoint reloaded);
    #: "eval": the user's distributed evaluation on the fresh objects (D7, :mod:`.evaluation`)
    mode: str = "train"
    load_path: str = ""
    pg_timeout: float = 60.0
    #: the seed of a fresh process's global torch generator (None: from the OS, different on every rank), set by
    #: :func:`launch`
    fresh_seed: int | None = TORCH_DEFAULT_SEED
    #: D7: the user's evaluation (dlcheck_dist_eval), their eval DataLoader factory, the weights to evaluate (the
    #: distributed launch's rank 0's, for the one-process reference), and whether to evaluate twice (determinism)
    dist_eval: Any = None
    make_eval_dataloader: Any = None
    eval_weights: Any = None
    eval_twice: bool = False


@dataclass
class RankResult:
    rank: int
    exitcode: int | None
    stages: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    progress: list[str] = field(default_factory=list)
    log: str = ""
    killed: bool = False

    @property
    def last(self) -> str:
        return self.progress[-1] if self.progress else "starting"


@dataclass
class Launch:
    world: int
    start_method: str
    backend: str
    ranks: list[RankResult]
    wall: float
    timed_out: bool
    out: str
    port: int = 0
    #: the process group's timeout the ranks ran under (seconds)
    pg_timeout: float = 60.0

    def stage(self, name: str) -> list[Any] | None:
        """Every rank's record of a stage, or None when some rank did not finish it."""
        got = [r.stages.get(name) for r in self.ranks]
        return None if any(g is None for g in got) else got

    @property
    def errors(self) -> list[RankResult]:
        return [r for r in self.ranks if r.error is not None]


# --------------------------------------------------------------------------------------------------
# the parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _backend(world: int) -> str:
    """gloo: it carries CPU and CUDA tensors alike, so a model on either device runs (NCCL would reject a CPU
    model; a GPU per rank is still given to each rank, see ``Rank.run``)."""
    return "gloo"


def launch(
    job: Job, limit: float = 120.0, hang: float = 8.0, grace: float = 3.0, start_method: str | None = None
) -> Launch:
    """Run ``job`` in ``job.world`` processes and collect what they wrote. Every process started here is
    ended here: past ``limit`` seconds, ``grace`` seconds after a rank raised, ``hang`` seconds after the
    first rank finished the non-finite step. ``fork`` unless CUDA is initialised here (then ``spawn``, which
    pickles the job: the roles must be importable functions)."""
    import torch
    import torch.multiprocessing as tmp

    if start_method is None:
        start_method = "spawn" if torch.cuda.is_available() and torch.cuda.is_initialized() else "fork"
    if start_method == "fork" and "fork" not in tmp.get_all_start_methods():
        start_method = "spawn"
    backend = _backend(job.world)
    job.fresh_seed = fresh_process_seed()
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = tmp.get_context(start_method)
    port = free_port()
    # not daemonic: a rank is a script's process, which may start DataLoader workers (a daemonic process may not
    # have children); every rank is ended and joined below whatever happens
    procs = [
        ctx.Process(target=rank_entry, args=(r, job.world, port, backend, job), daemon=False, name=f"dlcheck-rank{r}")
        for r in range(job.world)
    ]
    t0 = time.monotonic()
    timed_out = False
    killed: set[int] = set()
    try:
        for p in procs:
            try:
                p.start()
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                if start_method != "spawn":
                    raise
                from ...training import SetupError

                raise SetupError(
                    "the ranks are spawned (CUDA is initialised in this process) and the roles cannot be sent to "
                    f"them: {type(exc).__name__}: {str(exc)[:200]} — define the role functions at module level of an "
                    "importable module (not closures or lambdas)"
                ) from None
        stop_at: float | None = None
        while any(p.is_alive() for p in procs):
            now = time.monotonic()
            raised = any(p.exitcode not in (None, 0) for p in procs)
            last_stage = {"train": "d6", "save": "ckpt", "eval": "eval"}.get(job.mode, "load")
            finished = any((out / f"rank{r}.{last_stage}.pt").exists() for r in range(job.world))
            if raised or finished:
                limit_here = now + (grace if raised else hang)
                stop_at = limit_here if stop_at is None else min(stop_at, limit_here)
            if now - t0 > limit or (stop_at is not None and now > stop_at):
                timed_out = now - t0 > limit
                break
            time.sleep(0.05)
    finally:
        for r, p in enumerate(procs):
            if p.is_alive():
                killed.add(r)
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join(10)
    ranks = [_collect(out, r, procs[r].exitcode, r in killed) for r in range(job.world)]
    return Launch(
        job.world, start_method, backend, ranks, time.monotonic() - t0, timed_out, str(out), port, job.pg_timeout
    )


def _collect(out: Path, rank: int, exitcode: int | None, killed: bool) -> RankResult:
    import torch

    res = RankResult(rank, exitcode, killed=killed)
    for stage in STAGES:
        f = out / f"rank{rank}.{stage}.pt"
        if f.exists():
            with contextlib.suppress(Exception):  # a file cut short by a kill is a stage not finished
                res.stages[stage] = torch.load(f, weights_only=False)
    err = out / f"rank{rank}.error.json"
    if err.exists():
        with contextlib.suppress(Exception):
            res.error = json.loads(err.read_text())
    prog = out / f"rank{rank}.progress"
    if prog.exists():
        res.progress = prog.read_text().splitlines()
    log = out / f"rank{rank}.log"
    if log.exists():
        res.log = log.read_text(errors="replace")[-4000:]
    return res


# --------------------------------------------------------------------------------------------------
# a rank


def rank_entry(rank: int, world: int, port: int, backend: str, job: Job) -> None:
    """The target of every process: torchrun's environment, then the program; never returns into the
    parent's code (a forked pytest must not run its own teardown)."""
    out = Path(job.out)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        OMP_NUM_THREADS="1",
    )
    code = 0
    try:
        log = os.open(out / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        Rank(rank, world, backend, job).run()
    except BaseException as exc:  # noqa: BLE001 - every failure of a rank is reported by the parent
        code = 1
        from ...errors import RoleError

        err: dict[str, Any] = {
            "type": type(exc).__name__,
            "traceback": traceback.format_exc()[-3000:],
            "time": time.time(),
        }
        if isinstance(exc, RoleError):
            err.update(role=exc.role, message=exc.message)
        else:
            err.update(role=None, message=f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}")
        with contextlib.suppress(Exception):
            (out / f"rank{rank}.error.json").write_text(json.dumps(err))
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def is_sharded(t: Any) -> bool:
    """A DTensor (FSDP2's ``fully_shard`` parameters and their state dicts): each rank holds its own shard."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without DTensor
        return False
    return isinstance(t, DTensor)


def gathered(t: Any) -> Any:
    """The full tensor of a DTensor (a collective: every rank calls it in the same order), else ``t``."""
    return t.full_tensor() if is_sharded(t) else t


def sharded_tensors(obj: Any, prefix: str = "") -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """(name, local shape, full shape) of every DTensor / ShardedTensor in a (nested) state dict."""
    found: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
    if is_sharded(obj):
        found.append((prefix, tuple(obj.to_local().shape), tuple(obj.shape)))
    elif type(obj).__name__ == "ShardedTensor" and hasattr(obj, "local_shards"):
        local = [tuple(s.tensor.shape) for s in obj.local_shards()]
        found.append((prefix, local[0] if local else (0,), tuple(obj.size())))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            found += sharded_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found += sharded_tensors(v, f"{prefix}.{i}" if prefix else str(i))
    return found


def unwrap(model: Any) -> Any:
    import torch

    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def _cpu(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return gathered(obj).detach().cpu().clone()
    if isinstance(obj, Mapping):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj) if not hasattr(obj, "_fields") else type(obj)(*(_cpu(v) for v in obj))
    return obj


@contextlib.contextmanager
def _saved_rng(*generators: Any):
    """The rank's global generators (and the given ones) put back afterwards: a probe does not move the run."""
    import numpy as np
    import torch

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    gens = [(g, g.get_state()) for g in generators if g is not None and hasattr(g, "get_state")]
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        for g, s in gens:
            g.set_state(s)


#: D4: how many times example 0 is fetched on each rank: a p = 0.5 flip comes out the same on every fetch with
#: probability 2 ** -(FETCHES - 1)
FETCHES = 16

#: the global generators D4 follows, as its evidence names them
GENERATORS = {"random": "Python's random", "numpy": "NumPy's global generator", "torch": "torch's global generator"}


def generator_name(key: str) -> str:
    return GENERATORS.get(key) or f"torch's CUDA generator ({key})"


def rng_digests() -> dict[str, str]:
    """A digest of every global generator's state: Python's random, NumPy's, torch's CPU one and, when CUDA is in
    use in this process, its current device's."""
    import numpy as np
    import torch

    kind, keys, pos, gauss, cached = np.random.get_state()
    found = {
        "random": hashlib.sha1(repr(random.getstate()).encode()).hexdigest()[:16],
        "numpy": hashlib.sha1(keys.tobytes() + repr((kind, pos, gauss, cached)).encode()).hexdigest()[:16],
        "torch": tensor_digest(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        i = torch.cuda.current_device()  # this rank's device only: another device's generator is another rank's
        found[f"cuda:{i}"] = tensor_digest(torch.cuda.get_rng_state(i))
    return found


def next_draws(n: int = 3) -> dict[str, list[float]]:
    """The next ``n`` uniform numbers of every global generator, drawn from copies (the generators do not move)."""
    import numpy as np
    import torch

    r = random.Random()
    r.setstate(random.getstate())
    g = np.random.RandomState()
    g.set_state(np.random.get_state())
    found = {
        "random": [r.random() for _ in range(n)],
        "numpy": [float(x) for x in g.random_sample(n)],
        "torch": torch.rand(n, generator=torch.Generator().set_state(torch.get_rng_state())).tolist(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        i = torch.cuda.current_device()  # this rank's device only: no CUDA context opened on the other ranks' GPUs
        cg = torch.Generator(device=f"cuda:{i}")
        cg.set_state(torch.cuda.get_rng_state(i))
        found[f"cuda:{i}"] = torch.rand(n, generator=cg, device=f"cuda:{i}").cpu().tolist()
    return found


class _RankTmp:
    """``tmp_path_factory.mktemp`` for a launched rank: numbered directories under the rank's own folder."""

    def __init__(self, root: Path) -> None:
        self.root, self.n = root, 0

    def mktemp(self, name: str) -> Path:
        self.n += 1
        path = self.root / f"{name}{self.n}"
        path.mkdir(parents=True)
        return path


class Rank:
    def __init__(self, rank: int, world: int, backend: str, job: Job):
        self.rank, self.world, self.backend, self.job = rank, world, backend, job
        self.out = Path(job.out)
        #: the user's plain loop (pytest_dlcheck.training's setup): its step is the user's step
        self.setup = job.setup
        if self.setup is not None:
            from ...errors import MISSING

            # a spawned rank unpickled its own copies of the MISSING sentinel: make them the sentinel again
            for key, value in list(vars(self.setup).items()):
                if type(value) is type(MISSING) and value is not MISSING:
                    setattr(self.setup, key, MISSING)

    # ---- plumbing

    def progress(self, text: str) -> None:
        with open(self.out / f"rank{self.rank}.progress", "a") as f:
            f.write(text + "\n")

    def write(self, stage: str, record: dict[str, Any]) -> None:
        import torch

        tmp = self.out / f"rank{self.rank}.{stage}.pt.tmp"
        torch.save(record, tmp)
        os.replace(tmp, self.out / f"rank{self.rank}.{stage}.pt")
        self.progress(f"wrote {stage}")

    def call(self, role: str, fn: Any) -> Any:
        from ...session import user_call

        self.progress(f"in dlcheck_{role}")
        return user_call(role, fn)

    # ---- the program

    def run(self) -> None:
        import numpy as np
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        from . import generators

        # D4: what is alive before any of the user's code runs here was built before the rank (in the pytest process)
        self.before_user = generators.alive() if self.job.mode == "train" else None
        # a fresh process: this torch's start (its default seed, the same on every rank, or one from the OS as
        # torch 2.14 draws), Python and NumPy from the OS
        if self.job.fresh_seed is None:
            # seeded from the OS in a real launch (a different seed on every rank): here a seed of the rank's own,
            # fixed, so that a verdict is the same on every run of the checks
            torch.manual_seed(rank_seed(self.rank))
        else:
            torch.manual_seed(self.job.fresh_seed)
        random.seed()
        np.random.seed()
        if torch.cuda.is_available() and torch.cuda.device_count() >= self.world:
            torch.cuda.set_device(self.rank)  # as torchrun users do with LOCAL_RANK: one GPU per rank
        self.progress("init_process_group")
        if dist.is_initialized():
            # forked from a pytest process that holds a process group of its own (a script whose start runs
            # init_process_group on a world of 1 in a fixture, as DINO's does): the rank forgets the inherited group,
            # never talking on it (its store and sockets are the parent's), and joins the launch's own
            c10d = dist.distributed_c10d
            c10d._world = c10d._World()
        dist.init_process_group(self.backend, init_method="env://", timeout=timedelta(seconds=self.job.pg_timeout))
        from .accelerate import reset_state

        # Accelerate's singletons inherited from the pytest process forgotten: the user's Accelerator() sees this rank
        reset_state(cpu=not (torch.cuda.is_available() and torch.cuda.device_count() >= self.world))
        if self.job.mode == "load":
            self.reload()
            return
        if self.job.mode == "eval":
            from .evaluation import evaluate

            self.write("eval", evaluate(self))
            return
        if getattr(self.setup, "kind", None) == "trainer":
            from .trainer import run as run_trainer

            # a clone of the user's Trainer runs its own train() in this rank: D1's record only (see trainer.py)
            self.write("train", run_trainer(self))
            return
        if self.job.dist_setup is not None:
            self.call("dist_setup", lambda: self.job.dist_setup(self.rank, self.world))
        local_sgd = _watch_local_sgd()  # accelerate's LocalSGD, made by the user's code in this rank
        state = self.build()
        model = state["model"]
        if fsdp_kind(model) == "FSDP":
            from ...training import SetupError

            raise SetupError(
                "the model is wrapped in FullyShardedDataParallel (FSDP1), whose flat parameters and optimizer state "
                "are each rank's own shard: the dist domain compares FSDP2 models only yet (fully_shard(model))"
            )
        inner = unwrap(model)
        rec: dict[str, Any] = {
            "rank": self.rank,
            "wrapped": type(model).__name__,
            "ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel),
            "accelerate": getattr(self.setup, "kind", None) == "accelerate",
            "fsdp": fsdp_kind(model),
            "init": self.params(inner),
            "unsynced": unsynced(model, inner),
            "small": sum(p.numel() for p in inner.parameters()) <= SMALL_MODEL,
        }
        rec["init_tensors"] = self.tensors(inner) if rec["small"] else None
        loader, built_by = self.dataloader(state)
        if loader is None:
            from ...training import SetupError

            raise SetupError(
                "no training data: define fixture dlcheck_make_dataloader (or dlcheck_dataloader) in conftest.py"
            )
        rec["loader"] = self.describe_loader(loader) | {"built_by": built_by}
        rec["indices"] = {}
        self.start_epoch(state, loader, 0)
        rec["indices"][0] = self.indices(loader, 0)
        from .shards import resolve

        rec["resolved"] = resolve(getattr(loader, "dataset", None), rec["indices"][0])  # D3: the examples selected
        rec["augment"] = self.augmentation(loader)
        self.own_streams(loader, rec["augment"])
        self.before_user = None  # the objects alive before the rank, kept for the probe only
        rec["rng_at_step0"] = tensor_digest(torch.get_rng_state())
        rec["dropout"] = [
            f"{n} (p={m.p})"
            for n, m in inner.named_modules()
            if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
        ]
        from .schedule import rank_end, rank_start

        rec["schedule"] = rank_start(state, loader)  # D8: the scheduler's plan on this rank, before it trains
        if hasattr(self.setup, "train_mode"):
            self.setup.train_mode(state)  # as the user's epoch loop sets it before its steps
        it = iter(loader)
        self.train(state, inner, it, rec)
        del it
        rec["local_sgd"] = local_sgd or None
        rank_end(rec["schedule"], state)
        from .zero import rank_reference

        # D1 on a ZeroRedundancyOptimizer: this rank's shard after the first step against one process's step
        rec["zero_reference"] = rank_reference(unwrap_prepared(state.get("optimizer")), rec)
        self.start_epoch(state, loader, 1)
        rec["indices"][1] = self.indices(loader, 1)
        self.write("train", rec)
        if self.job.save is not None and self.job.load is not None:
            self.checkpoint(state, inner)
            if self.job.mode == "train":
                self.position(loader)
        if self.job.mode == "save":
            return
        self.nonfinite(state, inner, loader)

    def build(self) -> dict[str, Any]:
        state = self.call("make_training", self.job.make_training)
        if not isinstance(state, Mapping) or "model" not in state:
            from ...training import SetupError

            raise SetupError(
                "dlcheck_make_training must return a dict with at least 'model' and 'optimizer', "
                f"got {type(state).__name__}"
            )
        state = dict(state)
        if self.job.wrap is not None:
            wrapped = self.call("dist_wrap", lambda: self.job.wrap(state))
            if wrapped is not None:
                if not isinstance(wrapped, Mapping) or "model" not in wrapped:
                    from ...errors import RoleError

                    raise RoleError("dist_wrap", f"returned a {type(wrapped).__name__}, expected the dict of objects")
                state = dict(wrapped)
        return state

    def params(self, inner: Any) -> dict[str, str]:
        """Digests of the full parameters (a sharded model's are gathered: every rank calls this together)."""
        return {n: tensor_digest(gathered(p)) for n, p in inner.named_parameters()}

    def tensors(self, inner: Any) -> dict[str, Any]:
        return {n: gathered(p).detach().cpu().clone() for n, p in inner.named_parameters()}

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (every rank calls this together)."""
        import torch.distributed as dist

        flags: list[Any] = [None] * self.world
        dist.all_gather_object(flags, bool(flag))
        return any(flags)

    def loaded_params(self, model: Any, error: str | None) -> dict[str, str] | None:
        """The digests of the loaded model on every rank, or None: whether every rank loaded is agreed first, so
        a sharded model's gather is not entered by the ranks whose load went through while another raised."""
        import torch.distributed as dist

        ok: list[Any] = [None] * self.world
        dist.all_gather_object(ok, error is None)
        return self.params(unwrap(model)) if all(ok) else None

    def optimizer_state(self, opt: Any, inner: Any) -> dict[str, str]:
        import torch

        if opt is None or not hasattr(opt, "state"):
            return {}
        names = {id(p): n for n, p in inner.named_parameters()}
        found: dict[str, str] = {}
        for p, st in list(opt.state.items()):
            for k, v in (st or {}).items():
                if isinstance(v, torch.Tensor):
                    found[f"{names.get(id(p), '?')}:{k}"] = tensor_digest(gathered(v))
        return found

    def start_epoch(self, state: dict[str, Any], loader: Any, epoch: int) -> None:
        if self.job.start_epoch is not None:
            self.call("start_epoch", lambda: self.job.start_epoch(state, loader, epoch))

    def dataloader(self, state: dict[str, Any]) -> tuple[Any, str]:
        """(this rank's loader, which role built it): dlcheck_make_dataloader's; else, for an Accelerate user,
        the one their factory prepared (or dlcheck_dataloader prepared with their Accelerator); else the training
        DataLoader the factory's dict holds (a torchrun loop's, with its DistributedSampler), as the user's loop
        iterates it; else dlcheck_dataloader, the same on every rank."""
        if self.job.make_dataloader is not None:
            return self.call("make_dataloader", self.job.make_dataloader), "dlcheck_make_dataloader"
        if getattr(self.setup, "kind", None) == "accelerate":
            from .accelerate import loader_of

            return self.call("make_training", lambda: loader_of(state, self.job.loader))
        from ...training.loop import loader_key

        key = loader_key(state)
        if key is not None:
            return state[key], f"dlcheck_make_training (state[{key!r}])"
        return self.job.loader, "dlcheck_dataloader"

    def describe_loader(self, loader: Any) -> dict[str, Any]:
        from .accelerate import describe, is_prepared_loader

        if is_prepared_loader(loader):
            dataset = getattr(loader, "dataset", None)
            try:
                n = len(dataset) if dataset is not None else None
            except TypeError:
                n = None
            return describe(loader, n) | {"dataset_len": n, "num_workers": getattr(loader, "num_workers", None)}
        sampler = getattr(loader, "sampler", None)
        dataset = getattr(loader, "dataset", None)
        try:
            n = len(dataset) if dataset is not None else None
        except TypeError:
            n = None
        return {
            "type": type(loader).__name__,
            "sampler": type(sampler).__name__ if sampler is not None else None,
            "shuffle": getattr(sampler, "shuffle", None),
            "drop_last": getattr(sampler, "drop_last", None),
            "sampler_rank": getattr(sampler, "rank", None),
            "sampler_replicas": getattr(sampler, "num_replicas", None),
            "sampler_seed": getattr(sampler, "seed", None),
            "dataset_len": n,
            "num_workers": getattr(loader, "num_workers", None),
            "batch_size": getattr(loader, "batch_size", None),
            "subset": subset_indices(sampler, n),
        }

    def indices(self, loader: Any, epoch: int = 0) -> list[int] | None:
        from .accelerate import indices, is_prepared_loader

        if is_prepared_loader(loader):
            return indices(loader, _saved_rng, epoch)
        sampler = getattr(loader, "sampler", None)
        if sampler is None or not hasattr(sampler, "__iter__"):
            return None
        try:
            with _saved_rng(getattr(sampler, "generator", None), getattr(loader, "generator", None)):
                return [int(i) for i in sampler]
        except (TypeError, ValueError):
            return None

    def augmentation(self, loader: Any) -> dict[str, Any] | None:
        """Example 0 fetched :data:`FETCHES` times through the dataset's pipeline, as the loader fetches it (same
        workers, collate, worker_init_fn, generator), the rank's generators put back afterwards; without workers,
        which global generators the fetches moved (``moved``: a pipeline that draws, whatever came out)."""
        from torch.utils.data import DataLoader

        dataset = getattr(loader, "dataset", None)
        try:
            if dataset is None or not indexable(dataset) or len(dataset) == 0:
                return None
        except TypeError:
            return None
        idx = 0
        gen = getattr(loader, "generator", None)
        try:
            with _saved_rng(gen):
                workers = getattr(loader, "num_workers", 0) or 0
                probe = DataLoader(
                    dataset,
                    batch_size=1,
                    sampler=[idx] * FETCHES,
                    num_workers=workers,
                    collate_fn=getattr(loader, "collate_fn", None),
                    worker_init_fn=getattr(loader, "worker_init_fn", None),
                    generator=gen,
                )
                fetches = iter(probe)  # its creation draws the workers' base seed: not the pipeline's draw
                before = rng_digests()
                got = [nested_digest(b) for b in fetches]
                after = rng_digests()
        except Exception as exc:  # noqa: BLE001 - a dataset the probe cannot fetch from: D4 says so
            return {"index": idx, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        moved = None if workers else sorted(k for k in before if after.get(k) != before[k])
        return {"index": idx, "digests": got, "moved": moved}

    def own_streams(self, loader: Any, aug: dict[str, Any] | None) -> None:
        """Where a random pipeline's draws come from, added to ``aug`` (the rank's generators put back after every
        probe): example 0 fetched again with this rank's global generators (random, NumPy, torch) reseeded with
        the rank (``own_stream``: what still comes out the same on every rank is drawn from a generator of the
        user's own); the generators of the user's own reachable from the dataset, the collate function and the
        ``worker_init_fn`` (``generators``: each built in this rank or before it, inherited from the pytest
        process); and the fetches again with those built in the rank reseeded with the rank
        (``rank_built_stream``), then with those inherited reseeded (``inherited_stream``), and, where either holds
        several, the first few of them each alone (the generator's ``stream``)."""
        import numpy as np
        import torch

        from . import generators

        if not aug or "digests" not in aug or len(set(aug["digests"])) < 2:
            return
        with _saved_rng():
            seed = 7919 * (self.rank + 1)
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            aug["own_stream"] = (self.augmentation(loader) or {}).get("digests")
        before = getattr(self, "before_user", None)
        if before is None:
            return
        roots = [
            ("dataset", getattr(loader, "dataset", None)),
            ("collate_fn", getattr(loader, "collate_fn", None)),
            ("worker_init_fn", getattr(loader, "worker_init_fn", None)),
        ]
        found = [(path, gen, gen in before) for path, gen in generators.reachable(roots)]
        aug["generators"] = [generators.describe(path, gen, inherited) for path, gen, inherited in found]
        for key, inherited in (("rank_built_stream", False), ("inherited_stream", True)):
            part = [(i, gen) for i, (_, gen, inh) in enumerate(found) if inh is inherited]
            if part:
                with generators.reseeded([gen for _, gen in part], self.rank):
                    aug[key] = (self.augmentation(loader) or {}).get("digests")
            if len(part) > 1:
                for i, gen in part[: generators.ONE_BY_ONE]:  # which of them the draws come from
                    with generators.reseeded([gen], self.rank):
                        aug["generators"][i]["stream"] = (self.augmentation(loader) or {}).get("digests")

    def train(self, state: dict[str, Any], inner: Any, it: Any, rec: dict[str, Any]) -> None:

        from .schedule import current_lr
        from .zero import owned_state

        opt = unwrap_prepared(state.get("optimizer"))
        names = {id(p): n for n, p in inner.named_parameters()}
        seen = {"steps": 0, "grads": None}

        def pre(o: Any, args: Any, kwargs: Any) -> None:
            if seen["steps"] == 0:
                seen["grads"] = {
                    names[id(p)]: gathered(p.grad).detach().cpu().clone()
                    for g in o.param_groups
                    for p in g["params"]
                    if p.grad is not None and id(p) in names
                }
            seen["steps"] += 1

        handle = opt.register_step_pre_hook(pre) if hasattr(opt, "register_step_pre_hook") else None
        # D2 compares the first optimizer step with a single-process step: no dropout noise in it
        drops = quiet_dropout(inner)  # layers and float attention-dropout attributes, put back after the first step
        steps: list[dict[str, Any]] = []
        d2_batches: list[Any] = []
        clips: list[dict[str, float]] = []
        # a loop that accumulates over more micro-steps than the launch's: it trains on to its first optimizer step
        # (agreed by the ranks, at most ACCUMULATION_BOUND micro-steps), then to 2 x that - 1, so that D6's injected
        # micro-step closes the second window
        limit, searching, settled = self.job.steps, False, handle is None
        try:
            i = -1
            while i + 1 < limit:
                i += 1
                try:
                    batch = next(it)
                except StopIteration:
                    break
                before = seen["steps"]
                if before == 0:
                    d2_batches.append(_cpu(batch))
                self.progress(f"step {i}")
                if i == 0:  # D4: the global generators as the first step (dropout off) finds them
                    at_step, draws = rng_digests(), next_draws()
                with _recording_clips(clips) if before == 0 else contextlib.nullcontext():
                    loss = self.setup.step(state, batch, i)
                if i == 0:
                    after = rng_digests()
                    moved = sorted(k for k in at_step if after.get(k) != at_step[k])
                    rec["step_rng"] = {
                        "at_step": at_step,
                        "next": draws,
                        "moved": moved,
                        "depends": self.stream_dependence(state, inner, batch, moved) if moved else None,
                    }
                if before == 0 and seen["steps"] > 0:
                    restore_dropout(drops)
                    rec["d2_micro_steps"] = i + 1
                steps.append(
                    {
                        "loss": loss,
                        "opt_steps": seen["steps"] - before,
                        "params": self.params(inner),
                        "opt": self.optimizer_state(opt, inner),
                        "lr": current_lr(state),
                        "owned": owned_state(opt, inner, rec["small"]),
                        "tensors": self.tensors(inner) if rec["small"] else None,
                    }
                )
                if i + 1 == limit and not settled and limit < ACCUMULATION_BOUND:
                    if not self.any_rank(seen["steps"] > 0):
                        limit, searching = limit + 1, True
                    else:
                        settled = True
                        if searching:
                            limit = min(ACCUMULATION_BOUND, 2 * limit - 1)
        finally:
            restore_dropout(drops)
            if handle is not None:
                handle.remove()
        self.trained = len(steps)
        rec["steps"] = steps
        rec["grads"] = seen["grads"]
        rec["d2_batches"] = d2_batches if seen["grads"] is not None else None
        rec["hooked_optimizer"] = handle is not None
        #: the gradient-norm clippings of the micro-steps up to the first optimizer step (D2: is the length judged)
        rec["clips"] = clips if seen["grads"] is not None else None

    def stream_dependence(
        self, state: dict[str, Any], inner: Any, batch: Any, moved: list[str] | None = None
    ) -> dict[str, Any]:
        """D4: whether the loss of the first batch depends on the global generators (dropout still off): the
        user's loss (dlcheck_compute_loss, or the model's own) on that batch under two different seeds, without
        gradient, the model's buffers and the generators put back. ``{"losses": [a, b], "by": {generator: whether
        reseeding it alone changes the loss}}`` (``by`` only when the step moved more than one generator: one
        reseeded at a time), or ``{"error": why}`` when the loss cannot be computed here (a sharded model, no loss
        of the batch)."""
        import numpy as np
        import torch

        if fsdp_kind(state["model"]) is not None or not hasattr(self.setup, "loss_of"):
            return {"error": "the loss of a batch is not computed on a sharded model"}
        buffers = {n: b.detach().clone() for n, b in inner.named_buffers()}
        losses: list[float] = []
        by: dict[str, bool] = {}
        seeders = {"random": random.seed, "numpy": np.random.seed, "torch": torch.manual_seed}

        def loss_at(seeds: dict[str, int]) -> float:
            with _saved_rng(), torch.no_grad():
                for name, seed_fn in seeders.items():
                    seed_fn(seeds.get(name, 11))
                return float(self.setup.loss_of(inner, batch))

        try:
            losses = [loss_at({}), loss_at(dict.fromkeys(seeders, 12))]
            several = [g for g in (moved or []) if g in seeders]
            if len(several) > 1:
                for g in several:
                    by[g] = loss_at({g: 12}) != losses[0]
        except Exception as exc:  # noqa: BLE001 - a loss the rank cannot compute: D4 says the dependence is not known
            return {"error": getattr(exc, "message", None) or f"{type(exc).__name__}: {str(exc)[:200]}"}
        finally:
            with torch.no_grad():
                for n, b in inner.named_buffers():
                    if n in buffers:
                        b.copy_(buffers[n])
        return {"losses": losses, "by": by}

    # ---- D5

    def checkpoint(self, state: dict[str, Any], inner: Any) -> None:
        import torch.distributed as dist

        path = self.out / "ckpt" / "checkpoint"
        if self.rank == 0:
            path.parent.mkdir(exist_ok=True)
        dist.barrier()
        events: list[tuple[str, str]] = []
        shards: list[dict[str, Any]] = []
        with _recording_writes(events, shards):
            self.call("save_checkpoint", lambda: self.job.save(state, str(path)))
        self.progress("saved")
        dist.barrier()  # every rank has returned from its save before any rank loads
        rec: dict[str, Any] = {"events": events, "shards": shards, "path": str(path), "saved": self.params(inner)}
        saved = self.tensors(inner)  # on every rank: a sharded model's gather is a collective
        rec["saved_tensors"] = saved if self.rank == 0 else None
        fresh = self.build()
        rec["device_errors"] = []
        try:
            with _recording_device_errors(rec["device_errors"]):
                self.call("load_checkpoint", lambda: self.job.load(fresh, str(path)))
            rec["load_error"] = None
        except Exception as exc:  # noqa: BLE001 - a rank that cannot load is D5's evidence
            rec["load_error"] = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        rec["loaded"] = self.loaded_params(fresh["model"], rec["load_error"])
        rec["files"] = sorted(str(p.relative_to(path.parent)) for p in path.parent.rglob("*") if p.is_file())
        self.write("ckpt", rec)
        dist.barrier()

    def position(self, loader: Any) -> None:
        """D5's data position: on every rank, fresh objects train from the loader their training dict holds,
        save half way through the rank's epoch with the user's save (one path for every rank), and other fresh
        objects loaded by the user's load (after a barrier) draw the rest from theirs — the one-process run of
        C1 (:meth:`LoopSetup.data_resume`), on each rank. The examples are counted over the ranks together."""
        import dataclasses

        import torch.distributed as dist

        rec: dict[str, Any] = {"result": None, "error": None, "total": None, "device_errors": []}
        if not hasattr(self.setup, "data_resume"):
            self.write("position", rec)
            return
        try:
            epoch = len(loader)
        except TypeError:
            epoch = None
        total = min(POSITION_STEPS, epoch) if epoch and epoch >= 2 else POSITION_STEPS
        rec["total"] = total
        self.setup.tmp = _RankTmp(self.out / f"rank{self.rank}.tmp")  # the run's other files: this rank's own
        path = self.out / "position" / "checkpoint"
        if self.rank == 0:
            path.parent.mkdir(exist_ok=True)
        dist.barrier()
        self.progress("position")
        try:
            with _recording_device_errors(rec["device_errors"]):
                result = self.setup.data_resume(
                    total, build=self.build, path=path, before_load=dist.barrier, new_epoch=True
                )
            rec["result"] = dataclasses.asdict(result) if result is not None else None
        except Exception as exc:  # noqa: BLE001 - a run that cannot be made: D5 says the position is not judged
            rec["error"] = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        self.write("position", rec)
        dist.barrier()

    def reload(self) -> None:
        if self.job.dist_setup is not None:
            self.call("dist_setup", lambda: self.job.dist_setup(self.rank, self.world))
        state = self.build()
        rec: dict[str, Any] = {"load_error": None, "device_errors": []}
        try:
            with _recording_device_errors(rec["device_errors"]):
                self.call("load_checkpoint", lambda: self.job.load(state, self.job.load_path))
        except Exception as exc:  # noqa: BLE001 - D5's evidence
            rec["load_error"] = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        rec["loaded"] = self.loaded_params(state["model"], rec["load_error"])
        self.write("load", rec)

    # ---- D6

    def nonfinite(self, state: dict[str, Any], inner: Any, loader: Any) -> None:
        """One more micro-step in which the last rank's forward overflows (its first layer's output made
        infinite, as an fp16 overflow does); what each rank decided is written right after the step."""
        import torch

        target = next(
            (
                (n, m)
                for n, m in inner.named_modules()
                if not list(m.children()) and any(True for _ in m.parameters(recurse=False))
            ),
            None,
        )
        rec: dict[str, Any] = {"injected_rank": self.world - 1, "layer": target[0] if target else None}
        if target is None:
            self.write("d6", rec)
            return
        opt = unwrap_prepared(state.get("optimizer"))
        names = {id(p): n for n, p in inner.named_parameters()}
        seen: dict[str, Any] = {"steps": 0, "finite_grads": None}

        def pre(o: Any, args: Any, kwargs: Any) -> None:
            seen["steps"] += 1
            seen["finite_grads"] = all(
                bool(torch.isfinite(p.grad).all())
                for g in o.param_groups
                for p in g["params"]
                if p.grad is not None and id(p) in names
            )

        handle = opt.register_step_pre_hook(pre) if hasattr(opt, "register_step_pre_hook") else None

        def overflow(module: Any, args: Any, output: Any) -> Any:
            return output * float("inf") if isinstance(output, torch.Tensor) else output

        hook = target[1].register_forward_hook(overflow) if self.rank == self.world - 1 else None
        with _saved_rng(getattr(loader, "generator", None)):
            batch = next(iter(loader))
        before = self.params(inner)
        index = getattr(self, "trained", self.job.steps)
        self.progress(f"non-finite step {index}")
        try:
            loss = self.setup.step(state, batch, index)
            rec["error"] = None
        except Exception as exc:  # noqa: BLE001 - a rank that raised on the non-finite step: evidence
            loss = None
            rec["error"] = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        finally:
            if hook is not None:
                hook.remove()
            if handle is not None:
                handle.remove()
        after = self.params(inner)
        rec.update(
            loss=loss,
            opt_steps=seen["steps"],
            finite_grads=seen["finite_grads"],
            changed=sorted(n for n in after if after[n] != before.get(n)),
            after=after,
            finite_params=all(bool(torch.isfinite(p).all()) for p in inner.parameters()),
        )
        self.write("d6", rec)


def unsynced(model: Any, inner: Any) -> list[str]:
    """The parameters of a DistributedDataParallel model that its reducer does not know: modules created or
    attached after the wrap (DDP listed the parameters at construction; it neither broadcasts nor averages the
    others). Empty for a model that is not DDP."""
    import torch

    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return []
    known = {id(p) for p in getattr(model, "_module_parameters", None) or ()}
    if not known:
        return []
    ignored = set(getattr(model, "parameters_to_ignore", ()) or ())
    return [n for n, p in inner.named_parameters() if id(p) not in known and n not in ignored]


@contextlib.contextmanager
def _recording_clips(clips: list[dict[str, float]]):
    """Record every gradient-norm clipping (``clip_grad_norm_``, however imported, and Accelerate's, which calls
    it): torch's clip_grad_norm_ scales through the module-level ``_clip_grads_with_norm_``, patched here."""
    from torch.nn.utils import clip_grad

    orig = getattr(clip_grad, "_clip_grads_with_norm_", None)
    if orig is None:  # pragma: no cover - torch before 2.6: clip_grad_norm_ scales inline
        yield
        return

    def clip(parameters: Any, max_norm: float, total_norm: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):
            clips.append({"max_norm": float(max_norm), "total_norm": float(total_norm)})
        return orig(parameters, max_norm, total_norm, *args, **kwargs)

    clip_grad._clip_grads_with_norm_ = clip
    try:
        yield
    finally:
        clip_grad._clip_grads_with_norm_ = orig


def fsdp_kind(model: Any) -> str | None:
    """Which FSDP shards the model: "FSDP2" (``fully_shard``), "FSDP" (FullyShardedDataParallel), or None."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch without FSDP
        return None
    if isinstance(model, FullyShardedDataParallel):
        return "FSDP"
    modules = model.modules() if hasattr(model, "modules") else ()
    if isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in modules):
        return "FSDP2"
    return None


#: what torch.load raises when ``map_location`` is an indexed CPU device (``torch.device("cpu", 0)``), the
#: ``accelerator.device`` of Accelerate's MULTI_CPU processes, as in these CPU ranks
CPU_INDEX_ERROR = "don't know how to restore data location"


@contextlib.contextmanager
def _recording_device_errors(errors: list[str]):
    """Record each ``torch.load`` of the user's code that cannot map the storages to the ranks' CPU device
    (``map_location=accelerator.device``, which Accelerate's MULTI_CPU ranks give as ``cpu:0``) — also when the
    user's code catches it; the error is raised on as it was."""
    import torch

    orig = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        try:
            return orig(*args, **kwargs)
        except RuntimeError as exc:
            if CPU_INDEX_ERROR in str(exc) and "tagged with cpu" in str(exc):
                location = kwargs.get("map_location", args[1] if len(args) > 1 else None)
                errors.append(f"torch.load(..., map_location={location!r}) raised {str(exc)[:160]}")
            raise

    torch.load = load
    try:
        yield
    finally:
        torch.load = orig


@contextlib.contextmanager
def _recording_writes(events: list[tuple[str, str]], shards: list[dict[str, Any]] | None = None):
    """Record the checkpoint writes of a save: torch.save, safetensors' save_file and a
    torch.distributed.checkpoint save (one collective save: its own file writes are not listed); and, in
    ``shards``, the sharded tensors (DTensors: a rank's own shard only) that a plain write saves."""
    import torch

    patched: list[tuple[Any, str, Any]] = []
    inside_dcp = {"n": 0}

    def target_of(f: Any) -> str:
        return str(f) if isinstance(f, (str, os.PathLike)) else str(getattr(f, "name", type(f).__name__))

    def wrap_save(orig: Any, what: str) -> Any:
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if not inside_dcp["n"]:
                events.append((what, target_of(f)))
                found = sharded_tensors(obj)
                if found and shards is not None:
                    shards.append({"fn": what, "target": target_of(f), "tensors": found})
            return orig(obj, f, *args, **kwargs)

        return save

    def wrap_dcp(orig: Any) -> Any:
        def save(*args: Any, **kwargs: Any) -> Any:
            where = kwargs.get("checkpoint_id")
            writer = kwargs.get("storage_writer")
            if where is None and writer is not None:
                where = getattr(writer, "path", None) or getattr(writer, "checkpoint_id", None)
            events.append(("torch.distributed.checkpoint.save", str(where)))
            inside_dcp["n"] += 1
            try:
                return orig(*args, **kwargs)
            finally:
                inside_dcp["n"] -= 1

        return save

    patched.append((torch, "save", wrap_save(torch.save, "torch.save")))
    with contextlib.suppress(ImportError):
        import safetensors.torch as st

        patched.append((st, "save_file", wrap_save(st.save_file, "safetensors save_file")))
    with contextlib.suppress(ImportError):
        import torch.distributed.checkpoint as dcp

        patched.append((dcp, "save", wrap_dcp(dcp.save)))
    originals = [(mod, name, getattr(mod, name)) for mod, name, _ in patched]
    for mod, name, new in patched:
        setattr(mod, name, new)
    try:
        yield
    finally:
        for mod, name, old in originals:
            setattr(mod, name, old)


def subset_indices(sampler: Any, n: int | None) -> list[int] | None:
    """The dataset indices a sampler draws from when it is restricted to a subset of the dataset (a
    SubsetRandomSampler, also inside a distributed wrapper: Lightning's DistributedSamplerWrapper holds it as its
    ``dataset``), or None: the whole dataset."""
    seen: set[int] = set()
    current, depth = sampler, 0
    while current is not None and depth < 5 and id(current) not in seen:
        seen.add(id(current))
        indices = getattr(current, "indices", None)
        if indices is not None and not isinstance(indices, (str, bytes)) and not callable(indices):
            try:
                out = sorted({int(i) for i in indices})
            except (TypeError, ValueError):
                return None
            return out if n and out and len(out) < n and out[-1] < n and out[0] >= 0 else None
        current = next(
            (getattr(current, a) for a in ("sampler", "_sampler", "dataset") if getattr(current, a, None) is not None),
            None,
        )
        depth += 1
    return None


def _watch_local_sgd() -> dict[str, Any]:
    """What accelerate's LocalSGD objects the rank's code makes record ({"steps": local_sgd_steps} of an enabled
    one): a training that averages the replicas' weights every N steps instead of their gradients every step, whose
    replicas differ between two averagings by design (D1). Empty without accelerate."""
    seen: dict[str, Any] = {}
    if "accelerate" not in sys.modules:
        return seen
    try:
        from accelerate.local_sgd import LocalSGD
    except ImportError:
        return seen
    original = LocalSGD.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if getattr(self, "enabled", False):
            seen["steps"] = getattr(self, "local_sgd_steps", None)

    LocalSGD.__init__ = init  # this rank's process only (it ends with the launch)
    return seen
