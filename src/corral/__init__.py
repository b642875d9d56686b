"""Corral: many independent Slurm clusters, one GPU pool."""

__version__ = "0.1.0"
