"""The agent's per-GPU Prometheus metrics, built at scrape time from the latest sample of each GPU.

A custom collector rather than gauges set per sample: the work happens once per scrape, a GPU that
disappears disappears from the output, and the driver's own monotonic counters (energy, ECC, PCIe replays,
NVLink errors) are exposed as counters. Names and their dcgm-exporter equivalents: docs/gpu-metrics.md.

Every per-GPU series is keyed by the GPU alone (``gpu``, ``uuid``, ``pci_bus_id``, ``model``): a job that
starts or ends changes no series, so ``rate()`` and ``increase()`` over a lifetime counter see one series
per GPU. Which job holds a GPU is one more series, ``watchd_gpu_job_info{gpu,uuid,job_id} 1``, present
while a job holds it, which queries join on ``uuid`` (docs/gpu-metrics.md). The label is not ``job``:
Prometheus sets ``job`` on every target and would rename ours ``exported_job``. ``job_label=True`` (the
agent's ``sources.gpu.job_label``) puts the old ``job`` label back on the gauges, never on the counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchd.gpu.model import GpuSample

LABELS = ["gpu", "uuid", "pci_bus_id", "model"]
JOB_INFO = "watchd_gpu_job_info"


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    help: str
    counter: bool
    value: Callable[[GpuSample], float | int | bool | None]
    dcgm: str


def _links_up(s: GpuSample) -> int | None:
    return None if s.nvlink_up is None else sum(s.nvlink_up)


SPECS: tuple[_Spec, ...] = (
    _Spec(
        "watchd_gpu_utilization_percent",
        "GPU utilization.",
        False,
        lambda s: s.util_gpu,
        "DCGM_FI_DEV_GPU_UTIL",
    ),
    _Spec(
        "watchd_gpu_memory_utilization_percent",
        "Memory controller utilization.",
        False,
        lambda s: s.util_mem,
        "DCGM_FI_DEV_MEM_COPY_UTIL",
    ),
    _Spec(
        "watchd_gpu_memory_used_bytes",
        "Frame buffer used.",
        False,
        lambda s: s.mem_used_bytes,
        "DCGM_FI_DEV_FB_USED (MiB)",
    ),
    _Spec(
        "watchd_gpu_memory_total_bytes",
        "Frame buffer size.",
        False,
        lambda s: s.mem_total_bytes,
        "DCGM_FI_DEV_FB_USED + FB_FREE (MiB)",
    ),
    _Spec(
        "watchd_gpu_encoder_utilization_percent",
        "Video encoder utilization.",
        False,
        lambda s: s.util_enc,
        "DCGM_FI_DEV_ENC_UTIL (%)",
    ),
    _Spec(
        "watchd_gpu_decoder_utilization_percent",
        "Video decoder utilization.",
        False,
        lambda s: s.util_dec,
        "DCGM_FI_DEV_DEC_UTIL (%)",
    ),
    _Spec(
        "watchd_gpu_temperature_celsius",
        "GPU temperature.",
        False,
        lambda s: s.temp_c,
        "DCGM_FI_DEV_GPU_TEMP",
    ),
    _Spec("watchd_gpu_power_watts", "Power draw.", False, lambda s: s.power_w, "DCGM_FI_DEV_POWER_USAGE"),
    _Spec(
        "watchd_gpu_power_limit_watts",
        "Enforced power limit.",
        False,
        lambda s: s.power_limit_w,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    ),
    _Spec(
        "watchd_gpu_energy_joules",
        "Energy since the driver loaded.",
        True,
        lambda s: s.energy_j,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ)",
    ),
    _Spec(
        "watchd_gpu_sm_clock_hertz",
        "SM clock.",
        False,
        lambda s: None if s.sm_clock_mhz is None else s.sm_clock_mhz * 1e6,
        "DCGM_FI_DEV_SM_CLOCK (MHz)",
    ),
    _Spec(
        "watchd_gpu_sm_clock_max_hertz",
        "Maximum SM clock.",
        False,
        lambda s: None if s.sm_clock_max_mhz is None else s.sm_clock_max_mhz * 1e6,
        "DCGM_FI_DEV_MAX_SM_CLOCK",
    ),
    _Spec(
        "watchd_gpu_clock_event_reasons",
        "Active clock-event (throttle) reasons, NVML bitmask.",
        False,
        lambda s: s.clock_event_reasons,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    ),
    _Spec(
        "watchd_gpu_ecc_volatile_uncorrected_errors",
        "Uncorrectable ECC errors since the driver loaded.",
        True,
        lambda s: s.ecc_volatile_uncorrected,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ),
    _Spec(
        "watchd_gpu_ecc_volatile_corrected_errors",
        "Correctable ECC errors since the driver loaded.",
        True,
        lambda s: s.ecc_volatile_corrected,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    ),
    _Spec(
        "watchd_gpu_ecc_aggregate_uncorrected_errors",
        "Uncorrectable ECC errors over the GPU's life.",
        True,
        lambda s: s.ecc_aggregate_uncorrected,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    ),
    _Spec(
        "watchd_gpu_ecc_aggregate_corrected_errors",
        "Correctable ECC errors over the GPU's life.",
        True,
        lambda s: s.ecc_aggregate_corrected,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    ),
    _Spec(
        "watchd_gpu_remapped_rows_uncorrectable",
        "Rows remapped for uncorrectable errors.",
        False,
        lambda s: s.remapped_rows_uncorrectable,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    ),
    _Spec(
        "watchd_gpu_remapped_rows_correctable",
        "Rows remapped for correctable errors.",
        False,
        lambda s: s.remapped_rows_correctable,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    ),
    _Spec(
        "watchd_gpu_row_remap_pending",
        "1 while a row remap is pending (reset needed).",
        False,
        lambda s: s.remap_pending,
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    ),
    _Spec(
        "watchd_gpu_row_remap_failure",
        "1 when row remapping failed.",
        False,
        lambda s: s.remap_failure,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    ),
    _Spec(
        "watchd_gpu_retired_pages_pending",
        "1 while a page retirement is pending.",
        False,
        lambda s: s.retired_pages_pending,
        "DCGM_FI_DEV_RETIRED_PENDING",
    ),
    _Spec(
        "watchd_gpu_pcie_replays",
        "PCIe replays since the driver loaded.",
        True,
        lambda s: s.pcie_replay_count,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    ),
    _Spec(
        "watchd_gpu_pcie_link_width",
        "Current PCIe link width.",
        False,
        lambda s: s.pcie_link_width,
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    ),
    _Spec(
        "watchd_gpu_pcie_link_width_max",
        "Maximum PCIe link width.",
        False,
        lambda s: s.pcie_link_width_max,
        "-",
    ),
    _Spec(
        "watchd_gpu_pcie_link_generation",
        "Current PCIe generation.",
        False,
        lambda s: s.pcie_link_gen,
        "DCGM_FI_DEV_PCIE_LINK_GEN",
    ),
    _Spec(
        "watchd_gpu_pcie_tx_bytes_per_second",
        "PCIe transmit throughput.",
        False,
        lambda s: s.pcie_tx_bytes_per_s,
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    ),
    _Spec(
        "watchd_gpu_pcie_rx_bytes_per_second",
        "PCIe receive throughput.",
        False,
        lambda s: s.pcie_rx_bytes_per_s,
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    ),
    _Spec("watchd_gpu_nvlink_links_up", "NVLinks up.", False, _links_up, "-"),
    _Spec(
        "watchd_gpu_nvlink_errors",
        "NVLink CRC, replay and recovery errors since the driver loaded.",
        True,
        lambda s: s.nvlink_errors,
        "DCGM_FI_DEV_NVLINK_CRC_*_ERROR_COUNT_TOTAL + REPLAY + RECOVERY",
    ),
    _Spec(
        "watchd_gpu_nvlink_tx_bytes_per_second",
        "NVLink transmit throughput.",
        False,
        lambda s: s.nvlink_tx_bytes_per_s,
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
    ),
    _Spec(
        "watchd_gpu_nvlink_rx_bytes_per_second",
        "NVLink receive throughput.",
        False,
        lambda s: s.nvlink_rx_bytes_per_s,
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    ),
    _Spec(
        "watchd_gpu_recovery_action",
        "NVML GPU recovery action (field 230): 0 none.",
        False,
        lambda s: s.recovery_action,
        "-",
    ),
    _Spec(
        "watchd_gpu_lost", "1 when the GPU fell off the bus (NVML GpuIsLost).", False, lambda s: s.lost, "-"
    ),
    _Spec(
        "watchd_gpu_last_sample_timestamp_seconds",
        "When the GPU was last read.",
        False,
        lambda s: s.time,
        "-",
    ),
)


class GpuCollector(Collector):
    """Exposes the latest sample of every GPU; ``update`` is called by the sampler."""

    def __init__(self, *, job_label: bool = False) -> None:
        self._latest: dict[str, tuple[GpuSample, str]] = {}
        self.job_label = job_label  # the gauges carry the job too (off by default: docs/gpu-metrics.md)

    def update(self, sample: GpuSample, job: str | None) -> None:
        self._latest[sample.gpu.uuid] = (sample, job or "")

    def forget(self, uuid: str) -> None:
        self._latest.pop(uuid, None)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # built at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        rows = sorted(self._latest.values(), key=lambda r: r[0].gpu.index)
        for spec in SPECS:
            family: GaugeMetricFamily | CounterMetricFamily
            with_job = self.job_label and not spec.counter
            labels = [*LABELS, "job"] if with_job else LABELS
            if spec.counter:
                family = CounterMetricFamily(spec.name, spec.help, labels=labels)
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=labels)
            for sample, job in rows:
                value = None if sample.lost and spec.name != "watchd_gpu_lost" else spec.value(sample)
                if value is None and spec.name in ("watchd_gpu_lost",):
                    value = False
                if value is None:
                    continue
                values = _gpu_labels(sample)
                family.add_metric([*values, job] if with_job else values, float(value))
            yield family
        info = GaugeMetricFamily(
            JOB_INFO,
            "1 while a job holds the GPU (from its processes: slurm:<id>, k8s:<pod-uid>); join on uuid.",
            labels=["gpu", "uuid", "job_id"],
        )
        for sample, job in rows:
            if job:
                info.add_metric([str(sample.gpu.index), sample.gpu.uuid, job], 1.0)
        yield info


def _gpu_labels(sample: GpuSample) -> list[str]:
    gpu = sample.gpu
    return [str(gpu.index), gpu.uuid, gpu.pci_bus_id, gpu.model]


def dcgm_mapping_markdown() -> str:
    """The table in docs/gpu-metrics.md (kept in sync by a test)."""
    lines = ["| watchd metric | type | dcgm-exporter equivalent |", "|---|---|---|"]
    for spec in SPECS:
        name = spec.name + ("_total" if spec.counter else "")
        lines.append(f"| `{name}` | {'counter' if spec.counter else 'gauge'} | {spec.dcgm} |")
    return "\n".join(lines)
