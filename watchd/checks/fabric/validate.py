"""A pair check in a node's validation: the node runs once with a known-good partner, so that it returns to
service only with its links checked.

The partner is an idle node of the node's partitions whose last result of this check passed (the most recent
pass first), lent to the node's validation for the run (Slurm: added to its maintenance reservation, then
taken out again). Each candidate is checked idle and unreserved once more right before it is lent (the last
check). A pass with it passes; a slow or failed run keeps the node drained with the evidence.

A partner the scheduler takes before the run starts (the check job pending because the node went to another
job) says nothing about the links: that run is set aside and the next candidate is lent instead. With no
known-good partner idle, the links are *not checked* (outcome ``not_checked``, never ``failed``): the
validation keeps the node drained saying so, and it is tried again when a partner frees up
(:mod:`watchd.checks.waiting`). ``in_suite: false`` on the pair check leaves it out of validation.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping

from watchd.checks.params import CheckSpec
from watchd.checks.runner import CheckRunner, RunnerError, RunOutput
from watchd.checks.verdict import NOT_CHECKED, Verdict, gbps
from watchd.store.checks import CheckRuns

__all__ = ["MAX_PARTNERS", "known_good", "validate_pair"]

RunJob = Callable[..., Awaitable[tuple[str, str, Verdict, RunOutput]]]
#: partners tried in one validation before its links count as not checked (each taken one costs seconds)
MAX_PARTNERS = 4


async def known_good(
    runner: CheckRunner, store: CheckRuns, spec: CheckSpec, node: str, busy: Mapping[str, str]
) -> list[str]:
    """The nodes sharing a partition with ``node`` whose last run of ``spec`` passed, the latest first (their
    idleness is not asked here)."""
    members = await runner.members(spec.partitions)
    near = {n for nodes in members.values() if node in nodes for n in nodes} - {node} - set(busy)
    state = store.nodes(spec.name)
    return sorted(
        (n for n in near if (st := state.get(n)) is not None and st.last_outcome == "passed"),
        key=lambda n: (-(state[n].last_success or 0.0), n),
    )


def _not_checked(
    store: CheckRuns, spec: CheckSpec, node: str, round_id: str, now: float, why: str
) -> tuple[str, Verdict, RunOutput]:
    """A run that could not start: recorded (the validation's history shows why), never a pass nor a
    failure."""
    run_id = f"{spec.name}.{node}.{uuid.uuid4().hex[:10]}"
    store.start(run_id, spec.name, node, round_id, now, validation=True)
    return run_id, Verdict(NOT_CHECKED, f"links not checked: {why}"), RunOutput("not_started", detail=why)


async def _idle_now(runner: CheckRunner, spec: CheckSpec, partner: str, busy: Mapping[str, str]) -> str:
    """ "" when ``partner`` may be lent now (idle, unreserved, checking nothing), else why not."""
    if partner in busy:
        return "already being checked"
    try:
        a = (await runner.availability([partner], spec.time_limit)).get(partner)
    except RunnerError as exc:
        return f"the scheduler could not be asked: {exc}"
    if a is None:
        return "unknown node"
    return "" if a.idle else a.why


async def validate_pair(
    runner: CheckRunner,
    store: CheckRuns,
    spec: CheckSpec,
    node: str,
    round_id: str,
    busy: Mapping[str, str],
    run_job: RunJob,
    now: Callable[[], float],
    skip: Callable[[str, str], None],
) -> tuple[str, Verdict, RunOutput]:
    """The run of pair check ``spec`` in ``node``'s validation: its run id (its row in the state database),
    the verdict on the node, the output. ``skip`` records a run set aside (its partner taken) and why."""
    try:
        candidates = await known_good(runner, store, spec, node, busy)
    except RunnerError as exc:
        return _not_checked(store, spec, node, round_id, now(), f"the scheduler could not be asked: {exc}")
    try:
        avail = await runner.availability(candidates, spec.time_limit) if candidates else {}
    except RunnerError as exc:
        return _not_checked(store, spec, node, round_id, now(), f"the scheduler could not be asked: {exc}")
    idle = [n for n in candidates if (a := avail.get(n)) is not None and a.idle]
    taken: list[str] = []  # candidates set aside, and why
    for partner in idle:
        if len(taken) >= MAX_PARTNERS:
            break
        why = await _idle_now(runner, spec, partner, busy)  # the last check, right before it is lent
        if why:
            taken.append(f"{partner} {why}")
            continue
        try:
            await runner.lend(node, (partner,))
        except RunnerError as exc:  # the runner cannot (Kubernetes) or the scheduler refused: not waited out
            run_id, _, output = _not_checked(store, spec, node, round_id, now(), str(exc))
            return (
                run_id,
                Verdict("error", f"{spec.type}: {partner} could not join the validation: {exc}"),
                output,
            )
        try:
            _, run_id, verdict, output = await run_job(
                spec, node, round_id, None, validation=True, peers=(partner,)
            )
        finally:
            with contextlib.suppress(RunnerError):
                await runner.lend(node, ())
        if output.status == "not_started":  # the scheduler gave it (or the node) to another job first
            why = output.detail or "did not start"
            skip(run_id, f"{partner} was taken before the check started: {why}")
            taken.append(f"{partner} taken ({why})")
            continue
        figures = {**verdict.figures, "partners": partner}
        bw = verdict.busbw
        speed = f"busbw {gbps(bw)} GB/s" if bw is not None else "no bandwidth"
        if verdict.passed:
            return (
                run_id,
                Verdict("passed", f"nccl 2-node {speed} with {partner} (known good)", figures),
                output,
            )
        evidence = f"nccl 2-node with {partner}, which passed with others: {verdict.evidence}"
        return run_id, Verdict(verdict.outcome, evidence, figures), output
    why = f"no node that passed {spec.name} is idle to pair with"
    if not candidates:
        why = f"no node has passed {spec.name} yet to pair with"
    if taken:
        why += f" ({'; '.join(taken)})"
    return _not_checked(store, spec, node, round_id, now(), why)
