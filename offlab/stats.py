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


# ---- deciding a comparison while looking after every round ---------------------------------
#
# A confidence sequence by alpha spending: look k (k = 1, 2, ...) uses an interval on the ratio at
# level 1 − α_k with α_k = α / (k (k + 1)). Since Σ α_k = α, the chance that ANY look's interval
# misses the true ratio is at most α (the union bound), however many looks are taken and
# whenever one stops. So every interval of the sequence holds at once, they may be intersected,
# and a verdict read off any of them is wrong with probability at most α.
#
# The interval is on the ratio of cell to baseline measured in the same round (paired): a shared
# machine's load that comes and goes moves both samples of a round together and cancels in their
# ratio, and the pairs are independent whatever the variances of the two sides.

EQUIVALENT = "equivalent"
UNDECIDED = "undecided"
MIN_PAIRS = 3  # a paired interval needs 2 degrees of freedom to be worth a look (t(0.9875, 1) = 25)


def look_alpha(alpha: float, look: int) -> float:
    """The error the k-th look may spend: α / (k (k + 1)); the looks together spend at most α."""
    if look < 1:
        raise ValueError("looks count from 1")
    return alpha / (look * (look + 1))


def paired_ratio_ci(a_values: Sequence[float], b_values: Sequence[float], level: float = 99.0) -> Ratio:
    """Ratio b/a from pairs (a_i, b_i) measured together: exp of the mean of ln(b_i / a_i), with
    the Student-t interval exp(d̄ ± t(n − 1)·s_d/√n). A value ≤ 0 has no logarithm: no ratio."""
    n = len(a_values)
    if n == 0 or n != len(b_values):
        raise ValueError("paired_ratio_ci needs the same number of values on both sides")
    if min(a_values) <= 0 or min(b_values) <= 0:
        return Ratio(None, None, None)
    d = [math.log(b / a) for a, b in zip(a_values, b_values, strict=True)]
    mean = math.fsum(d) / n
    if n < 2:
        return Ratio(math.exp(mean), None, None)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    hw = t_quantile(1 - (1 - level / 100) / 2, n - 1) * sd / math.sqrt(n)
    return Ratio(math.exp(mean), math.exp(mean - hw), math.exp(mean + hw), n - 1)


@dataclass(frozen=True)
class Decision:
    """One look at a comparison b/a: the running interval and what it decides."""

    verdict: str  # faster | slower | lower (better) | higher (worse) | equivalent | undecided
    ratio: float | None
    low: float | None  # the running (intersected) interval on the ratio
    high: float | None
    look: int
    level: float  # % of this look's own interval, e.g. 97.5 at look 1 of a 95 % sequence
    n: int  # pairs

    @property
    def decided(self) -> bool:
        return self.verdict != UNDECIDED

    def to_dict(self) -> dict:
        return asdict(self)


def sequential_decision(a_values: Sequence[float], b_values: Sequence[float], look: int, level: float = 95.0,
                        equivalence_pct: float | None = 5.0, better: str = "higher",
                        previous: tuple[float | None, float | None] | None = None) -> Decision:
    """Look `look` at pairs (a_i, b_i): paired_ratio_ci at level 1 − α/(k(k+1)), intersected with
    `previous`. Significant when the running interval excludes 1; equivalent when it lies inside
    [1 − m, 1 + m], m = equivalence_pct / 100; else undecided.
    """
    alpha = 1 - level / 100
    look_level = 100 * (1 - look_alpha(alpha, look))
    r = paired_ratio_ci(a_values, b_values, look_level)
    low, high = r.low, r.high
    if previous is not None and previous[0] is not None and low is not None:
        low, high = max(low, previous[0]), min(high, previous[1])
    verdict = UNDECIDED
    if r.ratio is not None and low is not None and high is not None:
        word = _verdict(r.ratio, low, high, 1.0, better)
        if word != NO_DIFFERENCE:
            verdict = word
        elif equivalence_pct is not None and 1 - equivalence_pct / 100 <= low and high <= 1 + equivalence_pct / 100:
            verdict = EQUIVALENT
    return Decision(verdict, r.ratio, low, high, look, look_level, len(a_values))


def rounds_to_decide(a_values: Sequence[float], b_values: Sequence[float], looks_done: int, level: float = 95.0,
                     equivalence_pct: float | None = 5.0, limit: int = 1000) -> int | None:
    """More rounds (pairs) an undecided comparison would need at the noise of its pairs so far.

    A verdict comes when a later look's half-width t(n − 1)·s_d/√n on the log scale falls below
    the distance from ln(ratio) to 0 (significance) or to the nearer equivalence bound
    (equivalence), at that look's level. None: fewer than two pairs, a value ≤ 0, or more than
    `limit` rounds.
    """
    n0 = len(a_values)
    if n0 < 2 or n0 != len(b_values) or min(a_values) <= 0 or min(b_values) <= 0:
        return None
    d = [math.log(b / a) for a, b in zip(a_values, b_values, strict=True)]
    mean = math.fsum(d) / n0
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n0 - 1))
    target = abs(mean)
    if equivalence_pct is not None:
        m = equivalence_pct / 100
        target = max(target, min(math.log(1 + m) - mean, mean - math.log(1 - m)))
    if target <= 0:
        return None
    alpha = 1 - level / 100
    for extra in range(1, limit + 1):
        n = n0 + extra
        if n < MIN_PAIRS:
            continue
        look = looks_done + n - max(n0, MIN_PAIRS - 1)
        if t_quantile(1 - look_alpha(alpha, look) / 2, n - 1) * sd / math.sqrt(n) < target:
            return extra
    return None


Point = tuple[int, float]  # (round, value): one sample of a cell in a run that pairs by round


def paired(a: Sequence[Point], b: Sequence[Point]) -> tuple[list[float], list[float]]:
    """The values of both sides in the rounds both were measured, in round order."""
    av, bv = dict(a), dict(b)
    both = sorted(set(av) & set(bv))
    return [av[r] for r in both], [bv[r] for r in both]


def replay(a: Sequence[Point], b: Sequence[Point], n0: int, level: float, equivalence: float | None,
           better: str) -> Decision | None:
    """The sequential decision after every look so far, from (round, value) histories: a look at each new
    pair once there are at least max(n0, MIN_PAIRS) pairs, stopping at the first decided look. The
    runner decides by it and every table of the run shows it (offlab.report.compare), so they agree."""
    pa, pb = paired(a, b)
    decision, previous, look = None, None, 0
    for n in range(max(n0, MIN_PAIRS), len(pa) + 1):
        look += 1
        decision = sequential_decision(pa[:n], pb[:n], look, level, equivalence, better, previous)
        previous = (decision.low, decision.high)
        if decision.decided:
            break
    return decision


def partition(parts: Sequence[float], whole: float) -> tuple[list[float], float]:
    """Shares of `whole` that add up to exactly 1: each part's, and the rest's (what no part covers).

    Parts that add up to more than the whole (estimates with bounds, or counts read a little apart) are
    not summed as if exact: each then gets its part of their sum, and the rest is 0.
    """
    total = sum(max(0.0, p) for p in parts)
    base = max(whole, total)
    if base <= 0:
        return [0.0 for _ in parts], 0.0
    shares = [max(0.0, p) / base for p in parts]
    return shares, 1.0 - sum(shares)


def percents(shares: Sequence[float], decimals: int = 0) -> list[str]:
    """Shares that add up to 1 as percentages that add up to 100 as printed (largest remainder):
    [1/3, 1/3, 1/3] → ['33', '33', '34'] rather than three '33'."""
    scale = 10 ** decimals
    exact = [100 * scale * s for s in shares]
    floors = [math.floor(x + 1e-9) for x in exact]
    left = round(100 * scale * sum(shares)) - sum(floors)
    for i in sorted(range(len(exact)), key=lambda i: floors[i] - exact[i])[:max(0, left)]:
        floors[i] += 1
    return [f"{f / scale:.{decimals}f}" for f in floors]


# Two counts of the same thing read at the same edges but not the same instants (a kernel tracepoint's
# map and a counter file, ~0.1 s apart at most): a difference under both of these is agreement.
AGREE_SHARE = 0.01
AGREE_COUNT = 10


def agreement(first: int, second: int, known_to: float = 0) -> dict:
    """first against second: the difference, its share of the second, and whether they agree (within
    AGREE_*, or within `known_to`: what the second is known to itself, e.g. a lost count's ± datagrams)."""
    diff = first - second
    return {"kernel": first, "other": second, "difference": diff,
            "difference_share": diff / second if second else None, **({"known_to": known_to} if known_to else {}),
            "agree": abs(diff) <= max(AGREE_COUNT, AGREE_SHARE * max(first, second), known_to)}
