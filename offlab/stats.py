"""Confidence intervals on repetition means, their stopping rule, and ratios of means.

Pure functions over lists of floats. The t quantile comes from scipy.special.stdtrit, the
function scipy.stats.t.ppf calls, without the second of import time scipy.stats costs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile: P(T <= q) = p with df degrees of freedom (df may be fractional)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


@dataclass(frozen=True)
class CI:
    """Student-t interval on a mean. With n = 1 there is no interval: low/high/half_width are None."""

    mean: float
    low: float | None
    high: float | None
    half_width: float | None
    n: int
    rel_half_width: float | None  # half_width / |mean| as a fraction; None when n = 1 or mean = 0
    level: float = 99.0
    sd: float | None = None

    @property
    def width_pct(self) -> float | None:
        """The full interval as % of the mean: the figure netperf prints in
        "!!! Confidence intervals: Throughput : 6.663%"."""
        return None if self.rel_half_width is None else 200.0 * self.rel_half_width

    def to_dict(self) -> dict:
        return {**asdict(self), "width_pct": self.width_pct}


def mean_ci(values: Sequence[float], level: float = 99.0) -> CI:
    """Mean of `values` and its two-sided Student-t interval at `level` % (n - 1 degrees of freedom)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci of no values")
    mean = math.fsum(values) / n
    if n == 1:
        return CI(mean, None, None, None, 1, None, level, None)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    hw = t_quantile(1 - (1 - level / 100) / 2, n - 1) * sd / math.sqrt(n)
    rel = hw / abs(mean) if mean != 0 else (0.0 if hw == 0 else None)
    return CI(mean, mean - hw, mean + hw, hw, n, rel, level, sd)


def converged(values: Sequence[float], level: float = 99.0, width: float = 5.0) -> bool:
    """netperf's `-I level,width`: the half-width is within width/2 % of the mean.

    `-I 99,5` asks to be 99 % confident that the mean is within ±2.5 % of the true mean, i.e. the
    whole interval is at most 5 % of the mean wide (netperf: "+/-2.500% @ 99% conf."). Needs at
    least two values; identical values (half-width 0) have converged, even at mean 0.
    """
    if len(values) < 2:
        return False
    ci = mean_ci(values, level)
    return ci.half_width <= width / 200.0 * abs(ci.mean)


@dataclass(frozen=True)
class Ratio:
    """mean(b) / mean(a) with its interval; low/high None when no bounded interval exists."""

    ratio: float | None
    low: float | None
    high: float | None
    df: float | None = None
    unbounded: bool = False  # Fieller's set is not an interval: the baseline mean is not clearly ≠ 0

    def __iter__(self):
        return iter((self.ratio, self.low, self.high))


def ratio_ci(a_values: Sequence[float], b_values: Sequence[float], level: float = 99.0) -> Ratio:
    """Ratio of means b/a with Fieller's interval for two independent samples.

    Fieller: the interval is every ρ with (b̄ − ρ·ā)² ≤ t²·(V_b + ρ²·V_a), V = s²/n, solved as a
    quadratic in ρ. Variances may differ, so the degrees of freedom are Welch–Satterthwaite's for
    b̄ − ρ·ā at ρ = b̄/ā:  df = (V_b + r²V_a)² / (V_b²/(n_b−1) + r⁴V_a²/(n_a−1)).
    When ā is not significantly different from 0 the set is unbounded: low/high are None.
    One value on either side: the ratio without an interval.
    """
    na, nb = len(a_values), len(b_values)
    if na == 0 or nb == 0:
        raise ValueError("ratio_ci needs values on both sides")
    ma, mb = math.fsum(a_values) / na, math.fsum(b_values) / nb
    if ma == 0:
        return Ratio(None, None, None)
    r = mb / ma
    if na < 2 or nb < 2:
        return Ratio(r, None, None)
    va = math.fsum((v - ma) ** 2 for v in a_values) / (na - 1) / na
    vb = math.fsum((v - mb) ** 2 for v in b_values) / (nb - 1) / nb
    if va == 0 and vb == 0:
        return Ratio(r, r, r)
    denominator = vb * vb / (nb - 1) + r ** 4 * va * va / (na - 1)
    # b constant at 0 (a dead path): all the uncertainty is a's, with its n − 1 degrees of freedom.
    df = (vb + r * r * va) ** 2 / denominator if denominator > 0 else na - 1
    t2 = t_quantile(1 - (1 - level / 100) / 2, df) ** 2
    qa = ma * ma - t2 * va  # coefficient of ρ²; ≤ 0: ā is indistinguishable from 0
    if qa <= 0:
        return Ratio(r, None, None, df, unbounded=True)
    qc = mb * mb - t2 * vb
    disc = (ma * mb) ** 2 - qa * qc
    root = math.sqrt(max(disc, 0.0))
    return Ratio(r, (ma * mb - root) / qa, (ma * mb + root) / qa, df)


@dataclass(frozen=True)
class Diff:
    """mean(b) − mean(a) with Welch's interval; used where a ratio is undefined (baseline mean 0)."""

    diff: float
    low: float | None
    high: float | None


def diff_ci(a_values: Sequence[float], b_values: Sequence[float], level: float = 99.0) -> Diff:
    """Difference of means b − a with Welch's t interval (Welch–Satterthwaite df)."""
    na, nb = len(a_values), len(b_values)
    ma, mb = math.fsum(a_values) / na, math.fsum(b_values) / nb
    d = mb - ma
    if na < 2 or nb < 2:
        return Diff(d, None, None)
    va = math.fsum((v - ma) ** 2 for v in a_values) / (na - 1) / na
    vb = math.fsum((v - mb) ** 2 for v in b_values) / (nb - 1) / nb
    if va + vb == 0:
        return Diff(d, d, d)
    df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    hw = t_quantile(1 - (1 - level / 100) / 2, df) * math.sqrt(va + vb)
    return Diff(d, d - hw, d + hw)


FASTER, SLOWER = "faster", "slower"
LOWER, HIGHER = "lower (better)", "higher (worse)"
NO_DIFFERENCE = "no significant difference"
UNDETERMINED = "undetermined"  # no interval: fewer than two values on a side, or baseline mean 0
UNBOUNDED = "unbounded interval: no verdict"  # Fieller: the baseline is not significantly different from 0


def verdict(ratio: float | None, low: float | None, high: float | None, better: str) -> str:
    """Word for a ratio b/a and its interval: significant only when the interval excludes 1.

    Rates (better="higher": throughput, pps) read "faster" / "slower"; costs (better="lower":
    CPU, service demand, loss) read "lower (better)" / "higher (worse)". An interval touching 1
    is "no significant difference".
    """
    return _verdict(ratio, low, high, 1.0, better)


def verdict_diff(diff: float | None, low: float | None, high: float | None, better: str) -> str:
    """The same words for a difference b − a and its interval: significant when it excludes 0."""
    return _verdict(diff, low, high, 0.0, better)


def _verdict(value: float | None, low: float | None, high: float | None, no_change: float, better: str) -> str:
    if value is None or low is None or high is None:
        return UNDETERMINED
    if low > no_change:
        return FASTER if better == "higher" else HIGHER
    if high < no_change:
        return SLOWER if better == "higher" else LOWER
    return NO_DIFFERENCE


def is_improvement(v: str) -> bool | None:
    """True for a verdict that is good news, False for bad news, None for neither."""
    return {FASTER: True, LOWER: True, SLOWER: False, HIGHER: False}.get(v)
