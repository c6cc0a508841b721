"""The negotiation chain builder on real captured outputs (QEMU 10.0.2 QMP, a 6.12 guest's sysfs and
ethtool, the host tap's ethtool), and the feature dependencies on captured veth ethtool output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offlab.netdev import held_off, parse_features
from offlab.vm import virtio

FIX = Path(__file__).parent / "fixtures"


def chain(case: str) -> virtio.NicChain:
    d = FIX / "virtio" / case
    status = json.loads((d / "x-query-virtio-status.json").read_text())
    return virtio.build(
        role="client", iface="eth0", device_id="nic0",
        effective=json.loads((d / "qom-get.json").read_text()),
        set_props=json.loads((d / "nic.json").read_text())["set_properties"],
        offered=virtio.parse_status_features(status["host-features"]),
        accepted=virtio.parse_sysfs_features((d / "guest-features").read_text()),
        guest_feats=parse_features((d / "guest-ethtool-k.txt").read_text()),
        tap_feats=parse_features((d / "tap-ethtool-k.txt").read_text()), tap="olex10", tap_host="server")


def test_host_uso_off_explains_the_fixed_udp_segmentation():
    row = chain("host_uso_off").row("host_uso")
    assert (row.value, row.source, row.bit, row.offered, row.accepted) == ("off", "set", 56, False, False)
    assert row.guest == {"tx-udp-segmentation": "off [fixed]"}
    assert row.why == "tx-udp-segmentation off [fixed]: host_uso=off, VIRTIO_NET_F_HOST_USO (bit 56) not offered"


def test_a_chain_as_a_sample_holds_it_reads_its_rows_as_fields_and_writes_back_its_json():
    c = chain("host_uso_off")
    nic = c.stored()
    assert json.dumps(nic.to_json()) == json.dumps(c.to_json())
    row = next(r for r in nic.rows if r.prop == "host_uso")
    assert (row.bit, row.offered, row.lacking, row.fixed_off) == (56, False, c.row("host_uso").lacking, True)
    assert row.why == c.row("host_uso").why


def test_default_host_uso_is_on_from_qemus_default_and_the_guest_leaves_uso_off_but_changeable():
    c = chain("default")
    row = c.row("host_uso")
    assert (row.value, row.source, row.offered, row.accepted) == ("on", "default", True, True)
    assert row.guest == {"tx-udp-segmentation": "off"}  # not [fixed]: negotiated, the 6.12 driver leaves it off
    assert "`ethtool -K eth0 tx-udp-segmentation on` in the guest" in row.why
    # host → guest: the guest accepted USO4 and USO6, so QEMU's TUNSETOFFLOAD turned the tap's USO on
    assert c.row("guest_uso6").tap == {"tx-udp-segmentation": "on"}
    assert c.row("guest_uso6").accepted is True


def test_a_vhost_user_backend_that_lacks_uso_is_named_as_the_reason_uso_is_fixed():
    # dpdk-vm: testpmd's net_vhost port (tso=1) behind the guest; host_uso stays QEMU's default, on
    d = FIX / "virtio" / "dpdk_vhost_user"
    status = json.loads((d / "x-query-virtio-status.json").read_text())
    backend = virtio.parse_status_features(status["backend-features"])
    assert 56 not in backend and {0, 11} <= backend
    c = virtio.build(role="server", iface="eth0", device_id="nic0",
                     effective=json.loads((d / "qom-get.json").read_text()),
                     set_props=json.loads((d / "nic.json").read_text())["set_properties"],
                     offered=virtio.parse_status_features(status["host-features"]),
                     accepted=virtio.parse_sysfs_features((d / "guest-features").read_text()),
                     guest_feats=parse_features((d / "guest-ethtool-k.txt").read_text()), tap_feats=None,
                     vhost_user="/run/x/vhost0.sock", backend_bits=backend)
    row = c.row("host_uso")
    assert (row.value, row.source, row.offered, row.accepted) == ("on", "default", False, False)
    assert row.why == ("tx-udp-segmentation off [fixed]: host_uso=on (QEMU's default) but VIRTIO_NET_F_HOST_USO "
                       "(bit 56) not offered: the vhost-user backend does not offer it (its backend-features lack "
                       "the bit)")
    assert c.row("host_tso4").guest == {"tx-tcp-segmentation": "on"}
    assert c.backend == "vhost-user /run/x/vhost0.sock" and c.row("guest_tso4").tap == {}


def test_every_property_the_issue_names_has_a_row_with_its_virtio_bit():
    c = chain("default")
    bits = {r.prop: r.bit for r in c.rows}
    assert bits == {"csum": 0, "guest_csum": 1, "host_tso4": 11, "host_tso6": 12, "host_ecn": 13, "host_ufo": 14,
                    "host_uso": 56, "guest_tso4": 7, "guest_tso6": 8, "guest_ecn": 9, "guest_ufo": 10,
                    "guest_uso4": 54, "guest_uso6": 55, "mrg_rxbuf": 15, "ctrl_vq": 17, "mq": 22,
                    "ctrl_guest_offloads": 2}
    assert c.row("mq").value == "off" and c.row("mq").offered is False  # QEMU's default: mq off


def test_guest_rx_gro_hw_off_takes_the_taps_tso_and_uso_back_over_the_control_queue():
    c = chain("host_uso_off_gro_hw_off")
    row = c.row("guest_tso4")
    assert row.guest == {"rx-gro-hw": "off"} and row.tap == {"tx-tcp-segmentation": "off"}
    assert "the guest switched its rx-gro-hw off" in row.why and "CTRL_GUEST_OFFLOADS" in row.why
    assert c.row("guest_uso4").tap == {"tx-udp-segmentation": "off"}
    # the same lab before the guest switched it: the tap had TSO
    assert chain("host_uso_off").row("guest_tso4").tap == {"tx-tcp-segmentation": "on"}


@pytest.mark.parametrize("case", ["default", "host_uso_off"])
def test_qemus_accepted_bits_match_the_guests_sysfs_bits(case):
    # QEMU 10.0 names bit 55 "VIRTIO_NET_F_GUEST_USO4: ... USOv6": read by its description, both agree
    d = FIX / "virtio" / case
    status = json.loads((d / "x-query-virtio-status.json").read_text())
    sysfs = virtio.parse_sysfs_features((d / "guest-features").read_text())
    assert virtio.parse_status_features(status["guest-features"]) == sysfs
    assert {54, 55} <= sysfs


def test_host_uso_is_offered_only_when_on():
    offered = {case: virtio.parse_status_features(json.loads(
        (FIX / "virtio" / case / "x-query-virtio-status.json").read_text())["host-features"])
        for case in ("default", "host_uso_off")}
    assert 56 in offered["default"] and 56 not in offered["host_uso_off"]
    assert offered["default"] - offered["host_uso_off"] == {56}


def test_unread_parts_leave_the_reason_honest():
    c = virtio.build(role="client", iface="eth0", device_id="nic0", effective={}, set_props={"host_uso": "off"},
                     offered=None, accepted=None, guest_feats=None, tap_feats=None, problems=["QMP: gone"])
    row = c.row("host_uso")
    assert (row.value, row.source, row.offered, row.accepted) == ("off", "set", None, None)
    assert "accepted unknown" in row.why
    assert c.row("csum").source == "unread"
    assert "  could not read: QMP: gone" in c.lines()


def test_a_sysfs_feature_string_that_is_not_bits_is_refused():
    with pytest.raises(ValueError, match="not a virtio feature bit string"):
        virtio.parse_sysfs_features("virtio1\n")


def test_tx_checksumming_off_holds_tso_and_uso_off_and_names_it():
    before = held_off(parse_features((FIX / "features" / "veth-before.txt").read_text()))
    after = held_off(parse_features((FIX / "features" / "veth-tx-off.txt").read_text()))
    assert before == {}
    want = "needs tx-checksumming, which is off"
    assert {k: after[k] for k in ("tx-tcp-segmentation", "tx-tcp6-segmentation", "tx-udp-segmentation")} == \
        {"tx-tcp-segmentation": want, "tx-tcp6-segmentation": want, "tx-udp-segmentation": want}


def test_scatter_gather_off_holds_tso_and_gso_off_but_not_uso():
    after = held_off(parse_features((FIX / "features" / "veth-sg-off.txt").read_text()))
    assert after["tx-tcp-segmentation"] == "needs scatter-gather, which is off"
    assert after["generic-segmentation-offload"] == "needs scatter-gather, which is off"
    assert "tx-udp-segmentation" not in after  # 6.18 keeps USO on without scatter-gather


def test_results_show_json_gives_the_chain_a_guest_sample_stored(tmp_path):
    import random

    from offlab.metrics import metrics_of
    from offlab.sample import StoredSample
    from offlab.store import Store
    from tests.conftest import offlab_cli
    from tests.synthetic_results import ENV, PLAN_TEXT, sample

    db = tmp_path / "r.db"
    store = Store.open(db)
    plan = {"name": "g", "axes": {}, "repeat": {"min": 1, "max": 1, "level": 99, "width": 5}}
    run = store.create_run("g", PLAN_TEXT, plan, 1, ENV, None, plan["repeat"])
    cid = store.add_cells(run, [{"key": "only", "params": {}, "settings": {}}])["only"]
    s = sample(random.Random(1), payload=1472, mtu=1500, gso=True, throughput_bps=1e9)
    s["guests"] = {"client": {"accel": "tcg", "vhost": False, "qemu_version": "10.0.2",
                              "kernel_release": "6.12.117+deb12-cloud-amd64",
                              "nics": [chain("host_uso_off").to_json()]}}
    store.add_sample(run, cid, 0, s, metrics_of(StoredSample.from_json(s)))
    store.set_cell_status(cid, "done")
    store.set_run_status(run, "done")
    store.close()
    res = offlab_cli("results", "show", str(run), "--db", str(db), "--json")
    assert res.returncode == 0, res.stderr
    (stored,) = json.loads(res.stdout)["samples"]
    (nic,) = stored["sample"]["guests"]["client"]["nics"]
    uso = next(r for r in nic["rows"] if r["prop"] == "host_uso")
    assert uso["why"] == "tx-udp-segmentation off [fixed]: host_uso=off, VIRTIO_NET_F_HOST_USO (bit 56) not offered"
