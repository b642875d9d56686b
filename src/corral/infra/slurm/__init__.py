"""Slurm clusters reached through their login nodes."""

from corral.infra.slurm.cluster import SlurmInfra

__all__ = ["SlurmInfra"]
