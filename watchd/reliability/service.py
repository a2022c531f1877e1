"""Node-hours in service: per node, intervals during which it reported and watchd had not drained it.

A node is *in service* from the moment it reports (any event from its agent: GPU summaries every window,
health reports, heartbeats) for as long as its reports keep coming, no two further apart than ``gap_s``; a
longer silence closes the interval at the last report (the node was down, or its agent was, and neither
counts as exposure). A failure (a watchd drain with hardware evidence) closes the interval at the failure and
takes the node *out*: its reports do not count until it is back, which is when watchd resumes it, a
``node_repaired`` event arrives, or a job it was not running at the failure is seen on it (the scheduler put
work on it again: someone returned it to service).

Pure: the caller passes every time (the events' own observation times); bounded by ``max_nodes`` (the node
least recently seen is forgotten first, and counted).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["Interval", "NodeService", "ServiceTracker"]

_JOBS_KEPT = 8  # recent jobs remembered per node (to tell a new job from the one running at the failure)
_MAX_GPUS = 1024


@dataclass(frozen=True, slots=True)
class Interval:
    node: str
    start: float
    end: float


@dataclass(slots=True)
class NodeService:
    node: str
    start: float | None = None  # the open interval's start (None: no open interval)
    end: float = 0.0  # its last report
    out_since: float | None = None  # drained by watchd for a failure since then
    model: str | None = None  # the GPU model its summaries name
    gpus: set[int] = field(default_factory=set)
    jobs: dict[str, float] = field(default_factory=dict)  # recent job -> last seen
    jobs_at_failure: frozenset[str] = frozenset()
    dirty: bool = False  # attributes changed since the last flush


class ServiceTracker:
    def __init__(self, gap_s: float = 300.0, max_nodes: int = 200_000) -> None:
        if gap_s <= 0 or max_nodes < 1:
            raise ValueError("gap_s must be > 0 and max_nodes >= 1")
        self.gap_s = gap_s
        self.max_nodes = max_nodes
        self.nodes: OrderedDict[str, NodeService] = OrderedDict()
        self._closed: list[Interval] = []
        self.evicted = 0

    def _node(self, name: str) -> NodeService:
        state = self.nodes.get(name)
        if state is None:
            state = self.nodes[name] = NodeService(name)
            while len(self.nodes) > self.max_nodes:
                _, old = self.nodes.popitem(last=False)
                self._close(old)
                self.evicted += 1
        else:
            self.nodes.move_to_end(name)
        return state

    def restore(self, node: str, *, out_since: float | None, model: str | None, gpus: int) -> None:
        """What the store remembers of a node (after a restart): whether it is out, its model and GPUs."""
        state = self._node(node)
        state.out_since = out_since
        state.model = model
        state.gpus = set(range(min(max(gpus, 0), _MAX_GPUS)))

    def seen(
        self, node: str, t: float, *, model: str | None = None, gpu: int | None = None, job: str | None = None
    ) -> bool:
        """A report from ``node`` observed at ``t``; True when it brought the node back into service (a job
        it was not running at its failure)."""
        state = self._node(node)
        back = False
        if model is not None and model != state.model:
            state.model, state.dirty = model, True
        if gpu is not None and 0 <= gpu < _MAX_GPUS and gpu not in state.gpus:
            state.gpus.add(gpu)
            state.dirty = True
        if job is not None:
            state.jobs[job] = t
            if len(state.jobs) > _JOBS_KEPT:
                del state.jobs[min(state.jobs, key=state.jobs.__getitem__)]
            if state.out_since is not None and job not in state.jobs_at_failure and t > state.out_since:
                back = self.restored(node, t) is not None
        if state.out_since is not None:
            return back
        if state.start is None or t - state.end > self.gap_s:
            if state.start is not None and t < state.end:
                return back  # late and out of order: within what was already counted, or before it
            self._close(state)
            state.start = state.end = t
        elif t > state.end:
            state.end = t
        return back

    def failed(self, node: str, t: float) -> None:
        """A failure at ``t``: the interval ends there and the node is out until it is back in service."""
        state = self._node(node)
        if state.start is not None and t < state.end:
            state.end = max(state.start, t)  # reports after the failure (out of order) are not exposure
        self._close(state)
        if state.out_since is None:
            state.out_since = t
            state.jobs_at_failure = frozenset(state.jobs)
            state.dirty = True

    def restored(self, node: str, t: float) -> float | None:
        """The node is back in service at ``t``; returns when it went out (None: it was not out)."""
        state = self._node(node)
        was = state.out_since
        if was is None:
            return None
        state.out_since = None
        state.jobs_at_failure = frozenset()
        state.dirty = True
        state.start = state.end = max(t, was)
        return was

    def _close(self, state: NodeService) -> None:
        if state.start is not None:
            self._closed.append(Interval(state.node, state.start, state.end))
            state.start = None

    @property
    def closed_pending(self) -> int:
        """Intervals closed since the last :meth:`take` (evictions add one each: the caller flushes early
        when they pile up, so a flood of new nodes cannot grow them between flushes)."""
        return len(self._closed)

    def take_closed(self) -> list[Interval]:
        """The intervals closed since the last call (the open ones stay for the periodic flush)."""
        out, self._closed = self._closed, []
        return out

    def take(self) -> list[Interval]:
        """The intervals to persist now: those closed since the last call and every open one (as far as it
        reaches): the store keeps one row per (node, start) and extends its end."""
        opened = [Interval(s.node, s.start, s.end) for s in self.nodes.values() if s.start is not None]
        return self.take_closed() + opened

    @staticmethod
    def open_and_dirty(states: list[NodeService]) -> tuple[list[Interval], list[NodeService]]:
        """Of ``states`` (a page of :attr:`nodes`): their open intervals as far as they reach, and those whose
        attributes (model, GPUs, out of service) changed since they were last taken (no longer marked)."""
        dirty = [s for s in states if s.dirty]
        for s in dirty:
            s.dirty = False
        return [Interval(s.node, s.start, s.end) for s in states if s.start is not None], dirty
