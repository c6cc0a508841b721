"""MTU arithmetic (`offlab mtu calc`) and path-MTU probing inside labs (`offlab mtu probe`)."""

from offlab.mtu.calc import fragments, frame_size, inner_mtu, table, tcp_mss, udp_payload_max
from offlab.mtu.probe import PathMtu, check_dest, probe

__all__ = ["table", "fragments", "frame_size", "inner_mtu", "tcp_mss", "udp_payload_max",
           "probe", "check_dest", "PathMtu"]
