"""Every doctor check: the functions marked with @check in these modules, in this order."""

from __future__ import annotations

from functools import cache

from offlab.doctor.checks import platform, cpu, kernel, kvm, nic, placement, stack, paths, ovs, dpdk
from offlab.doctor.registry import SPEC_ATTR, CheckSpec

MODULES = (platform, cpu, kernel, kvm, nic, placement, stack, paths, ovs, dpdk)


@cache
def all_checks() -> tuple[CheckSpec, ...]:
    """Each module's checks in the order they are written there; a check imported by another module
    is counted where it is defined."""
    return tuple(getattr(fn, SPEC_ATTR) for module in MODULES for fn in vars(module).values()
                 if hasattr(fn, SPEC_ATTR) and getattr(fn, "__module__", None) == module.__name__)
