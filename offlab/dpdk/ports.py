"""What MTU an OVS-DPDK port takes here (DPDK 22.11, OVS 3.1), known once for `lab up` and the `mtu` knob.

OVS sets a DPDK port's MTU as a frame of MTU + 18 B (Ethernet header and CRC) and refuses the
`mtu_request` when that frame exceeds what the PMD takes: it logs `Frame size (9018) > device max
frame size (1522)` and takes the port out of the datapath until the request is cleared. vhost-user
ports are limited by OVS itself (NETDEV_DPDK_MAX_PKT_LEN, 9728-byte frames).
"""

from __future__ import annotations

from offlab.wire import ETH_HEADER, FCS, VLAN_TAG

FRAME_OVERHEAD = ETH_HEADER + FCS  # a PMD's frame length counts the CRC
# The largest frame each PMD takes (`show port info`: Maximum configurable length of RX packet).
# net_tap 1522 (a 1500 MTU, its FCS and a VLAN tag), net_af_packet 1518
PMD_MAX_FRAME = {"net_tap": 1500 + FRAME_OVERHEAD + VLAN_TAG, "net_af_packet": 1500 + FRAME_OVERHEAD}
# The largest MTU offlab's labs ask of those PMDs: 1500 (the tap's 1522 leaves room for a VLAN tag).
PMD_MAX_MTU = 1500
VHOST_MAX_FRAME = 9728
VHOST_MAX_MTU = VHOST_MAX_FRAME - FRAME_OVERHEAD  # 9710, seed 004's jumbo MTU
VHOST_TYPES = ("dpdkvhostuser", "dpdkvhostuserclient")
DPDK_TYPES = ("dpdk", *VHOST_TYPES)
# A net_tap port's kernel tap lives in another namespace than OVS (the lab moves it to its host); the
# PMD sets the MTU by the tap's name in its own namespace, so any run-time change fails `No such device`
# and the port stops forwarding until `mtu_request` is put back.
PINNED_MTU = {"net_tap": "its kernel tap lives in another namespace, where the tap PMD cannot reach it by name "
                         "(OVS logs `MTU setup error: No such device` and the port stops forwarding)"}


def max_mtu(ovs_type: str, driver: str | None) -> tuple[int, int] | None:
    """(largest MTU, largest frame) of an OVS-DPDK port of `ovs_type` on PMD `driver`; None if unknown."""
    if ovs_type in VHOST_TYPES:
        return VHOST_MAX_MTU, VHOST_MAX_FRAME
    if ovs_type == "dpdk" and driver in PMD_MAX_FRAME:
        return PMD_MAX_MTU, PMD_MAX_FRAME[driver]
    return None
