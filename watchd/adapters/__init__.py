"""Adapters act on the world: schedulers (Slurm, later Kubernetes), alert receivers."""
