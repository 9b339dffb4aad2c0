"""R8: observations reach the policy unnormalised."""

from __future__ import annotations

import numpy as np

from ...errors import MISSING
from ...registry import Setting, check
from ...roles import is_hf_trainer
from ...session import user_call
from . import measure as rl
from . import policy_rollout


@check(
    "R8",
    domain="rl",
    title="observations reach the policy unnormalised",
    optional_roles=("algorithm", "rollout", "env", "preprocess_obs", "trainer"),
    settings=(
        Setting(
            "rollout_steps",
            256,
            "env steps whose observations are measured: enough for a stable 90th "
            "percentile per dimension, a few milliseconds of a classic-control env",
        ),
        Setting(
            "max_scale",
            10.0,
            "largest per-dimension scale (90th percentile of |x|) a network input may have; "
            "every classic-control env observed raw stays under 4 (Pendulum's angular velocity), pixels in "
            "0-255 and positions in metres or pixels exceed it",
        ),
        Setting(
            "max_scale_ratio",
            30.0,
            "largest ratio between the scales of two dimensions; raw CartPole is at "
            "10, Pendulum and Acrobot at 5, MountainCar (position 0.6 vs velocity 0.008) at about 75",
        ),
    ),
)
def check_observation_scale(dlcheck):
    """The observations your policy network takes are on a unit-like scale in every dimension.

    What it does
        Measures the observations as the policy sees them: from an SB3 dlcheck_algorithm, its last
        rollout (or 256 steps of its policy on a copy of its env), VecNormalize included and SB3's own
        preprocessing (images / 255) applied; else the observations of dlcheck_rollout, a rollout your
        loop collected; else 256 steps of random actions in a fresh env from the dlcheck_env factory (or
        a copy of the env), normalising wrappers included. The last two pass through
        dlcheck_preprocess_obs when given. Per dimension it takes the 90th percentile of |x| (robust to
        rare outliers; all-zero dimensions are ignored) and fails when one exceeds R8.max_scale or two
        differ by more than R8.max_scale_ratio. Box observation spaces only.
    Why it is bad
        A network's first layer weights every input alike at initialisation: a dimension 100× smaller
        than the others barely moves the weighted sums and is learned late or never, and inputs in
        the hundreds saturate tanh units and blow up gradients. RL has no dataset to normalise once,
        so this is easy to forget — RL Zoo's tuned PPO for MountainCar sets normalize: true.
    Example
        env = make_vec_env("MountainCar-v0", n_envs=4)       # position ~0.5, velocity ~0.007
        model = PPO("MlpPolicy", env)
    Use instead
        env = VecNormalize(make_vec_env("MountainCar-v0", n_envs=4))   # save its statistics (R4)
        gymnasium: gym.wrappers.NormalizeObservation(env) / gym.wrappers.vector.NormalizeObservation(envs)
    Known problems
        Random actions visit other states than a trained policy. Normalisation inside your agent is seen
        only through dlcheck_preprocess_obs. Dict observation spaces are skipped.
    Not applicable
        Observation spaces that are not Box (Discrete, MultiDiscrete: SB3 one-hot encodes them), and RL on
        language models (a TRL trainer: the policy reads token ids).
    """
    steps = dlcheck.setting("rollout_steps")
    algo = dlcheck.role("algorithm")
    if algo is not MISSING and rl.is_sb3_algorithm(algo):
        space = algo.observation_space
        if type(space).__name__ == "Dict":
            dlcheck.skip(f"R8 does not sample Dict observation spaces ({type(algo).__name__})")
        if type(space).__name__ != "Box":
            dlcheck.not_applicable(
                f"R8 measures Box observation spaces; {type(algo).__name__} has {type(space).__name__}"
            )
        sample = policy_rollout(dlcheck.state.derived, algo)
        if isinstance(sample, rl.RolloutUnavailable):
            dlcheck.skip(str(sample))
        obs = rl.sb3_preprocess(algo, sample.observations)
        source = sample.source
        normalised_by = "VecNormalize" if algo.get_vec_normalize_env() is not None else None
    else:
        normalised_by = None
        if dlcheck.has("rollout"):
            obs, source = rl.rollout_observations(dlcheck.role("rollout")), "dlcheck_rollout"
        elif dlcheck.has("env"):
            env = dlcheck.role("env")
            try:
                obs, source = dlcheck.memo(env, f"rl:observations:{steps}", lambda: rl.env_observations(env, steps))
            except rl.NotBoxSpace as exc:
                dlcheck.not_applicable(str(exc))
            except rl.RolloutUnavailable as exc:
                dlcheck.skip(str(exc))
        else:
            trainer = dlcheck.role("trainer")
            if trainer is not MISSING and is_hf_trainer(trainer):
                dlcheck.not_applicable(
                    f"dlcheck_trainer is a {type(trainer).__name__}: its policy reads token ids, not vector "
                    "observations whose scale could be off"
                )
            dlcheck.skip(
                "missing role: define fixture dlcheck_env (a function returning a fresh env), dlcheck_rollout "
                "or dlcheck_algorithm in conftest.py"
            )
        if dlcheck.has("preprocess_obs"):
            fn = dlcheck.role("preprocess_obs")
            obs = rl.to_numpy(user_call("preprocess_obs", lambda: fn(obs)))
            source += ", through dlcheck_preprocess_obs"
    scales = [s for s in rl.observation_scales(obs) if s.scale > 0]
    if not scales:
        dlcheck.skip(f"every observation dimension is 0 in {source}")
    big = [s for s in scales if s.scale > dlcheck.setting("max_scale")]
    lo, hi = min(scales, key=lambda s: s.scale), max(scales, key=lambda s: s.scale)
    ratio = hi.scale / lo.scale
    wide = ratio > dlcheck.setting("max_scale_ratio")
    if not big and not wide and np.asarray(obs).ndim > 2 and rl.observation_matrix(obs).shape[1] == 1:
        dlcheck.measured(
            f"{source}; image observations of shape {tuple(np.asarray(obs).shape[1:])}: 90% of the nonzero pixel values "
            f"over every axis are ≤ {hi.scale:.3g} ≤ R8.max_scale {dlcheck.setting('max_scale'):g}",
            largest_scale=round(hi.scale, 6),
        )
        return
    if not big and not wide:
        dlcheck.measured(
            f"{source}; {len(scales)} dimension(s): largest scale (90% of |x|) {hi.scale:.3g} at dim {hi.index} "
            f"≤ R8.max_scale {dlcheck.setting('max_scale'):g}; dims {hi.index} and {lo.index} are {ratio:.3g}× "
            f"apart ≤ R8.max_scale_ratio {dlcheck.setting('max_scale_ratio'):g}",
            dimensions=len(scales),
            largest_scale=round(hi.scale, 6),
            scale_ratio=round(ratio, 4),
        )
        return
    frames = np.asarray(obs)
    if frames.ndim > 2 and rl.observation_matrix(obs).shape[1] == 1 and big:
        # image observations: one scale over every axis of the frames (C, H, W or H, W, C), not per pixel
        dlcheck.fail(
            [
                f"{source}; image observations of shape {tuple(frames.shape[1:])} ({frames.dtype}): 90% of the pixel "
                f"values are ≤ {hi.scale:.3g} (max {float(np.abs(frames).max()):.3g}) > R8.max_scale "
                f"{dlcheck.setting('max_scale'):g}"
            ],
            "raw pixel values (0-255) reach the network: the first convolution sees inputs hundreds of times larger "
            "than its initialisation assumes, and its activations saturate",
            "divide the frames by 255 before the policy (SB3's CnnPolicy does so with normalize_images=True; a "
            "custom agent: x = obs.float() / 255.0), and hand that function to the checks as dlcheck_preprocess_obs",
        )
    keep = {s.index for s in big[:4]} | {lo.index, hi.index} | {s.index for s in scales[:6]}
    shown = [s for s in scales if s.index in keep][:8]
    evidence = [f"{source}; scale of each of {len(scales)} dimension(s):"]
    evidence += [f"dim {s.index}: 90% of |x| ≤ {s.scale:.3g} (mean {s.mean:.3g}, std {s.std:.3g})" for s in shown]
    causes = []
    if big:
        dims = ", ".join(str(s.index) for s in big[:6])
        evidence.append(
            f"dimension(s) {dims} reach |x| ≈ {max(s.scale for s in big):.3g} > R8.max_scale "
            f"{dlcheck.setting('max_scale'):g}"
        )
        causes.append(
            "observations in the tens or hundreds reach the network as they are: tanh units saturate and "
            "the gradients of the first layer are dominated by those inputs"
        )
    if wide:
        evidence.append(
            f"dim {hi.index} is {ratio:.3g}× dim {lo.index} > R8.max_scale_ratio {dlcheck.setting('max_scale_ratio'):g}"
        )
        causes.append(
            f"the dimensions are on scales {ratio:.3g}× apart: dim {lo.index} barely moves the first layer's "
            "weighted sums, so the policy learns from it late or not at all"
        )
    if normalised_by:
        causes.append(f"({normalised_by} is present but leaves these scales: norm_obs=False, or clipped?)")
    fix = (
        "normalise observations: SB3 env = VecNormalize(env) (norm_obs=True; save its statistics with the "
        "checkpoint, see R4); gymnasium gym.wrappers.NormalizeObservation(env) or "
        "gym.wrappers.vector.NormalizeObservation(envs); or scale inside your agent and hand that function to "
        "the checks as dlcheck_preprocess_obs"
    )
    x = rl.observation_matrix(obs)
    dlcheck.attach(
        "histogram",
        series={f"dim {s.index}": x[:, s.index].tolist() for s in (lo, hi)},
        title="observations as the policy sees them",
        caption=source,
    )
    dlcheck.fail(evidence, "; ".join(causes), fix)
