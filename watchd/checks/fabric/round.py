"""One round of a pair check (``type: nccl-pair``): the idle nodes in pairs, each pair one scheduler job over
both nodes, the nodes of slow pairs run again with nodes that passed, then a verdict per node and per link
(:mod:`watchd.checks.fabric.pairs`), each a ``check_result`` event the rules act on.

Runs go in waves, each wave capped like any round (``max_share`` of a partition at once, counting both nodes
of a pair), and each wave's nodes asked again whether they are idle right before it starts: a node that got a
job meanwhile is left for the next round. A run that could not be judged (not started, unreadable output)
says nothing about its nodes. A restart mid-round runs the round again: the runs it had started are followed
to their end and recorded, never judged alone.
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from watchd.checks import plan
from watchd.checks.fabric.pairs import Group, PairRun, attribute, first_groups, next_wave
from watchd.checks.params import ChecksConfig, CheckSpec
from watchd.checks.runner import CheckRunner, RunnerError, RunOutput
from watchd.checks.topology import read_leaf_switches
from watchd.checks.verdict import Verdict, gbps
from watchd.clock import Clock
from watchd.logs import get_logger
from watchd.model.events import Event, Scalar
from watchd.store.checks import CheckRuns

__all__ = ["PairRound"]

_log = get_logger("watchd.checks.fabric")
_MAX_WAVES = 4
_SETTLE_S = 30.0
_NIC_RECENT_S = 7 * 86400.0

RunJob = Callable[..., Awaitable[tuple[str, str, Verdict, RunOutput]]]
Settle = Callable[..., Awaitable[Event]]
FinishRaw = Callable[[str, str, str, dict[str, Any]], None]


def _size(runs: Sequence[PairRun]) -> str:
    """``2`` when every run was a pair, else the sizes (``8/4/2``)."""
    return "/".join(dict.fromkeys(str(len(r.nodes)) for r in runs))


def _speed(run: PairRun) -> str:
    """``busbw 41 GB/s``, or what went wrong when the run gave no bandwidth."""
    if run.busbw_gbps is not None:
        return f"busbw {gbps(run.busbw_gbps)} GB/s"
    return f"failed ({run.evidence[:80]})"


def _waves(
    pairs: Sequence[Group], parts: Mapping[str, tuple[str, ...]], limits: Mapping[str, int]
) -> list[list[Group]]:
    """``pairs`` in groups that keep each partition within its limit (a pair counts its two nodes; a limit
    below two still lets one pair run)."""
    groups: list[list[Group]] = []
    current: list[Group] = []
    load: dict[str, int] = {}
    for pair in pairs:
        need: dict[str, int] = {}
        for node in pair:
            for p in parts.get(node, ()):
                need[p] = need.get(p, 0) + 1
        fits = all(load.get(p, 0) + n <= max(len(pair), limits.get(p, 2)) for p, n in need.items())
        if current and not fits:
            groups.append(current)
            current, load = [], {}
        current.append(pair)
        for p, n in need.items():
            load[p] = load.get(p, 0) + n
    if current:
        groups.append(current)
    return groups


class PairRound:
    def __init__(
        self,
        runner: CheckRunner,
        store: CheckRuns,
        config: ChecksConfig,
        clock: Clock,
        busy: Mapping[str, str],
        run_job: RunJob,
    ) -> None:
        self.runner = runner
        self.store = store
        self.config = config
        self.clock = clock
        self.busy = busy  # nodes running a check of this engine now
        self.run_job = run_job
        #: when the node's NIC was last reported faulty (its IB ports, NCCL's NET/IB errors), if ever
        self.nic_seen: Callable[[str], float | None] = lambda node: None

    async def run(
        self, spec: CheckSpec, rid: str, scheduled_at: float, settle: Settle, finish_raw: FinishRaw
    ) -> dict[str, Any]:
        self.store.begin_round(spec.name, rid, scheduled_at, self.clock.now())
        try:
            members = await self.runner.members(spec.partitions)
        except RunnerError as exc:
            _log.error("check_round_no_members", check=spec.name, error=str(exc))
            return {"round": rid, "error": str(exc)}
        cands = plan.candidates(spec, members)
        limits = plan.caps(spec, {p: members[p] for p in members if any(p in ps for ps in cands.values())})
        not_idle: dict[str, str] = {}
        idle = await self._idle(spec, list(cands), not_idle)
        runs: list[PairRun] = []
        verdicts: dict[Group, Verdict] = {}
        wave = first_groups(idle, spec.group_size, read_leaf_switches(self.config.risk.topology))
        pending = set(idle) - {n for pair in wave for n in pair}
        for _ in range(_MAX_WAVES):
            if not wave:
                break
            for group in _waves(wave, cands, limits):
                ready = set(await self._ready(spec, [n for pair in group for n in pair], not_idle))
                group = [pair for pair in group if set(pair) <= ready]
                done = await asyncio.gather(
                    *(self._pair(spec, rid, pair, cands, finish_raw) for pair in group)
                )
                for pair, verdict in done:
                    verdicts[pair] = verdict
            runs = self._judged(verdicts)
            wave = next_wave(runs, pending)
            pending = set()
        att = attribute(runs)
        threshold = self._threshold(spec, verdicts)
        for node, bad in att.at_fault.items():
            fine = sorted({n for r in bad for n in r.others(node)} & set(att.passed))
            with_whom = " and ".join(f"{_speed(r)} with {r.partner(node)}" for r in bad)
            evidence = (
                f"nccl {_size(bad)}-node {with_whom}{threshold}; {', '.join(fine)} fine with others"
                + self._nic_note([node])
            )
            figures = self._figures(verdicts, bad[-1], ",".join(r.partner(node) for r in bad))
            await self._emit(spec, node, rid, Verdict("failed", evidence, figures), settle)
        for node, good in att.passed.items():
            figures = self._figures(verdicts, good, good.partner(node))
            evidence = f"nccl {len(good.nodes)}-node {_speed(good)} with {good.partner(node)}"
            await self._emit(spec, node, rid, Verdict("passed", evidence, figures), settle)
        for link in att.links:
            a, b = link.nodes[0], ",".join(link.nodes[1:])
            well = (
                "both fine with others: the link between them"
                if len(link.nodes) == 2
                else "each fine with others: the links between them"
            )
            evidence = (
                f"nccl {len(link.nodes)}-node {_speed(link)} between {a} and {b}{threshold}; {well}"
                + self._nic_note(link.nodes)
            )
            await self._emit(
                spec, a, rid, Verdict("link", evidence, self._figures(verdicts, link, b)), settle
            )
        self.store.finish_round(spec.name, rid, self.clock.now())
        summary: dict[str, Any] = {
            "round": rid,
            "runs": len(verdicts),
            "checked": sorted({n for pair in verdicts for n in pair}),
            "failed": sorted(att.at_fault),
            "links": [list(r.nodes) for r in att.links],
            "unresolved": sorted(att.unresolved),
            "not_idle": dict(sorted(not_idle.items())),
        }
        _log.info("check_pair_round_finished", check=spec.name, **{k: summary[k] for k in ("runs", "failed")})
        return summary

    async def _ready(self, spec: CheckSpec, nodes: list[str], not_idle: dict[str, str]) -> list[str]:
        """The idle ones of ``nodes``, waiting up to :data:`_SETTLE_S` for those still completing the run
        before (Slurm keeps a node COMPLETING for a moment after its job ends)."""
        deadline = self.clock.monotonic() + _SETTLE_S
        while True:
            why: dict[str, str] = {}
            idle = await self._idle(spec, nodes, why)
            settling = [n for n, w in why.items() if "complet" in w.lower()]
            if not settling or self.clock.monotonic() > deadline:
                not_idle.update(why)
                return idle
            await asyncio.sleep(0.5)

    async def _idle(self, spec: CheckSpec, nodes: list[str], not_idle: dict[str, str]) -> list[str]:
        try:
            avail = await self.runner.availability(nodes, spec.time_limit)
        except RunnerError as exc:
            _log.warning("check_availability_failed", check=spec.name, error=str(exc))
            return []
        state = self.store.nodes(spec.name)
        out = []
        for node in nodes:
            a = avail.get(node)
            st = state.get(node)
            why = (
                "unknown to the scheduler"
                if a is None
                else (a.why or "not idle")
                if not a.idle
                else "already being checked"
                if node in self.busy
                else "backing off"
                if st is not None and st.next_try > self.clock.now()
                else ""
            )
            if why:
                not_idle[node] = why
            else:
                out.append(node)
        return out

    async def _pair(
        self,
        spec: CheckSpec,
        rid: str,
        group: Group,
        cands: Mapping[str, tuple[str, ...]],
        finish_raw: FinishRaw,
    ) -> tuple[Group, Verdict]:
        first, peers = group[0], group[1:]
        partition = cands[first][0] if cands.get(first) else None
        _, run_id, verdict, _ = await self.run_job(spec, first, rid, partition, peers=peers)
        finish_raw(
            run_id, verdict.outcome, verdict.evidence, {**verdict.figures, "partners": ",".join(peers)}
        )
        return group, verdict

    def _judged(self, verdicts: Mapping[Group, Verdict]) -> list[PairRun]:
        """The runs as the attribution sees them: passed, or slow/failed/hung; below ``peers.share`` of the
        round's median pair (with ``peers.min_nodes`` pairs measured) counts as slow too."""
        peers = self.config.peers
        measured = [v.busbw for v in verdicts.values() if v.busbw is not None and v.outcome == "passed"]
        median = statistics.median(measured) if peers.enabled and len(measured) >= peers.min_nodes else None
        out = []
        for pair, v in verdicts.items():
            good = v.outcome == "passed" and (median is None or (v.busbw or 0.0) >= peers.share * median)
            judged = v.outcome in ("passed", "failed", "timeout")
            out.append(PairRun(pair, good, v.busbw, v.evidence, judged))
        return out

    def _nic_note(self, nodes: Sequence[str]) -> str:
        """``; NIC faults reported on gpu-3 (2 h ago)`` for the nodes whose NIC was reported faulty within
        :data:`_NIC_RECENT_S` (the agent's IB ports, NCCL's NET/IB errors): hardware evidence beside the
        bandwidth."""
        now = self.clock.now()
        seen = {n: t for n in nodes if (t := self.nic_seen(n)) is not None and now - t <= _NIC_RECENT_S}
        if not seen:
            return ""
        ago = ", ".join(f"{n} ({(now - t) / 3600:.0f} h ago)" for n, t in sorted(seen.items()))
        return f"; NIC faults reported on {ago}"

    @staticmethod
    def _threshold(spec: CheckSpec, verdicts: Mapping[Group, Verdict]) -> str:
        base = next(
            (v.figures.get("baseline_gbps") for v in verdicts.values() if v.figures.get("baseline_gbps")),
            None,
        )
        if isinstance(base, int | float):
            return f" < {spec.threshold * 100:.0f}% of {gbps(float(base))} GB/s"
        return " (below the round's other pairs)"

    @staticmethod
    def _figures(verdicts: Mapping[Group, Verdict], run: PairRun, partners: str) -> dict[str, Scalar]:
        return {**verdicts[run.nodes].figures, "partners": partners}

    async def _emit(self, spec: CheckSpec, node: str, rid: str, verdict: Verdict, settle: Settle) -> None:
        """The node's verdict as a run of its own (its history, its standing) and a ``check_result``."""
        run_id = f"{spec.name}.{node}.{uuid.uuid4().hex[:10]}"
        self.store.start(run_id, spec.name, node, rid, self.clock.now())
        await settle(spec, node, rid, run_id, verdict, None)
