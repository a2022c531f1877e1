"""Per-team usage, queue waits, energy and lost GPU-hours from Slurm accounting and what watchd
observed (docs/reports.md)."""
