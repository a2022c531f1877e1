"""The hang detector with training-stack evidence (issue 19): NIC errors, the wavefront, CUDA errors, late
arrival, watchdog timeouts as a hang signal of their own; what corroborated or contradicted the culprit."""

from __future__ import annotations

from tests.detect.test_detect_hang import JOB, Job, hangs, warmed
from watchd.detect.trainlog_evidence import TrainingEvidence
from watchd.model.events import Event, stable_id
from watchd.model.kinds import Attrs
from watchd.model.trainlog import CollectiveReport, CollectiveTimeout, FlightRecord, NcclWarn

_n = 0


def ev(node: str, t: float, record: Attrs) -> Event:
    global _n
    _n += 1
    return record.to_event(id=stable_id("t", _n), node=node, source="slurm-jobs", time=t)


def ib_error(node: str, t: float, gpu: int = 1, device: str | None = "mlx5_1") -> Event:
    return ev(
        node,
        t,
        NcclWarn(
            category="ib_completion",
            message="NET/IB : Got completion ...",
            gpu=gpu,
            status=12,
            vendor_err=129,
            device=device,
            job=JOB,
        ),
    )


def fr(job: Job, rank: int, completed: int, t: float) -> Event:
    node = job.nodes[rank // job.gpus]
    return ev(
        node,
        t,
        FlightRecord(
            rank=rank,
            pg="0",
            last_enqueued=completed + 2,
            last_started=completed + 1,
            last_completed=completed,
            job=JOB,
        ),
    )


def spin_hang(job: Job) -> None:
    """Every GPU spins: NVML alone has no odd one out."""
    job.run_for(20.0, "spin")


def test_nic_errors_on_one_node_name_it_with_hardware_evidence() -> None:
    job = warmed()
    job.observe(ib_error("n2", job.t + 2))
    spin_hang(job)
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence, f.hardware) == ("n2", 1, "nic_errors", True)
    assert "mlx5_1" in f.extra["detail"] and "status 12" in f.extra["detail"]  # type: ignore[operator]
    assert f.detection().hardware is True  # the default rules drain only this


def test_without_training_evidence_the_same_hang_has_no_culprit() -> None:
    job = warmed()
    spin_hang(job)
    [f] = hangs(job.findings)
    assert f.culprit_node is None and f.evidence == "none"


def test_nic_errors_on_two_nodes_name_nobody() -> None:
    job = warmed()
    job.observe(ib_error("n1", job.t + 1))
    job.observe(ib_error("n2", job.t + 2))
    spin_hang(job)
    assert hangs(job.findings)[0].culprit_node is None


def test_the_wavefront_names_the_lagging_rank_and_is_not_hardware() -> None:
    job = warmed()
    for rank in range(8):
        job.observe(fr(job, rank, 99 if rank == 6 else 100, job.t + 1))
    spin_hang(job)
    [f] = hangs(job.findings)
    # a dump names its rank, not its GPU
    assert (f.culprit_node, f.culprit_gpu, f.evidence, f.hardware) == ("n2", None, "wavefront", False)
    assert "rank(s) 6 completed collective 99" in f.extra["detail"]  # type: ignore[operator]


def test_nic_errors_confirmed_by_the_wavefront_and_contradicted_elsewhere() -> None:
    job = warmed()
    job.observe(ib_error("n2", job.t + 2))
    for rank in range(8):
        job.observe(fr(job, rank, 99 if rank == 5 else 100, job.t + 1))
    spin_hang(job)
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.evidence, f.extra.get("corroborated")) == ("n2", "nic_errors", "wavefront")
    other = warmed()
    other.observe(ib_error("n2", other.t + 2))
    for rank in range(8):
        other.observe(fr(other, rank, 99 if rank == 0 else 100, other.t + 1))  # rank 0 is on n1
    spin_hang(other)
    [g] = hangs(other.findings)
    assert (g.culprit_node, g.evidence, g.extra.get("contradicted")) == ("n2", "nic_errors", "wavefront")


def test_a_cuda_error_on_one_node_names_it_without_hardware_attribution() -> None:
    job = warmed()
    job.observe(
        ev(
            "n1",
            job.t + 1,
            CollectiveReport(
                report="watchdog_exception",
                rank=2,
                gpu=2,
                job=JOB,
                detail="CUDA error: an illegal memory access was encountered",
            ),
        )
    )
    spin_hang(job)
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence, f.hardware) == ("n1", 2, "cuda_error", False)


def timeout(job: Job, rank: int, t: float, seq: int = 500, ran_ms: int = 600_000) -> Event:
    node = job.nodes[rank // job.gpus]
    return ev(
        node,
        t,
        CollectiveTimeout(
            rank=rank,
            seq=seq,
            op="ALLREDUCE",
            timeout_ms=600_000,
            ran_ms=ran_ms,
            job=JOB,
            gpu=rank % job.gpus,
        ),
    )


def test_watchdog_timeouts_alone_are_a_hang_and_work_status_gives_the_wavefront() -> None:
    job = Job()  # no NVML windows, no heartbeats: only the job's output
    t = 2000.0
    for rank in range(8):
        job.observe(timeout(job, rank, t))
        last = 498 if rank == 3 else 499
        status = CollectiveReport(
            report="work_status", rank=rank, seq=500, last_enqueued=501, last_completed=last, job=JOB
        )
        job.observe(ev(job.nodes[rank // 4], t, status))
    job.t = t
    [f] = job.step(None)
    assert f.kind == "nccl_hang" and f.signal == "trainlog"
    assert f.onset == t - 600.0  # the collective began when it started running, 600 s before the report
    assert (f.culprit_node, f.culprit_gpu, f.evidence) == ("n1", 3, "wavefront")


def test_the_rank_that_entered_the_collective_last_is_named_when_nothing_else_does() -> None:
    job = Job()
    t = 2000.0
    for rank in range(8):
        late = rank == 7
        # every rank times out on seq 500; rank 7 entered it 40 s after the others (it times out last)
        job.observe(timeout(job, rank, t + (40.0 if late else 0.0)))
    job.t = t + 40.0
    [f] = job.step(None)
    assert (f.culprit_node, f.culprit_gpu, f.evidence) == ("n2", 3, "late_arrival")


def test_evidence_is_bounded_and_drops_are_counted() -> None:
    ev_ = TrainingEvidence(max_jobs=2, max_ranks=3, max_nodes=2)
    for j in range(4):
        for rank in range(5):
            ev_.observe(
                ev(
                    f"n{rank}",
                    1.0,
                    CollectiveTimeout(rank=rank, seq=1, op="X", timeout_ms=1, ran_ms=2, job=f"slurm:{j}"),
                )
            )
    assert len(ev_.jobs) == 2 and all(len(r) == 3 for r in ev_.jobs.values())
    assert ev_.dropped == 2 * 2 + 2 * 5  # 2 ranks past the bound in each kept job, every rank of the others
    for node in range(5):
        ev_.observe(ib_error(f"x{node}", 1.0))
    assert len(ev_.nodes) == 2
    ev_.observe(
        CollectiveTimeout(rank=-1, seq=1, op="X", timeout_ms=1, ran_ms=1, job="slurm:0").to_event(
            id="a", node="n", source="s", time=1.0
        )
    )
    ev_.prune(1.0 + ev_.ttl_s + 1)
    assert ev_.jobs == {} and ev_.nodes == {}


def test_a_line_without_a_job_counts_for_the_job_on_its_gpu() -> None:
    job = warmed()  # the agents label GPUs with JOB
    warn = NcclWarn(category="ib_completion", message="m", gpu=0, status=12)
    job.observe(warn.to_event(id="w", node="n1", source="journald", time=job.t))
    timeout_no_job = CollectiveTimeout(rank=0, seq=9, op="ALLREDUCE", timeout_ms=1, ran_ms=1, gpu=0)
    job.observe(timeout_no_job.to_event(id="t", node="n1", source="journald", time=job.t))
    assert [r.rank for r in job.c.fleet.training.ranks(JOB)] == [0]
    assert len(job.c.fleet.training.nic_errors(JOB, ("n1",), 0, job.t)["n1"]) == 1
