"""Per-team usage, queue waits, energy and lost GPU-hours from Slurm accounting and what watchd
observed (issue 18; docs/reports.md)."""
