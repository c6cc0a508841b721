"""What offlab learns about a lab's hosts ends with the lab (hosts/memo.py): a lab of the same name
built next sees fresh feature names and clock estimates, never the removed one's. Real namespaces and
a real sshd pair (an SSH host's reads are the round trips the memo saves); nothing is mocked."""

from __future__ import annotations

import json
import shutil

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.hosts import NetnsHost
from offlab.hosts import memo
from offlab.knobs import knob_for
from offlab.knobs.queues import possible_cpus
from offlab.knobs.target import target_for
from offlab.lab import hosts as hosts_lab
from offlab.probes import CLOCK_EXCHANGES, ProbeSession
from tests import sshd as sshd_mod
from tests.conftest import OUR_NAMESPACES, requires_root
from tests.helpers import stand_in_machines

pytestmark = requires_root


def test_a_removed_labs_namespaces_keep_nothing_and_its_successor_starts_empty(lab_name, clean_machine):
    """A namespace host's memo (where testpmd's answers are kept) is dropped by the lab's removal."""
    built = labs.up("veth", lab_name)
    try:
        client = built.host("client")
        client.memo.put("probe", 1)
        assert NetnsHost(client.netns_name).memo.get("probe") == 1  # found again from a rebuilt host
    finally:
        teardown.down(lab_name)
    assert not memo.kept(client.key)
    again = labs.up("veth", lab_name)
    try:
        assert again.host("client").key == client.key  # the same name: the same host key
        assert again.host("client").memo.get("probe") is None
    finally:
        teardown.down(lab_name)


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                    reason="QEMU is not installed (scripts/install-deps installs it)")
def test_a_removed_guest_labs_channel_is_closed_and_what_it_learned_is_gone(lab_name, clean_machine):
    from offlab.hosts.guest import _CHANNELS

    built = labs.up("vm", lab_name)
    try:
        guest = built.host("client")
        names = knob_for(target_for(guest, "eth0", built), "gro").names  # a round trip, kept in its memo
        assert names and guest.socket in _CHANNELS
        assert built.host("client").memo.get(("feature names", "eth0", "gro")) == names
    finally:
        teardown.down(lab_name)
    assert guest.socket not in _CHANNELS  # closed with its lab, not left for the process's life
    assert not memo.kept(guest.key)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with stand_in_machines(lambda: sshd_mod.start_pair(tmp_path_factory.mktemp("hm"), f"{OUR_NAMESPACES[0]}hm", subnet=234)) as p:
        yield p


def test_an_ssh_lab_of_the_same_name_sees_fresh_feature_names_cpus_and_clock_exchanges(pair, tmp_path, state_dir,
                                                                                       lab_name):
    inv = tmp_path / "inventory.yml"
    inv.write_text(json.dumps(pair.inventory()))  # JSON is YAML

    def gro(lab):
        return knob_for(target_for(lab.host("server"), "t1", lab), "gro")

    first = hosts_lab.up(lab_name, str(inv))
    try:
        server = first.host("server")
        assert not server.shares_kernel
        real = gro(first).names
        assert real and "stale-name" not in real
        assert possible_cpus(server) >= 1
        # What the host's memo holds is what the next knob of this lab gets, without asking the host:
        # a stale answer planted there shows it is used (and, below, that the next lab does not see it).
        server.memo.put(("feature names", "t1", "gro"), ["stale-name"])
        server.memo.put("possible cpus", 999)
        assert gro(first).names == ["stale-name"]
        assert possible_cpus(first.host("server")) == 999
        with ProbeSession(first) as s:
            assert len(s.exchanges["server"]) == CLOCK_EXCHANGES  # the lab's first session: a fresh estimate
        with ProbeSession(first) as s:
            assert len(s.exchanges["server"]) == CLOCK_EXCHANGES + 1  # kept from the last one, plus one
    finally:
        teardown.down(lab_name)
    assert not memo.kept(server.key)

    second = hosts_lab.up(lab_name, str(inv))
    try:
        assert second.host("server").key == server.key  # the same machine and lab name: the same key
        assert gro(second).names == real
        assert possible_cpus(second.host("server")) != 999
        with ProbeSession(second) as s:
            assert len(s.exchanges["server"]) == CLOCK_EXCHANGES  # nothing kept from the removed lab
    finally:
        teardown.down(lab_name)
