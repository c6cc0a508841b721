#!/usr/bin/env python3
"""How often `offlab results trend`'s grouping (offlab.report.trend.groups) cuts a series of pure noise, and
how often it finds a step, on normal random series with a fixed seed (no measurement: the method alone).

For each number of runs and each scatter (the standard deviation of run means as a share of their mean),
--trials series of pure noise count the false cuts; series with one step in the middle (the second half
scaled by each --step) count the steps found at the right run. Prints one table; takes seconds.

    .venv/bin/python benchmarks/trend_noise/run.py [--trials 400] [--seed 1]
"""

from __future__ import annotations

import argparse
import random

from offlab.report.trend import groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    steps = (0.9, 0.7, 0.5)
    print(f"{'runs':>5} {'scatter':>8} {'noise cut':>10} " + " ".join(f"{f'step ×{s}':>11}" for s in steps))
    for runs in (4, 6, 12, 24):
        for cv in (0.05, 0.15, 0.30):
            noise = sum(len(groups([rnd.gauss(1, cv) for _ in range(runs)])) > 1 for _ in range(args.trials))
            found = []
            for s in steps:
                half = runs // 2
                hits = sum(groups([rnd.gauss(1, cv) for _ in range(half)] +
                                  [rnd.gauss(s, cv * s) for _ in range(runs - half)]) == [(0, half), (half, runs)]
                           for _ in range(args.trials))
                found.append(hits)
            print(f"{runs:>5} {cv:>7.0%} {noise / args.trials:>10.1%} "
                  + " ".join(f"{h / args.trials:>11.1%}" for h in found))


if __name__ == "__main__":
    main()
