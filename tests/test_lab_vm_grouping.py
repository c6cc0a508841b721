"""The runner keeps one guest lab up at a time: cells are grouped by guest, the guest that is up first."""

from __future__ import annotations

import random

from offlab.experiment import suites
from offlab.experiment.runner import CellState, Runner


def _groups(order: list[CellState]) -> list[str]:
    keys = [c.cell.lab_key for c in order]
    return [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]


def test_cells_needing_other_qemu_properties_run_grouped_with_the_guest_that_is_up_first():
    plan = suites.plans("virtio-tuning")[0]
    runner = Runner(plan, store=None)
    runner.one_guest_at_a_time = True
    keys = list(dict.fromkeys(c.lab_key for c in plan.cells))
    assert len(keys) == 3  # q1, q2 (shared by q2 and q2-xps), rx1024: three guests
    for rnd in range(6):
        up = keys[rnd % 3]
        runner.labs = {up: object()}
        order = runner._order([CellState(c, i) for i, c in enumerate(plan.cells)], rnd)
        assert sorted(c.cell.key for c in order) == sorted(c.key for c in plan.cells)
        groups = _groups(order)
        assert len(groups) == len(set(groups)) == 3  # each guest once a round: at most 2 restarts
        assert groups[0] == up


def test_plans_with_one_lab_per_topology_keep_the_plain_seeded_shuffle():
    plan = suites.plans("pps")[0]
    runner = Runner(plan, store=None)
    cells = [CellState(c, i) for i, c in enumerate(plan.cells)]
    expected = list(cells)
    random.Random(runner.seed * 1009 + 1).shuffle(expected)
    assert runner._order(list(cells), 1) == expected


def test_a_deciding_run_also_boots_each_guest_at_most_once_a_round():
    """uso-vm decides: its rounds come from the Decider (headline first, A B … B A), and
    they are grouped by guest too — before, 1500 → 9000 → 1500 cost three guest boots in one round."""
    from offlab.experiment.decide import Decider

    plan = suites.plans("uso-vm")[0]
    runner = Runner(plan, store=None)
    runner.one_guest_at_a_time = True
    cells = [CellState(c, i) for i, c in enumerate(plan.cells)]
    runner.cells = cells
    keys = list(dict.fromkeys(c.lab_key for c in plan.cells))
    assert len(keys) == 2  # MTU 1500 and 9000: two guests
    decider = Decider(plan, cells)
    for rnd in range(4):
        up = keys[rnd % 2]
        runner.labs = {up: object()}
        order = runner._by_guest(decider.order(rnd, 7))
        assert sorted(c.cell.key for c in order) == sorted(c.key for c in plan.cells)
        groups = _groups(order)
        assert len(groups) == len(set(groups)) == 2 and groups[0] == up
    # The Decider's own order switches guests more often than that: the grouping is what saves boots.
    assert max(len(_groups(decider.order(rnd, 7))) for rnd in range(4)) > 2
