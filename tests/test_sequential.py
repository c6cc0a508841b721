"""Deciding a comparison while looking after every round: error rates on synthetic data, seeded.

The data are normal samples with a known true ratio, so a verdict is right or wrong by
construction. Each simulated run starts with `n0` values per side and adds one per side per
round until a verdict or `rounds` values, like the runner.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from offlab import stats

SIMS = 2000


def simulate(true_ratio: float, cv: float, *, n0: int = 3, rounds: int = 10, level: float = 95,
             equivalence: float | None = 5, seed: int = 1, peek_fixed: bool = False) -> Counter:
    """Verdicts of SIMS simulated runs. peek_fixed: the naive rule, a fixed-level interval every round."""
    rng = random.Random(seed)
    verdicts: Counter = Counter()
    for _ in range(SIMS):
        a = [rng.gauss(100, 100 * cv) for _ in range(n0)]
        b = [rng.gauss(100 * true_ratio, 100 * cv * true_ratio) for _ in range(n0)]
        previous, verdict = None, stats.UNDECIDED
        for look in range(1, rounds - n0 + 2):
            if peek_fixed:
                r = stats.ratio_ci(a, b, level)
                word = stats.verdict(r.ratio, r.low, r.high, "higher")
                verdict = stats.UNDECIDED if word == stats.NO_DIFFERENCE else word
            else:
                d = stats.sequential_decision(a, b, look, level, equivalence, "higher", previous)
                previous, verdict = (d.low, d.high), d.verdict
            if verdict != stats.UNDECIDED:
                break
            a.append(rng.gauss(100, 100 * cv))
            b.append(rng.gauss(100 * true_ratio, 100 * cv * true_ratio))
        verdicts[verdict] += 1
    return verdicts


def wrong_direction(v: Counter) -> float:
    return (v[stats.FASTER] + v[stats.SLOWER]) / SIMS


@pytest.mark.parametrize("n0,rounds,level", [(3, 10, 95), (2, 8, 95), (3, 30, 95), (3, 10, 99)])
def test_no_effect_is_called_faster_or_slower_at_most_at_the_nominal_rate(n0, rounds, level):
    v = simulate(1.0, 0.05, n0=n0, rounds=rounds, level=level, equivalence=None)
    assert wrong_direction(v) <= 1 - level / 100, v


def test_peeking_every_round_at_a_fixed_level_exceeds_it():
    """Why the looks must spend their error: the naive rule is wrong far more often than 5 %."""
    v = simulate(1.0, 0.05, n0=3, rounds=10, peek_fixed=True)
    assert wrong_direction(v) > 0.10, v


def test_a_true_difference_at_the_margin_is_rarely_called_equivalent():
    """True ratio 1.05 with a ±5 % margin: 'equivalent' would be a false claim."""
    v = simulate(1.05, 0.03, rounds=30)
    assert v[stats.EQUIVALENT] / SIMS <= 0.05, v
    assert v[stats.SLOWER] == 0, v


def test_a_clear_effect_is_decided_in_the_first_looks():
    v = simulate(1.3, 0.05, n0=2, rounds=5)
    assert v[stats.FASTER] / SIMS >= 0.95, v


def test_a_ten_percent_effect_at_five_percent_noise_is_found_in_most_runs_of_ten_rounds():
    v = simulate(1.10, 0.05, rounds=10)
    assert v[stats.FASTER] / SIMS >= 0.5 and v[stats.SLOWER] == 0, v


def test_no_effect_at_low_noise_is_decided_equivalent():
    v = simulate(1.0, 0.02, rounds=10)
    assert v[stats.EQUIVALENT] / SIMS >= 0.75, v


def test_the_looks_spend_alpha_over_k_k_plus_1_and_never_more_than_alpha():
    assert stats.look_alpha(0.05, 1) == pytest.approx(0.025)
    assert stats.look_alpha(0.05, 2) == pytest.approx(0.05 / 6)
    assert sum(stats.look_alpha(0.05, k) for k in range(1, 10_000)) == pytest.approx(0.05, rel=1e-3)
    assert sum(stats.look_alpha(0.05, k) for k in range(1, 10_000)) < 0.05


def test_first_look_is_fiellers_interval_at_97_5_percent_of_a_95_percent_sequence():
    a, b = [100, 101, 99], [300, 310, 290]
    d = stats.sequential_decision(a, b, 1, 95)
    r = stats.ratio_ci(a, b, 97.5)
    assert d.level == pytest.approx(97.5)
    assert (d.ratio, d.low, d.high) == (pytest.approx(3.0), pytest.approx(r.low), pytest.approx(r.high))
    assert d.verdict == stats.FASTER and d.decided


def test_the_running_interval_is_the_intersection_of_the_looks():
    a, b = [100, 104, 96, 100], [103, 99, 107, 103]
    alone = stats.sequential_decision(a, b, 2, 95, None)
    narrowed = stats.sequential_decision(a, b, 2, 95, None, previous=(1.0, 1.02))
    assert alone.low < 1.0 < 1.02 < alone.high
    assert (narrowed.low, narrowed.high) == (pytest.approx(1.0), pytest.approx(1.02))


def test_costs_read_lower_and_higher():
    d = stats.sequential_decision([10, 10.2, 9.8], [5, 5.1, 4.9], 1, 95, better="lower")
    assert d.verdict == stats.LOWER


def test_an_unbounded_first_look_stays_undecided():
    d = stats.sequential_decision([1, 100, 0.5], [50, 52, 51], 1, 95)
    assert d.verdict == stats.UNDECIDED and d.low is None


def test_rounds_to_decide_is_zero_when_decided_and_grows_with_noise():
    a, b = [100, 101, 99], [100, 101.5, 99]
    assert stats.sequential_decision(a, b, 1).verdict == stats.EQUIVALENT
    assert stats.rounds_to_decide(a, b, 1) == 0
    calm = stats.rounds_to_decide([100, 104, 96], [110, 114, 106], 1)
    noisy = stats.rounds_to_decide([100, 120, 80], [110, 130, 90], 1)
    assert calm is not None and noisy is not None and 0 < calm < noisy
    assert stats.rounds_to_decide([100], [110, 111], 1) is None


def test_rounds_to_decide_is_roughly_what_a_simulation_needs():
    """The estimate at the true noise: runs given that many rounds decide in most cases."""
    rng = random.Random(5)
    extra = stats.rounds_to_decide([95, 100, 105], [104.5, 110, 115.5], 1)
    decided = 0
    for _ in range(400):
        a = [rng.gauss(100, 5) for _ in range(3 + extra)]
        b = [rng.gauss(110, 5.5) for _ in range(3 + extra)]
        previous = None
        for look in range(1, extra + 2):
            n = 3 + look - 1
            d = stats.sequential_decision(a[:n], b[:n], look, 95, 5, "higher", previous)
            previous = (d.low, d.high)
        decided += d.decided
    assert decided / 400 >= 0.4
