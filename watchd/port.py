"""A port: what watchd may ask of one side of a cluster (a scheduler, its fleet, its check runner, the
commands to the agents), as a table of named verbs. Each :class:`Verb` says whether it changes the cluster
and which capability it needs; a verb a port cannot do is absent from its table.

:func:`gated` is the one gate: it wraps any port so that each verb that changes the cluster is asked
through a refusal (the engine's leadership, with its fencing token confirmed) right before the call; a
refused call touches nothing and answers as its verb says (a failed result, or an error raised). Reads pass
through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

__all__ = ["Absent", "Refusal", "Verb", "VerbTable", "ask", "gated", "gated_class", "table", "verbs_of"]

#: why ``what`` may not be done now, or None when it may
Refusal = Callable[[str], Awaitable[str | None]]

P = TypeVar("P")


def _always(*_args: Any, **_kwargs: Any) -> bool:
    return True


def _one_or_each(answers: Sequence[Any]) -> Any:
    return answers[0] if len(answers) == 1 else tuple(answers)


class Absent(Exception):
    """The port has no such verb (a verb a scheduler cannot do is absent from its table)."""


@dataclass(frozen=True, slots=True)
class Verb:
    """``what`` names a call in a refusal's message; ``refused`` answers a refused call (``why`` first,
    then the call's arguments), returning the verb's failed result or raising; ``asks`` says which calls of
    a changing verb are asked (all by default: a check runner's scheduled checks are not); ``merge`` makes
    one answer of those of several schedulers (a node routed to two that both have the verb: by default the
    one answer, or each one's in route order)."""

    name: str
    changes: bool = False
    capability: str = "read"
    what: Callable[..., str] | None = None
    refused: Callable[..., Any] | None = None
    asks: Callable[..., bool] = _always
    merge: Callable[[Sequence[Any]], Any] = _one_or_each

    def __post_init__(self) -> None:
        if self.changes and (self.what is None or self.refused is None):
            raise ValueError(f"verb {self.name}: a change needs what it is called and how a refusal answers")


VerbTable = Mapping[str, Verb]


def table(*verbs: Verb) -> dict[str, Verb]:
    """The verbs by name (a name twice is a mistake)."""
    out: dict[str, Verb] = {}
    for verb in verbs:
        if verb.name in out:
            raise ValueError(f"verb {verb.name} twice")
        out[verb.name] = verb
    return out


def verbs_of(port: object) -> VerbTable:
    """The verbs ``port`` declares (its ``verbs`` table); none when it declares no table."""
    verbs = getattr(port, "verbs", None)
    return verbs if isinstance(verbs, Mapping) else {}


async def ask(port: object, verb: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``verb`` of ``port``; :class:`Absent` when its table has no such verb."""
    if verb not in verbs_of(port):
        raise Absent(f"{getattr(port, 'name', port)} cannot {verb}")
    return await getattr(port, verb)(*args, **kwargs)


class _Gated:
    """The gated port's base: everything that is no verb (its name, a sync read) is the inner port's."""

    def __init__(self, port: object, refusal: Refusal) -> None:
        self.inner = port
        self._refusal = refusal

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def _method(verb: Verb) -> Callable[..., Awaitable[Any]]:
    if not verb.changes:

        async def read(self: _Gated, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.inner, verb.name)(*args, **kwargs)

        read.__name__ = verb.name
        return read

    what, refused = cast(Callable[..., str], verb.what), cast(Callable[..., Any], verb.refused)

    async def change(self: _Gated, *args: Any, **kwargs: Any) -> Any:
        if verb.asks(*args, **kwargs):
            why = await self._refusal(what(*args, **kwargs))
            if why is not None:
                return refused(why, *args, **kwargs)
        return await getattr(self.inner, verb.name)(*args, **kwargs)

    change.__name__ = verb.name
    return change


_CLASSES: dict[int, tuple[VerbTable, type[_Gated]]] = {}  # by the table's id (the table kept alive)


def gated_class(verbs: VerbTable) -> type[_Gated]:
    """The gated port's class for a verb table: one coroutine method per verb (built once per table)."""
    known = _CLASSES.get(id(verbs))
    if known is not None:
        return known[1]
    cls = type("Gated", (_Gated,), {name: _method(verb) for name, verb in verbs.items()})
    _CLASSES[id(verbs)] = (verbs, cls)
    return cls


def gated(port: P, verbs: VerbTable, refusal: Refusal) -> P:
    """``port`` with each verb of ``verbs`` that changes the cluster asked through ``refusal`` right before
    the call."""
    return cast(P, gated_class(verbs)(port, refusal))
