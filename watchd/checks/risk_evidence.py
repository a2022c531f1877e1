"""Recent hardware events and NIC errors per node, for the risk planner: fed every event the engine evaluates
(the kinds of :meth:`EventEvidence.subscriptions`, a few dict operations), read at the start of a round.

Which events count:

- **hardware**: what the reliability record calls hardware evidence (:func:`watchd.reliability.evidence.
  hardware_evidence`): an Xid of a hardware bucket, a hardware ``gpu_health`` condition while it holds, a
  finding with a hardware culprit;
- **nic**: an ``ib_port_health`` condition while it holds (a port down, downtrained, or its link error
  counters climbing), and NCCL's ``NET/IB`` completion errors (``nccl_warn``, category ``ib_completion``).

A condition is reported again while it holds, so events of one class on one node within ``episode_s`` of
the last counted one count once. In memory only: a restarted engine starts with none (the failures and the
checks' results, which weigh more, are in the state database)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType

from watchd.model.events import Event
from watchd.reliability.evidence import HARDWARE_KINDS, hardware_evidence

__all__ = ["EventEvidence", "evidence_class"]

NIC_KIND = "ib_port_health"  # watchd.model.ib (the agent's InfiniBand / RoCE port collector)
NCCL_WARN = "nccl_warn"


def _hardware(event: Event) -> str | None:
    return "hardware" if hardware_evidence(event) is not None else None


def _port(event: Event) -> str | None:
    return "nic" if event.attrs.get("value") not in (0, 0.0, None, False) else None


def _nccl_warn(event: Event) -> str | None:
    return "nic" if event.attrs.get("category") == "ib_completion" else None


#: kind -> the class of evidence an event of it is (``hardware``, ``nic``), or None when it is none
CLASSES: Mapping[str, Callable[[Event], str | None]] = MappingProxyType(
    {**dict.fromkeys(HARDWARE_KINDS, _hardware), NIC_KIND: _port, NCCL_WARN: _nccl_warn}
)


def evidence_class(event: Event) -> str | None:
    """``hardware``, ``nic`` or None (not evidence the planner counts)."""
    classify = CLASSES.get(event.kind)
    return None if classify is None else classify(event)


class EventEvidence:
    def __init__(self, episode_s: float = 3600.0, per_node: int = 32, max_nodes: int = 200_000) -> None:
        self.episode_s = episode_s
        self.per_node = per_node
        self.max_nodes = max_nodes
        self._times: dict[str, dict[str, deque[float]]] = {}

    def subscriptions(self) -> Mapping[str, Callable[[Event], None]]:
        """The kinds that can be evidence, each with its handler."""
        return {kind: partial(self._take, classify) for kind, classify in CLASSES.items()}

    def observe(self, event: Event) -> None:
        """One event of any kind (what the engine's dispatch does with :meth:`subscriptions`)."""
        classify = CLASSES.get(event.kind)
        if classify is not None:
            self._take(classify, event)

    def _take(self, classify: Callable[[Event], str | None], event: Event) -> None:
        cls = classify(event)
        if cls is None:
            return
        node = event.node
        if event.attrs.get(
            "gathered"
        ):  # read from a job's output that every node writes: the line says whose
            host = event.attrs.get("host")
            if not isinstance(host, str):
                return
            node = host
        self.add(node, cls, event.time)

    def add(self, node: str, cls: str, t: float) -> None:
        by_class = self._times.get(node)
        if by_class is None:
            if len(self._times) >= self.max_nodes:
                self._times.pop(next(iter(self._times)))  # the node seen first goes first
            by_class = self._times[node] = {}
        times = by_class.setdefault(cls, deque(maxlen=self.per_node))
        if times and abs(t - times[-1]) < self.episode_s:
            return
        times.append(t)

    def of(self, node: str, cls: str) -> tuple[float, ...]:
        return tuple(self._times.get(node, {}).get(cls, ()))
