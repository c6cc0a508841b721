"""Device queue parameters: channels (`ethtool -L`), rings (`-G`), coalescing (`-C`).

Not every driver has them: veth has rx/tx channels but neither rings nor
coalescing. A parameter the device lacks is a "cannot test here" outcome that
says so ("veth olx0 has no ring parameters (ethtool -g: Operation not supported)"),
not a failure deep inside a command.
"""

from __future__ import annotations

import difflib
from typing import Any

from offlab.errors import BadInput, CommandFailed
from offlab.knobs.base import Knob, Plan, as_bool, as_int, failure_text, onoff
from offlab.netdev import link, parse_coalesce, parse_limits


class _EthtoolParam(Knob):
    """A numeric (or on/off) parameter read with `ethtool -x IF`, set with `ethtool -X IF name value`."""

    show_flag = ""
    set_flag = ""
    what = ""
    params: tuple[str, ...] = ()
    onoff_params: tuple[str, ...] = ()

    def __init__(self, target, key: str) -> None:
        super().__init__(target, key)
        self.param = key.split(".", 1)[1] if "." in key else ""
        self.why_not: str | None = None

    def _read(self) -> tuple[str | None, int | None] | None:
        """(this parameter's value as ethtool prints it, its maximum), or None with `why_not` set when
        the device has none of them."""
        res = self.host.run(["ethtool", self.show_flag, self.iface], check=False, timeout=10)
        if not res.ok:
            detail = failure_text(CommandFailed(res.argv, res.rc, res.stderr))
            detail = detail.replace("netlink error: ", "")
            self.why_not = (f"{self._device_kind()} {self.iface} has no {self.what} "
                            f"(ethtool {self.show_flag}: {detail})")
            return None
        return self._parse(res.stdout)

    def _parse(self, text: str) -> tuple[str | None, int | None]:
        limit = parse_limits(text)[self.param]
        return (None if limit.current is None else str(limit.current)), limit.maximum

    def _device_kind(self) -> str:
        try:
            return link(self.host, self.iface).kind or "device"
        except (BadInput, CommandFailed):
            return "device"

    def check(self, value: Any, plan: Plan) -> str:
        if self.param not in self.params:
            close = difflib.get_close_matches(self.param, self.params, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(self.kind + '.' + c for c in close)}?" if close else \
                f"; one of {', '.join(self.kind + '.' + p for p in self.params)}"
            raise BadInput(f"unknown {self.what} parameter {self.key!r} on {self.target.where}{hint}")
        if self.iface not in plan.links(self.target):
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        if self.param in self.onoff_params:
            return onoff(as_bool(self.label, value))
        n = as_int(self.label, value, 0, 1 << 24)
        got = self._read()
        if got is not None:
            top = got[1]
            if top is not None and n > top:
                raise BadInput(f"{self.label}: {n} is more than {self.iface} allows (maximum {top})")
        return str(n)

    def snapshot(self) -> str | None:
        got = self._read()
        if got is None:
            return None
        val = got[0]
        if val is None or val == "n/a":
            self.why_not = (f"{self._device_kind()} {self.iface} has no {self.key} "
                            f"(ethtool {self.show_flag} shows n/a)")
            return None
        return val

    def show(self, snap: str | None) -> str:
        return "n/a" if snap is None else snap

    def impossible(self, value: str, snap: str | None) -> str | None:
        return f"{self.why_not} — cannot test {self.key}={value} here" if snap is None else None

    def apply(self, value: str) -> None:
        self.host.run(["ethtool", self.set_flag, self.iface, self.param, value], timeout=10)

    def restore(self, snap: str | None) -> None:
        if snap is not None and self.snapshot() != snap:
            self.apply(snap)


class Channels(_EthtoolParam):
    kind, what = "channels", "channel parameters"
    show_flag, set_flag = "-l", "-L"
    params = ("rx", "tx", "other", "combined")


class Ring(_EthtoolParam):
    kind, what = "ring", "ring parameters"
    show_flag, set_flag = "-g", "-G"
    params = ("rx", "rx-mini", "rx-jumbo", "tx")


class Coalesce(_EthtoolParam):
    kind, what = "coalesce", "coalescing parameters"
    show_flag, set_flag = "-c", "-C"
    onoff_params = ("adaptive-rx", "adaptive-tx", "cqe-mode-rx", "cqe-mode-tx")
    params = (*onoff_params, "rx-usecs", "rx-frames", "rx-usecs-irq", "rx-frames-irq",
              "tx-usecs", "tx-frames", "tx-usecs-irq", "tx-frames-irq", "stats-block-usecs",
              "sample-interval", "pkt-rate-low", "pkt-rate-high", "rx-usecs-low", "rx-frames-low",
              "tx-usecs-low", "tx-frames-low", "rx-usecs-high", "rx-frames-high", "tx-usecs-high",
              "tx-frames-high")

    def _parse(self, text: str) -> tuple[str | None, int | None]:
        return parse_coalesce(text).text(self.param), None
