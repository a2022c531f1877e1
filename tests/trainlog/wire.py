"""The training-log events of the recorded wire batch ``tests/data/wire-v1/trainlog.json`` (issue 19): every
line of tests/data/trainlog/*.log the parser reads, and the Flight Recorder dumps summarized, as the agent
builds them."""

from __future__ import annotations

from pathlib import Path

from watchd.model.events import Event, stable_id
from watchd.trainlog.flight_recorder import load_dump, summarize
from watchd.trainlog.parser import parse_line

DATA = Path(__file__).resolve().parent.parent / "data" / "trainlog"
LOGS = sorted(DATA.glob("*.log"))
DUMPS = sorted(DATA.glob("fr_*"))


def real_lines() -> list[tuple[str, str]]:
    """(file name, line) of every real line in the data (comments and blank lines left out)."""
    return [
        (p.name, line)
        for p in LOGS
        for line in p.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def trainlog_events(node: str, t0: float) -> list[Event]:
    out: list[Event] = []
    for i, (name, line) in enumerate(real_lines()):
        record = parse_line(line, job="slurm:4242")
        if record is not None:
            key = f"{name}:{i}"
            out.append(
                record.to_event(
                    id=stable_id(node, "slurm-jobs", key, "trainlog"),
                    node=node,
                    source="slurm-jobs",
                    time=t0 + i,
                )
            )
    for j, path in enumerate(DUMPS):
        records, _ = summarize(
            load_dump(path.read_bytes()), rank=j, job="slurm:4242", path=f"/tmp/fr/4242/{path.name}"
        )
        for rec in records:
            out.append(
                rec.to_event(
                    id=stable_id(node, "flight_recorder", path.name, rec.pg),
                    node=node,
                    source="flight-recorder",
                    time=t0 + 100 + j,
                )
            )
    return out
