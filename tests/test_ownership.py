"""Ownership: a lab belongs to the state directory that made it; no other offlab removes it."""

from __future__ import annotations

import json

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.errors import BadInput
from offlab.lab.model import LabState
from tests.conftest import netns_names, offlab_cli, requires_root

pytestmark = [requires_root, pytest.mark.network]


@pytest.fixture
def other_state_dir(tmp_path):
    d = tmp_path / "other-state"
    d.mkdir()
    return d


def test_same_lab_name_in_another_state_dir_is_refused_and_never_destroys_the_first(
        lab_name, state_dir, other_state_dir, monkeypatch, clean_machine):
    from offlab.lab import owner

    first = labs.up("veth", lab_name)
    try:
        mine = set(first.namespaces)
        assert all(owner.owner_of(ns) == str(state_dir.resolve()) for ns in mine)
        monkeypatch.setenv("OFFLAB_STATE_DIR", str(other_state_dir))
        with pytest.raises(BadInput, match=f"taken by the state directory {state_dir.resolve()}"):
            labs.up("veth", lab_name)
        with pytest.raises(BadInput, match=f"belongs to {state_dir.resolve()}"):
            teardown.down(lab_name)
        res = offlab_cli("lab", "down", lab_name, env={"OFFLAB_STATE_DIR": str(other_state_dir)})
        assert res.returncode == 2 and "offlab leaves it alone" in res.stderr and "Traceback" not in res.stderr
        assert mine <= netns_names()
        # The first lab still works: its namespaces were not touched.
        assert first.client.run(["ping", "-c", "1", "-W", "1", first.entry("server").address], check=False).ok
    finally:
        monkeypatch.setenv("OFFLAB_STATE_DIR", str(state_dir))
        teardown.down(lab_name)
    assert not set(first.namespaces) & netns_names()


def test_a_state_file_listing_anothers_namespaces_removes_only_itself(
        lab_name, state_dir, other_state_dir, monkeypatch, clean_machine):
    first = labs.up("veth", lab_name)
    try:
        # What an older offlab (or a `lab up` that lost the race for the name) leaves behind.
        monkeypatch.setenv("OFFLAB_STATE_DIR", str(other_state_dir))
        stray = LabState(name=lab_name, topology="veth", mtu=1500, namespaces=list(first.namespaces))
        stray.save()
        removed = teardown.down(lab_name)
        assert not stray.path.exists()
        assert any(f"belongs to {state_dir.resolve()}" in r for r in removed)
        assert not any(r.startswith("namespace ") for r in removed)
        assert set(first.namespaces) <= netns_names()
    finally:
        monkeypatch.setenv("OFFLAB_STATE_DIR", str(state_dir))
        teardown.down(lab_name)


def test_an_unmarked_namespace_with_a_lab_name_is_not_offlabs_to_delete(lab_name, state_dir, clean_machine):
    from offlab.hosts import LOCAL

    ns = f"ol-{lab_name}-client"
    LOCAL.run(["ip", "netns", "add", ns])
    try:
        with pytest.raises(BadInput, match=f"namespace {ns} belongs to no offlab state directory"):
            teardown.down(lab_name)
        assert ns in netns_names()
    finally:
        LOCAL.run(["ip", "netns", "del", ns])


def test_lab_state_records_owner_and_namespace_inodes(lab_name, state_dir, clean_machine):
    from offlab.lab import owner

    lab = labs.up("veth", lab_name)
    try:
        saved = json.loads(lab.path.read_text())
        assert saved["owner"] == str(state_dir.resolve())
        assert set(saved["netns_inodes"]) == set(lab.namespaces)
        assert all(saved["netns_inodes"][ns] == owner.inode(ns) for ns in lab.namespaces)
    finally:
        teardown.down(lab_name)


def test_a_recorded_daemon_pid_running_outside_the_labs_namespace_is_not_stopped(lab_name, state_dir, clean_machine):
    import subprocess

    from offlab.hosts import LOCAL
    from offlab.lab.model import Daemon

    lab = labs.up("veth", lab_name)
    # A process of the same name and pid as the record, in the machine's namespace: not the lab's daemon.
    other = LOCAL.spawn(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lab.daemons.append(Daemon(name="sleep", pid=other.pid, netns=lab.hosts["client"].netns))
        lab.save()
        removed = teardown.down(lab_name)
        assert f"namespace ol-{lab_name}-client" in removed
        assert other.poll() is None, "a process outside the lab's namespace was stopped"
    finally:
        other.kill()
        other.wait()


def test_a_namespace_file_left_by_a_cut_off_ip_netns_add_goes_with_the_lab_only_if_recorded(
        lab_name, state_dir, clean_machine):
    """`ip netns add` creates /run/netns/NAME, then mounts the new namespace on it; a signal during
    `lab up` kills it in between (subprocess.run kills its child when interrupted). The empty file is
    what it leaves: `lab down` removes it when the lab's state recorded the name (it is recorded before
    `ip netns add` runs), and leaves one it did not record."""
    import os

    from offlab.hosts.local import NETNS_DIR
    from offlab.lab import owner

    ns, stranger = f"ol-{lab_name}-client", f"ol-{lab_name}-server"
    for name in (ns, stranger):
        with open(os.path.join(NETNS_DIR, name), "x"):  # what `ip netns add` makes before its mount
            pass
    try:
        assert owner.half_made(ns) and {ns, stranger} <= netns_names()
        LabState(name=lab_name, topology="veth", mtu=1500, namespaces=[ns], step="create namespace").save()
        removed = teardown.down(lab_name)
        assert any(ns in r and "cut off" in r for r in removed), removed
        assert ns not in netns_names() and stranger in netns_names()
        owner.remove_half_made(stranger)
        # The name is free again: a lab of that name builds.
        labs.up("veth", lab_name)
        assert not owner.half_made(ns) and owner.inode(ns)
        assert not owner.half_made("lo-is-no-namespace-here")
    finally:
        for name in (ns, stranger):
            owner.remove_half_made(name)
        teardown.down(lab_name)
