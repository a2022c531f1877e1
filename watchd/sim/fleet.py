"""The fleet file of ``watchd sim``: which nodes, GPUs, jobs and faults a simulated fleet has.

A fleet file (validated strictly; errors name the file and the key path)::

    seed: 7
    duration: 600                                  # seconds (default: until stopped)
    nodes: {count: 1000, name: "sim-{i}", start: 1}
    gpus: {model: H100-SXM, count: 8}
    interval_s: 5                                  # GPU sampling interval
    summary_window_s: 5
    jobs:
      - {id: 1001, nodes: "sim-[1-512]"}           # a Slurm job id (or "slurm:<id>", "k8s:<pod uid>")
      - {id: 1002, nodes: [sim-600, "sim-[601-700]"]}
    faults:                                         # any fault of watchd/gpu/scenario.py, plus its node(s)
      - {node: sim-3, at: 30, kind: ecc_dbe, gpu: 3}
      - {node: "sim-[10-12]", at: 60, kind: thermal, gpu: all, duration: 120}
      - {node: sim-40, at: 90, kind: xid, code: 13}
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from watchd.config import load_yaml
from watchd.errors import ConfigError
from watchd.gpu.jobs import JobRef, parse_job_label
from watchd.sim.hostlist import MAX_NODES, NodeSelector, select_nodes
from watchd.sim.scenario import FAULT_KINDS, Fault, GpuSpec, Scenario, check_faults
from watchd.strict import Strict as _Strict

__all__ = ["Fleet", "FleetFault", "FleetJob", "NodeNames", "load_fleet", "parse_fleet"]

Seconds = Annotated[float, Field(gt=0)]


class NodeNames(_Strict):
    """``count`` nodes named ``name.format(i=i)`` for i from ``start``: ``sim-{i}`` gives sim-1, sim-2, ..."""

    count: Annotated[int, Field(ge=1, le=MAX_NODES)]
    name: str = "sim-{i}"
    start: Annotated[int, Field(ge=0)] = 1

    @field_validator("name")
    @classmethod
    def _pattern(cls, name: str) -> str:
        try:
            first, second = name.format(i=1), name.format(i=2)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"bad pattern {name!r} (use {{i}}, e.g. sim-{{i}}): {exc}") from None
        if first == second:
            raise ValueError(f"pattern {name!r} must contain {{i}} (e.g. sim-{{i}})")
        return name

    def names(self) -> list[str]:
        return [self.name.format(i=i) for i in range(self.start, self.start + self.count)]


class FleetJob(_Strict):
    """A job running on some nodes: their GPUs train, and their summaries carry the job."""

    id: int | str
    nodes: NodeSelector

    def ref(self) -> JobRef | None:
        if isinstance(self.id, int):
            return JobRef("slurm", str(self.id)) if self.id >= 0 else None
        if self.id.isascii() and self.id.isdigit():
            return JobRef("slurm", self.id)
        return parse_job_label(self.id)


class FleetFault(_Strict):
    """A fault of :mod:`watchd.sim.scenario` on one or more nodes (``node``: a name or a host list). Written
    flat in the file: ``{node: sim-3, at: 30, kind: ecc_dbe, gpu: 3}``."""

    node: NodeSelector
    fault: Fault

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "fault" not in data:
            rest = dict(data)
            node = rest.pop("node", None)
            return {"fault": rest} if node is None else {"node": node, "fault": rest}
        return data


class Fleet(_Strict):
    seed: int = 0
    duration: Seconds | None = None
    nodes: NodeNames
    gpus: GpuSpec = GpuSpec()
    interval_s: Seconds = 5.0
    summary_window_s: Seconds = 5.0
    health_report_interval_s: Seconds = 30.0
    jobs: tuple[FleetJob, ...] = ()
    faults: tuple[FleetFault, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Fleet:
        names = self.nodes.names()
        known = set(names)
        where = f"nodes are {names[0]}..{names[-1]}" if len(names) > 1 else f"the node is {names[0]}"
        if len(known) != len(names):
            raise ValueError(f"nodes.name: pattern {self.nodes.name!r} gives duplicate names")
        owner: dict[str, int] = {}
        for n, job in enumerate(self.jobs):
            if job.ref() is None:
                raise ValueError(
                    f"jobs.{n}.id: {job.id!r} is not a Slurm job id (digits) or a label slurm:<id>, k8s:<uid>"
                )
            for node in _checked(f"jobs.{n}.nodes", job.nodes, known, where):
                if node in owner:
                    raise ValueError(f"jobs.{n}.nodes: {node} is already in jobs.{owner[node]}")
                owner[node] = n
        for n, ff in enumerate(self.faults):
            _checked(f"faults.{n}.node", ff.node, known, where)
            problem = check_faults(self.gpus, [ff.fault])
            if problem is not None:
                raise ValueError(problem.replace("faults.0.", f"faults.{n}.", 1))
        return self

    def node_names(self) -> list[str]:
        return self.nodes.names()

    def jobs_by_node(self) -> dict[str, JobRef]:
        out: dict[str, JobRef] = {}
        for job in self.jobs:
            ref = job.ref()
            assert ref is not None  # validated
            for node in select_nodes(job.nodes):
                out[node] = ref
        return out

    def faults_by_node(self) -> dict[str, list[Fault]]:
        out: dict[str, list[Fault]] = {}
        for ff in self.faults:
            for node in select_nodes(ff.node):
                out.setdefault(node, []).append(ff.fault)
        return out

    def scenario(self, index: int, node: str, training: bool, faults: Iterable[Fault] = ()) -> Scenario:
        """The scenario of the ``index``-th node (its own seed: GPU UUIDs and serials differ across nodes)."""
        return Scenario(
            seed=self.seed * 1_000_003 + index,
            gpus=self.gpus,
            load="training" if training else "idle",
            faults=tuple(faults),
        )


def _checked(path: str, selector: NodeSelector, known: set[str], where: str) -> list[str]:
    try:
        nodes = select_nodes(selector)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not nodes:
        raise ValueError(f"{path}: no nodes")
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise ValueError(f"{path}: unknown node {unknown[0]!r} ({where})")
    return nodes


def _format(source: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = list(err["loc"])
        # a flat fault is validated as {node, fault: {...}} and a discriminated union puts the tag in the
        # path (faults.0.fault.thermal.bogus): show faults.0.bogus
        if len(loc) >= 3 and loc[0] == "faults" and isinstance(loc[1], int) and loc[2] == "fault":
            del loc[2]
            if len(loc) >= 3 and loc[2] in FAULT_KINDS:
                del loc[2]
        # str | tuple selectors name the union member tried (nodes.str, nodes.tuple[str, ...]): drop it
        loc = [p for p in loc if not (isinstance(p, str) and (p in ("str", "int") or p.startswith("tuple[")))]
        kind = err["type"]
        msg = "unknown key" if kind == "extra_forbidden" else err["msg"]
        if kind == "union_tag_not_found":
            loc.append("kind")
            msg = f"missing (one of {', '.join(FAULT_KINDS)})"
        elif kind == "union_tag_invalid":
            loc.append("kind")
            tag = (err.get("ctx") or {}).get("tag", "?")
            msg = f"unknown fault kind {tag!r} (one of {', '.join(FAULT_KINDS)})"
        if kind == "value_error":
            msg = msg.removeprefix("Value error, ")
            if not loc:  # the fleet's own checks name the path themselves
                problems.append(f"{source}: {msg}")
                continue
        path = ".".join(str(p) for p in loc) or "(top level)"
        line = f"{source}: {path}: {msg}"
        if line not in problems:
            problems.append(line)
    return "\n".join(problems)


def parse_fleet(data: Any, source: str = "<fleet>") -> Fleet:
    """Validate parsed YAML into a :class:`Fleet`; :class:`ConfigError` names the key path."""
    if not isinstance(data, dict):
        got = "nothing" if data is None else type(data).__name__
        raise ConfigError(f"{source}: expected a mapping at the top level, got {got}")
    try:
        return Fleet.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(source, exc)) from None


def load_fleet(path: Path) -> Fleet:
    return parse_fleet(load_yaml(path), str(path))
