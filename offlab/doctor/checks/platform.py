"""What the target packet rate asks of the platform as a whole (seed 002's tiers)."""

from __future__ import annotations

from offlab.doctor import tiers
from offlab.doctor.model import Outcome
from offlab.doctor.registry import Context, check


@check("platform.tier", area="platform", title="What the target rate needs", tier=None,
       why="the guide grades tuning by packet rate: untouched below 100 kpps, SR-IOV/vDPA above 3 Mpps")
def tier(ctx: Context) -> Outcome | None:
    if ctx.target_pps is None:
        return None
    t = tiers.tier_for(ctx.target_pps)
    evidence = {"target_pps": ctx.target_pps, **t.to_json()}
    if t.level >= 3:
        vfs = {}
        for iface in ctx.ifaces:
            n = ctx.int_value(f"/sys/class/net/{iface}/device/sriov_totalvfs")
            if n:
                vfs[iface] = n
        evidence["sriov_totalvfs"] = vfs
        have = ", ".join(f"{i} offers {n} VFs" for i, n in vfs.items()) or "no audited NIC reports SR-IOV VFs"
        if t.level == 3:
            return Outcome("warn", f"{ctx.target_pps:,} pps is at the kernel's limit per the guide ({have})", evidence,
                           fix="plan for SR-IOV or vDPA if the rate must hold with no loss")
        return Outcome("warn", f"{ctx.target_pps:,} pps: the guide's advice is SR-IOV or vDPA ({have})", evidence,
                       fix="give the VM an SR-IOV VF (echo N > /sys/class/net/IF/device/sriov_numvfs, "
                           "<hostdev> in the VM XML) or a vDPA device")
    if t.level == 0:
        return Outcome("ok", f"{ctx.target_pps:,} pps is {t.name}: {t.advice}", evidence)
    return Outcome("info", f"{ctx.target_pps:,} pps is in the {t.name} tier: {t.advice}", evidence)
