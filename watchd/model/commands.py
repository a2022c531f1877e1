"""Commands the engine asks an agent to carry out on its own node (a GPU reset), and what the agent reports:
the wire format both sides share (version 1, as the event batches).

The agent pulls: ``GET /api/v1/agent/commands?node=NODE&instance=I`` answers the node's pending commands
(``{"version": 1, "commands": [...]}``), and ``POST /api/v1/agent/commands/<id>/result?node=NODE&instance=I``
reports how one ended. Both need the agents' token. ``I`` is the agent process's own random instance id: the
engine binds each command to the first instance that fetched it, durably, before handing it out, and hands it
out with that binding (``bound_to``); a later run of the agent that does not remember the command refuses it,
and a result is taken only from the node the command is for and the instance it is bound to.

A command is handed out at every poll until its result arrives (at least once); its ``id`` is stable (every
re-drive of one action after an engine restart asks with the same id), and the agent runs an id at most once:
asked again, it reports what it remembers. Version 1 readers ignore ``bound_to``; an agent that sends no
``instance`` (older than its engine) is refused, and an agent given a command without ``bound_to`` (an engine
older than it) refuses the command."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from watchd.model.events import WIRE_VERSION, WireError

__all__ = [
    "AGENT_PREFIX",
    "COMMANDS_PATH",
    "DONE",
    "FAILED",
    "GPU_RESET",
    "REFUSED",
    "WITHDRAWN",
    "Command",
    "CommandResult",
    "Validity",
    "result_path",
    "valid_instance",
]

#: every path under it is an agent's own call (the agents' token; never an operator's or a viewer's)
AGENT_PREFIX: Final = "/api/v1/agent/"
COMMANDS_PATH: Final = "/api/v1/agent/commands"
GPU_RESET: Final = "gpu_reset"
KINDS = frozenset({GPU_RESET})

#: how a command ended, as the agent reports it: done; refused before anything was touched (a process holds
#: the GPU, the agent may not); failed while it ran (the reset itself failed, the GPU did not come back)
DONE: Final = "done"
REFUSED: Final = "refused"
FAILED: Final = "failed"
AGENT_OUTCOMES = frozenset({DONE, REFUSED, FAILED})
#: the engine's outcome of a command whose reason no longer held when its agent asked: never handed out
WITHDRAWN: Final = "withdrawn"

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_INSTANCE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_NODE = 253
_MAX_DETAIL = 2000
#: a result's data, as JSON: the GPUs reset and the GPUs seen after (a node has at most a few dozen)
MAX_DATA_BYTES = 16 * 1024
MAX_ARGS = 16
_MAX_ARG = 256


#: whether the reason a command was queued for still holds, asked right before it is handed out: None if
#: it does, else why not; an exception when it cannot tell now (the command is kept back that time)
Validity = Callable[[], Awaitable["str | None"]]


def result_path(command_id: str) -> str:
    return f"{COMMANDS_PATH}/{command_id}/result"


def valid_id(value: object) -> bool:
    return isinstance(value, str) and _ID.match(value) is not None


def valid_instance(value: object) -> bool:
    """An agent instance id: 1-64 characters [A-Za-z0-9_-]."""
    return isinstance(value, str) and _INSTANCE.match(value) is not None


def valid_node(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= _MAX_NODE and value.isprintable() and " " not in value


def _number(d: Mapping[str, Any], key: str) -> float:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WireError(f"{key}: expected a number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Command:
    """One thing the engine asks of the agent of ``node``. ``args`` of ``gpu_reset``: ``gpu``, the PCI bus id
    of the GPU to reset (``0000:3b:00.0``), or "" for every GPU of the node. ``bound_to``: the agent instance
    the engine handed it to first ("" until it is handed out; never changed after)."""

    id: str
    node: str
    kind: str
    args: Mapping[str, str] = field(default_factory=dict)
    issued_at: float = 0.0
    bound_to: str = ""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "id": self.id,
            "node": self.node,
            "kind": self.kind,
            "args": dict(self.args),
            "issued_at": self.issued_at,
        }
        if self.bound_to:
            wire["bound_to"] = self.bound_to
        return wire

    @classmethod
    def from_wire(cls, d: object) -> Command:
        if not isinstance(d, dict):
            raise WireError(f"a command: expected an object, got {type(d).__name__}")
        if not valid_id(d.get("id")):
            raise WireError(f"id: expected 1-128 characters [A-Za-z0-9_.:-], got {d.get('id')!r}")
        if not valid_node(d.get("node")):
            raise WireError(f"node: expected a node name, got {d.get('node')!r}")
        kind = d.get("kind")
        if not isinstance(kind, str) or not kind:
            raise WireError(f"kind: expected a command name, got {kind!r}")
        args = d.get("args", {})
        if (
            not isinstance(args, dict)
            or len(args) > MAX_ARGS
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(v) <= _MAX_ARG for k, v in args.items()
            )
        ):
            raise WireError(f"args: expected at most {MAX_ARGS} string values, got {args!r}"[:300])
        bound_to = d.get("bound_to", "")
        if bound_to != "" and not valid_instance(bound_to):
            raise WireError(f"bound_to: expected an agent instance id, got {bound_to!r}"[:300])
        return cls(str(d["id"]), str(d["node"]), kind, dict(args), _number(d, "issued_at"), str(bound_to))


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command ended. ``outcome``: one of :data:`AGENT_OUTCOMES` as the agent reports it; the engine
    adds its own when no report came (``expired``: never fetched; ``unanswered``: fetched, no report in
    time; ``not_queued``: the engine's bound on pending commands). ``data`` of a ``gpu_reset``:
    ``{"gpus": [PCI bus ids reset], "seconds": s, "after": [{"index", "uuid", "pci_bus_id"}...]}``."""

    id: str
    outcome: str
    detail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    finished_at: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {
            "version": WIRE_VERSION,
            "id": self.id,
            "outcome": self.outcome,
            "detail": self.detail,
            "data": dict(self.data),
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_wire(cls, d: object) -> CommandResult:
        """A result as an agent sent it: bounded and checked (the outcome one an agent may report)."""
        if not isinstance(d, dict):
            raise WireError(f"a result: expected an object, got {type(d).__name__}")
        if d.get("version") != WIRE_VERSION:
            raise WireError(f"version: expected {WIRE_VERSION}, got {d.get('version')!r}")
        if not valid_id(d.get("id")):
            raise WireError(f"id: expected 1-128 characters [A-Za-z0-9_.:-], got {d.get('id')!r}")
        outcome = d.get("outcome")
        if outcome not in AGENT_OUTCOMES:
            raise WireError(f"outcome: expected one of {sorted(AGENT_OUTCOMES)}, got {outcome!r}")
        detail = d.get("detail", "")
        if not isinstance(detail, str):
            raise WireError("detail: expected a string")
        data = d.get("data", {})
        if not isinstance(data, dict):
            raise WireError("data: expected an object")
        if len(json.dumps(data)) > MAX_DATA_BYTES:
            raise WireError(f"data: more than {MAX_DATA_BYTES} bytes")
        detail = detail[:_MAX_DETAIL].encode("utf-8", "replace").decode("utf-8")
        return cls(str(d["id"]), str(outcome), detail, data, _number(d, "finished_at"))
