"""DPDK: dpdk-testpmd as a lab daemon driven through its command line, and what it answers."""

from offlab.dpdk.testpmd import (DAEMON, INSTALL, Info, Port, Testpmd, TestpmdNoAnswer, TestpmdRefused,
                                 remove_runtime, rundir_for, runtime_dir, version)

__all__ = ["DAEMON", "INSTALL", "Info", "Port", "Testpmd", "TestpmdNoAnswer", "TestpmdRefused", "remove_runtime",
           "rundir_for", "runtime_dir", "version"]
