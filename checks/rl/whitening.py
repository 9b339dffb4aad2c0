"""R3: advantages not whitened, whitened at the wrong level, or GRPO groups with no signal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import MISSING, RoleError
from ...registry import Setting, check
from ...roles import is_hf_trainer
from ...sampling import sample_rows
from ...session import user_call
from . import measure as rl

LEVELS = ("any", "minibatch", "buffer", "none")

#: completions every sampled prompt is scored with, besides the data's own answers
PROBE_COMPLETIONS = ("", " 4", " The answer is 4.", " I do not know.", " yes", " " + "word " * 24)
ANSWER_COLUMNS = ("completion", "solution", "answer", "answers", "ground_truth", "reference", "target", "label")


@dataclass
class Finding:
    evidence: list[str]
    cause: str
    fix: str


@check(
    "R3",
    domain="rl",
    title="advantages not whitened, or whitened at the wrong level",
    optional_roles=(
        "advantage_minibatches",
        "group_advantages",
        "reward_funcs",
        "raw_dataset",
        "tokenizer",
        "train_log",
        "algorithm",
        "trainer",
    ),
    settings=(
        Setting(
            "level",
            "any",
            "where the recipe whitens PPO advantages: 'any' (whitened per minibatch or once over the rollout, "
            "both valid recipes; unwhitened fails), 'minibatch' (CleanRL norm_adv, SB3 PPO normalize_advantage, "
            "OpenAI baselines), 'buffer' (once over the rollout, as SpinningUp and CleanRL's PPG), or 'none'; a "
            "derived SB3 algorithm uses its own recipe",
        ),
        Setting(
            "tolerance",
            0.02,
            "how far a whitened minibatch's mean may sit from 0 and its std from 1, beyond "
            "the n/(n-1) gap between the biased and the unbiased std; exact whitening is within 1e-6",
        ),
        Setting(
            "max_examples",
            100,
            "reward groups Hypothesis generates for dlcheck_group_advantages; a division by "
            "a zero std or a batch-wide mean shows on the first few",
        ),
        Setting(
            "max_zero_std_share",
            1.0,
            "share of GRPO groups with identical rewards, averaged over the logged "
            "steps of dlcheck_train_log (TRL's frac_reward_zero_std), at which the run had no learning signal; "
            "1.0: only a run where every group of every step was flat fails",
        ),
    ),
)
def check_advantage_whitening(dlcheck):
    """PPO advantages are whitened per minibatch (or at the recipe's level); GRPO groups carry signal.

    What it does
        PPO: reads the advantages of each minibatch as the loss sees them (dlcheck_advantage_minibatches;
        from an SB3 PPO: the minibatches PPO.train() forms from its last rollout, or from 256 steps of its
        policy on a copy of its env, normalize_advantage applied) and finds the level they are whitened at:
        every minibatch mean 0 / std 1 (minibatch), only their concatenation (buffer), or neither (none);
        it fails when they are not whitened, or, when R3.level names a level (your recipe's), when that
        differs from it (by default either level passes: per minibatch as CleanRL's PPO, once over the
        rollout as SpinningUp and CleanRL's PPG; an SB3 algorithm is held to its own recipe). GRPO: generates reward groups with Hypothesis, groups
        whose rewards are all equal included, and checks that dlcheck_group_advantages gives finite
        advantages with mean 0 within every group and 0 for flat groups; scores sampled prompts of
        dlcheck_raw_dataset with several completions each through dlcheck_reward_funcs (as TRL calls
        them) and fails a reward function that gives every completion of a prompt the same reward; fails
        a logged run (dlcheck_train_log) in which every group of every step had identical rewards.
    Why it is bad
        Unwhitened PPO advantages make the policy-gradient step scale with the reward scale, so one
        learning rate fits one environment only, and the clipped objective behaves differently as returns
        grow. In GRPO the advantage is r − mean(group) (divided by its std): a reward that does not
        depend on the completion, or groups whose rewards are all equal, give advantage 0 — no learning
        signal — and a hand-written division by a zero std gives NaN.
    Example
        PPO("MlpPolicy", env, normalize_advantage=False)
        def reward(prompts, completions, **kw): return [len(p) / 20 for p in prompts]   # reads the prompt
        adv = (r - r.view(-1, G).mean(1).repeat_interleave(G)) / r.view(-1, G).std(1).repeat_interleave(G)
    Use instead
        mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8) per minibatch (SB3:
        normalize_advantage=True, the default); score the completions (TRL passes completions aligned with
        prompts; dataset columns such as solution= come as keywords); divide by (std + 1e-4) as TRL does.
    Known problems
        Sees only what the roles hand over: a CleanRL-style loop must expose its minibatch advantages.
        A reward function that gives the same reward to every probe completion (a format reward no probe
        matches) cannot be judged and is reported, not failed. Whitening twice is harmless and not flagged.
        When one part is judged and another cannot be, the check passes and its evidence names the part
        left unjudged.
    Not applicable
        Off-policy algorithms (SB3 DQN, SAC, TD3, or a hand-written loop that gives dlcheck_td_target_fn or
        dlcheck_replay_buffer and no dlcheck_advantage_fn: they learn from TD targets, with no advantages); A2C,
        whose recipe does not whiten advantages (normalize_advantage=False); trainers without rewards
        (SFT, DPO) given as dlcheck_trainer.
    """
    findings: list[Finding] = []
    judged: list[str] = []  # what was measured and passed
    notes: list[str] = []  # parts the check concerns but cannot decide
    na: list[str] = []  # parts the check does not concern
    if dlcheck.has("advantage_minibatches"):
        _ppo_minibatches(dlcheck, findings, judged, notes, na)
    if dlcheck.has("group_advantages"):
        if rl.hypothesis_missing():
            notes.append(rl.hypothesis_missing())
        else:
            _group_advantages(dlcheck, findings, judged)
    if dlcheck.has("reward_funcs"):
        _reward_funcs(dlcheck, findings, judged, notes)
    if dlcheck.has("train_log"):
        key, points = rl.log_series(dlcheck.role("train_log"), "zero_std")
        if points:
            _flat_groups_in_log(dlcheck, key, points, findings, judged)
    if findings:
        evidence = [line for f in findings for line in f.evidence]
        dlcheck.fail(
            evidence,
            "; ".join(dict.fromkeys(f.cause for f in findings)),
            "; ".join(dict.fromkeys(f.fix for f in findings)),
        )
    if judged:
        dlcheck.measured(*judged, *(f"not judged: {n}" for n in notes + na), parts=len(judged))
        return
    if notes:
        dlcheck.skip("; ".join(notes))
    if na:
        dlcheck.not_applicable("; ".join(na))
    algo, trainer = dlcheck.role("algorithm"), dlcheck.role("trainer")
    if algo is not MISSING and rl.is_sb3_algorithm(algo) and not rl.is_on_policy(algo):
        dlcheck.not_applicable(
            f"{type(algo).__name__} is off-policy: it learns from TD targets on its replay buffer, so it has no "
            "advantages to whiten and no reward groups"
        )
    if trainer is not MISSING and is_hf_trainer(trainer) and not rl.rewarded(trainer):
        dlcheck.not_applicable(
            f"dlcheck_trainer is a {type(trainer).__name__}: it trains without rewards, so it has no advantages to "
            "whiten and no reward groups"
        )
    off_policy = [f"dlcheck_{name}" for name in ("td_target_fn", "replay_buffer") if dlcheck.has(name)]
    if off_policy and not dlcheck.has("advantage_fn"):
        dlcheck.not_applicable(
            f"an off-policy loop ({' and '.join(off_policy)} given, no advantage function): it learns from TD "
            "targets on a replay buffer, so it has no advantages to whiten and no reward groups"
        )
    dlcheck.skip(
        "missing role: define fixture dlcheck_advantage_minibatches (PPO; or dlcheck_algorithm), "
        "dlcheck_group_advantages or dlcheck_reward_funcs (GRPO; or dlcheck_trainer) in conftest.py"
    )


# --------------------------------------------------------------------------------------------------
# PPO: whitening level of the minibatch advantages


def _ppo_minibatches(dlcheck, findings: list[Finding], judged: list[str], notes: list[str], na: list[str]) -> None:
    value = dlcheck.role("advantage_minibatches")
    if isinstance(value, rl.RolloutUnavailable):
        notes.append(str(value))
        return
    expected = dlcheck.setting("level")
    if expected not in LEVELS:
        raise RoleError("advantage_minibatches", f"R3.level is {expected!r}; expected one of {LEVELS}")
    source = "dlcheck_advantage_minibatches"
    if isinstance(value, rl.Minibatches):
        source = value.source
        if value.recipe is None:
            na.append("A2C's recipe does not whiten advantages (normalize_advantage=False): nothing to hold them to")
            return
        expected = value.recipe
    batches = [mb for mb in rl.iter_minibatches(value) if len(mb) > 1]
    if not batches:
        notes.append("dlcheck_advantage_minibatches gave no minibatch of 2 or more advantages")
        return
    whole = np.concatenate(batches)
    if np.allclose(whole, whole[0]):
        notes.append("every advantage is equal: nothing to whiten")
        return
    tol = dlcheck.setting("tolerance")
    per_minibatch = all(rl.whitened(mb, tol) for mb in batches)
    level = "minibatch" if per_minibatch else "buffer" if rl.whitened(whole, tol) else "none"
    if (
        level == expected
        or (expected == "any" and level != "none")
        or (expected == "buffer" and level == "minibatch" and len(batches) == 1)
    ):
        stats = [rl.minibatch_stats(mb) for mb in batches]
        sizes = sorted({s[0] for s in stats})
        size_text = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        n, mean, std = rl.minibatch_stats(whole)
        judged.append(
            f"{source}: {len(batches)} minibatches of {size_text} advantages, whitened at the level '{level}' "
            + (
                "(R3.level 'any': per minibatch or once over the rollout, both valid recipes)"
                if expected == "any"
                else f"as the recipe says ('{expected}')"
            )
            + ": minibatch means within "
            f"±{max(abs(s[1]) for s in stats):.2g}, stds {min(s[2] for s in stats):.3f} to "
            f"{max(s[2] for s in stats):.3f}; all {n} together: mean {mean:.2g}, std {std:.3f} (tolerance {tol:g})"
        )
        return
    rows = []
    for i, mb in enumerate(batches[:4]):
        n, mean, std = rl.minibatch_stats(mb)
        rows.append(f"minibatch {i}: {n} advantages, mean {mean:.3g}, std {std:.3g}")
    n, mean, std = rl.minibatch_stats(whole)
    evidence = (
        [
            f"{source}: advantages whitened at the level '{level}', "
            + ("the recipe whitens them (R3.level 'any')" if expected == "any" else f"the recipe says '{expected}'")
        ]
        + rows
        + [f"all {len(batches)} minibatches together: {n} advantages, mean {mean:.3g}, std {std:.3g}"]
    )
    if level == "none":
        cause = (
            f"the advantages reach the loss unnormalised (std {std:.3g}): the policy-gradient step scales with the "
            "reward scale, so the learning rate and clip range only fit this one reward scale"
        )
        fix = (
            "whiten each minibatch before the policy loss: mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8) "
            "(CleanRL norm_adv=True; SB3 PPO normalize_advantage=True, the default)"
        )
    elif level == "buffer":
        cause = (
            "the advantages are whitened once over the whole rollout, not per minibatch as the recipe says: each "
            "minibatch's advantages have a mean away from 0, which biases every update toward or against the "
            "minibatch's actions"
        )
        fix = (
            "whiten inside the minibatch loop: mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8), or set "
            "R3.level=buffer if your recipe whitens the whole rollout"
        )
    else:
        cause = "the advantages are whitened per minibatch, but the recipe (R3.level) says " + expected
        fix = f"set --dlcheck-set R3.level=minibatch if per-minibatch whitening is intended, else whiten at the {expected} level"
    dlcheck.attach(
        "histogram",
        series={"advantages, all minibatches": whole.tolist()},
        title=f"advantages the loss sees (level '{level}')",
        caption=source,
    )
    findings.append(Finding(evidence, cause, fix))


# --------------------------------------------------------------------------------------------------
# GRPO: group normalisation, reward functions, flat groups in a run


def _group_advantages(dlcheck, findings: list[Finding], judged: list[str]) -> None:
    import torch

    fn = dlcheck.role("group_advantages")

    def run(example: tuple[list[float], int]) -> np.ndarray:
        rewards, size = example
        out = rl.to_numpy(fn(torch.tensor(rewards, dtype=torch.float32), size)).reshape(-1)
        if out.shape != (len(rewards),):
            raise RoleError("group_advantages", f"returned {out.shape[0]} advantages for {len(rewards)} rewards")
        return out

    seen = {"examples": 0, "flat": 0}

    def bad(example: tuple[list[float], int]) -> bool:
        seen["examples"] += 1
        rewards, size = example
        seen["flat"] += sum(len(set(rewards[g : g + size])) == 1 for g in range(0, len(rewards), size))
        try:
            return _group_problem(example, run(example)) is not None
        except Exception:  # noqa: BLE001 - a group the function cannot take is a counterexample too
            return True

    smallest = rl.search(rl.reward_groups(), bad, dlcheck.setting("max_examples"))
    if smallest is None:
        judged.append(
            f"dlcheck_group_advantages on {seen['examples']} Hypothesis-generated batches of reward groups (group "
            f"sizes 2-6, {seen['flat']} flat groups among them): finite advantages averaging 0 within every group"
        )
        return
    adv = dlcheck.call(
        "group_advantages", lambda: run(smallest), synthetic=f"generated reward groups (group size {smallest[1]})"
    )
    rewards, size = smallest
    problem = _group_problem(smallest, adv)
    evidence = [
        f"dlcheck_group_advantages on the smallest reward groups that show it (Hypothesis-shrunk), group_size {size}:"
    ]
    for g in range(len(rewards) // size):
        sl = slice(g * size, (g + 1) * size)
        evidence.append(
            f"group {g}: rewards {rl.fmt_values(rewards[sl], size)} -> advantages {rl.fmt_values(adv[sl], size)}"
        )
    r = np.asarray(rewards, np.float64)
    whole = (r - r.mean()) / (r.std(ddof=1) + 1e-8) if len(r) > 1 else r * 0
    if problem == "nonfinite":
        cause = (
            "the group's rewards are all equal, so its std is 0 and the division gives NaN/inf advantages, "
            "which poison the loss and the weights"
        )
        fix = "divide by (std + 1e-4) as TRL does: adv = (r - mean_g) / (std_g + 1e-4), or skip flat groups"
    elif np.allclose(adv, whole, atol=1e-3):
        cause = (
            "the advantages are whitened over the whole batch instead of within each prompt's group: completions "
            "are compared with other prompts' completions, so easy prompts get positive advantages throughout"
        )
        fix = (
            "normalise per group: g = r.view(-1, G); adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + "
            "1e-4)).view(-1)"
        )
    else:
        cause = "the advantages of a group do not average to 0 (a flat group must get 0): the baseline is not the group mean"
        fix = (
            "subtract the group mean: g = r.view(-1, G); adv = (g - g.mean(1, keepdim=True)).view(-1), divided by "
            "(g.std(1, keepdim=True) + 1e-4) for group scaling"
        )
    findings.append(Finding(evidence, cause, fix))


def _group_problem(example: tuple[list[float], int], adv: np.ndarray) -> str | None:
    rewards, size = example
    if not np.isfinite(adv).all():
        return "nonfinite"
    scale = 1.0 + float(np.abs(adv).max(initial=0.0))
    for g in range(len(rewards) // size):
        a = adv[g * size : (g + 1) * size]
        if abs(a.mean()) > 1e-4 * scale:
            return "mean"
    return None


def _reward_funcs(dlcheck, findings: list[Finding], judged: list[str], notes: list[str]) -> None:
    funcs = dlcheck.role("reward_funcs")
    funcs = list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
    dataset = dlcheck.role("raw_dataset")
    if dataset is MISSING:
        notes.append(
            "dlcheck_reward_funcs needs prompts: define dlcheck_dataset (rows with 'prompt') or dlcheck_trainer"
        )
        return
    rows, _ = sample_rows(dataset, min(dlcheck.samples, 4), "raw_dataset")
    rows = [dict(r) for r in rows if isinstance(r, dict) or hasattr(r, "keys")]
    rows = [r for r in rows if "prompt" in r]
    if len(rows) < 2:
        notes.append("fewer than 2 sampled rows with a 'prompt' column: the reward functions cannot be probed")
        return
    texts = list(PROBE_COMPLETIONS)
    for col in ANSWER_COLUMNS:
        texts += [" " + r[col].strip() for r in rows if isinstance(r.get(col), str)]
    texts = list(dict.fromkeys(texts))[:10]
    conversational = isinstance(rows[0]["prompt"], list)
    completions = [[{"role": "assistant", "content": t.strip()}] if conversational else t for t in texts]
    prompts = [r["prompt"] for r in rows for _ in completions]
    columns = {k: [r.get(k) for r in rows for _ in completions] for k in rows[0] if k not in ("prompt", "completion")}
    comp = [c for _ in rows for c in completions]
    tok = dlcheck.role("tokenizer")
    ids = [tok(t, add_special_tokens=False)["input_ids"] if tok is not MISSING and callable(tok) else [] for t in texts]
    trainer = dlcheck.role("trainer")
    state = getattr(trainer, "state", None) if trainer is not MISSING else None
    extras = dict(
        completion_ids=[i for _ in rows for i in ids],
        trainer_state=state,
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
    )
    for i, func in enumerate(funcs):
        if not callable(func) or _is_module(func):  # a reward model: scored inside the trainer
            notes.append(f"reward_funcs[{i}] is a reward model ({type(func).__name__}): not probed")
            continue
        name = getattr(func, "__name__", type(func).__name__)
        out = user_call(
            "reward_funcs",
            lambda: func(prompts=prompts, completions=comp, **extras, **columns),
            synthetic="the sampled prompts with probe completions made up by the check",
        )
        scores = np.array([np.nan if v is None else float(v) for v in out], np.float64)
        if scores.shape != (len(prompts),):
            raise RoleError("reward_funcs", f"{name} returned {scores.shape[0]} rewards for {len(prompts)} completions")
        grid = scores.reshape(len(rows), len(completions))
        finite = grid[np.isfinite(grid).sum(1) >= 2]
        if len(finite) == 0:
            notes.append(f"reward_funcs[{i}] {name} gave no finite reward (None/NaN) to the probe completions")
            continue
        within = np.array([np.nanstd(g) for g in finite])
        across = float(np.nanstd([np.nanmean(g) for g in finite]))
        if (within > 0).any():
            judged.append(
                f"reward_funcs[{i}] {name}: the rewards of a prompt's completions differ on {int((within > 0).sum())} "
                f"of {len(finite)} sampled prompts ({len(completions)} probe completions each; largest within-prompt "
                f"std {float(within.max()):.3g})"
            )
            continue
        if across == 0:
            notes.append(
                f"reward_funcs[{i}] {name} gave {float(np.nanmax(finite)):g} to every probe completion of every "
                f"prompt: cannot tell whether it depends on the completion"
            )
            continue
        shown = ", ".join(repr(t if len(t) < 20 else t[:17] + "...") for t in texts[:4])
        evidence = [
            f"reward_funcs[{i}] {name} gave every completion of a prompt the same reward: {len(finite)} of "
            f"{len(finite)} prompts, {len(completions)} completions each ({shown}, …)"
        ]
        for r, g in list(zip(rows, grid))[:3]:
            evidence.append(f"prompt {_short(r['prompt'])}: rewards {rl.fmt_values(g, 4)}")
        evidence.append(
            f"across prompts the rewards differ (std {across:.3g}): the reward follows the prompt, not the completion"
        )
        findings.append(
            Finding(
                evidence,
                f"{name} scores the prompt, not the completion: within each GRPO group every completion gets the same reward, "
                "so its group-normalised advantage (r − mean_group) is 0 and this reward gives no gradient",
                f"compute {name}'s reward from completions=[...] (aligned with prompts=[...]); the row's own data (e.g. "
                "solution=) arrives as keyword columns",
            )
        )


def _flat_groups_in_log(
    dlcheck, key: str, points: list[tuple[int, float]], findings: list[Finding], judged: list[str]
) -> None:
    share = float(np.mean([v for _, v in points]))
    if share < dlcheck.setting("max_zero_std_share"):
        judged.append(
            f"dlcheck_train_log: {key} averages {share:.3g} over {len(points)} logged steps (the run had no signal "
            f"at {dlcheck.setting('max_zero_std_share'):g})"
        )
        return
    findings.append(
        Finding(
            [
                f"dlcheck_train_log: {key} = {rl.fmt_values([v for _, v in points], 8)} over {len(points)} logged steps: every "
                f"group of every step had identical rewards"
            ],
            "no GRPO group ever had rewards that differ, so every advantage was 0 and the run learned nothing: the task is "
            "too hard or too easy for the policy, or the rewards do not depend on the completions",
            "check the reward functions on real completions; use easier prompts or more generations per prompt "
            "(num_generations), or a denser reward",
        )
    )


def _is_module(obj: Any) -> bool:
    return any(c.__name__ == "Module" and c.__module__.startswith("torch.nn") for c in type(obj).__mro__)


def _short(prompt: Any) -> str:
    text = (
        prompt[-1].get("content", "")
        if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict)
        else str(prompt)
    )
    return repr(text if len(text) <= 30 else text[:27] + "...")
