"""offlab-engine tx's send paths (issue 29): send, sendmmsg, MSG_ZEROCOPY, io_uring SEND and SEND_ZC in a
real veth lab. A veth copies every zero-copy send: the kernel's completions say so
(SO_EE_CODE_ZEROCOPY_COPIED, IORING_NOTIF_USAGE_ZC_COPIED), and the sample says so instead of claiming
a zero-copy figure."""

from __future__ import annotations

import pytest

from offlab.errors import BadInput
from offlab.experiment.effects import NOT_EXERCISED
from offlab.experiment.measure import measure
from offlab.experiment.witnesses import zerocopy
from offlab.sample import Traffic
from offlab.traffic import Workload
from tests.conftest import requires_root

pytestmark = [requires_root, pytest.mark.network]


def test_every_send_path_delivers_and_zerocopy_reports_the_kernels_copies(veth_lab, state_dir):
    got = {}
    for send, batch in (("send", None), ("sendmmsg", 8), ("zerocopy", None)):
        # 3000 pps: each path must deliver, at any speed (a paced engine sleeps part of the time between sends)
        w = Workload(tool="engine", protocol="udp", size=1472, send=send, batch=batch, rate="3000pps", duration=1,
                     warmup=0.3).check()
        s = measure(veth_lab, w)
        got[send] = s
        assert s.traffic.datagrams_received > 1000, (send, s.traffic)
        assert s.workload.send == send
    z = got["zerocopy"].traffic.zerocopy
    # every send completed before the report, and a veth copied each one
    assert z is not None and z.sends == got["zerocopy"].traffic.datagrams_sent == z.completed
    assert z.pending_at_end == 0 and z.copied == z.completed and z.all_copied is True
    assert any("not a zero-copy figure" in n for n in got["zerocopy"].notes)
    assert got["send"].traffic.zerocopy is None and not any(n.startswith("zerocopy") for n in got["send"].notes)


def test_zerocopy_note_says_what_was_not_copied():
    assert zerocopy(Traffic.from_json({"zerocopy": {"completed": 10, "copied": 4, "pending_at_end": 0}})) == \
        "zerocopy: 6 of 10 MSG_ZEROCOPY sends completed without a copy"
    assert zerocopy(Traffic.from_json({"zerocopy": None})) is None


@pytest.mark.parametrize("fields, message", [
    ({"tool": "iperf3", "protocol": "udp", "send": "zerocopy"}, "needs tool engine"),
    ({"tool": "engine", "protocol": "udp", "send": "uring"}, "choose send, sendmmsg, zerocopy, io_uring, io_uring-zc"),
    ({"tool": "engine", "protocol": "udp", "send": "zerocopy", "batch": 8},
     "batch 8 needs send sendmmsg, io_uring, io_uring-zc"),
])
def test_a_send_path_the_engine_cannot_take_is_refused_naming_the_field(fields, message):
    with pytest.raises(BadInput, match=message) as e:
        Workload(**fields).check()
    assert "send" in str(e.value)


def test_io_uring_batches_are_accepted_like_sendmmsg():
    for send in ("io_uring", "io_uring-zc"):
        assert Workload(tool="engine", protocol="udp", send=send, batch=8).check().batch == 8


@pytest.mark.parametrize("send, gso", [("io_uring", False), ("io_uring-zc", False), ("io_uring-zc", True)])
def test_io_uring_paths_deliver_what_the_receiver_counts(veth_lab, state_dir, send, gso):
    # Paced well below what the receiver takes, with room in its buffer: every datagram arrives, so the
    # receiver's count equals the sender's exactly (linked SQEs: what was sent is a prefix of the seqs).
    w = Workload(tool="engine", protocol="udp", size=1472, send=send, batch=8, gso=gso, rate="10kpps",
                 rcvbuf=4 << 20, duration=1, warmup=0.3).check()
    s = measure(veth_lab, w)
    t = s.traffic
    assert t.datagrams_received == t.datagrams_sent > 5000, t
    assert t.duplicates == 0 and t.loss == 0
    assert s.workload.send == send
    assert (t.zerocopy is not None) == (send == "io_uring-zc")


def test_io_uring_zc_over_a_veth_reports_every_send_copied(veth_lab, state_dir):
    w = Workload(tool="engine", protocol="udp", size=1472, send="io_uring-zc", batch=8, gso=True,
                 duration=1, warmup=0.3).check()
    s = measure(veth_lab, w)
    z, t = s.traffic.zerocopy, s.traffic
    assert 0 < t.datagrams_received <= t.datagrams_sent
    assert z is not None and z.via == "IORING_OP_SEND_ZC" and z.copied_flag == "IORING_NOTIF_USAGE_ZC_COPIED"
    # one notification per send, every buffer back before the report, each send copied by the veth
    assert z.sends == z.completed == z.notifications > 100
    assert z.sends < t.datagrams_sent  # GSO: several datagrams a send
    assert z.pending_at_end == 0 and z.copied == z.completed and z.all_copied is True
    assert any(n.startswith("zerocopy: the kernel copied all") and "IORING_OP_SEND_ZC" in n
               and "not a zero-copy figure" in n for n in s.notes), s.notes
    zc = [e for e in s.effects or [] if e.setting == "workload send (zerocopy)"]
    assert [e.status for e in zc] == [NOT_EXERCISED], zc


def _refuse_io_uring_setup() -> None:
    """In the child before exec: a seccomp filter that makes io_uring_setup fail with EPERM, as the
    kernel does for everyone under kernel.io_uring_disabled = 2 (without changing that sysctl for the
    whole machine)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    # ld [nr]; jeq 425 (io_uring_setup on x86_64) ? next : skip; ret ERRNO|EPERM; ret ALLOW
    filt = (ctypes.c_uint64 * 4)(*[code | jt << 16 | jf << 24 | k << 32 for code, jt, jf, k in (
        (0x20, 0, 0, 0), (0x15, 0, 1, 425), (0x06, 0, 0, 0x00050000 | 1), (0x06, 0, 0, 0x7FFF0000))])

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(4, ctypes.addressof(filt))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(prog), 0, 0):  # NO_NEW_PRIVS, SECCOMP
        raise OSError(ctypes.get_errno(), "seccomp")


@pytest.mark.parametrize("send", ["io_uring", "io_uring-zc"])
def test_where_io_uring_is_refused_the_engine_says_cannot_test_here(send):
    import platform
    import subprocess

    from offlab.traffic.engine import engine_path

    if platform.machine() != "x86_64":
        pytest.skip("the seccomp filter names x86_64's io_uring_setup number")
    p = subprocess.run([engine_path(), "tx", "--dest", "127.0.0.1", "--port", "9", "--duration", "0.2",
                        "--send", send], capture_output=True, text=True, timeout=30,
                       preexec_fn=_refuse_io_uring_setup)
    assert p.returncode == 3 and p.stdout == ""
    assert p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"offlab-engine: error: --send {send}: io_uring_setup: Operation not permitted "
                               "(EPERM)") and p.stderr.rstrip().endswith(": cannot test here"), p.stderr


SKIP_PLAN = """\
name: uring-skip
topology: {kind: veth}
axes:
  path:
    send: {send: send}
    io_uring: {send: io_uring, batch: 8}
workload: {tool: engine, protocol: udp, size: 1472, rate: 500pps, duration: 0.5, warmup: 0.2}
repeat: {min: 1, max: 1}
baseline: {path: send}
"""

RUN_PLAN = """\
import json, sys
from offlab.experiment.plan import load_plan
from offlab.experiment.runner import Runner
from offlab.store import Store
store = Store.open(sys.argv[1])
run_id = Runner(load_plan(sys.argv[2], "uring-skip.yaml"), store).run()
print(json.dumps({"run": store.get_run(run_id)["status"],
                  "cells": {c["key"]: [c["status"], c["reason"]] for c in store.cells(run_id)}}))
"""


def test_a_run_where_io_uring_is_refused_skips_its_cells_and_measures_the_rest(tmp_path, clean_machine):
    import json
    import platform
    import subprocess
    import sys

    if platform.machine() != "x86_64":
        pytest.skip("the seccomp filter names x86_64's io_uring_setup number")
    # The whole run (offlab and every engine it starts) under the filter: io_uring_setup says EPERM.
    p = subprocess.run([sys.executable, "-c", RUN_PLAN, str(tmp_path / "r.db"), SKIP_PLAN], capture_output=True,
                       text=True, timeout=300, preexec_fn=_refuse_io_uring_setup)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["run"] == "done"
    status, reason = got["cells"]["path=io_uring"]
    assert status == "skipped" and reason.startswith("cannot test here: offlab-engine tx: --send io_uring: "
                                                     "io_uring_setup: Operation not permitted (EPERM)"), reason
    assert got["cells"]["path=send"][0] == "done"
