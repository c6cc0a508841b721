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


def test_every_guest_suites_quick_run_decides_its_headline_in_the_one_guest_it_boots():
    """A guest boot is 10-100 s here: --quick of each guest suite measures its headline, its shape cells
    and their baselines in a single guest, with its own shorter samples, within the 2-minute budget."""
    for name in ("uso-vm", "gro-gso-vm", "virtio-tuning"):
        full, quick = suites.plans(name)[0], suites.plans(name, quick=True)[0]
        assert len({c.lab_key for c in quick.cells}) == 1, name
        assert quick.cells[0].lab_key == full.cells[0].lab_key, name  # the guest a full run boots first
        assert quick.headline and quick.budget_s == 120, name
        assert {c.workload.duration for c in quick.cells} == {1}, name
        assert min(c.workload.duration for c in full.cells) > 1, name
        headline = [c for c in quick.cells if any(all(c.params[k] == v for k, v in h.items()) for h in quick.headline)]
        assert headline and all(c.params != quick.baseline for c in headline), name


def test_virtio_tuning_switches_its_queues_in_the_guest_against_one_queue_in_use():
    [quick] = suites.plans("virtio-tuning", quick=True)
    assert quick.cells[0].topology.nic == {"queues": 2}  # one boot, both queue pairs there
    combined = {c.params["nic"]: dict(((t, k), v) for t, k, v in c.changes)[("router:eth1", "channels.combined")]
                for c in quick.cells}
    assert combined == {"q2-use1": 1, "q2": 2, "q2-xps": 2}
    assert quick.baseline == {"nic": "q2-use1", "bridge-nf": "off"}
