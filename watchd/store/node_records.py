"""What watchd holds of each node for the safety of its remediations: the automatic remediations done
(reboots and GPU resets, each claimed once, counted in the limit's window), the marks that keep a node out
of automatic service (``lemon``: the lemon rule's verdict; ``left_for_a_person``: its remediations in the
window were spent), and the generation of watchd's drain of it (bumped at every drain watchd makes, so a
command issued under one drain is not carried out under another).

Held, not replayed: the limit and the marks are rows read and written inside one transaction with the
claim of the remediation itself, so no amount of other records (a flapping GPU's thousand repeated Xids)
can hide them, and two remediations racing for the last slot cannot both win. A mark is cleared only by an
operator's audited command or when the agent reports a different GPU in the slot it was about; the rows
are kept with who cleared them and why (a node's history)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from watchd.store.connection import Connection, Row, Tx

MarkKind = Literal["lemon", "left_for_a_person"]
MARKS: tuple[MarkKind, ...] = ("lemon", "left_for_a_person")

_MARK_COLS = "id, node, mark, rule, detail, set_at, gpu, uuid, gpus, cleared_at, cleared_by, cleared_why"


@dataclass(frozen=True, slots=True)
class Mark:
    """A mark on a node: while open (``cleared_at`` None) no automatic remediation and no automatic return
    to service. ``gpu``/``uuid``: the PCI slot it is about and the GPU seen there (may be empty), ``gpus``:
    every slot's GPU the engine saw since the mark (slot -> UUID), so a replaced GPU is recognised."""

    id: int
    node: str
    mark: MarkKind
    rule: str
    detail: str
    set_at: float
    gpu: str = ""
    uuid: str = ""
    gpus: Mapping[str, str] = field(default_factory=dict)
    cleared_at: float | None = None
    cleared_by: str = ""
    cleared_why: str = ""

    def describe(self) -> str:
        what = "a lemon" if self.mark == "lemon" else "left for a person"
        return f"marked {what} by rule {self.rule} ({self.detail})"

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "node": self.node,
            "mark": self.mark,
            "rule": self.rule,
            "detail": self.detail,
            "set_at": self.set_at,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "gpus": dict(self.gpus),
            "cleared_at": self.cleared_at,
            "cleared_by": self.cleared_by,
            "cleared_why": self.cleared_why,
        }


@dataclass(frozen=True, slots=True)
class Claimed:
    """A remediation may go ahead: ``count`` automatic remediations of the node in the window with it."""

    count: int
    again: bool = False  # claimed before (a re-drive): nothing new was counted
    #: watchd's drain of the node it was claimed under: a command of it lapses once the node is drained again
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Refused:
    """A remediation may not go ahead: the node's open mark, or the limit just reached (then ``mark`` is
    the ``left_for_a_person`` mark this claim set)."""

    mark: Mark
    count: int = 0
    limit_reached: bool = False


def _mark(row: Row) -> Mark:
    gpus = json.loads(row[8] or "{}")
    return Mark(
        int(row[0]),
        str(row[1]),
        row[2],
        str(row[3]),
        str(row[4]),
        float(row[5]),
        str(row[6]),
        str(row[7]),
        {str(k): str(v) for k, v in gpus.items()} if isinstance(gpus, dict) else {},
        None if row[9] is None else float(row[9]),
        str(row[10]),
        str(row[11]),
    )


class NodeRecords:
    def __init__(self, db: Connection) -> None:
        self._db = db

    # ------------------------------------------------------------------------------- remediations

    def claim(
        self,
        node: str,
        kind: str,
        claim: str,
        rule: str,
        now: float,
        *,
        window_s: float,
        limit: int,
    ) -> Claimed | Refused:
        """In one transaction: refuse if the node has an open mark; allow again a claim made before (a
        re-drive of the same decision); refuse, and mark the node ``left_for_a_person``, when it had
        ``limit`` remediations in the last ``window_s``; else count this one and allow it."""
        with self._db.write(f"claiming a {kind} of {node}") as tx:
            marks = _open_marks(tx, node)
            if marks:
                return Refused(marks[0])
            row = tx.execute("SELECT generation FROM node_remediations WHERE claim = ?", (claim,)).fetchone()
            if row is not None:
                return Claimed(_count(tx, node, now - window_s), again=True, generation=int(row[0]))
            done = _count(tx, node, now - window_s)
            if done >= limit:
                detail = f"{done} automatic remediations in {window_s / 86400:g} d (at most {limit})"
                mark = _set_mark(tx, node, "left_for_a_person", rule, detail, now)
                return Refused(mark, done, limit_reached=True)
            gen = tx.execute("SELECT generation FROM node_drains WHERE node = ?", (node,)).fetchone()
            generation = 0 if gen is None else int(gen[0])
            tx.execute(
                "INSERT INTO node_remediations (node, kind, claim, rule, at, generation)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (node, kind, claim, rule, now, generation),
            )
            return Claimed(done + 1, generation=generation)

    def settle(self, claim: str, outcome: str, done: bool) -> None:
        """How a claimed remediation ended: kept in the count with its outcome when it was (or may have
        been) done; taken back when nothing was touched (refused before it began, never fetched)."""
        with self._db.write(f"settling remediation {claim}") as tx:
            if done:
                tx.execute("UPDATE node_remediations SET outcome = ? WHERE claim = ?", (outcome, claim))
            else:
                tx.execute("DELETE FROM node_remediations WHERE claim = ?", (claim,))

    def remediations(self, node: str, since: float) -> int:
        row = self._db.one(
            f"counting the remediations of {node}",
            "SELECT count(*) FROM node_remediations WHERE node = ? AND at >= ?",
            (node, since),
        )
        return 0 if row is None else int(row[0])

    def prune(self, older_than: float) -> int:
        """Forget remediations older than every window (and marks cleared before ``older_than``)."""
        with self._db.write("pruning the node records") as tx:
            n = tx.execute("DELETE FROM node_remediations WHERE at < ?", (older_than,)).rowcount
            n += tx.execute(
                "DELETE FROM node_marks WHERE cleared_at IS NOT NULL AND cleared_at < ?", (older_than,)
            ).rowcount
            return n

    # ------------------------------------------------------------------------------- marks

    def mark(
        self, node: str, kind: MarkKind, rule: str, detail: str, now: float, gpu: str = "", uuid: str = ""
    ) -> Mark:
        """Set a mark (the open one is kept as it is if the node has it already)."""
        with self._db.write(f"marking {node} {kind}") as tx:
            return _set_mark(tx, node, kind, rule, detail, now, gpu, uuid)

    def open_marks(self, node: str) -> list[Mark]:
        rows = self._db.all(
            f"reading the marks of {node}",
            f"SELECT {_MARK_COLS} FROM node_marks WHERE node = ? AND cleared_at IS NULL ORDER BY id",
            (node,),
        )
        return [_mark(r) for r in rows]

    def marked(self) -> list[Mark]:
        """Every open mark of the fleet (a few nodes: marks are rare and cleared by people)."""
        rows = self._db.all(
            "reading the open marks",
            f"SELECT {_MARK_COLS} FROM node_marks WHERE cleared_at IS NULL ORDER BY id",
        )
        return [_mark(r) for r in rows]

    def history(self, node: str, limit: int = 100) -> list[Mark]:
        rows = self._db.all(
            f"reading the marks of {node}",
            f"SELECT {_MARK_COLS} FROM node_marks WHERE node = ? ORDER BY id DESC LIMIT ?",
            (node, limit),
        )
        return [_mark(r) for r in rows][::-1]

    def saw_gpus(self, mark_id: int, gpus: Mapping[str, str]) -> None:
        """Remember the GPUs seen in the marked node's slots (only slots not remembered yet are added)."""
        with self._db.write(f"remembering the GPUs of mark {mark_id}") as tx:
            row = tx.execute("SELECT gpus FROM node_marks WHERE id = ?", (mark_id,)).fetchone()
            if row is None:
                return
            known = json.loads(row[0] or "{}")
            merged = {**gpus, **(known if isinstance(known, dict) else {})}
            tx.execute(
                "UPDATE node_marks SET gpus = ? WHERE id = ?", (json.dumps(merged, sort_keys=True), mark_id)
            )

    def clear(
        self, node: str, by: str, why: str, now: float, kinds: tuple[MarkKind, ...] = MARKS
    ) -> list[Mark]:
        """Clear the node's open marks of ``kinds``; returns those cleared (as they were)."""
        with self._db.write(f"clearing the marks of {node}") as tx:
            marks = [m for m in _open_marks(tx, node) if m.mark in kinds]
            for m in marks:
                tx.execute(
                    "UPDATE node_marks SET cleared_at = ?, cleared_by = ?, cleared_why = ? WHERE id = ?",
                    (now, by, why, m.id),
                )
            return marks

    # ------------------------------------------------------------------------------- drain generations

    def drained(self, node: str, now: float) -> int:
        """watchd drained ``node`` (again): its new drain generation."""
        with self._db.write(f"counting a drain of {node}") as tx:
            tx.execute(
                "INSERT INTO node_drains (node, generation, drained_at) VALUES (?, 1, ?)"
                " ON CONFLICT (node) DO UPDATE SET generation = node_drains.generation + 1,"
                " drained_at = excluded.drained_at",
                (node, now),
            )
            row = tx.execute("SELECT generation FROM node_drains WHERE node = ?", (node,)).fetchone()
            return int(row[0])

    def generation(self, node: str) -> int:
        """The generation of watchd's last drain of ``node`` (0: never drained by watchd)."""
        row = self._db.one(
            f"reading the drain generation of {node}",
            "SELECT generation FROM node_drains WHERE node = ?",
            (node,),
        )
        return 0 if row is None else int(row[0])


def _count(tx: Tx, node: str, since: float) -> int:
    row = tx.execute(
        "SELECT count(*) FROM node_remediations WHERE node = ? AND at >= ?", (node, since)
    ).fetchone()
    return 0 if row is None else int(row[0])


def _open_marks(tx: Tx, node: str) -> list[Mark]:
    rows = tx.execute(
        f"SELECT {_MARK_COLS} FROM node_marks WHERE node = ? AND cleared_at IS NULL ORDER BY id", (node,)
    ).fetchall()
    return [_mark(r) for r in rows]


def _set_mark(
    tx: Tx, node: str, kind: MarkKind, rule: str, detail: str, now: float, gpu: str = "", uuid: str = ""
) -> Mark:
    for m in _open_marks(tx, node):
        if m.mark == kind:
            return m
    gpus = json.dumps({gpu: uuid} if gpu and uuid else {}, sort_keys=True)
    cur = tx.execute(
        "INSERT INTO node_marks (node, mark, rule, detail, set_at, gpu, uuid, gpus)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (node, kind, rule, detail, now, gpu, uuid, gpus),
    )
    return Mark(int(cur.lastrowid or 0), node, kind, rule, detail, now, gpu, uuid, json.loads(gpus))
