"""The training-log parser on real lines from public issue threads (tests/data/trainlog, sources in its
README), every PyTorch and NCCL format there, and on lines it must leave alone or bound."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.trainlog.wire import real_lines
from watchd.model.registry import KINDS
from watchd.model.trainlog import (
    MAX_TEXT,
    CollectiveReport,
    CollectiveTimeout,
    NcclRas,
    NcclWarn,
    TcpStoreError,
)
from watchd.trainlog.parser import MAX_LINE, parse_line

#: What each file's real lines parse to, in order (None: a line that must give no event).
EXPECTED_KINDS = {
    "torch_watchdog.log": ["collective_timeout"] * 9,
    "tcpstore.log": ["tcpstore_error"] * 6,
    "nccl_warn.log": ["nccl_warn"] * 13,
    "nccl_ras.log": [
        None,
        None,
        None,
        "nccl_ras",
        None,
        "nccl_ras",
        "nccl_ras",
        "nccl_ras",
        "nccl_ras",
        None,
    ],
}


def _by_file() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, line in real_lines():
        out.setdefault(name, []).append(line)
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED_KINDS))
def test_every_real_line_gives_its_kind(name: str) -> None:
    kinds = []
    for line in _by_file()[name]:
        record = parse_line(line)
        kinds.append(None if record is None else record.KIND)
    assert kinds == EXPECTED_KINDS[name]


def test_watchdog_timeouts_of_every_version_carry_rank_seq_op_sizes_timeout_and_duration() -> None:
    got = [parse_line(line) for line in _by_file()["torch_watchdog.log"]]
    assert all(isinstance(r, CollectiveTimeout) for r in got)
    fields = [(r.rank, r.seq, r.op, r.numel_in, r.numel_out, r.timeout_ms, r.ran_ms) for r in got]  # type: ignore[union-attr]
    assert fields == [
        (1, 469508, "ALLREDUCE", None, None, 1800000, 1802212),  # 1.x: no NumelIn/NumelOut
        (7, 64088, "ALLREDUCE", None, None, 1800000, 25625251),
        (2, 48490, "ALLREDUCE", 1, 1, 1800000, 1800781),  # inside "watchdog thread terminated with exception"
        (1, 44, "ALLREDUCE", 6832129, 6832129, 1800000, 1800772),  # [rank1]: prefix, no timestamp
        (7, 80078, "BROADCAST", 5056, 5056, 600000, 600026),  # indented, timestamped
        (0, 7753, "_REDUCE_SCATTER_BASE", 544997376, 68124672, 600000, 600061),
        (1, 808, "ALLREDUCE", 9801523, 9801523, 600000, 600020),
        (2, 120049, "_ALLGATHER_BASE", 16384000, 131072000, 1800000, 1800065),
        (0, 1580, "ALLREDUCE", 466119168, 466119168, 600000, 600060),
    ]


def test_watchdog_reports_work_status_heartbeat_monitor_and_desync() -> None:
    got = [parse_line(line) for line in _by_file()["torch_watchdog_reports.log"]]
    reports = [r for r in got if isinstance(r, CollectiveReport)]
    assert Counter(r.report for r in reports) == {
        "failed_or_timed_out": 3,
        "work_status": 4,
        "heartbeat_monitor": 2,
        "watchdog_stuck": 3,
        "desync": 5,
        "watchdog_exception": 1,
    }
    status = [
        (r.rank, r.pg, r.seq, r.last_enqueued, r.last_completed) for r in reports if r.report == "work_status"
    ]
    assert status == [
        (0, "1", 1580, 1582, 1579),  # [PG 1 Rank 0]
        (1, "default_pg", 808, 811, 807),  # [PG ID 0 PG GUID 0(default_pg) Rank 1]
        (0, "1", 7753, 7755, 7752),  # "Timeout at NCCL work"
        (5, "default_pg", 120049, 120051, 120048),  # 2.7+: "failure detected ... PG status"
    ]
    stuck = [(r.rank, r.pg, r.stuck_s) for r in reports if r.report == "watchdog_stuck"]
    assert stuck == [(1, "0", 600), (2, "default_pg", 480), (4, "EXPERT_MODEL_PARALLEL_GROUP", 480)]
    desync = [(r.ranks, r.seq, r.detail) for r in reports if r.report == "desync"]
    assert desync[0] == ("4,5,6,7", None, "failed to pass monitoredBarrier")
    assert desync[2:] == [
        ("47", None, "never joined any collectives"),
        ("47", 41207, "joined but didn't finish"),
        ("0,1,2", 41208, "finished but didn't join the next"),
    ]
    [exc] = [r for r in reports if r.report == "watchdog_exception"]
    assert exc.rank == 0 and exc.detail == "CUDA error: an illegal memory access was encountered"
    # the FlightRecorder-disabled hint is no event
    assert sum(r is None for r in got) == 1


def test_nccl_warnings_carry_peer_status_vendor_error_device_and_gpu() -> None:
    got = [parse_line(line) for line in _by_file()["nccl_warn.log"]]
    assert all(isinstance(r, NcclWarn) for r in got)
    warns = [r for r in got if isinstance(r, NcclWarn)]
    ib = [
        (w.host, w.gpu, w.status, w.vendor_err, w.direction, w.device)
        for w in warns
        if w.category == "ib_completion"
    ]
    assert ib == [
        ("H100-2", 1, 4, 81, "Send", "ib0"),  # NCCL 2.18 "with error 4, opcode": the peer's GID interface
        ("kolyoz2", 0, 4, 81, "Send", None),
        ("kp-ddp-worker-0", 4, 12, 129, "Recv", None),  # "status=12 opcode=0"
        ("hostname-test", 4, 5, 249, "Recv", None),
        (None, None, 12, 129, None, None),  # inside PyTorch's ncclRemoteError text
    ]
    assert Counter(w.category for w in warns) == {
        "ib_completion": 5,
        "cuda_failure": 2,
        "socket": 3,
        "other": 1,
        "remote_error": 1,
        "system_error": 1,
    }
    cuda = [(w.cuda_error, w.gpu) for w in warns if w.category == "cuda_failure"]
    assert cuda == [(700, None), (None, 1)]
    assert [w.rank for w in warns if w.category == "remote_error"] == [3]


def test_tcpstore_failures_name_operation_remote_and_error() -> None:
    got = [parse_line(line) for line in _by_file()["tcpstore.log"]]
    assert [(r.operation, r.remote, r.rank) for r in got if isinstance(r, TcpStoreError)] == [
        ("recvValueWithTimeout", "[localhost]:1234", None),
        ("recvValue", "[sglang-0.default.pod.transwarp.local]:20000", 12),
        ("should_dump_check", None, 8),
        ("should_dump_check", None, 2),
        ("should_dump_check", None, 7),
        ("recvValue", "[::ffff:0.0.0.0]:12201", 1),
    ]


def test_ras_report_mismatch_op_counts_and_ranks_healthy_rows_give_nothing() -> None:
    got = [r for r in (parse_line(line) for line in _by_file()["nccl_ras.log"]) if isinstance(r, NcclRas)]
    assert [(r.what, r.status, r.errors, r.ranks, r.operation, r.rank, r.gpu, r.node_addr) for r in got] == [
        ("comm_status", "RUNNING", "MISMATCH", 32, None, None, None, None),
        ("op_count", None, None, 30, 640, None, None, None),
        ("op_count", None, None, 2, 641, None, None, None),
        ("rank", None, None, None, None, 12, 4, "10.137.190.124"),
        ("rank", None, None, None, None, 13, 5, "10.137.190.124"),
    ]


def test_the_job_the_source_knows_is_carried() -> None:
    line = _by_file()["torch_watchdog.log"][4]
    record = parse_line(line, job="slurm:77")
    assert record is not None and record.to_attrs()["job"] == "slurm:77"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "epoch 3 step 1200 loss 2.31",
        "NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/IPC",
        "[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=abc)",
        "    0         1         4         8        32        32   running  ok",
        "Rank 12 -- GPU x managed by process 1 on node a",
        "\x00\udcff NCCL WARN",
    ],
)
def test_ordinary_or_broken_lines_give_no_event_or_a_bounded_one(line: str) -> None:
    record = parse_line(line)
    assert record is None or record.KIND in KINDS


def test_an_overlong_line_is_bounded() -> None:
    base = (
        "[rank3]:[E ProcessGroupNCCL.cpp:1] [Rank 3] Some NCCL operations have failed or timed out."
        + "x" * 10_000_000
    )
    record = parse_line(base)
    assert isinstance(record, CollectiveReport) and record.rank == 3
    assert record.raw is not None and len(record.raw) <= MAX_TEXT
    warn = parse_line("h:1:2 [0] x.cc:1 NCCL WARN " + "y" * (2 * MAX_LINE))
    assert isinstance(warn, NcclWarn) and len(warn.message) <= MAX_TEXT and len(warn.raw or "") <= MAX_TEXT
    huge_seq = parse_line(
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=99999999999999999999, "
        "OpType=ALLREDUCE, Timeout(ms)=1) ran for 2 milliseconds before timing out."
    )
    assert huge_seq is None  # 20 digits: not a sequence number
    past_64_bits = parse_line(
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9999999999999999999, "
        "OpType=ALLREDUCE, Timeout(ms)=1) ran for 2 milliseconds before timing out."
    )
    assert past_64_bits is None  # beyond what the wire carries: no event rather than a refused one


def test_every_event_passes_the_wire_checks() -> None:
    from watchd.model.events import event_from_wire

    for name, line in real_lines():
        record = parse_line(line, job="slurm:1")
        if record is not None:
            event = record.to_event(id="x", node="n", source="s", time=1.0)
            assert event_from_wire(event.to_wire(), name).attrs == event.attrs
