"""Confidence intervals, the netperf stopping rule, Fieller ratios and verdicts, on numbers checked by hand."""

from __future__ import annotations

import math

import pytest

from offlab import stats


def test_t_interval_of_10_12_14_at_95_percent():
    """mean 12, s = sqrt(((−2)² + 0² + 2²) / 2) = 2, t(0.975, 2) = 4.3027,
    half-width = 4.3027 · 2 / √3 = 4.9683, interval [7.0317, 16.9683]."""
    ci = stats.mean_ci([10, 12, 14], level=95)
    assert ci.mean == 12
    assert ci.sd == pytest.approx(2.0)
    assert ci.n == 3
    assert ci.half_width == pytest.approx(4.9683, abs=1e-4)
    assert (ci.low, ci.high) == (pytest.approx(7.0317, abs=1e-4), pytest.approx(16.9683, abs=1e-4))
    assert ci.rel_half_width == pytest.approx(4.9683 / 12, abs=1e-5)
    assert ci.width_pct == pytest.approx(82.805, abs=1e-3)  # netperf's "Confidence intervals: ... %"


def test_t_quantile_is_scipys():
    import scipy.stats  # here, not at the top: every pytest worker imports every test module

    assert stats.t_quantile(0.975, 2) == pytest.approx(scipy.stats.t.ppf(0.975, 2))
    assert stats.t_quantile(0.995, 7.3) == pytest.approx(scipy.stats.t.ppf(0.995, 7.3))


def test_one_value_has_a_mean_and_no_interval():
    ci = stats.mean_ci([3.5e9], level=99)
    assert ci.mean == 3.5e9 and ci.n == 1
    assert ci.low is None and ci.high is None and ci.half_width is None and ci.width_pct is None
    assert not stats.converged([3.5e9], 99, 5)


def test_no_values_is_a_programming_error():
    with pytest.raises(ValueError):
        stats.mean_ci([])


def test_converged_means_half_width_within_half_the_width_percent_of_the_mean():
    """[10, 12, 14] at 95 %: half-width 4.9683 is 41.40 % of the mean, so the full interval is 82.80 %
    of the mean: `-I 95,82.9` is met, `-I 95,82.7` is not."""
    assert stats.converged([10, 12, 14], 95, 82.9)
    assert not stats.converged([10, 12, 14], 95, 82.7)


def test_converged_at_99_5_like_netperf():
    """[100, 101, 99, 100.5, 99.5]: mean 100, s = √(2.5/4) = 0.7906, t(0.995, 4) = 4.6041,
    half-width = 4.6041 · 0.7906 / √5 = 1.628 = 1.63 % of the mean ≤ 2.5 %: met.
    [100, 101, 99]: s = 1, t(0.995, 2) = 9.925, half-width 5.73 % > 2.5 %: not met."""
    assert stats.mean_ci([100, 101, 99, 100.5, 99.5], 99).half_width == pytest.approx(1.628, abs=1e-3)
    assert stats.converged([100, 101, 99, 100.5, 99.5], 99, 5)
    assert not stats.converged([100, 101, 99], 99, 5)


def test_identical_values_have_converged_even_at_zero():
    assert stats.converged([0.0, 0.0, 0.0], 99, 5)  # loss 0 in every round
    assert stats.converged([7.0, 7.0], 99, 5)


def test_fieller_ratio_interval_by_hand():
    """a = [100, 102, 98]: ā = 100, s² = 4, V_a = 4/3.   b = [150, 153, 147]: b̄ = 150, s² = 9, V_b = 3.
    r = 1.5.  Welch–Satterthwaite at r: df = (3 + 2.25·4/3)² / (3²/2 + 2.25²·(4/3)²/2) = 36 / 9 = 4.
    t(0.975, 4) = 2.776445, t² = 7.708647.
    Fieller: ρ²(ā² − t²V_a) − 2ρ·ā·b̄ + (b̄² − t²V_b) = 0
      qa = 10000 − 7.708647·4/3 = 9989.7218,  qc = 22500 − 7.708647·3 = 22476.8741
      disc = 15000² − qa·qc = 462281.15,  √disc = 679.913
      ρ = (15000 ∓ 679.913) / 9989.7218 = 1.43348 … 1.56960."""
    r = stats.ratio_ci([100, 102, 98], [150, 153, 147], level=95)
    assert r.ratio == pytest.approx(1.5)
    assert r.df == pytest.approx(4.0)
    assert r.low == pytest.approx(1.43348, abs=1e-5)
    assert r.high == pytest.approx(1.56960, abs=1e-5)
    # Both ends solve Fieller's equation.
    t2 = stats.t_quantile(0.975, 4) ** 2
    for rho in (r.low, r.high):
        assert (150 - rho * 100) ** 2 == pytest.approx(t2 * (3 + rho * rho * 4 / 3))


def test_ratio_without_interval_when_a_side_has_one_value():
    r = stats.ratio_ci([100.0], [150.0, 151.0])
    assert r.ratio == pytest.approx(1.5 + 0.005) and r.low is None and r.high is None


def test_ratio_of_a_baseline_indistinguishable_from_zero_has_no_bounded_interval():
    r = stats.ratio_ci([-1.0, 0.5, 1.0], [5.0, 5.1, 4.9], level=95)
    assert r.low is None and r.high is None
    assert stats.ratio_ci([0.0, 0.0], [1.0, 2.0]).ratio is None


def test_welch_difference_interval_by_hand():
    """a = [0, 0, 0], b = [0.010, 0.012, 0.014]: diff 0.012, V_b = 0.002²/3, df = 2,
    half-width = 4.3027 · 0.002/√3 = 0.0049683."""
    d = stats.diff_ci([0.0, 0.0, 0.0], [0.010, 0.012, 0.014], level=95)
    assert d.diff == pytest.approx(0.012)
    assert d.high - d.diff == pytest.approx(0.0049683, abs=1e-7)


@pytest.mark.parametrize("ratio, low, high, better, expected", [
    (1.05, 1.0001, 1.10, "higher", "faster"),
    (1.05, 1.0, 1.10, "higher", "no significant difference"),  # the interval touches 1
    (0.95, 0.90, 1.0, "higher", "no significant difference"),
    (0.95, 0.90, 0.9999, "higher", "slower"),
    (0.80, 0.75, 0.85, "lower", "lower (better)"),  # CPU went down
    (1.20, 1.10, 1.30, "lower", "higher (worse)"),
    (1.20, None, None, "higher", "undetermined"),
    (None, None, None, "lower", "undetermined"),
])
def test_verdict_boundaries(ratio, low, high, better, expected):
    assert stats.verdict(ratio, low, high, better) == expected


def test_improvement_reads_the_verdict_for_either_direction():
    assert stats.is_improvement("faster") and stats.is_improvement("lower (better)")
    assert stats.is_improvement("slower") is False and stats.is_improvement("higher (worse)") is False
    assert stats.is_improvement("no significant difference") is None


def test_no_nan_from_constant_samples():
    r = stats.ratio_ci([5.0, 5.0], [6.0, 6.0])
    assert (r.ratio, r.low, r.high) == (pytest.approx(1.2), pytest.approx(1.2), pytest.approx(1.2))
    assert not any(math.isnan(x) for x in r)


def test_ratio_to_a_constant_zero_is_zero_with_a_zero_width_interval():
    """b = [0, 0]: b̄ = 0, V_b = 0, so Fieller's quadratic is ρ²(ā² − t²V_a) = 0 and ρ = 0 exactly."""
    r = stats.ratio_ci([9.4e9, 9.5e9, 9.3e9], [0.0, 0.0], level=99)
    assert (r.ratio, r.low, r.high, r.df) == (0.0, 0.0, 0.0, 2)
    assert stats.verdict(*r, "higher") == "slower"
