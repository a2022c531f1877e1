"""The ``checks:`` section of the engine config (docs/checks.md): which active checks run, when, where, within
which limits, and what they are compared with. Strict like every config model: an unknown key is an error.

Durations are seconds or ``30s``, ``10m``, ``24h``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from apscheduler.triggers.cron import CronTrigger
from pydantic import Field, field_validator, model_validator

from watchd.checks.kinds import CHECK_KINDS
from watchd.checks.risk_params import RiskBudget, RiskWeights
from watchd.model.durations import Duration
from watchd.strict import Strict

__all__ = [
    "DEFAULT_BASELINES",
    "Baseline",
    "CheckSpec",
    "ChecksConfig",
    "KubernetesCheckRunner",
    "PeersConfig",
    "Schedule",
    "SlurmCheckRunner",
    "command_of",
]

Share = Annotated[float, Field(gt=0, le=1)]


class Schedule(Strict):
    """When a check's rounds start: ``every`` (an interval) or ``cron`` (five fields, UTC), and a random delay
    of up to ``jitter`` so that engines and checks do not start in step."""

    every: Duration | None = None
    cron: str | None = None
    jitter: Duration = 0.0

    @model_validator(mode="after")
    def _one(self) -> Schedule:
        if (self.every is None) == (self.cron is None):
            raise ValueError("give exactly one of every, cron")
        if self.every is not None and self.every < 60:
            raise ValueError("every: at least 60s (a round takes minutes)")
        if self.cron is not None:
            try:
                CronTrigger.from_crontab(self.cron, timezone="UTC")
            except ValueError as exc:
                raise ValueError(f"cron: {exc}") from None
        return self


class Backoff(Strict):
    """A node where the check keeps failing to run (could not be submitted, timed out, unreadable output)
    waits ``initial`` x 2^(failures-1), at most ``max``, before the check tries it again."""

    initial: Duration = 600.0
    max: Duration = 86400.0


class CheckSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")
    type: str  # a check kind: a row of watchd.checks.kinds.CHECK_KINDS (nccl | dcgm-diag | command)
    #: the program and its arguments, run on the node (no shell). Default: the kind's (nccl: all_reduce_perf
    #: -b 8 -e 8G -f 2 -g 8; dcgm-diag: dcgmi diag -r <level> [-j]); command: required
    command: list[str] | None = None
    level: Literal[1, 2, 3, 4] = 2  # dcgm-diag: dcgmi diag -r LEVEL
    json_output: bool = False  # dcgm-diag: add -j (DCGM 2.x and later print JSON then)
    fail_on_warn: bool = False  # dcgm-diag: a test that warns fails the check
    schedule: Schedule | None = None  # None: only on demand (watchd checks run, watchd node validate)
    partitions: list[str] = Field(default_factory=list)  # Slurm partitions / Kubernetes pools covered
    nodes: list[str] = Field(
        default_factory=list
    )  # shell patterns on node names (with or instead of partitions)
    max_share: Share = 0.1  # of a partition checked at once
    time_limit: Duration = 600.0
    backoff: Backoff = Backoff()
    threshold: Share = 0.8  # nccl: the share of the baseline (and of the peers' median) a node must reach
    baseline_gbps: float | None = Field(default=None, gt=0)  # nccl: overrides the baselines table
    #: nccl-pair: nodes per run (2: pairs); a larger group that runs slowly is bisected, wave by wave
    group_size: Annotated[int, Field(ge=2, le=64)] = 2
    in_suite: bool = True  # part of `watchd node validate`
    #: which nodes a round tries first: the least recently checked, or the riskiest within ``budget``
    planner: Literal["oldest_first", "risk"] = "oldest_first"
    budget: RiskBudget | None = None  # planner risk: GPU-hours per partition per period, and the floor

    @field_validator("type")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in CHECK_KINDS:
            raise ValueError(f"unknown check type {value!r} (known: {', '.join(sorted(CHECK_KINDS))})")
        return value

    def argv(self) -> list[str]:
        return CHECK_KINDS[self.type].argv(self)


def command_of(spec: CheckSpec) -> list[str]:
    """The program a check runs: its ``command``, else its kind's default (:meth:`CheckSpec.argv`)."""
    return spec.argv()


class Baseline(Strict):
    """The bus bandwidth a healthy node reaches: for the GPU model all_reduce_perf prints (a case-insensitive
    substring, e.g. ``H100``) or for nodes (shell patterns). The first that matches applies. ``scope``:
    ``node`` for one node's run (NVLink), ``pair`` for two nodes' (``nccl-pair``: the fabric between them)."""

    scope: Literal["node", "pair"] = "node"
    gpu_model: str | None = None
    nodes: list[str] = Field(default_factory=list)
    busbw_gbps: float = Field(gt=0)
    source: str = ""  # where the figure comes from (shown in the event)

    @model_validator(mode="after")
    def _matches_something(self) -> Baseline:
        if self.gpu_model is None and not self.nodes:
            raise ValueError("give gpu_model or nodes")
        return self


#: The shipped defaults (docs/checks.md): single-node all_reduce_perf over 8 NVLink-4 GPUs. 450 GB/s is what
#: the default threshold (80%) is applied to: an 8 x H100 SXM node measured 470.7 GB/s at 2 GiB
#: (tests/data/checks/nccl/h100-8gpu-single-node-pass.txt); the H200 has the same NVLink generation.
#: Two nodes: 2 x 8 H100 over 8 x 400 Gb/s InfiniBand NDR, 400-450 GB/s at 8 GB and more (Saturn Cloud,
#: "Validating Multi-Node GPU Clusters with NCCL Tests": expected bus bandwidth, H100/H200 SXM with IB NDR);
#: the recorded 2 x 8 H100 run over TCPXO reached 338.8 GB/s (tests/data/checks/nccl). Other fabrics (RoCE,
#: fewer NICs, EFA) need their own line: without one, only the round's other pairs are the measure.
DEFAULT_BASELINES: tuple[Baseline, ...] = (
    Baseline(gpu_model="H100", busbw_gbps=450.0, source="8 x H100 SXM NVLink: 470.7 GB/s measured at 2 GiB"),
    Baseline(gpu_model="H200", busbw_gbps=450.0, source="NVLink 4 as the H100 (8 x H100: 470.7 GB/s)"),
    Baseline(
        scope="pair",
        gpu_model="H100",
        busbw_gbps=400.0,
        source="2 x 8 H100, 8 x 400G NDR: 400-450 GB/s published",
    ),
    Baseline(
        scope="pair",
        gpu_model="H200",
        busbw_gbps=400.0,
        source="2 x 8 H200, 8 x 400G NDR: 400-450 GB/s published",
    ),
)


class PeersConfig(Strict):
    """A node whose bus bandwidth is below ``share`` of the median of its peers in the same round (same check,
    same GPU model) fails, baseline or not, when the round has at least ``min_nodes`` measured."""

    enabled: bool = True
    share: Share = 0.8
    min_nodes: Annotated[int, Field(ge=2)] = 4


class SlurmCheckRunner(Strict):
    sbatch: str = "sbatch"
    scancel: str = "scancel"
    partition: str | None = None  # -p (default: the partition the node was picked from)
    qos: str | None = None
    reservation: str | None = None
    account: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    poll_interval_s: Annotated[float, Field(gt=0)] = 1.0
    #: validate: the user the maintenance reservation admits (sbatch's user: the engine's)
    user: str = "root"
    grace: Duration = 30.0  # past the time limit, the job is cancelled and counted as timed out


class KubernetesCheckRunner(Strict):
    namespace: str = "watchd-checks"  # the shipped manifests' (Pod Security baseline)
    image: str = "nvcr.io/nvidia/pytorch:24.04-py3"
    gpu_resource: str = "nvidia.com/gpu"
    gpus: Annotated[int, Field(ge=0)] = 8  # requested by the check's pod (every GPU of the node)
    poll_interval_s: Annotated[float, Field(gt=0)] = 2.0
    grace: Duration = 30.0  # past the time limit the Job is deleted and counted as timed out
    #: multi-node checks (nccl-pair): the pods use their nodes' network (rank 0 reached at its node's address)
    host_network: bool = False


class ChecksConfig(Strict):
    enabled: bool = False
    runner: Literal["slurm", "kubernetes", "fake"] = "slurm"
    #: where jobs write their output (Slurm: a path the engine can read, e.g. on a shared file system; the
    #: engine's user's alone, checked at start: docs/checks.md, "The output folder, and what is refused")
    output_dir: Path = Path("/var/lib/watchd/checks")
    max_output_bytes: Annotated[int, Field(ge=1024)] = 1024 * 1024
    items: list[CheckSpec] = Field(default_factory=list)
    baselines: list[Baseline] = Field(default_factory=lambda: list(DEFAULT_BASELINES))
    peers: PeersConfig = PeersConfig()
    slurm: SlurmCheckRunner = SlurmCheckRunner()
    kubernetes: KubernetesCheckRunner = KubernetesCheckRunner()
    #: event kinds that start `watchd node validate` on their node by themselves (a reboot watchd asked for
    #: is over; a repair system's ``node_repaired``): only nodes watchd drained are validated, as by hand
    auto_validate: list[str] = Field(default_factory=lambda: ["node_rebooted", "node_gpu_reset"])
    risk: RiskWeights = RiskWeights()  # the risk planner's weights and the switch topology
    #: a validation whose pair check found no idle known-good partner keeps its node drained, "not checked",
    #: and validates it again when one frees up; past this wait the shipped rule pages (once)
    partner_wait: Duration = 600.0

    @model_validator(mode="after")
    def _valid(self) -> ChecksConfig:
        names = [c.name for c in self.items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"items: duplicate check names {dup}")
        for i, c in enumerate(self.items):
            if CHECK_KINDS[c.type].default_argv is None and not c.command:
                raise ValueError(f"items.{i}.command: a check of type {c.type} needs a command")
            if c.schedule is not None and not (c.partitions or c.nodes):
                raise ValueError(f"items.{i}: a scheduled check needs partitions or nodes")
        return self

    def check(self, name: str) -> CheckSpec | None:
        return next((c for c in self.items if c.name == name), None)

    def suite(self) -> list[CheckSpec]:
        """The checks `watchd node validate` runs: each node check, then each pair check (with a known-good
        node: :mod:`watchd.checks.fabric.validate`)."""
        chosen = [c for c in self.items if c.in_suite]
        return sorted(chosen, key=lambda c: CHECK_KINDS[c.type].nodes_per_run)

    def node_suite(self) -> list[CheckSpec]:
        """The suite's checks that run on one node alone (`watchd checks run`)."""
        return [c for c in self.suite() if CHECK_KINDS[c.type].nodes_per_run == 1]
