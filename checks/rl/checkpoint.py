"""R4: normalisation statistics or replay buffer not saved with the checkpoint."""

from __future__ import annotations

import dataclasses
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
        A plain loop that resumes (it saves the network, the optimizer and the global step): save the buffer's
        arrays with them (rb.observations, rb.next_observations, rb.actions, rb.rewards, rb.dones, rb.pos,
        rb.full) and put them back into the buffer the resumed loop samples from.
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
        concerns a resume, which passes ``env=`` (or calls ``set_env``) and is judged. Likewise, for a plain
        loop as for SB3, a load that gives back the network alone (an nn.Module or its state_dict, or a dict /
        tuple of networks with the envs to play them in and the run's configuration) and no optimizer, step
        counter or replay buffer: an export to evaluate with (CleanRL's save_model for its evaluate()), not a
        resume. A load that gives back the optimizer or the step counter is a resume, and its buffer is judged.
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
    # a plain loop's load that gives back the network alone (no optimizer, no step counter: CleanRL's save_model
    # for its evaluate()) is an export to evaluate with, not a resume, whatever library the loop is written with
    not_resume = None
    if not after.get("replay_buffer.transitions"):
        not_resume = _predict_only(loaded) or _export_only(loaded)
    buffer_unjudged = []
    if not_resume and any(k.startswith("replay_buffer") for k in before):
        gives, why = not_resume
        buffer_unjudged = [k for k in before if k.startswith("replay_buffer")]
        lost = [k for k in lost if k not in buffer_unjudged]
        if len(buffer_unjudged) == len(before):
            dlcheck.not_applicable(f"dlcheck_load_agent gives {gives}: {why}, and no running statistics to lose")
        dlcheck.not_judged("replay buffer", f"dlcheck_load_agent gives {gives}: {why}")
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
        if _sb3_buffer(dlcheck, holders):
            algo = dlcheck.role("algorithm") if dlcheck.has("algorithm") else None
            algo = algo if algo is not None and rl.is_sb3_algorithm(algo) else None
            algo = algo or next((h.owner for h in holders if rl.is_sb3_algorithm(h.owner)), None)
            name = type(algo).__name__ if algo is not None else "the algorithm's"
            causes.append(
                "the checkpoint does not carry the replay buffer (model.save() excludes it): a resumed off-policy "
                "run starts from an empty buffer"
            )
            fixes.append(
                "model.save_replay_buffer(d / 'replay_buffer.pkl') beside model.save(), and "
                f"model.load_replay_buffer(d / 'replay_buffer.pkl') after {name}.load(...)"
            )
        else:
            restored = _resume_state(loaded)
            if restored:
                evidence.append(f"the load gives back {', '.join(restored)}: a resume, without the replay buffer")
            causes.append(
                "the checkpoint does not carry the replay buffer"
                + (
                    f" (the load restores {' and '.join(dict.fromkeys(r.split(' (')[0] for r in restored))}, not the buffer)"
                    if restored
                    else ""
                )
                + ": a resumed off-policy run starts from an empty buffer and learns from its first new transitions "
                "only"
            )
            fixes.append(_buffer_fix(sources))
    dlcheck.fail(evidence, "; ".join(causes), "; ".join(fixes))


def _predict_only(loaded: Any) -> tuple[str, str] | None:
    """What SB3's load to predict with gives (an SB3 algorithm that has no env to learn on), and why no replay
    buffer concerns it; None for anything else (a resume, a wrapper, the user's own object)."""
    if not rl.is_sb3_algorithm(loaded) or loaded.get_env() is not None:
        return None
    name = type(loaded).__name__
    return (
        f"a {name} with no env ({name}.load without env=)",
        "a load to predict with, which no replay buffer concerns (a resume passes env= or calls set_env before "
        "learn, and is judged)",
    )


#: keys under which a load gives back the run's configuration (CleanRL saves vars(args) beside the weights)
CONFIG_KEYS = ("args", "config", "cfg", "hparams", "hyperparameters", "hyper_parameters")


def _export_only(loaded: Any) -> tuple[str, str] | None:
    """What the load gives, when it is the trained network(s) alone: an nn.Module or a network's state_dict, or a
    dict / list / tuple holding only those, the envs to play them in and the run's configuration — with no
    optimizer (or optimizer state), no step counter, no replay buffer, nothing a resume restores. That is an export
    to evaluate with (CleanRL's save_model for its evaluate()), and why no replay buffer concerns it; None for
    anything else (a resume, the user's own agent object, a load into the live objects)."""
    import argparse

    import torch
    from torch import nn

    networks: list[str] = []
    others: list[str] = []

    def network(x: Any) -> str | None:
        if isinstance(x, nn.Module):
            # a module that carries its optimizer (self.optimizer = Adam(...)) is a training object, not an export
            if any(isinstance(v, torch.optim.Optimizer) for v in vars(x).values()):
                return None
            return f"{type(x).__name__} (nn.Module)"
        if isinstance(x, dict) and x and all(isinstance(v, torch.Tensor) for v in x.values()):
            return f"a state_dict of {len(x)} tensors"
        return None

    def item(key: str | None, x: Any) -> bool:
        net = network(x)
        if net is not None:
            networks.append(f"{key}: {net}" if key else net)
            return True
        if rl.is_env(x):
            others.append(f"{key}: {type(x).__name__}" if key else type(x).__name__)
            return True
        if x is None or isinstance(x, (str, bool)):
            return True
        config = isinstance(x, argparse.Namespace) or (dataclasses.is_dataclass(x) and not isinstance(x, type))
        if key is not None and key.lower() in CONFIG_KEYS and isinstance(x, dict):
            config = all(v is None or isinstance(v, (str, bool, int, float, list, tuple)) for v in x.values())
        if config:
            others.append(f"{key}: the run's configuration" if key else "the run's configuration")
        return config

    if network(loaded) is not None:
        item(None, loaded)
    elif isinstance(loaded, dict) and loaded:
        if not all(isinstance(k, str) and item(k, v) for k, v in loaded.items()):
            return None
    elif isinstance(loaded, (list, tuple)) and loaded:
        if not all(item(None, v) for v in loaded):
            return None
    else:
        return None
    if not networks:
        return None
    gives = ", ".join(networks + others)
    if isinstance(loaded, dict) and network(loaded) is None:
        gives = "{" + gives + "}"
    elif isinstance(loaded, (list, tuple)):
        gives = f"({gives})"
    return (
        gives,
        "the network alone, with no optimizer, step counter or replay buffer: an export to evaluate with, not a "
        "resume (a run started from it begins anew, with a fresh optimizer at step 0 and a buffer of its own), "
        "and a replay buffer concerns a resume only (a load that "
        "gives back what a resume restores, the optimizer or the step counter, is judged)",
    )


#: keys of a loaded dict that hold a training-progress counter
COUNTER_WORDS = ("step", "epoch", "iter", "update", "frame", "episode")


def _resume_state(loaded: Any) -> list[str]:
    """What the load gives back that only a resume needs: optimizers (or their state) and progress counters."""
    import torch

    items = list(loaded.items()) if isinstance(loaded, dict) else []
    if isinstance(loaded, (list, tuple)):
        items = [(f"[{i}]", v) for i, v in enumerate(loaded)]
    found = []
    for key, v in items[:32]:
        if isinstance(v, torch.optim.Optimizer):
            found.append(f"the optimizer ({key}: {type(v).__name__})")
        elif isinstance(v, dict) and "param_groups" in v and "state" in v:
            found.append(f"the optimizer ({key}: its state_dict)")
        elif (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and any(w in str(key).lower() for w in COUNTER_WORDS)
        ):
            found.append(f"the step counter ({key} = {v:g})")
    return found


def _sb3_buffer(dlcheck, holders: list[Any]) -> bool:
    """Whether the replay buffer is an SB3 algorithm's (its save_replay_buffer is the fix), not a plain loop's."""
    if dlcheck.has("algorithm") and rl.is_sb3_algorithm(dlcheck.role("algorithm")):
        return True
    return any(h.attr == "replay_buffer" and rl.is_sb3_algorithm(h.owner) for h in holders)


def _buffer_fix(sources: list[Any]) -> str:
    """The fix for a plain loop's lost buffer, naming the arrays of the user's own buffer."""
    rb = next((s for s in sources if rl.is_replay_buffer(s)), None)
    if rb is None:
        rb = next((s.replay_buffer for s in sources if rl.is_replay_buffer(getattr(s, "replay_buffer", None))), None)
    fields = [
        f
        for f in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")
        if getattr(rb, f, None) is not None
    ]
    fields += [f for f in ("pos", "full") if hasattr(rb, f)]
    name = type(rb).__name__ if rb is not None else "replay buffer"
    listed = ", ".join(f"rb.{f}" for f in fields) or "the buffer's arrays and its write position"
    return (
        f"save the replay buffer's arrays with the checkpoint ({listed} of your {name}: e.g. "
        "torch.save({..., 'replay_buffer': {k: getattr(rb, k) for k in (...)}}, path), or pickle the buffer beside "
        "it) and, when resuming, put them back into the buffer the loop samples from before it learns on"
    )


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
