"""Correlation detectors: NCCL hangs, host stalls and stragglers across the GPUs of one job (pure)."""
