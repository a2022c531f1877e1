"""Evidence lands on the node that printed it: a Slurm job's output file gathers every node's tasks and is
read by the agent on the batch host (n1 here), so its lines are credited to the host or rank they name, never
to the reader; a node's own logs still speak for it."""

from __future__ import annotations

from pathlib import Path

from tests.detect.test_detect_hang import JOB, IbNode, Job, hangs, warmed
from tests.ib.tree import port, write
from tests.trainlog.test_trainlog_culprit import ev, spin_hang
from watchd.checks.risk_evidence import EventEvidence
from watchd.detect.attribution import Origin, credit, host_node
from watchd.model.heartbeat import Heartbeat
from watchd.model.trainlog import CollectiveReport, FlightRecord, NcclWarn

NODES = ("n1", "n2")


def nobody(rank: int) -> str | None:
    return None


def test_a_printed_host_is_one_of_the_jobs_nodes_by_name_or_first_label() -> None:
    assert host_node("n2", NODES) == "n2"
    assert host_node("N2.cluster.example", NODES) == "n2"  # NCCL prints gethostname(), maybe qualified
    assert host_node("n2", ("n1.cluster", "n2.cluster")) == "n2.cluster"
    assert host_node("n3", NODES) is None
    assert host_node("n2.a", ("n2.a", "n2.b")) == "n2.a" and host_node("n2", ("n2.a", "n2.b")) is None


def test_whose_line_it_is() -> None:
    own = Origin("n1", gathered=False, host="elsewhere")
    assert credit(own, NODES, nobody) == "n1"  # a node's own log speaks for it
    assert credit(Origin("n1", True, "n2"), NODES, nobody) == "n2"
    assert credit(Origin("n1", True, "n9"), NODES, nobody) is None  # a host outside the job: nobody's
    assert credit(Origin("n1", True, None, rank=5), NODES, {5: "n2"}.get) == "n2"
    assert credit(Origin("n1", True, None, rank=5), NODES, nobody) is None  # the reader is not evidence
    assert credit(Origin("n1", True), ("n1",), nobody) == "n1"  # a one-node job's lines are its node's
    assert credit(Origin("n7", True, "n2"), NODES, nobody) is None  # read by an agent outside the job


def ib_line(reader: str, t: float, host: str | None, *, gathered: bool = True) -> object:
    return ev(
        reader,
        t,
        NcclWarn(
            category="ib_completion",
            message="NET/IB : Got completion from peer 10.0.0.2<42385> with status=12 ...",
            host=host,
            pid=4242,
            gpu=1,
            status=12,
            vendor_err=129,
            device="mlx5_1",
            job=JOB,
            gathered=gathered or None,
        ),
    )


def test_nic_errors_printed_on_n2_and_read_on_n1_name_n2() -> None:
    job = warmed()
    job.observe(ib_line("n1", job.t + 2, "n2"))  # type: ignore[arg-type]
    spin_hang(job)
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence, f.hardware) == ("n2", 1, "nic_errors", True)


def test_gathered_nic_errors_naming_no_host_name_nobody_in_a_multi_node_job() -> None:
    job = warmed()
    job.observe(ib_line("n1", job.t + 2, None))  # type: ignore[arg-type]
    job.observe(ib_line("n1", job.t + 3, "login-7"))  # type: ignore[arg-type]  # not a node of the job
    spin_hang(job)
    [f] = hangs(job.findings)
    assert f.culprit_node is None and f.evidence == "none"


def test_the_same_lines_in_a_one_node_job_are_its_nodes() -> None:
    job = warmed(Job(("n1",)))
    job.observe(ib_line("n1", job.t + 2, None))  # type: ignore[arg-type]
    spin_hang(job)
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.evidence) == ("n1", "nic_errors")


def work_status(reader: str, t: float, rank: int, completed: int) -> object:
    return ev(
        reader,
        t,
        CollectiveReport(
            report="work_status",
            rank=rank,
            last_enqueued=completed + 1,
            last_completed=completed,
            job=JOB,
            gathered=True,
        ),
    )


def test_a_gathered_wavefront_needs_the_lagging_ranks_placed() -> None:
    # every rank's work status read from the output on n1; rank 6 lags. Unplaced, it names nobody
    job = warmed()
    for rank in range(8):
        job.observe(work_status("n1", job.t + 1, rank, 99 if rank == 6 else 100))  # type: ignore[arg-type]
    spin_hang(job)
    [f] = hangs(job.findings)
    assert f.culprit_node is None and f.evidence == "none"
    assert [r.node for r in job.c.fleet.training.ranks(JOB, NODES)] == [None] * 8


def test_ranks_are_placed_by_their_own_nodes_evidence() -> None:
    # rank 6 says where it runs: its heartbeat comes from n2's agent
    job = warmed()
    for rank in range(8):
        job.observe(work_status("n1", job.t + 1, rank, 99 if rank == 6 else 100))  # type: ignore[arg-type]
    beat = Heartbeat(job=JOB, rank=6, step=10)
    job.observe(beat.to_event(id="hb6", node="n2", source="heartbeat", time=job.t + 1))
    spin_hang(job)
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.evidence) == ("n2", "wavefront")


def test_a_flight_recorder_dump_places_its_rank_and_a_host_named_line_too() -> None:
    training = warmed().c.fleet.training
    dump = FlightRecord(rank=3, pg="0", last_enqueued=5, last_started=5, last_completed=4, job=JOB)
    training.observe(ev("n2", 1.0, dump))
    named = NcclWarn(category="socket", message="m", host="n2", rank=5, job=JOB, gathered=True)
    training.observe(ev("n1", 1.0, named))
    placed = training.placement(JOB)
    assert (placed(3), placed(5), placed(0)) == ("n2", "n2", None)


def test_nccls_net_ib_errors_on_the_port_the_agent_saw_go_down_are_one_nic(tmp_path: Path) -> None:
    job = warmed()
    ib = IbNode("n2", tmp_path)
    ib.scan(job.t - 30.0)
    write(port(ib.root, "mlx5_5") / "state", "1: DOWN")
    write(port(ib.root, "mlx5_5") / "phys_state", "3: Disabled")
    for event in ib.scan(job.t + 1.0):
        job.observe(event)
    line = NcclWarn(
        category="ib_completion",
        message="m",
        host="n2",
        status=12,
        device="mlx5_5",
        port=1,
        job=JOB,
        gathered=True,
    )
    job.observe(ev("n1", job.t + 2.0, line))  # printed on n2, read on the batch host n1
    spin_hang(job)
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.evidence, f.extra.get("corroborated")) == ("n2", "hardware_event", "nic_errors")
    assert str(f.extra["detail"]).endswith("; NCCL NET/IB errors on mlx5_5 too")


def test_the_risk_planner_counts_a_gathered_nic_error_for_the_host_it_names() -> None:
    evidence = EventEvidence()
    for reader, host in (("n1", "n2"), ("n1", None)):
        line = NcclWarn(category="ib_completion", message="m", host=host, status=12, job=JOB, gathered=True)
        evidence.observe(ev(reader, 1.0, line))
    assert set(evidence._times) == {"n2"}  # the reader is not evidence; a line naming nobody counts nowhere
