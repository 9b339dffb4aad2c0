"""R4: normalisation statistics or replay buffer not saved with the checkpoint."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, NoReturn

from ...errors import MISSING
from ...registry import Setting, check
from ...roles import is_hf_trainer
from ...session import user_call
from . import measure as rl

#: a normaliser whose count after the load is at most this share of the saved count (and below it) was built
#: anew and stepped a few times by the load (a reset, a warm-up step): fresh statistics, not restored ones
FRESH_SHARE = 0.05

#: statistics shown line by line in a failure; the others get one line each
SHOWN_IN_FULL = 2


def _verdict(prefix: str, before: dict[str, Any], after: dict[str, Any]) -> tuple[str, str]:
    """(kind, words) for one normaliser whose statistics the load did not give back: "fresh" (a normaliser
    built anew, count at its initial 1e-4 or a few observations above it), "absent" or "other"."""
    saved = float(before.get(f"{prefix}.count", 0.0))
    if f"{prefix}.count" not in after:
        return "absent", f"{prefix}: absent from the loaded objects (saved with count {saved:.4g})"
    count = float(after[f"{prefix}.count"])
    if count <= 1.0:
        return "fresh", (
            f"{prefix}: the load gave fresh statistics (mean 0, var 1, count {count:.4g}: a normaliser built anew), not "
            f"the saved ones (count {saved:.4g})"
        )
    if count < saved and count <= 1.0 + FRESH_SHARE * saved:
        return "fresh", (
            f"{prefix}: the load gave fresh statistics updated by {round(count)} observation(s) since (count "
            f"{count:.4g}), not the saved ones (count {saved:.4g})"
        )
    differ = [f for f in ("mean", "var", "count") if f"{prefix}.{f}" in after and f"{prefix}.{f}" in before]
    differ = [f for f in differ if not rl.same_value(before[f"{prefix}.{f}"], after[f"{prefix}.{f}"], 1e-6)]
    return "other", (
        f"{prefix}: the load gave other statistics than the saved ones ({', '.join(differ) or 'shape'} differ: count "
        f"{count:.4g} after the load, {saved:.4g} before the save)"
    )


def _lost_evidence(
    before: dict[str, Any], after: dict[str, Any], lost: list[str], saved_files: list[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """The failure's evidence (per normaliser what the load gave, then the values) and the normalisers by kind."""
    evidence = [f"saved {len(saved_files)} file(s) ({', '.join(saved_files[:4]) or 'none'}); after the load:"]
    kinds: dict[str, list[str]] = {}
    prefixes = list(dict.fromkeys(k.rsplit(".", 1)[0] for k in lost if not k.startswith("replay_buffer")))
    for i, prefix in enumerate(prefixes):
        kind, words = _verdict(prefix, before, after)
        kinds.setdefault(kind, []).append(prefix)
        evidence.append(words)
        if i >= SHOWN_IN_FULL:
            continue
        for k in (k for k in lost if k.rsplit(".", 1)[0] == prefix):
            now = rl.fmt_values(after[k]) if k in after else "absent from the loaded objects"
            evidence.append(f"{k}: {rl.fmt_values(before[k])} before the save, {now} after the load")
    for k in lost:
        if not k.startswith("replay_buffer") or k == "replay_buffer.content" and "replay_buffer.transitions" in lost:
            continue
        now = rl.fmt_values(after[k]) if k in after else "absent from the loaded objects"
        evidence.append(f"{k}: {rl.fmt_values(before[k])} before the save, {now} after the load")
    return evidence, kinds


def _is_vec_normalize(obj: Any) -> bool:
    return any(c.__name__ == "VecNormalize" and c.__module__.startswith("stable_baselines3") for c in type(obj).__mro__)


def _statistics_fix(before: dict[str, Any], holders: list[Any], sb3: bool) -> str:
    """The fix for lost statistics, for the kind of normaliser that holds them."""
    if sb3:
        return (
            "save them beside the model: model.get_vec_normalize_env().save(d / 'vecnormalize.pkl'); load with "
            "venv = VecNormalize.load(d / 'vecnormalize.pkl', make_vec_env(...)) and PPO.load(d / 'model', "
            "env=venv) (for evaluation set venv.training = False, venv.norm_reward = False)"
        )
    if any(k.startswith("envs[") for k in before):
        return (
            "save the obs_rms (mean, var, count) of the NormalizeObservation inside each sub-env (envs.envs[i], down "
            "its wrapper chain through .env) beside the agent, and put each back into the same sub-env's wrapper "
            "after make_env builds the envs for evaluation or resumption (wrapper.update_running_mean = False to "
            "evaluate with them frozen)"
        )
    names = sorted({type(h.owner).__name__ for h in holders if h.attr != "replay_buffer"})
    return (
        f"save wrapper.obs_rms (mean, var, count) of your {', '.join(names) or 'normaliser'} beside the agent and "
        "assign it after building the env (gymnasium NormalizeObservation: wrapper.obs_rms = saved; "
        "update_running_mean = False to evaluate with it frozen)"
    )


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
        dlcheck_replay_buffer (derived from dlcheck_algorithm, or from the wrappers of dlcheck_env; inside
        a SyncVectorEnv each sub-env envs.envs[i] down its wrapper chain, as CleanRL wraps them), calls
        dlcheck_save_agent(dir), swaps those live statistics for fresh ones (so a load that writes
        into the live objects is seen too), calls dlcheck_load_agent(dir), and compares what the
        loaded objects hold with what was saved, sub-env by sub-env. A failure says per normaliser what
        the load gave: fresh statistics (count at its initial 1e-4, or a few observations above it),
        other statistics (another sub-env's, another save's), or none. The live statistics are put back
        afterwards.
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
        policy's weights alone (C1 checks a resume). A transformers/TRL trainer (DPO, KTO, GRPO, reward
        modelling) with no env and no SB3 algorithm: it keeps no running observation statistics or replay
        buffer. A load that gives an SB3 algorithm with no env (``DQN.load(path)`` alone: a model to predict
        with, which cannot learn on as loaded) when there are no running statistics: the replay buffer
        concerns a resume, which passes ``env=`` (or calls ``set_env``) and is judged.
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
    # an SB3 algorithm loaded without an env (DQN.load(path) alone) cannot learn on as loaded: a load to predict
    # with, which needs no replay buffer; a resume passes env= (or set_env) — the buffer is judged only then
    # (a buffer the load filled says it is a resume all the same)
    predict_only = _predict_only(loaded) if not after.get("replay_buffer.transitions") else None
    buffer_unjudged = []
    if predict_only and any(k.startswith("replay_buffer") for k in before):
        buffer_unjudged = [k for k in before if k.startswith("replay_buffer")]
        lost = [k for k in lost if k not in buffer_unjudged]
        if len(buffer_unjudged) == len(before):
            dlcheck.not_applicable(
                f"dlcheck_load_agent gives {predict_only}: a load to predict with, which no replay buffer concerns "
                "(a resume passes env= or calls set_env before learn, and is judged), and no running statistics "
                "to lose"
            )
        dlcheck.not_judged(
            "replay buffer",
            f"dlcheck_load_agent gives {predict_only}: a load to predict with; the buffer concerns a resume only",
        )
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
            if k in buffer_unjudged:
                continue
            if k in reward_only or "ret_rms" in k and any(r.startswith(k.rsplit(".", 1)[0]) for r in reward_only):
                continue
            if k.endswith(".count"):
                kept.append(f"{k[: -len('.count')]} (mean, var, count {float(v):.4g})")
            elif k == "replay_buffer.transitions":
                kept.append(f"the replay buffer ({int(v)} transitions, same content)")
        dlcheck.measured(
            f"save_agent wrote {len(saved_files)} file(s) ({', '.join(saved_files[:4]) or 'none'}); after "
            f"load_agent all {len(before) - len(reward_only) - len(buffer_unjudged)} values "
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
    evidence, kinds = _lost_evidence(before, after, lost, saved_files)
    buffer_lost = any(k.startswith("replay_buffer") for k in lost)
    stats_lost = any(not k.startswith("replay_buffer") for k in lost)
    causes, fixes = [], []
    if stats_lost:
        sb3 = any(_is_vec_normalize(h.owner) for h in holders)
        if kinds.get("fresh") and not kinds.get("other"):
            got = (
                "the loaded run normalises observations with fresh statistics (mean 0, var 1: a normaliser built "
                "anew, nothing put back into it)"
            )
        elif kinds.get("fresh"):
            got = (
                "the loaded run normalises observations with fresh statistics in part, with other statistics elsewhere"
            )
        else:
            got = (
                "the loaded objects hold other statistics than those saved (another sub-env's or another save's, "
                "partly restored, or updated after the load)"
            )
        if kinds.get("fresh") or kinds.get("absent"):
            causes.append(
                "the checkpoint does not carry the running normalisation statistics"
                + (" (SB3's model.save() stores the policy, not VecNormalize's obs_rms/ret_rms)" if sb3 else "")
                + f": {got}, so the policy sees inputs on another scale than it was trained on"
            )
        else:
            causes.append(
                f"the load does not put the saved normalisation statistics back where they were: {got}, so the "
                "policy sees inputs on another scale than it was trained on"
            )
        fixes.append(_statistics_fix(before, holders, sb3))
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


def _predict_only(loaded: Any) -> str | None:
    """``"a DQN with no env (DQN.load without env=)"`` when the load gives an SB3 algorithm that has no env to
    learn on (SB3's deployment load); None for anything else (a resume, a wrapper, the user's own object)."""
    if not rl.is_sb3_algorithm(loaded) or loaded.get_env() is not None:
        return None
    name = type(loaded).__name__
    return f"a {name} with no env ({name}.load without env=)"


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
    trainer = dlcheck.role("trainer")
    if trainer is not MISSING and is_hf_trainer(trainer):
        dlcheck.not_applicable(
            f"dlcheck_trainer is a {type(trainer).__name__} with no env and no SB3 algorithm: it keeps no running "
            "observation statistics or replay buffer for a checkpoint to lose"
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
