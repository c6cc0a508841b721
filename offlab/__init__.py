"""offlab: network offload, MTU and tuning experiments on Linux and virtualised Linux networking."""

__version__ = "0.1.0"
