"""offlab: network offload, MTU and tuning experiments in Linux network namespaces."""

__version__ = "0.1.0"
