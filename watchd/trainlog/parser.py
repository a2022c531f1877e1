"""Training-log lines -> training-stack events (:mod:`watchd.model.trainlog`). Pure; never raises.

One line gives at most one event. The formats differ between PyTorch versions (1.x
``[E ProcessGroupNCCL.cpp:N]``, 2.2+ ``[rankN]:`` prefixes, 2.4+ timestamps, ``[PG 1 Rank 0]`` /
``[PG ID 0 PG GUID 0(default_pg) Rank 1]`` process-group tags, NumelIn/NumelOut from 2.0 on) and between
NCCL versions (``with error 4, opcode 32564`` vs ``with status=12 opcode=0``); tests/data/trainlog/ holds
real lines of each with their sources.

Bounded: a line longer than :data:`MAX_LINE` is looked at only in its first :data:`MAX_LINE` characters, every
text field is cut to :data:`~watchd.model.trainlog.MAX_TEXT`, and a quick substring test skips the lines of
ordinary training output before any regular expression runs.
"""

from __future__ import annotations

import re
from dataclasses import replace

from watchd.model.trainlog import (
    MAX_TEXT,
    CollectiveReport,
    CollectiveTimeout,
    NcclRas,
    NcclWarn,
    TcpStoreError,
)

__all__ = ["MAX_LINE", "LineRecord", "parse_line"]

LineRecord = CollectiveTimeout | CollectiveReport | TcpStoreError | NcclWarn | NcclRas

MAX_LINE = 8192
_INT_MAX = 2**63 - 1

# Substrings one of which every line we parse contains (checked before any regex).
_MARKERS = (
    "Watchdog",
    "watchdog",
    "NCCL",
    "TCPStore",
    "monitoredBarrier",
    "CollectiveFingerPrint",
    "collective #",
    "lagging ranks",
    "Heartbeat monitor",
    "ranks have launched",
    "managed by process",
    "RUNNING",
)

_RANK_PREFIX = re.compile(r"\[rank(\d{1,9})\]:")
_RANK_TAG = re.compile(r"\[Rank (\d{1,9})\]")
_PG_TAG = re.compile(
    r"\[PG (?:ID )?(?P<id>\d{1,9})(?: PG GUID (?P<guid>\d{1,12}))?\s*"
    r"(?:\((?P<name>[^)\]]{0,128})\))? Rank (?P<rank>\d{1,9})\]"
)
_TIMEOUT = re.compile(
    r"(?:\[Rank (?P<rank>\d{1,9})\] )?Watchdog caught collective operation timeout: "
    r"WorkNCCL\(SeqNum=(?P<seq>\d{1,19}), "
    r"OpType=(?P<op>[A-Za-z_0-9]{1,64})(?:, NumelIn=(?P<nin>-?\d{1,19}), NumelOut=(?P<nout>-?\d{1,19}))?, "
    r"Timeout\(ms\)=(?P<timeout>\d{1,19})\) ran for (?P<ran>\d{1,19}) milliseconds before timing out"
)
_WORK_STATUS = re.compile(
    r"(?:detected by watchdog at work|Timeout at NCCL work|detected by watchdog at work sequence id):? "
    r"(?P<seq>-?\d{1,19}),? (?:PG status: )?last enqueued (?:NCCL )?work: (?P<enq>-?\d{1,19}), "
    r"last completed (?:NCCL )?work: (?P<done>-?\d{1,19})"
)
_STUCK = re.compile(r"watchdog got stuck for (\d{1,12}) seconds")
_MONITORED = re.compile(r"Ranks? ([\d, ]{1,4096}) failed to pass monitoredBarrier in (\d{1,19}) ms")
_MISMATCH = re.compile(
    r"Rank (\d{1,9}) is running collective: "
    r"CollectiveFingerPrint\(SequenceNumber=(\d{1,19})\s*OpType=(\w{1,64})"
    r".{0,512}?but Rank (\d{1,9}) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d{1,19})"
)
_MISSING = re.compile(r"ranks \[([\d, ]{1,4096})\] are the lagging ranks that caused this timeout")
_JOINED = re.compile(r"\[([\d, ]{1,4096})\] joined but didn't finish collective #(\d{1,19})")
_NOT_JOINED = re.compile(
    r"\[([\d, ]{1,4096})\] finished collective #(\d{1,19}), but didn't join collective #(\d{1,19})"
)
_TCPSTORE = re.compile(
    r"\[c10d\] (?P<op>\w{1,64}) failed on SocketImpl\(fd=\d+, addr=(?P<addr>[^,]{0,256}), "
    r"remote=(?P<remote>[^)]{0,256})\): "
    r"(?P<err>.*)"
)
_SHOULD_DUMP = re.compile(r'Failed to check the "should dump" flag on TCPStore.{0,128}?with error: (.*)')
_NCCL_HEADER = re.compile(
    r"(?:^|\s)(?P<host>[\w.\-]{1,255}):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>\d{1,4})\] "
)
_NCCL_WARN = re.compile(r"NCCL WARN (.*)")
_NCCL_ERROR = re.compile(r"NCCL error(?: in: [^,]{0,512},|:) ?(.*)")
_IB_COMPLETION = re.compile(
    r"NET/IB\w{0,8} ?: ?Got completion from peer (?P<peer>\S{1,256}?) "
    r"with (?:error |status=)(?P<status>\d{1,9}),? "
    r"opcode[ =](?P<opcode>\d{1,9}),? len[ =](?P<len>\d{1,19}),? vendor err (?P<vendor>\d{1,9})"
    r"(?: \((?P<dir>Send|Recv)\))?"
)
_IB_DEVICE = re.compile(r"\b((?:mlx\d_|bnxt_re|irdma|efa_|hfi1_|qedr|rocep|ionic_)\w{0,32}):(\d{1,3})\b")
_PEER_IFACE = re.compile(r"%(\w{1,32})<")
_CUDA_FAILURE = re.compile(r"Cuda failure (?:(\d{1,6}) )?'([^']{0,256})'")
_RAS_ROW = re.compile(
    r"^\s*(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+([A-Z_]{2,32})\s+([A-Z_]{2,32})\s*$"
)
_RAS_OPS = re.compile(r"(\d{1,9}) ranks? ha(?:ve|s) launched up to operation (\d{1,19})")
_RAS_RANK = re.compile(r"Rank (\d{1,9}) -- GPU (\d{1,4}) managed by process (\d{1,10}) on node (\S{1,255})")


def _cut(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    n = int(value)
    return n if -_INT_MAX <= n <= _INT_MAX else None


def _ranks(text: str) -> str:
    return _cut(",".join(r.strip() for r in text.split(",") if r.strip()))


def _rank_of(line: str) -> tuple[int | None, str | None]:
    """The rank and process group a line names (``[PG .. Rank N]``, ``[Rank N]``, ``[rankN]:``)."""
    pg = _PG_TAG.search(line)
    if pg is not None:
        name = pg.group("name")
        return int(pg.group("rank")), _cut(name or pg.group("id"))
    tag = _RANK_TAG.search(line)
    if tag is not None:
        return int(tag.group(1)), None
    prefix = _RANK_PREFIX.search(line)
    return (int(prefix.group(1)), None) if prefix is not None else (None, None)


def parse_line(text: str, *, job: str | None = None, gathered: bool = False) -> LineRecord | None:
    """The training-stack event ``text`` reports, None for any other line. ``gathered``: the line was read
    from a job's output file that every node's tasks write (the event says so)."""
    line = text[:MAX_LINE]
    if not any(m in line for m in _MARKERS):
        return None
    try:
        record = _parse(line, job)
    except (ValueError, IndexError):  # pragma: no cover - the patterns only capture digits where int() reads
        return None
    return replace(record, gathered=True) if gathered and record is not None else record


def _parse(line: str, job: str | None) -> LineRecord | None:
    raw = _cut(line)
    if "Watchdog caught collective operation timeout" in line:
        m = _TIMEOUT.search(line)
        if m is not None:
            rank, pg = _rank_of(line)
            if m.group("rank") is not None:
                rank = int(m.group("rank"))
            seq, timeout, ran = _int(m.group("seq")), _int(m.group("timeout")), _int(m.group("ran"))
            if rank is not None and seq is not None and timeout is not None and ran is not None:
                return CollectiveTimeout(
                    rank=rank,
                    seq=seq,
                    op=m.group("op"),
                    timeout_ms=timeout,
                    ran_ms=ran,
                    numel_in=_int(m.group("nin")),
                    numel_out=_int(m.group("nout")),
                    job=job,
                    pg=pg,
                    raw=raw,
                )
    report = _report(line, raw, job)
    if report is not None:
        return report
    if "TCPStore" in line:
        return _tcpstore(line, raw, job)
    if "NCCL" in line:
        warn = _nccl(line, raw, job)
        if warn is not None:
            return warn
    return _ras(line, raw, job)


def _report(line: str, raw: str, job: str | None) -> CollectiveReport | None:
    rank, pg = _rank_of(line)

    def make(report: str, **kw: object) -> CollectiveReport:
        return CollectiveReport(report=report, rank=rank, pg=pg, job=job, raw=raw, **kw)  # type: ignore[arg-type]

    m = _WORK_STATUS.search(line)
    if m is not None:
        return make(
            "work_status",
            seq=_int(m.group("seq")),
            last_enqueued=_int(m.group("enq")),
            last_completed=_int(m.group("done")),
        )
    if "Some NCCL operations have failed or timed out" in line:
        return make("failed_or_timed_out")
    m = _STUCK.search(line)
    if m is not None:
        return make("watchdog_stuck", stuck_s=_int(m.group(1)))
    if "Heartbeat monitor timed out" in line or "detected no heartbeat of its watchdog" in line:
        return make("heartbeat_monitor")
    m = _MONITORED.search(line)
    if m is not None:
        return make("desync", ranks=_ranks(m.group(1)), detail="failed to pass monitoredBarrier")
    m = _MISMATCH.search(line)
    if m is not None:
        return make(
            "desync",
            ranks=f"{m.group(1)},{m.group(4)}",
            detail=_cut(f"rank {m.group(1)} at seq {m.group(2)}, rank {m.group(4)} at seq {m.group(5)}"),
        )
    m = _MISSING.search(line)
    if m is not None:
        return make("desync", ranks=_ranks(m.group(1)), detail="never joined any collectives")
    m = _JOINED.search(line)
    if m is not None:
        return make(
            "desync", ranks=_ranks(m.group(1)), seq=_int(m.group(2)), detail="joined but didn't finish"
        )
    m = _NOT_JOINED.search(line)
    if m is not None:
        return make(
            "desync",
            ranks=_ranks(m.group(1)),
            seq=_int(m.group(3)),
            last_completed=_int(m.group(2)),
            detail="finished but didn't join the next",
        )
    if "watchdog thread terminated with exception" in line:
        detail = line.split("terminated with exception:", 1)[1]
        return make("watchdog_exception", detail=_cut(detail))
    return None


def _tcpstore(line: str, raw: str, job: str | None) -> TcpStoreError | None:
    rank, _ = _rank_of(line)
    m = _TCPSTORE.search(line)
    if m is not None:
        return TcpStoreError(
            error=_cut(m.group("err")),
            operation=m.group("op"),
            remote=_cut(m.group("remote")),
            rank=rank,
            job=job,
            raw=raw,
        )
    m = _SHOULD_DUMP.search(line)
    if m is not None:
        return TcpStoreError(
            error=_cut(m.group(1)), operation="should_dump_check", rank=rank, job=job, raw=raw
        )
    return None


def _nccl(line: str, raw: str, job: str | None) -> NcclWarn | None:
    warn = _NCCL_WARN.search(line)
    error = _NCCL_ERROR.search(line) if warn is None else None
    if warn is None and error is None:
        return None
    message = (warn or error).group(1)  # type: ignore[union-attr]
    header = _NCCL_HEADER.search(line)
    rank, _ = _rank_of(line)
    common: dict[str, object] = {
        "message": _cut(message),
        "host": header.group("host") if header else None,
        "pid": int(header.group("pid")) if header else None,
        "gpu": int(header.group("dev")) if header else None,
        "rank": rank,
        "job": job,
        "raw": raw,
    }
    device = _IB_DEVICE.search(line)
    if device is not None:
        common["device"], common["port"] = device.group(1), int(device.group(2))
    ib = _IB_COMPLETION.search(line)
    if ib is not None:
        if device is None:
            iface = _PEER_IFACE.search(ib.group("peer"))
            common["device"] = iface.group(1) if iface else None
        return NcclWarn(
            category="ib_completion",
            peer=_cut(ib.group("peer")),
            status=int(ib.group("status")),
            opcode=int(ib.group("opcode")),
            vendor_err=int(ib.group("vendor")),
            direction=ib.group("dir"),
            **common,  # type: ignore[arg-type]
        )
    cuda = _CUDA_FAILURE.search(line)
    if cuda is not None:
        return NcclWarn(category="cuda_failure", cuda_error=_int(cuda.group(1)), **common)  # type: ignore[arg-type]
    if "remote process exited" in line:
        category = "remote_error"
    elif "unhandled system error" in line:
        category = "system_error"
    elif "unhandled cuda error" in line:
        category = "cuda_failure"
    elif "NET/IB" in line and device is not None:
        category = "ib_async"
    elif "socket" in message.lower() or "Call to recv" in message or "Connection closed" in message:
        category = "socket"
    else:
        category = "other"
    return NcclWarn(category=category, **common)  # type: ignore[arg-type]


def _ras(line: str, raw: str, job: str | None) -> NcclRas | None:
    m = _RAS_RANK.search(line)
    if m is not None:
        return NcclRas(
            what="rank",
            rank=int(m.group(1)),
            gpu=int(m.group(2)),
            pid=int(m.group(3)),
            node_addr=_cut(m.group(4)),
            job=job,
            raw=raw,
        )
    m = _RAS_OPS.search(line)
    if m is not None:
        return NcclRas(what="op_count", ranks=int(m.group(1)), operation=_int(m.group(2)), job=job, raw=raw)
    m = _RAS_ROW.match(line)
    if m is not None:
        status, errors = m.group(7), m.group(8)
        if status == "RUNNING" and errors == "OK":
            return None
        return NcclRas(
            what="comm_status", status=status, errors=errors, ranks=int(m.group(6)), job=job, raw=raw
        )
    return None
