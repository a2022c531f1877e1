"""GPU telemetry: backends (NVML, fake, dcgm-exporter), the sampler, health events and window summaries."""
