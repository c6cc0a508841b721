"""Every doctor check; importing this package registers them in a fixed order."""

from offlab.doctor.checks import platform, cpu, kernel, kvm, nic, placement, stack, paths, ovs, dpdk  # noqa: F401
