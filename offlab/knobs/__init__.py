"""Settings an experiment varies, each journalled before it changes and put back after.

    from offlab.knobs import Change, Transaction
    with Transaction(label="cell 3") as tx:
        tx.apply([Change(lab.client, "uso", "on", "to-server", lab), Change(lab.client, "mtu", 9000, "to-server", lab)])
        ...

Knobs: ethtool features (kernel or short names), mtu, txqueuelen, channels.*,
ring.*, coalesce.*, rps / xps masks, qdisc, per-bridge nf_call_*, gro_flush_timeout /
napi_defer_hard_irqs, sysctls.
See docs/knobs.md.
"""

from offlab.knobs.base import Knob
from offlab.knobs.journal import Entry, forget_namespaces
from offlab.knobs.registry import knob_class, knob_for
from offlab.knobs.restore import (forget_lab_namespaces, list_pending, pending_changes, restore_pending,
                                  restore_report)
from offlab.knobs.target import Target
from offlab.interrupts import Terminated
from offlab.knobs.transaction import Change, Outcome, Transaction

__all__ = ["Change", "Outcome", "Transaction", "Terminated", "restore_pending", "restore_report",
           "list_pending", "pending_changes", "forget_namespaces", "forget_lab_namespaces", "Knob", "Target", "Entry", "knob_for", "knob_class"]
