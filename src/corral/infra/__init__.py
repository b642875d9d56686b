"""Places that run work. `Infra` is the interface; Slurm is its first implementation."""
