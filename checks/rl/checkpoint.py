"""R4: normalisation statistics or replay buffer not saved with the checkpoint."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, NoReturn

from ...errors import MISSING
from ...registry import Setting, check
from ...session import user_call
from . import measure as rl


@check(
    "R4",
    domain="rl",
    title="normalisation statistics or replay buffer not saved with the checkpoint",
    roles=(),
    optional_roles=("save_agent", "load_agent", "normalizer", "replay_buffer", "algorithm", "env"),
    settings=(
        Setting(
            "rtol",
            1e-6,
            "relative tolerance between a statistic before the save and after the load; a pickle "
            "or torch.save round trip is exact, 1e-6 allows a float32 cast",
        ),
    ),
)
def check_checkpoint_round_trip(dlcheck):
    """Your save → load round trip restores the running normalisation statistics and the replay buffer.

    What it does
        Reads the running statistics (obs_rms / ret_rms mean, var and count: SB3 VecNormalize, gymnasium
        NormalizeObservation / NormalizeReward and their vector versions, any object with obs_rms or
        ret_rms) and the replay buffer (transitions and a content digest) of dlcheck_normalizer and
        dlcheck_replay_buffer (derived from dlcheck_algorithm, or from the wrappers of dlcheck_env), calls
        dlcheck_save_agent(dir), swaps those live statistics for fresh ones (so a load that writes
        into the live objects is seen too), calls dlcheck_load_agent(dir), and compares what the
        loaded objects hold with what was saved. The live statistics are put back afterwards.
    Why it is bad
        A policy trained on normalised observations sees other inputs when it is evaluated or resumed
        with fresh statistics (mean 0, var 1): returns collapse after loading and nothing says why. SB3's
        model.save() stores neither the VecNormalize statistics nor the replay buffer; an off-policy run
        resumed with an empty buffer restarts its learning from scratch.
    Example
        model.save(path)                                          # VecNormalize statistics lost
        model = PPO.load(path, env=VecNormalize(make_vec_env("CartPole-v1")))
    Use instead
        model.save(d / "model"); model.get_vec_normalize_env().save(d / "vecnormalize.pkl")
        venv = VecNormalize.load(d / "vecnormalize.pkl", make_vec_env("CartPole-v1"))
        model = PPO.load(d / "model", env=venv)
        Off-policy: model.save_replay_buffer(d / "replay.pkl"); model.load_replay_buffer(d / "replay.pkl").
    Known problems
        Needs statistics that have seen data (a count above 1): it skips on a freshly built normaliser.
        Statistics kept inside the policy network (a running-norm layer) are part of its state_dict and
        are not checked here.
        A reward normaliser's statistics (ret_rms) never reach the policy: when only they are lost, the
        pass notes it ("not carried, not judged") — a resumed training run would scale its rewards afresh.
    Not applicable
        Pipelines with no running statistics and no replay buffer: an on-policy SB3 algorithm without
        VecNormalize, an env (or env factory) without a normalising wrapper. Their checkpoint is the
        policy's weights alone (C1 checks a resume).
    """
    sources = [dlcheck.role(name) for name in ("normalizer", "replay_buffer")]
    if dlcheck.has("algorithm"):
        sources.append(dlcheck.role("algorithm"))
    sources = [s for s in sources if s is not MISSING]
    before, holders = rl.running_statistics(sources)
    if not before:
        _nothing_to_round_trip(dlcheck)
    if rl.fresh_statistics(before):
        dlcheck.skip(
            "the running statistics are at their initial values (count ≤ 1) and no buffer holds data: a "
            "round trip cannot tell restored statistics from fresh ones; run a few steps in the fixture"
        )
    save, load = dlcheck.require("save_agent", "load_agent")

    rtol = dlcheck.setting("rtol")
    originals = [(h, getattr(h.owner, h.attr)) for h in holders]
    with tempfile.TemporaryDirectory(prefix="dlcheck-R4-") as tmp:
        directory = Path(tmp)
        dlcheck.call("save_agent", lambda: save(directory))
        saved_files = sorted(p.name for p in directory.rglob("*") if p.is_file())
        try:
            for h, value in originals:
                setattr(h.owner, h.attr, rl.blank_copy(value))
            loaded = dlcheck.call("load_agent", lambda: load(directory))
            after, _ = rl.running_statistics(loaded)
        finally:
            for h, value in originals:
                setattr(h.owner, h.attr, value)

    lost = [k for k in before if k not in after or not rl.same_value(before[k], after[k], rtol)]
    # a reward normaliser's return statistics never reach the policy: losing them changes a resumed run's
    # reward scale, not what the loaded policy sees — noted, not judged (evaluation is unaffected)
    reward_only = [k for k in lost if "ret_rms" in k]
    lost = [k for k in lost if k not in reward_only]
    if not lost and reward_only and all("ret_rms" in k for k in before):
        dlcheck.skip(
            "only a reward normaliser's statistics (ret_rms) to compare, and the load does not carry them: the "
            "loaded policy's inputs do not depend on them (a resumed training run would scale its rewards afresh)"
        )
    if not lost:
        kept = []
        for k, v in before.items():
            if k in reward_only or "ret_rms" in k and any(r.startswith(k.rsplit(".", 1)[0]) for r in reward_only):
                continue
            if k.endswith(".count"):
                kept.append(f"{k[: -len('.count')]} (mean, var, count {float(v):.4g})")
            elif k == "replay_buffer.transitions":
                kept.append(f"the replay buffer ({int(v)} transitions, same content)")
        dlcheck.measured(
            f"save_agent wrote {len(saved_files)} file(s) ({', '.join(saved_files[:4]) or 'none'}); after "
            f"load_agent all {len(before) - len(reward_only)} values "
            + ("the policy depends on " if reward_only else "")
            + f"are as saved (rtol {rtol:g}): "
            + ", ".join(kept),
            *(
                [
                    f"not carried, not judged: {', '.join(sorted({k.rsplit('.', 1)[0] for k in reward_only}))} (a reward "
                    "normaliser's statistics: a resumed training run would scale its rewards afresh)"
                ]
                if reward_only
                else []
            ),
            statistics=len(before),
            files=len(saved_files),
        )
        return
    evidence = [f"saved {len(saved_files)} file(s) ({', '.join(saved_files[:4]) or 'none'}); after the load:"]
    for k in lost:
        if k == "replay_buffer.content" and "replay_buffer.transitions" in lost:
            continue
        now = rl.fmt_values(after[k]) if k in after else "absent from the loaded objects"
        evidence.append(f"{k}: {rl.fmt_values(before[k])} before the save, {now} after the load")
    buffer_lost = any(k.startswith("replay_buffer") for k in lost)
    stats_lost = any(not k.startswith("replay_buffer") for k in lost)
    causes, fixes = [], []
    if stats_lost:
        causes.append(
            "the checkpoint does not carry the running normalisation statistics (SB3's model.save() stores "
            "the policy, not VecNormalize's obs_rms/ret_rms): the loaded run normalises observations with "
            "fresh statistics, so the policy sees inputs on another scale than it was trained on"
        )
        fixes.append(
            "save them beside the model: model.get_vec_normalize_env().save(d / 'vecnormalize.pkl'); load with "
            "venv = VecNormalize.load(d / 'vecnormalize.pkl', make_vec_env(...)) and PPO.load(d / 'model', "
            "env=venv) (for evaluation set venv.training = False, venv.norm_reward = False); gymnasium "
            "NormalizeObservation: save wrapper.obs_rms (mean, var, count) and assign it after building the env"
        )
    if buffer_lost:
        causes.append(
            "the checkpoint does not carry the replay buffer (model.save() excludes it): a resumed off-policy "
            "run starts from an empty buffer"
        )
        fixes.append(
            "model.save_replay_buffer(d / 'replay_buffer.pkl') beside model.save(), and "
            "model.load_replay_buffer(d / 'replay_buffer.pkl') after PPO/SAC/DQN.load"
        )
    dlcheck.fail(evidence, "; ".join(causes), "; ".join(fixes))


def _nothing_to_round_trip(dlcheck) -> NoReturn:
    """No running statistics and no replay buffer: not applicable to what the user gave, or name the fixture."""
    algo, env = dlcheck.role("algorithm"), dlcheck.role("env")
    if dlcheck.has("normalizer"):
        dlcheck.skip(
            f"dlcheck_normalizer ({type(dlcheck.role('normalizer')).__name__}) holds no running statistics "
            "(obs_rms / ret_rms with mean, var, count) R4 can read"
        )
    if algo is not MISSING and rl.is_sb3_algorithm(algo):
        dlcheck.not_applicable(
            f"{type(algo).__name__} has no VecNormalize and no replay buffer: its checkpoint is the policy alone, with "
            "no running statistics to lose"
        )
    if env is not MISSING:
        built = dlcheck.memo(env, "rl:normalising-wrapper", lambda: _factory_statistics(env))
        if built is None:
            dlcheck.not_applicable(
                "dlcheck_env has no normalising wrapper (NormalizeObservation / NormalizeReward / VecNormalize): no "
                "running statistics for a checkpoint to lose"
            )
        dlcheck.skip(
            f"missing role: define fixture dlcheck_normalizer in conftest.py: dlcheck_env is a factory whose env "
            f"normalises ({built}), and R4 needs the live statistics your run updated"
        )
    dlcheck.skip(
        "missing role: define fixture dlcheck_normalizer (or dlcheck_algorithm, or a normalising wrapper "
        "in dlcheck_env) in conftest.py: no running statistics or replay buffer to round-trip"
    )


def _factory_statistics(env: Any) -> str | None:
    """When dlcheck_env is a factory, what one env it builds normalises (the statistics' names), else None."""
    if rl.is_env(env) or not callable(env):
        return None
    built = user_call("env", env)
    try:
        stats, _ = rl.running_statistics(built)
    finally:
        if hasattr(built, "close"):
            built.close()
    names = sorted({k.split(".")[0] for k in stats})
    return ", ".join(names) or None
