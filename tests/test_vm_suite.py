"""Guest measurements that show direction: where TCP segmentation happened, and a gro-gso-vm cell.

Real TCG guests, real taps. No speeds are asserted (TCG on a shared 2-core host): the proof is the
tap's bytes per packet — a super-packet crosses it whole (~64 KB) only when the guest may hand
TSO super-packets to virtio-net.
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from offlab.experiment import suites
from offlab.experiment.plan import load_plan
from offlab.experiment.runner import Runner
from offlab.metrics import TCG_MARK
from offlab.sample import StoredSample
from offlab.store import Store
from tests.conftest import requires_root

pytestmark = [
    requires_root,
    pytest.mark.network,
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                       reason="QEMU is not installed (scripts/install-deps installs it)"),
]

FRAME_1500 = 1500 + 14


def _tap_rx_avg(sample: StoredSample, tap: str) -> float | None:
    return sample.probes.interfaces[f"server:{tap}"].rx_avg_bytes


def test_guest_tso_carries_super_packets_over_the_tap_and_the_sample_records_its_guest(lab_name, clean_machine,
                                                                                       monkeypatch):
    from offlab import lab as labs
    from offlab.experiment import teardown
    from offlab.experiment.measure import measure
    from offlab.hosts.guest import GuestHost
    from offlab.knobs import Change, Transaction
    from offlab.traffic import Workload

    sent: list[list[str]] = []  # every command offlab sends the guest (each a channel round trip)
    real = GuestHost.run_bytes

    def counted(self, argv, **kw):
        sent.append([str(a) for a in argv])
        return real(self, argv, **kw)

    monkeypatch.setattr(GuestHost, "run_bytes", counted)
    lab = labs.up("vm", lab_name)
    try:
        tap = lab.hosts["client"].guest["tap"]
        # 100 Mbit/s: what is checked is the size of the frames on the tap, which TSO decides whatever the
        # rate (iperf3 still writes 128 KiB at a time), not how fast (full speed takes both host CPUs under TCG)
        w = dict(tool="iperf3", protocol="tcp", duration=1.0, warmup=0.5, rate="100M")
        on = measure(lab, Workload(**w))
        with Transaction(label="test guest tso off") as tx:
            sent.clear()
            outcomes = tx.apply([Change(lab.client, k, "off", "eth0", lab) for k in ("tso", "gso")])
            writes = [a for a in sent if a[:2] == ["ethtool", "-K"]]
            reads = [a for a in sent if a[:2] == ["ethtool", "-k"]]
            off = measure(lab, Workload(**w))
            sent.clear()
            in_force = tx.in_force()
            reads_back = [a for a in sent if a[:2] == ["ethtool", "-k"]]
        tso_after = lab.client.run(["ethtool", "-k", "eth0"]).stdout
    finally:
        teardown.down(lab.name, force=True)
    # Each setting journalled from a read, written, read back; the pass over the settings in force reads
    # the interface once for both; the run's end puts TSO back on.
    assert all(o.ok and o.journalled for o in outcomes) and len(writes) == 2
    assert 2 * 2 <= len(reads) <= 2 * 3  # before and after each write, and at most one to resolve its name
    assert [d["value"] for d in in_force] == ["off", "off"] and len(reads_back) == 1
    assert "tcp-segmentation-offload: on" in tso_after
    assert on.traffic.throughput_bps > 0 and off.traffic.throughput_bps > 0
    assert _tap_rx_avg(on, tap) > 4 * FRAME_1500  # TSO super-packets crossed virtio-net and the tap whole
    assert _tap_rx_avg(off, tap) <= FRAME_1500  # the guest segmented: MSS-sized frames on the tap
    assert on.guests is not None
    guest = on.guests["client"]
    assert guest.accel in ("tcg", "kvm") and guest.vhost is False and guest.qemu_version
    assert any(TCG_MARK in n for n in on.notes) == (guest.accel == "tcg")


def test_a_gro_gso_vm_cell_boots_its_guest_with_host_tso4_off(tmp_path, clean_machine):
    """QEMU host_tso4=off reaches the device: the guest cannot do TSO, the tap sees MSS-sized frames."""
    data = yaml.safe_load(suites.text("gro-gso-vm"))
    data.update(only=[{"placement": "kernel-gso-gro", "direction": "guest-to-host"}],
                # 100 Mbit/s: the guest's frame sizes on the tap are checked, not its speed (TCG at full speed
                # takes both host CPUs)
                workload={**data["workload"], "duration": 1, "warmup": 0.5, "rate": "100M"},
                repeat={"min": 1, "max": 1, "level": 95, "width": 200}, seed=3)
    for key in ("baseline", "headline", "quick", "quick_workload"):  # one cell alone: nothing to compare
        data.pop(key)
    plan = load_plan(yaml.safe_dump(data, sort_keys=False), "gro-gso-vm-cell.yaml")
    store = Store.open(tmp_path / "r.db")
    run_id = Runner(plan, store).run()
    (cell,) = store.cells(run_id)
    (s,) = store.samples(run_id)
    sample = s["sample"]
    assert cell["status"] in ("done", "confidence_not_reached"), cell["reason"]
    (lab,) = store.get_run(run_id)["env"]["labs"]
    guest = lab["hosts"]["client"]
    assert guest["guest"]["nic_properties"] == {"host_tso4": "off", "guest_tso4": "off"}
    eth0 = guest["interfaces"][0]
    assert eth0["features"]["tx-tcp-segmentation"] is False and "tx-tcp-segmentation" in eth0["fixed"]
    tap = guest["guest"]["tap"]
    assert sample["traffic"]["throughput_bps"] > 0
    assert _tap_rx_avg(StoredSample.from_json(sample), tap) <= FRAME_1500
    store.close()
