"""No flake from statistics: every check whose verdict rests on random draws states its false-alarm
probability (≤ 1e-6) in its doc, and that probability is checked — exactly, with rational arithmetic
independent of the plugin's floating-point tails, and by seeded simulation of the check's own decision
functions (so this test is deterministic itself).

- DF5: exact one-sided binomial tests at false_alarm/2 on each side of [low, high], early stops that
  only pass (cfg_dropout._clearly_inside), rows or calls counted (cfg_dropout._units).
- DF8: the DKW test of the timesteps (diffusion.uniform_cdf_gap vs diffusion.dkw_epsilon), and the
  ±noise_std_tol band on the noise's std and mean.
- T7: two epochs of a shuffling sampler in the same order happen by chance with probability 1/n!."""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

import numpy as np
import pytest

from pytest_dlcheck import registry
from pytest_dlcheck.checks.diffusion import cfg_dropout
from pytest_dlcheck.checks.diffusion import measure as D

CHECKS = registry.load_checks()
BOUND = 1e-6

#: the checks whose verdict depends on random draws (a new one belongs here, with a simulation below)
STATISTICAL = ("DF5", "DF8", "T7", "V6")


def test_every_check_with_a_false_alarm_setting_is_known_here():
    with_setting = {cid for cid, c in CHECKS.items() if any(s.name == "false_alarm" for s in c.settings)}
    assert with_setting <= set(STATISTICAL), f"add {sorted(with_setting - set(STATISTICAL))} to STATISTICAL"


@pytest.mark.parametrize("cid", [c for c in STATISTICAL if c in CHECKS])
def test_statistical_check_states_its_false_alarm_bound(cid):
    check = CHECKS[cid]
    text = " ".join((check.func.__doc__ or "").split())
    stated = [
        float(x)
        for x in re.findall(r"(?:false[- ]alarm|probability)[^.]{0,80}?≤ ?([0-9.]+e-?\d+)", text, re.IGNORECASE)
    ]
    assert stated and max(stated) <= BOUND, f"{cid}'s doc must state its false-alarm probability (≤ {BOUND:g}):\n{text}"
    for s in check.settings:
        if s.name == "false_alarm":
            assert s.default <= BOUND


# ---- DF5 ------------------------------------------------------------------------------------------


def exact_cdf(k: int, n: int, p: Fraction) -> Fraction:
    return sum((Fraction(math.comb(n, i)) * p**i * (1 - p) ** (n - i) for i in range(k + 1)), Fraction(0))


@functools.cache
def df5_fails(k: int, n: int, low: float, high: float, alpha: float) -> bool:
    """DF5's verdict on the full draws, through the check's own tail functions."""
    return D.binom_cdf(k, n, low) <= alpha / 2 or D.binom_sf(k, n, high) <= alpha / 2


@pytest.mark.parametrize("n", [300, 1200])  # 300 calls; or 300 calls × 4 rows when rows are counted
def test_df5_false_alarm_exactly(n):
    """At the band's edges (the worst cases: the fail probability grows towards them), the binomial law
    puts at most false_alarm on the rejection regions the check computes."""
    alpha = CHECKS["DF5"].setting("false_alarm").default
    low, high = CHECKS["DF5"].setting("low").default, CHECKS["DF5"].setting("high").default
    lo_region = [k for k in range(n + 1) if D.binom_cdf(k, n, low) <= alpha / 2]
    hi_region = [k for k in range(n + 1) if D.binom_sf(k, n, high) <= alpha / 2]
    assert lo_region and hi_region and max(lo_region) < min(hi_region)
    assert lo_region == list(range(max(lo_region) + 1)) and hi_region == list(range(min(hi_region), n + 1))
    p_low, p_high = Fraction(low).limit_denominator(1000), Fraction(high).limit_denominator(1000)
    fa_low = exact_cdf(max(lo_region), n, p_low)  # P(K <= k_lo | p = low)
    fa_high = 1 - exact_cdf(min(hi_region) - 1, n, p_high)  # P(K >= k_hi | p = high)
    assert fa_low <= Fraction(alpha) / 2 and fa_high <= Fraction(alpha) / 2, (float(fa_low), float(fa_high))
    assert float(fa_low + fa_high) <= BOUND
    # and the test has power: a path that never drops (k = 0) fails
    assert df5_fails(0, n, low, high, alpha)


def simulate_df5(p: float, alpha: float, runs: int, seed: int, calls: int = 300) -> float:
    """The share of simulated DF5 runs that fail when each call drops the condition with probability p:
    sequential draws, the check's early passing stops at 25/50/100/200 calls, its verdict at 300."""
    low, high = CHECKS["DF5"].setting("low").default, CHECKS["DF5"].setting("high").default
    rng = np.random.default_rng(seed)
    draws = rng.random((runs, calls)) < p
    counts = draws.cumsum(axis=1)

    @functools.cache
    def early(n: int, k: int) -> bool:
        tally = cfg_dropout.Tally(rows=n, calls=n, uniform_calls=n, null_calls=k, null_u=k)
        return cfg_dropout._clearly_inside(tally, low, high)

    failed = 0
    for run in range(runs):
        if any(early(n, int(counts[run, n - 1])) for n in cfg_dropout.LOOKS):
            continue
        failed += df5_fails(int(counts[run, -1]), calls, low, high, alpha)
    return failed / runs


@pytest.mark.parametrize("p", [0.05, 0.2, 0.5])
def test_df5_false_alarm_by_simulation(p):
    """At inflated levels the simulated false-alarm rate stays under the level (DF5 is conservative: exact
    tails, early stops that only pass); at the default level no simulated run fails."""
    runs = 4000
    for alpha in (0.1, 0.02):
        rate = simulate_df5(p, alpha, runs, seed=int(p * 1000 + alpha * 100))
        slack = 5 * math.sqrt(alpha * (1 - alpha) / runs)
        assert rate <= alpha + slack, (p, alpha, rate)
    assert simulate_df5(p, CHECKS["DF5"].setting("false_alarm").default, runs, seed=7) == 0.0


def test_df5_catches_what_it_is_for():
    """Power at the simulated level of the real check: no dropout, or 90 % dropout (an inverted comparison: the
    band's upper bound is 50 %, what ControlNet's recipe drops on purpose), fail every time."""
    alpha = CHECKS["DF5"].setting("false_alarm").default
    assert simulate_df5(0.0, alpha, 200, seed=1) == 1.0
    assert simulate_df5(0.9, alpha, 200, seed=2) == 1.0


# ---- DF8 ------------------------------------------------------------------------------------------


def test_df8_dkw_false_alarm_by_simulation():
    """Uniform integer timesteps on [0, T) fail the check's DKW test at most at the chosen level (DKW-Massart
    holds for any law, discrete ones included: here it is far from tight)."""
    T, n, runs = 1000, CHECKS["DF8"].setting("timestep_draws").default, 3000
    rng = np.random.default_rng(8)
    gaps = np.array([D.uniform_cdf_gap(rng.integers(0, T, n).tolist(), T)[0] for _ in range(runs)])
    for alpha in (0.2, 0.05, 0.01):
        rate = float((gaps > D.dkw_epsilon(n, alpha)).mean())
        assert rate <= alpha + 5 * math.sqrt(alpha / runs), (alpha, rate)
    eps = D.dkw_epsilon(n, CHECKS["DF8"].setting("false_alarm").default)
    assert 2 * math.exp(-2 * n * eps**2) <= BOUND * (1 + 1e-9)  # Massart's bound at the default level
    assert not (gaps > eps).any()
    # and power: timesteps cut to a tenth of the range fail
    narrow = rng.integers(0, T // 10, n).tolist()
    assert D.uniform_cdf_gap(narrow, T)[0] > eps


def test_df8_noise_band_false_alarm():
    """|std − 1| and |mean| of standard Gaussian noise stay within noise_std_tol except with probability
    ≤ 1e-6, for the fewest noise values DF8 judges with latents of 4×8×8 (64 draws × 256 values)."""
    tol = CHECKS["DF8"].setting("noise_std_tol").default
    n = CHECKS["DF8"].setting("timestep_draws").default * 4 * 8 * 8
    # mean ~ N(0, 1/n); std ≈ N(1, 1/(2n)) (the chi law's normal approximation is accurate at n = 16384)
    p_mean = math.erfc(tol * math.sqrt(n) / math.sqrt(2))
    p_std = math.erfc(tol * math.sqrt(2 * n) / math.sqrt(2))
    assert p_mean + p_std <= BOUND, (p_mean, p_std)
    rng = np.random.default_rng(9)
    noise = rng.standard_normal((200, n))
    assert (np.abs(noise.std(axis=1) - 1) <= tol).all() and (np.abs(noise.mean(axis=1)) <= tol).all()


# ---- T7 -------------------------------------------------------------------------------------------


def test_t7_same_order_by_chance():
    """T7 fails when every epoch it reads of a shuffling sampler comes in the same order: with k distinct
    entries a correct shuffle repeats an order with probability 1/k!, so the check reads E epochs with
    (1/k!)^(E-1) ≤ 1e-6 — simulated here on the check's own reading of the orders, down to 3 examples."""
    import torch
    from torch.utils.data import DataLoader

    from pytest_dlcheck.checks.train.epoch_order import (
        MAX_EPOCHS,
        _order,
        epochs_needed,
    )

    alpha = CHECKS["T7"].setting("false_alarm").default
    for k in range(2, 70):
        e = epochs_needed(list(range(k)), alpha)
        assert e <= MAX_EPOCHS and (1 / math.factorial(k)) ** (e - 1) <= alpha, k
    assert epochs_needed(list(range(10)), alpha) == 2 and epochs_needed([1, 1, 2], alpha) == MAX_EPOCHS

    repeats, all_same = 0, 0
    for seed in range(600):
        torch.manual_seed(seed)
        loader = DataLoader(list(range(3)), batch_size=1, shuffle=True)
        orders = [_order(loader, e) for e in range(epochs_needed(_order(loader, 0), alpha))]
        repeats += orders[0] == orders[1]
        all_same += all(o == orders[0] for o in orders)
    assert abs(repeats / 600 - 1 / 6) < 5 * math.sqrt((1 / 6) * (5 / 6) / 600)  # two epochs alone repeat often
    assert all_same == 0  # the epochs T7 reads never all agree
