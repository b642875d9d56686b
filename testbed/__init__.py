"""A real multi-cluster Slurm testbed on one machine (root, Debian 12 packages)."""

from testbed.bed import Testbed, install_packages
from testbed.processes import TestbedError

__all__ = ["Testbed", "TestbedError", "install_packages"]
