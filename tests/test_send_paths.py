"""offlab-engine tx's send paths (issue 29): send, sendmmsg and MSG_ZEROCOPY in a real veth lab. A veth
copies every zero-copy send: the kernel's completions say so (SO_EE_CODE_ZEROCOPY_COPIED), and the
sample says so instead of claiming a zero-copy figure."""

from __future__ import annotations

import pytest

from offlab.errors import BadInput
from offlab.experiment.measure import measure
from offlab.experiment.witnesses import zerocopy
from offlab.sample import Traffic
from offlab.traffic import Workload
from tests.conftest import requires_root

pytestmark = [requires_root, pytest.mark.network]


def test_every_send_path_delivers_and_zerocopy_reports_the_kernels_copies(veth_lab, state_dir):
    got = {}
    for send, batch in (("send", None), ("sendmmsg", 8), ("zerocopy", None)):
        w = Workload(tool="engine", protocol="udp", size=1472, send=send, batch=batch, duration=1, warmup=0.3).check()
        s = measure(veth_lab, w)
        got[send] = s
        assert s.traffic["datagrams_received"] > 1000, (send, s.traffic)
        assert s.workload["send"] == send
    z = got["zerocopy"].traffic["zerocopy"]
    # every send completed before the report, and a veth copied each one
    assert z["sends"] == got["zerocopy"].traffic["datagrams_sent"] == z["completed"]
    assert z["pending_at_end"] == 0 and z["copied"] == z["completed"] and z["all_copied"] is True
    assert any("not a zero-copy figure" in n for n in got["zerocopy"].notes)
    assert got["send"].traffic["zerocopy"] is None and not any(n.startswith("zerocopy") for n in got["send"].notes)


def test_zerocopy_note_says_what_was_not_copied():
    assert zerocopy(Traffic.from_json({"zerocopy": {"completed": 10, "copied": 4, "pending_at_end": 0}})) == \
        "zerocopy: 6 of 10 MSG_ZEROCOPY sends completed without a copy"
    assert zerocopy(Traffic.from_json({"zerocopy": None})) is None


@pytest.mark.parametrize("fields, message", [
    ({"tool": "iperf3", "protocol": "udp", "send": "zerocopy"}, "needs tool engine"),
    ({"tool": "engine", "protocol": "udp", "send": "io_uring"}, "choose send, sendmmsg, zerocopy"),
    ({"tool": "engine", "protocol": "udp", "send": "zerocopy", "batch": 8}, "batch 8 needs send sendmmsg"),
])
def test_a_send_path_the_engine_cannot_take_is_refused_naming_the_field(fields, message):
    with pytest.raises(BadInput, match=message) as e:
        Workload(**fields).check()
    assert "send" in str(e.value)
